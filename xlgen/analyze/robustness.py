"""`xlgen analyze robustness`: how robust Press's numerical rank is, seed 001 §5.5 (Algorithms 5.1 and 5.2).

Both start from a log-probability matrix Q `[m, n]` (a workdir's, as `xlgen analyze rank` builds it, or a `.npy`),
take its thin SVD Q = U S Vᵀ and keep the top `--keep` singular values (001: 10), A = U S_k Vᵀ, of rank k.

* Algorithm 5.1 (reconstruction errors): `--iterations` times, A_i = U_i S_i V_iᵀ from the SVD of A_{i-1}; reports
  the Press rank of A_i and the reconstruction error ‖A_i - A_0‖²_F / (m n) (001 Table 5.11 prints an "error
  ×10⁻²⁸" whose definition it does not give; this mean squared drift is our reading). The rank should stay k.
* Algorithm 5.2 (Gaussian additive noise): for each c of `--noise`, A + Z with Z ~ N(0, (c/n²)²) i.i.d.; reports
  the Press rank and the ε-effective ranks (ε = 1e-3, 1e-4, 1e-5) of A + Z (001 Tables 5.12, 5.13). The Press rank
  jumps to full once the noise clears the tolerance; the ε-effective ranks stay near k.

All arithmetic is float64, so the Press tolerance uses float64's eps by default (`--eps-dtype`); the absolute c at
which the rank jumps depends on that eps and on σ_max, which is why 001's c values (1e-20 ... 1e-25 for a float64
10,000 x 10,000 Q) do not carry over to another matrix (docs/output_layers.md).

    xlgen analyze robustness (--workdir=DIR [--contexts=N] | --npy=Q.npy) [--keep=10] [--iterations=10]
                             [--noise=1e-2,1e-4,...] [--seed=0] [--json=FILE] [--png=FILE]
"""

from __future__ import annotations

import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

from xlgen.analyze.common import EFFECTIVE_EPS, effective_rank, fail, save_figure, tool_parser, write_json
from xlgen.analyze.rank import press_tolerance

DEFAULT_NOISE = (1e-2, 1e-4, 1e-8, 1e-12, 1e-16, 1e-20, 1e-24, 1e-28, 1e-32)


def press_rank(a: np.ndarray, eps: float) -> int:
    s = np.linalg.svd(a, compute_uv=False)
    return int((s > press_tolerance(s, a.shape, eps)).sum())


def truncate(q: np.ndarray, keep: int) -> np.ndarray:
    """U S_k Vᵀ: Q with all but its top `keep` singular values set to 0 (float64)."""
    u, s, vt = np.linalg.svd(np.asarray(q, np.float64), full_matrices=False)
    s = s.copy()
    s[keep:] = 0.0
    return (u * s) @ vt


def reconstruction_test(a0: np.ndarray, iterations: int, eps: float) -> List[Dict]:
    """Algorithm 5.1 on the rank-k matrix a0: [{"iteration", "press_rank", "error"}]."""
    out, a = [], a0
    for i in range(1, iterations + 1):
        u, s, vt = np.linalg.svd(a, full_matrices=False)
        a = (u * s) @ vt
        s_new = np.linalg.svd(a, compute_uv=False)
        out.append(
            {
                "iteration": i,
                "press_rank": int((s_new > press_tolerance(s_new, a.shape, eps)).sum()),
                "error": float(np.mean((a - a0) ** 2)),
            }
        )
    return out


def noise_test(a0: np.ndarray, noise: Sequence[float], eps: float, seed: int = 0) -> List[Dict]:
    """Algorithm 5.2: [{"c", "std", "press_rank", "effective_rank"}] for A + N(0, (c/n²)²)."""
    rng = np.random.default_rng(seed)
    n = a0.shape[1]
    out = []
    for c in noise:
        std = float(c) / n**2
        a = a0 + rng.normal(0.0, std, size=a0.shape)
        s = np.linalg.svd(a, compute_uv=False)
        out.append(
            {
                "c": float(c),
                "std": std,
                "press_rank": int((s > press_tolerance(s, a.shape, eps)).sum()),
                "effective_rank": {f"{e:g}": effective_rank(s, e) for e in EFFECTIVE_EPS},
            }
        )
    return out


def robustness_report(
    q: np.ndarray, *, keep: int = 10, iterations: int = 10, noise: Sequence[float] = DEFAULT_NOISE, seed: int = 0,
    eps_dtype: str = "float64",
) -> Dict:  # fmt: skip
    q = np.asarray(q, np.float64)
    if q.shape[0] < q.shape[1]:
        raise ValueError(f"Q is {q.shape[0]} x {q.shape[1]}: Algorithms 5.1/5.2 take m >= n (use more contexts)")
    if not 0 < keep <= min(q.shape):
        raise ValueError(f"--keep={keep}: must be in [1, {min(q.shape)}]")
    eps = float(np.finfo(np.dtype(eps_dtype)).eps)
    a0 = truncate(q, keep)
    return {
        "shape": list(q.shape),
        "keep": keep,
        "eps_dtype": str(np.dtype(eps_dtype)),
        "press_rank_of_q": press_rank(q, eps),
        "press_rank_of_truncated": press_rank(a0, eps),
        "reconstruction": reconstruction_test(a0, iterations, eps),
        "noise": noise_test(a0, noise, eps, seed),
    }


def _plot(path: str, rep: Dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    c = [r["c"] for r in rep["noise"]]
    ax.semilogx(c, [r["press_rank"] for r in rep["noise"]], "o-", label="Press rank")
    for e in rep["noise"][0]["effective_rank"]:
        ax.semilogx(c, [r["effective_rank"][e] for r in rep["noise"]], ".--", label=f"ε-rank, ε = {e}")
    ax.axhline(rep["keep"], color="k", lw=0.8, ls=":", label=f"true rank {rep['keep']}")
    ax.set_xlabel("c (noise std c / n²)")
    ax.set_ylabel("rank")
    ax.set_title(f"Algorithm 5.2 on Q {rep['shape'][0]} x {rep['shape'][1]} truncated to rank {rep['keep']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    p = tool_parser("robustness", __doc__, png="Press and ε-effective ranks against c")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workdir", default=None)
    src.add_argument("--npy", default="", help="a saved Q `[m, n]` (m >= n)")
    p.add_argument("--contexts", type=int, default=0, help="with --workdir: rows of Q (default = vocabulary size)")
    p.add_argument("--split", default="")
    p.add_argument("--keep", type=int, default=10)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--noise", default=",".join(f"{c:g}" for c in DEFAULT_NOISE), help="comma-separated c values")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eps-dtype", default="float64")
    args = p.parse_args(argv)
    try:
        noise = [float(x) for x in args.noise.split(",") if x]
        if args.npy:
            q = np.load(args.npy)
        else:
            from xlgen.analyze.common import load_model, output_embedding, setup
            from xlgen.analyze.rank import collect_log_probs

            setup(args.platform)
            config, model, _ = load_model(args.workdir)
            vocab = output_embedding(model)[0].shape[0]
            q = collect_log_probs(config, model, contexts=args.contexts or vocab, split=args.split or config.eval.split)
        rep = robustness_report(
            q, keep=args.keep, iterations=args.iterations, noise=noise, seed=args.seed, eps_dtype=args.eps_dtype
        )
    except (ValueError, FileNotFoundError, KeyError, OSError) as e:
        return fail("robustness", e)
    print(
        f"Q {rep['shape'][0]} x {rep['shape'][1]}: Press rank {rep['press_rank_of_q']} ({rep['eps_dtype']} eps); "
        f"top-{rep['keep']} truncation: {rep['press_rank_of_truncated']}"
    )
    print("Algorithm 5.1: " + ", ".join(f"{r['press_rank']} ({r['error']:.2e})" for r in rep["reconstruction"]))
    for r in rep["noise"]:
        eff = " / ".join(str(v) for v in r["effective_rank"].values())
        print(f"Algorithm 5.2: c = {r['c']:g}: Press rank {r['press_rank']}, ε-rank (1e-3/1e-4/1e-5) {eff}")
    if args.json:
        write_json(args.json, rep)
    if args.png:
        _plot(args.png, rep)
        print(f"png: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
