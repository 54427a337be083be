"""`xlgen analyze rank`: numerical rank of the log-probability matrix Q (the softmax bottleneck, seed 001 §2.5, §4.3).

Q `[M, V]` stacks the model's log-probability vectors log P(· | c) at M held-out contexts (the eval split, read in
order with the eval memory, one row per target token). For a softmax, Q = HEᵀ + 1bᵀ - lse·1ᵀ, so rank(Q) <= d + 2
(d + 1 without an output bias), d = width of the output embedding; MoS / SigSoftmax / GSS can exceed it.

Procedure (001 L675-678, L1243-1259): thin SVD (LAPACK via NumPy, float64 arithmetic on the float32 values of Q),
rank = #{s_i > ζ} with Press et al.'s ζ = ½ √(M + V + 1) · s_max · eps, where eps is the machine epsilon of the
dtype Q was COMPUTED in (float32: log-softmax is float32 in every xlgen output layer). The dtype matters: the
rounding noise of a float32 Q sits far above float64's ζ, so a float64 eps reports full rank for any softmax.
Also reported: the NumPy/MATLAB tolerance s_max · max(M, V) · eps, and ε-effective ranks (the smallest k with
Σ_{i<=k} s_i² >= (1 - ε) Σ s_i², ε ∈ {1e-3, 1e-4, 1e-5}; 001 L1883-1889), which are robust to noise.

    xlgen analyze rank --workdir=DIR [--contexts=N] [--split=valid] [--json=FILE] [--png=FILE] [--linear-png=FILE]

`--png` plots σ_k/σ_1 on a log axis (001 Figs. 5.9/5.11, the SigSoftmax paper's view); `--linear-png` the singular
values normalised to [0, 1] on a linear axis over the first 500 indices, y in [0, 0.2] (001 Figs. 5.10/5.12, where
every head's decay looks alike). `plot_linear` overlays several runs (the reproductions use it).
"""

from __future__ import annotations

import sys
from typing import Dict, List, Optional

import numpy as np

from xlgen.analyze.common import EFFECTIVE_EPS, effective_rank, fail, save_figure, setup, tool_parser, write_json


def press_tolerance(s: np.ndarray, shape, eps: float) -> float:
    """ζ = ½ √(M + N + 1) · max(s) · eps (Press et al., Numerical Recipes)."""
    m, n = shape
    return 0.5 * float(np.sqrt(m + n + 1.0)) * float(np.max(s)) * eps


def rank_report(q: np.ndarray, dtype: str = "float32") -> Dict:
    """Singular values and ranks of Q `[M, N]` (any float array; `dtype` = the dtype it was computed in)."""
    q = np.asarray(q)
    s = np.linalg.svd(q.astype(np.float64), compute_uv=False)
    eps = float(np.finfo(np.dtype(dtype)).eps)
    zeta = press_tolerance(s, q.shape, eps)
    numpy_tol = float(s.max()) * max(q.shape) * eps
    return {
        "shape": list(q.shape),
        "eps_dtype": str(np.dtype(dtype)),
        "eps": eps,
        "press_tolerance": zeta,
        "rank": int((s > zeta).sum()),
        "rank_numpy_tolerance": int((s > numpy_tol).sum()),
        "effective_rank": {f"{e:g}": effective_rank(s, e) for e in EFFECTIVE_EPS},
        "singular_values": s,
    }


def collect_log_probs(config, model, *, contexts: int, split: str) -> np.ndarray:
    """Q `[M, V]` float32: log P(·|c) at the first `contexts` target positions of `split`, with the eval memory."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from xlgen import registry
    from xlgen.train import loop

    objective = registry.objective(config)
    if not {"input_ids", "labels", "label_mask", "stream_reset"} <= set(objective.batch_shapes(config, split)):
        raise ValueError(
            f"xlgen analyze rank: objective {objective.name!r} is not a language model on a token stream "
            "(Transformer-XL's txl_lm)"
        )
    pipe = loop.make_pipeline(config, split)
    mems_shape = objective.mems_shape(config, split)  # [n_layer, batch, mem_len, d] of evaluation, or None
    mem_len = int(mems_shape[2]) if mems_shape else 0
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, ids, mems, reset):
        m = nnx.merge(graphdef, state)
        if mems is not None:
            mems = mems * (1.0 - reset.astype(mems.dtype))[None, :, None, None]
        return m(ids, mems, mem_len=mem_len)

    rows: List[np.ndarray] = []
    mems = None
    n = 0
    steps = getattr(pipe, "num_steps", None)
    s = 0
    while n < contexts and (steps is None or s < steps):
        batch = pipe.batch(s)
        ids = jnp.asarray(np.asarray(batch["input_ids"], np.int32))
        if mems is None and mem_len > 0:
            mems = model.init_mems(ids.shape[0], mem_len)
        lp, new_mems = forward(state, ids, mems, jnp.asarray(np.asarray(batch["stream_reset"], bool)))
        mems = new_mems if mem_len > 0 else None
        lp = np.asarray(lp, np.float32)
        mask = np.asarray(batch["label_mask"]) > 0
        # time-major order (all streams at t, then t+1): rows are contexts in reading order per stream
        rows.append(lp.transpose(1, 0, 2)[mask.T])
        n += int(mask.sum())
        s += 1
    if not rows:
        raise ValueError(f"split {split!r} gave no contexts")
    q = np.concatenate(rows)[:contexts]
    if not np.all(np.isfinite(q)):
        raise ValueError("log-probabilities contain non-finite values")
    return q


def _plot(path: str, s: np.ndarray, bound: int, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogy(np.arange(1, len(s) + 1), s / s[0], lw=1.2)
    ax.axvline(bound, color="k", ls="--", lw=0.8, label=f"softmax bound d+2 = {bound}")
    ax.set_xlabel("index k")
    ax.set_ylabel("σ_k / σ_1 of Q")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def plot_linear(path: str, curves: Dict[str, np.ndarray], title: str = "", top: int = 500, ymax: float = 0.2):
    """Singular values of Q normalised to [0, 1] (σ_k / σ_1) on a linear y axis, k <= `top`, y in [0, `ymax`],
    one line per label (001 Figs. 5.10/5.12)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, s in curves.items():
        s = np.asarray(s, np.float64)
        k = min(top, len(s))
        ax.plot(np.arange(1, k + 1), s[:k] / s[0], lw=1.2, label=label)
    ax.set_xlim(0, top)
    ax.set_ylim(0, ymax)
    ax.set_xlabel("index k")
    ax.set_ylabel("σ_k / σ_1 of Q (linear)")
    ax.set_title(title or "normalised singular values of Q")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def analyze(workdir: str, *, contexts: int = 0, split: str = "") -> Dict:
    """The rank report of a workdir (JSON-ready except `singular_values`, a NumPy array)."""
    from xlgen.analyze.common import load_model, output_embedding

    config, model, step = load_model(workdir)
    table, has_bias = output_embedding(model)
    vocab, d = table.shape
    contexts = contexts or 2 * vocab
    split = split or config.eval.split
    q = collect_log_probs(config, model, contexts=contexts, split=split)
    rep = rank_report(q, "float32")
    bound = d + (2 if has_bias else 1)
    rep.update(
        {
            "workdir": workdir,
            "step": int(step),
            "split": split,
            "output_layer": config.model.get("output_layer", "adaptive"),
            "d": int(d),
            "vocab_size": int(vocab),
            "has_output_bias": has_bias,
            "bound": int(bound),
            "exceeds_bound": rep["rank"] > bound,
        }
    )
    return rep


def main(argv: Optional[List[str]] = None) -> int:
    p = tool_parser(
        "rank",
        __doc__,
        json="write the report here (keys rank, bound, ...)",
        png="plot the normalised singular values of Q here",
    )
    p.add_argument("--workdir", required=True)
    p.add_argument("--contexts", type=int, default=0, help="rows M of Q (default 2 x vocab size)")
    p.add_argument("--split", default="", help="data split (default config.eval.split)")
    p.add_argument("--linear-png", default="", help="σ_k/σ_1 of Q, linear axis, k <= 500 (001 Fig. 5.10)")
    args = p.parse_args(argv)
    setup(args.platform)
    try:
        rep = analyze(args.workdir, contexts=args.contexts, split=args.split)
    except (ValueError, FileNotFoundError, KeyError) as e:
        return fail("rank", e)
    s = rep.pop("singular_values")
    print(
        f"{rep['workdir']} (step {rep['step']}, output_layer={rep['output_layer']}): Q {rep['shape'][0]} x "
        f"{rep['shape'][1]} on {rep['split']}\n"
        f"  rank (Press, {rep['eps_dtype']} eps, tol {rep['press_tolerance']:.3g}) = {rep['rank']}   "
        f"softmax bound d+1 = {rep['d'] + 1}, d+2 with output bias = {rep['d'] + 2}  "
        f"-> {'EXCEEDS' if rep['exceeds_bound'] else 'within'} the bound {rep['bound']}\n"
        f"  rank (NumPy tol) = {rep['rank_numpy_tolerance']}   epsilon-effective rank "
        + ", ".join(f"{k}: {v}" for k, v in rep["effective_rank"].items())
    )
    if args.json:
        write_json(args.json, {**rep, "singular_values": [float(x) for x in s]}, "  ")
    if args.png:
        _plot(args.png, s, rep["bound"], f"{rep['output_layer']}: rank {rep['rank']} (bound {rep['bound']})")
        print(f"  png: {args.png}")
    if args.linear_png:
        plot_linear(args.linear_png, {rep["output_layer"]: s}, f"{rep['output_layer']}: rank {rep['rank']}")
        print(f"  linear png: {args.linear_png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
