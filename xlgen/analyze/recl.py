"""`xlgen analyze recl`: Relative Effective Context Length of a group of Transformer-XL LMs (Dai thesis §2.1.4 /
Transformer-XL paper appendix).

    xlgen analyze recl --workdir=A [--workdir=B ...] [--r=0.1,0.5,1.0] [--delta=100] [--start=100]
                       [--max_context=1000] [--split=valid] [--max_tokens=20000] [--json=FILE] [--png=FILE]

Definition (thesis §2.1.4; M = {m_1..m_N} a model group sharing one baseline):

    l_i(c, t)   = -log P_{m_i}(x_t | x_{t-1}, ..., x_{t-c})             per-token loss with context length c
    b(c, t)     = min_i l_i(c, t)                                        the group's best short-context loss
    T           = the top-r fraction of positions t with largest b(c, t) (the hard tokens)
    f_i(c, c')  = 1/|T| sum_{t in T} min(b(c, t), l_i(c', t))            only gains over the baseline count
    g_i(c, c')  = (exp f_i(c, c) - exp f_i(c, c')) / exp f_i(c, c)       relative perplexity gain
    RECL_i      : c = start; while g_i(c, c + delta) >= 0.01: c += delta;  RECL_i = c

with the thesis' settings: threshold 0.01, r in {0.1, 0.5, 1.0} (Table 2.9), step delta = 100 tokens. If the
gain is still >= 0.01 at the largest context evaluated, RECL is reported as that context with `"capped": true`.

Context length: the model is evaluated over the split's token stream (cut into `--batch` contiguous rows) in
segments of `--segment` tokens with an evaluation memory of c states and `same_length` attention, so every token
attends to exactly c keys (itself and its c - 1 predecessors) at every layer (the thesis' "attention length");
the memory starts empty (masked fixed-length buffer), so the first tokens of a row have the same, shorter context
for every c. All workdirs of a group must read the same tokens (same tokenizer and data source).

Outputs: JSON (`recl[r][workdir]`, `capped`, the gain curves g_i(c, c + delta) and the unnormalised gains
exp f_i(c, c) - exp f_i(c, c + delta) per r, and the mean loss / perplexity per context length) and a PNG with
the relative-gain curves (threshold line) and perplexity against context length (thesis Figures 2.4 and 2.5).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from data_pipelines import paths
from xlgen.analyze.common import fail, setup, tool_parser

THRESHOLD = 0.01  # the thesis' gain threshold


# ----------------------------------------------------------------------------------------------------------------
# The metric (pure NumPy; per-token losses in, RECL out)
# ----------------------------------------------------------------------------------------------------------------


def relative_gain(losses: Dict[str, Dict[int, np.ndarray]], c: int, c2: int, r: float) -> Dict[str, Dict[str, float]]:
    """{model: {"g": g_i(c, c2), "gain": exp f_i(c,c) - exp f_i(c,c2)}} for a group of per-token losses
    `losses[model][context]` (float arrays over the same token positions)."""
    names = sorted(losses)
    base = np.min(np.stack([np.asarray(losses[m][c], np.float64) for m in names]), axis=0)  # b(c, t)
    n = max(1, int(math.ceil(r * base.size)))
    top = np.argsort(-base, kind="stable")[:n]  # T: the top-r positions with the largest baseline loss
    b = base[top]
    f_cc = float(b.mean())  # min(b, l_i(c, t)) = b since b is the group minimum
    out = {}
    for m in names:
        f = float(np.minimum(b, np.asarray(losses[m][c2], np.float64)[top]).mean())
        out[m] = {"g": (math.exp(f_cc) - math.exp(f)) / math.exp(f_cc), "gain": math.exp(f_cc) - math.exp(f)}
    return out


def recl(
    losses: Dict[str, Dict[int, np.ndarray]],
    *,
    r: float,
    delta: int,
    start: int,
    threshold: float = THRESHOLD,
) -> Dict[str, Any]:
    """RECL of every model of a group (the thesis' thresholding algorithm). Needs `losses[m][c]` for
    c = start, start + delta, ... Returns {"recl": {m: c}, "capped": {m: bool}, "curve": {m: [[c, g, gain], ...]}}."""
    contexts = sorted(set.intersection(*[set(v) for v in losses.values()]))
    grid = [c for c in contexts if c >= start and (c - start) % delta == 0]
    if len(grid) < 2 or grid[0] != start:
        raise ValueError(f"RECL needs losses at contexts {start}, {start + delta}, ...; have {contexts}")
    curves = {m: [] for m in losses}
    for c, c2 in zip(grid, grid[1:]):
        if c2 != c + delta:
            break
        for m, v in relative_gain(losses, c, c2, r).items():
            curves[m].append([c, v["g"], v["gain"]])
    result, capped = {}, {}
    for m, curve in curves.items():
        c = start
        for cc, g, _ in curve:  # c advances while the gain of one more step stays above the threshold
            if cc != c or g < threshold:
                break
            c = cc + delta
        result[m] = c
        capped[m] = c == (curve[-1][0] + delta if curve else start)  # never fell below the threshold
    return {"recl": result, "capped": capped, "curve": curves}


# ----------------------------------------------------------------------------------------------------------------
# Per-token losses of a Transformer-XL with a given context length
# ----------------------------------------------------------------------------------------------------------------


def _stream_rows(tokens: np.ndarray, batch: int):
    """(inputs, targets) `[batch, row_len]`: the stream cut into `batch` contiguous rows (x_t predicts x_{t+1})."""
    n = (len(tokens) - 1) // batch
    if n < 2:
        raise ValueError(f"{len(tokens)} tokens are too few for {batch} rows")
    x = tokens[: batch * n].reshape(batch, n)
    y = tokens[1 : batch * n + 1].reshape(batch, n)
    return x, y


class TokenLosses:
    """l(c, t) for a `TransformerXLLM`: one jitted segment step per context length (fixed shapes per c)."""

    def __init__(self, module):
        from flax import nnx

        module.eval()
        self.config = module.config
        self._graphdef, self._params = nnx.split(module)
        self._steps = {}

    def _step(self, context: int):
        if context not in self._steps:
            import jax
            from flax import nnx

            from xlgen.models.relative_attention import advance_memory_validity

            cfg = dataclasses.replace(self.config, same_length=True)
            graphdef = self._graphdef

            def step(params, ids, labels, mems, valid):
                model = nnx.merge(graphdef, params)
                model.config = cfg
                nll, mems = model(ids, mems, labels=labels, mem_len=context, mem_valid=valid)
                return nll, mems, advance_memory_validity(valid, ids.shape[1], context)

            self._steps[context] = jax.jit(step, donate_argnums=(3,))
        return self._steps[context]

    def __call__(self, tokens: np.ndarray, context: int, *, segment: int = 64, batch: int = 8) -> np.ndarray:
        """Per-token losses `[batch * row_len]` (row-major over the rows of `_stream_rows`) with context `context`."""
        import jax.numpy as jnp

        x, y = _stream_rows(np.asarray(tokens, np.int32), batch)
        c = self.config
        n = x.shape[1]
        pad = (-n) % segment
        x = np.pad(x, ((0, 0), (0, pad)))
        y = np.pad(y, ((0, 0), (0, pad)))
        mems = jnp.zeros((c.n_layer, batch, context, c.d_model), jnp.dtype(c.dtype))
        valid = jnp.zeros((batch,), jnp.int32)
        step = self._step(context)
        out = []
        for s in range(0, x.shape[1], segment):
            nll, mems, valid = step(self._params, x[:, s : s + segment], y[:, s : s + segment], mems, valid)
            out.append(np.asarray(nll, np.float32))
        return np.concatenate(out, axis=1)[:, :n].reshape(-1)


# ----------------------------------------------------------------------------------------------------------------
# Plot and CLI
# ----------------------------------------------------------------------------------------------------------------


def plot(result: Dict[str, Any], path: str) -> None:
    """Relative gain g(c, c + delta) against c per model and r (thesis Fig. 2.4), and perplexity against context
    length (Fig. 2.5)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = list(result["per_r"])
    fig, axes = plt.subplots(1, len(rs) + 1, figsize=(4.2 * (len(rs) + 1), 3.6), dpi=110)
    for ax, r in zip(axes, rs):
        per = result["per_r"][r]
        for m, curve in per["curve"].items():
            if curve:
                cs, gs = [p[0] for p in curve], [p[1] for p in curve]
                ax.plot(cs, gs, "o-", label=f"{_short(m)} (RECL {per['recl'][m]})")
        ax.axhline(result["threshold"], color="k", lw=0.8, ls="--")
        ax.set_xlabel(f"context c (gain of c -> c + {result['delta']})")
        ax.set_ylabel("relative gain g(c, c+Δ)")
        ax.set_title(f"r = {r}", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    ax = axes[-1]
    for m, rows in result["ppl"].items():
        ax.plot([p[0] for p in rows], [p[1] for p in rows], "o-", label=_short(m))
    ax.set_xlabel("context length c")
    ax.set_ylabel("perplexity")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.atomic_write_figure(path, fig)
    plt.close(fig)


def _short(name: str) -> str:
    return os.path.basename(os.path.normpath(name)) or name


def group_losses(
    workdirs: Sequence[str],
    contexts: Sequence[int],
    *,
    split: str = "valid",
    max_tokens: int = 20000,
    segment: int = 64,
    batch: int = 8,
) -> Dict[str, Dict[int, np.ndarray]]:
    """losses[workdir][c] for a group of Transformer-XL workdirs on the same evaluation tokens."""
    import tqdm

    import data_pipelines
    from data_pipelines.corpus import corpus_from_config
    from xlgen.train.workdir_model import restore_params

    losses, tokens, fingerprint = {}, None, None
    for wd in workdirs:
        config, program, params, _ = restore_params(wd)
        module = program.make_model(params, train=False)
        if type(module).__name__ != "TransformerXLLM":
            raise ValueError(f"{wd}: RECL is computed for Transformer-XL language models, not {type(module).__name__}")
        corpus = corpus_from_config(data_pipelines.resolved(config.data), split, "lm")
        fp = corpus.tokenizer.fingerprint()
        toks = corpus.tokens(0, min(corpus.num_tokens, max_tokens + 1))
        if tokens is None:
            tokens, fingerprint = toks, fp
        elif fp != fingerprint or not np.array_equal(toks, tokens):
            raise ValueError(f"{wd}: reads other evaluation tokens than {workdirs[0]} (a RECL group shares its data)")
        scorer = TokenLosses(module)
        print(f"recl: {wd}: per-token losses at {len(contexts)} context lengths", file=sys.stderr, flush=True)
        bar = tqdm.tqdm(contexts, desc=_short(wd), unit="context", disable=None)  # a bar on a terminal only
        losses[wd] = {int(c): scorer(tokens, int(c), segment=segment, batch=batch) for c in bar}
    return losses


def analyze(losses: Dict[str, Dict[int, np.ndarray]], rs: Sequence[float], delta: int, start: int) -> Dict[str, Any]:
    per_r = {str(r): recl(losses, r=r, delta=delta, start=start) for r in rs}
    ppl = {m: [[c, math.exp(float(np.mean(v[c])))] for c in sorted(v)] for m, v in losses.items()}
    return {"threshold": THRESHOLD, "delta": delta, "start": start, "per_r": per_r, "ppl": ppl}


def main(argv: Optional[List[str]] = None) -> int:
    p = tool_parser(
        "recl",
        __doc__,
        json="output JSON (default: <first workdir>/recl.json)",
        png="output PNG (default: the JSON path with .png)",
    )
    p.add_argument("--workdir", action="append", required=True, help="Transformer-XL workdir (repeat for a group)")
    p.add_argument("--r", default="0.1,0.5,1.0", help="fractions of hardest tokens (thesis: 0.1, 0.5, 1.0)")
    p.add_argument("--delta", type=int, default=100, help="context step (thesis: 100)")
    p.add_argument("--start", type=int, default=None, help="first (short) context (default: delta)")
    p.add_argument("--max_context", type=int, default=1000, help="longest context evaluated")
    p.add_argument("--split", default="valid")
    p.add_argument("--max_tokens", type=int, default=20000, help="evaluation tokens (from the split's start)")
    p.add_argument("--segment", type=int, default=64, help="evaluation segment length")
    p.add_argument("--batch", type=int, default=8, help="the stream is cut into this many contiguous rows")
    args = p.parse_args(argv)
    start = args.start or args.delta
    try:
        rs = [float(x) for x in args.r.split(",") if x.strip()]
        if not rs or any(not 0 < r <= 1 for r in rs):
            raise ValueError(f"--r={args.r}: fractions in (0, 1]")
        contexts = list(range(start, args.max_context + 1, args.delta))
        if len(contexts) < 2:
            raise ValueError(f"--start={start} --delta={args.delta} --max_context={args.max_context}: < 2 contexts")
        setup(args.platform)
        losses = group_losses(
            args.workdir,
            contexts,
            split=args.split,
            max_tokens=args.max_tokens,
            segment=args.segment,
            batch=args.batch,
        )
    except (ValueError, FileNotFoundError, KeyError) as e:
        return fail("recl", e)
    result = {
        "workdirs": list(args.workdir),
        "split": args.split,
        "tokens": int(next(iter(next(iter(losses.values())).values())).size),
    }
    result.update(analyze(losses, rs, args.delta, start))
    json_path = args.json or os.path.join(args.workdir[0], "recl.json")
    png_path = args.png or os.path.splitext(json_path)[0] + ".png"
    paths.atomic_write_text(json_path, json.dumps(result, indent=2) + "\n")
    plot(result, png_path)
    for r, per in result["per_r"].items():
        cells = "  ".join(f"{_short(m)} {c}{'+' if per['capped'][m] else ''}" for m, c in sorted(per["recl"].items()))
        print(f"RECL r={r}: {cells}")
    print(f"wrote {json_path} and {png_path}", flush=True)
    return 0
