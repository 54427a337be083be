"""`xlgen analyze kld`: the expected pairwise KL divergence between the next-token distributions of different
contexts, E_{c,c'}[KL(P(·|c) ‖ P(·|c'))] (seed 000 App. A.8.1, Table A.11: Softmax 4.869 / MoC 4.955 / MoS 5.400 on
PTB validation). A model that tells contexts apart better has less similar conditionals on average.

Estimator: the M held-out contexts of `xlgen analyze rank` (the eval split in reading order, with the eval memory),
the mean over all ordered pairs c != c' of KL(P_c ‖ P_c') = Σ_z P_c(z) (log P_c(z) - log P_c'(z)), in float64 from
the float32 log-probabilities: with Q the `[M, V]` log-probability matrix and P = exp Q, KL = diag(P Qᵀ) 1ᵀ - P Qᵀ.
(000 samples pairs; all pairs of M contexts is the same expectation without the sampling noise.)

    xlgen analyze kld --workdir=DIR [--contexts=N] [--split=valid] [--json=FILE] [--png=FILE]
"""

from __future__ import annotations

import sys
from typing import Dict, List, Optional

import numpy as np

from xlgen.analyze.common import fail, save_figure, setup, tool_parser, write_json


def pairwise_kld(log_probs: np.ndarray, block: int = 1024) -> np.ndarray:
    """KL(P_i ‖ P_j) `[M, M]` (float64, zero diagonal) for log-probabilities `[M, V]` (rows normalised)."""
    q = np.asarray(log_probs, np.float64)
    p = np.exp(q)
    neg_entropy = np.einsum("mv,mv->m", p, q)  # Σ_z P_i log P_i
    out = np.empty((q.shape[0], q.shape[0]))
    for s in range(0, q.shape[0], block):
        out[s : s + block] = neg_entropy[s : s + block, None] - p[s : s + block] @ q.T
    np.fill_diagonal(out, 0.0)
    return out


def kld_report(log_probs: np.ndarray) -> Dict:
    """{"expected_pairwise_kld" (mean over ordered pairs i != j), "std", "median", "contexts", "histogram"}."""
    k = pairwise_kld(log_probs)
    m = k.shape[0]
    if m < 2:
        raise ValueError("the pairwise KLD needs at least 2 contexts")
    off = k[~np.eye(m, dtype=bool)]
    counts, edges = np.histogram(off, bins=50)
    return {
        "expected_pairwise_kld": float(off.mean()),
        "std": float(off.std()),
        "median": float(np.median(off)),
        "contexts": int(m),
        "histogram": {"counts": [int(c) for c in counts], "edges": [float(e) for e in edges]},
    }


def analyze(workdir: str, *, contexts: int = 0, split: str = "") -> Dict:
    from xlgen.analyze.common import load_model, output_embedding
    from xlgen.analyze.rank import collect_log_probs

    config, model, step = load_model(workdir)
    vocab = output_embedding(model)[0].shape[0]
    contexts = contexts or min(2 * vocab, 4096)
    split = split or config.eval.split
    q = collect_log_probs(config, model, contexts=contexts, split=split)
    rep = kld_report(q)
    rep.update(
        {
            "workdir": workdir,
            "step": int(step),
            "split": split,
            "output_layer": config.model.get("output_layer", "adaptive"),
        }
    )
    return rep


def _plot(path: str, rep: Dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = rep["histogram"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.stairs(h["counts"], h["edges"], fill=True, alpha=0.6)
    ax.axvline(rep["expected_pairwise_kld"], color="k", ls="--", lw=1, label=f"mean {rep['expected_pairwise_kld']:.3f}")
    ax.set_xlabel("KL(P(·|c) ‖ P(·|c')) [nats]")
    ax.set_ylabel("context pairs")
    ax.set_title(f"{rep.get('output_layer', '')}: pairwise KLD over {rep['contexts']} contexts")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    p = tool_parser("kld", __doc__, png="histogram of the pairwise KLDs")
    p.add_argument("--workdir", required=True)
    p.add_argument("--contexts", type=int, default=0, help="contexts M (default min(2 x vocab, 4096))")
    p.add_argument("--split", default="")
    args = p.parse_args(argv)
    setup(args.platform)
    try:
        rep = analyze(args.workdir, contexts=args.contexts, split=args.split)
    except (ValueError, FileNotFoundError, KeyError) as e:
        return fail("kld", e)
    print(
        f"{rep['workdir']} (step {rep['step']}, output_layer={rep['output_layer']}): expected pairwise KLD "
        f"{rep['expected_pairwise_kld']:.4f} nats over {rep['contexts']} contexts of {rep['split']} "
        f"(std {rep['std']:.3f}, median {rep['median']:.3f})"
    )
    if args.json:
        write_json(args.json, rep, "  ")
    if args.png:
        _plot(args.png, rep)
        print(f"  png: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
