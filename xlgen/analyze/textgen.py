"""`xlgen analyze textgen`: BLEU / Self-BLEU / Inverse BLEU, FED and LCR of a generated sentence set against a
reference set (seed 004 §IV-A; definitions in `textgen_metrics.py`, encoders in `sentence_encoders.py`).

    xlgen analyze textgen --generated=FILE --reference=FILE [--encoder=lsa[:DIM]] [--encoder_fit=FILE]
                          [--bleu_size=5000] [--embed_size=10000] [--tau=0.65] [--seed=0] [--json=OUT]

Files hold one tokenized sentence per line (tokens split on whitespace; blank lines skipped). Sets larger than
`--bleu_size` (token metrics, the paper's 5,000) or `--embed_size` (FED/LCR, the paper's 10,000) are sampled
without replacement by `--seed`; smaller ones are used whole. JSON keys: `bleu`, `self_bleu`, `inverse_bleu`
(5-gram scores in [0, 1]; `*_by_n` per order 2-5), `fed`, `lcr` (at `tau`), `lcr_by_tau`, `coverage_generated` /
`coverage_reference` per τ (R of each set: the share of its sentences with a τ-similar partner in the other),
`encoder` and `encoder_deviation`, the set sizes.
"""

from __future__ import annotations

import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

from xlgen.analyze import textgen_metrics as tm
from xlgen.analyze.common import fail, tool_parser, write_json


def read_sentences(path: str) -> List[str]:
    """Non-blank lines of `path`, whitespace-normalised. Raises ValueError naming the file when it has none."""
    from data_pipelines import paths

    lines = [" ".join(line.split()) for line in paths.read_text(path).splitlines()]
    lines = [s for s in lines if s]
    if not lines:
        raise ValueError(f"{path}: no sentences (expected one tokenized sentence per line)")
    return lines


def sample(sentences: Sequence[str], size: int, seed: int) -> List[str]:
    """`size` sentences drawn without replacement by `seed` (in file order), or all of them."""
    if size <= 0 or len(sentences) <= size:
        return list(sentences)
    keep = np.sort(np.random.default_rng(seed).choice(len(sentences), size, replace=False))
    return [sentences[i] for i in keep]


def evaluate(
    generated: Sequence[str],
    reference: Sequence[str],
    encoder,
    *,
    bleu_size: int = 5000,
    embed_size: int = 10000,
    tau: float = tm.DEFAULT_TAU,
    taus: Sequence[float] = tm.TAU_SWEEP,
    seed: int = 0,
    token_metrics: bool = True,
) -> Dict:
    """Every metric of the module doc for two sentence lists; `encoder` as in sentence_encoders."""
    from xlgen.analyze.sentence_encoders import DEVIATION

    out: Dict = {"encoder": encoder.name, "encoder_deviation": DEVIATION, "seed": seed}
    if token_metrics:
        g = [s.split() for s in sample(generated, bleu_size, seed)]
        r = [s.split() for s in sample(reference, bleu_size, seed + 1)]
        for key, scores in (
            ("bleu", tm.bleu_scores(g, r)),
            ("self_bleu", tm.bleu_scores(g, g, leave_one_out=True)),
            ("inverse_bleu", tm.bleu_scores(r, g)),
        ):
            out[key] = scores[max(scores)]
            out[f"{key}_by_n"] = {str(n): v for n, v in scores.items()}
        out["bleu_sizes"] = {"generated": len(g), "reference": len(r)}
    ge = encoder.encode(sample(generated, embed_size, seed))
    re_ = encoder.encode(sample(reference, embed_size, seed + 1))
    taus = sorted(set(float(t) for t in taus) | {float(tau)})
    cov = tm.coverage(ge, re_, taus)
    out.update(
        fed=tm.frechet_distance(ge, re_),
        tau=float(tau),
        lcr=min(cov[float(tau)]),
        lcr_by_tau={f"{t:g}": min(cov[t]) for t in taus},
        coverage_generated={f"{t:g}": cov[t][0] for t in taus},
        coverage_reference={f"{t:g}": cov[t][1] for t in taus},
        embed_sizes={"generated": int(ge.shape[0]), "reference": int(re_.shape[0])},
    )
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = tool_parser("textgen", __doc__, png=None, platform=False)
    p.add_argument("--generated", required=True, help="generated sentences, one per line")
    p.add_argument("--reference", required=True, help="reference (test) sentences, one per line")
    p.add_argument("--encoder", default="lsa", help="sentence encoder for FED/LCR: lsa[:DIM] (default lsa = 256)")
    p.add_argument("--encoder_fit", default="", help="sentences the encoder is fitted on (default: --reference)")
    p.add_argument("--bleu_size", type=int, default=5000)
    p.add_argument("--embed_size", type=int, default=10000)
    p.add_argument("--tau", type=float, default=tm.DEFAULT_TAU)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no_bleu", action="store_true", help="FED and LCR only")
    args = p.parse_args(argv)
    from xlgen.analyze.sentence_encoders import make_encoder

    try:
        generated, reference = read_sentences(args.generated), read_sentences(args.reference)
        fit = read_sentences(args.encoder_fit) if args.encoder_fit else reference
        encoder = make_encoder(args.encoder, fit, fit_name=args.encoder_fit or f"reference {args.reference}")
    except (OSError, ValueError) as e:
        return fail("textgen", e)
    out = evaluate(
        generated,
        reference,
        encoder,
        bleu_size=args.bleu_size,
        embed_size=args.embed_size,
        tau=args.tau,
        seed=args.seed,
        token_metrics=not args.no_bleu,
    )
    out.update(generated=args.generated, reference=args.reference)
    if "bleu" in out:
        print(
            f"BLEU-5 {out['bleu']:.4f}  Self-BLEU-5 {out['self_bleu']:.4f}  Inverse BLEU-5 {out['inverse_bleu']:.4f}"
            f"  ({out['bleu_sizes']['generated']} generated, {out['bleu_sizes']['reference']} reference)"
        )
    print(f"FED {out['fed']:.5f}  LCR(τ={out['tau']:g}) {out['lcr']:.4f}  encoder: {out['encoder']}")
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
