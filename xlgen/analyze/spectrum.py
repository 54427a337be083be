"""`xlgen analyze spectrum`: singular-value decay and isotropy of a language model's output embedding W `[V, d]`.

Normalised singular values σ_k / σ_1 (seed 002 Figs. 1-3, seed 001 Figs. 5.4-5.7), drawn on log-log axes for one
or several workdirs overlaid. Isotropy (seed 002 §5, after Mu & Viswanath): with Z(a) = Σ_i exp(⟨w_i, a⟩) over the
eigenvectors a of WᵀW,

    I1(W) = min_a Z(a) / max_a Z(a)   (in [0, 1], 1 = isotropic)
    I2(W) = sqrt(Σ_a (Z(a) - Z̄)² / (|A| Z̄²))   (std / mean, 0 = isotropic)

computed in float64 over all words, or a uniform sample of `--sample` words (002 samples 40K of WT103's 260K).

The 2-D PCA projection of the rows of W (seed 002 Figs. 1-3: a narrow cone for degenerate embeddings; seed 001
Fig. 5.8) is reported as the explained-variance ratios of the first two components (JSON
`pca_explained_variance_ratio`) and drawn with `--pca-png` (one panel per workdir; sklearn's PCA, centred rows).

    xlgen analyze spectrum --workdir=DIR [--workdir=DIR2 ...] [--label=NAME ...] [--json=FILE] [--png=FILE]
                           [--pca-png=FILE]
"""

from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional

import numpy as np

from xlgen.analyze.common import (
    EFFECTIVE_EPS,
    effective_rank,
    fail,
    load_model,
    output_embedding,
    save_figure,
    setup,
    tool_parser,
    write_json,
)


def isotropy(w: np.ndarray, *, sample: int = 0, seed: int = 0) -> Dict[str, float]:
    """{"I1", "I2"} of W `[V, d]` (see the module doc); `sample` > 0 uses that many uniformly drawn rows."""
    w = np.asarray(w, np.float64)
    if sample and sample < w.shape[0]:
        w = w[np.random.default_rng(seed).choice(w.shape[0], sample, replace=False)]
    _, vecs = np.linalg.eigh(w.T @ w)  # columns: eigenvectors a of WᵀW
    logits = w @ vecs  # [V, d]: ⟨w_i, a⟩
    m = logits.max(axis=0)
    log_z = m + np.log(np.exp(logits - m).sum(axis=0))  # log Z(a), stable
    z = np.exp(log_z - log_z.max())  # Z(a) / max Z (I1, I2 are scale-free)
    return {"I1": float(z.min() / z.max()), "I2": float(np.sqrt(np.mean((z - z.mean()) ** 2)) / z.mean())}


def pca_2d(w: np.ndarray, *, sample: int = 0, seed: int = 0):
    """(coordinates `[V', 2]`, explained-variance ratios `[2]`) of the rows of W (`sample` > 0: that many rows,
    uniformly drawn) under sklearn's PCA (rows centred)."""
    from sklearn.decomposition import PCA

    w = np.asarray(w, np.float64)
    if sample and sample < w.shape[0]:
        w = w[np.random.default_rng(seed).choice(w.shape[0], sample, replace=False)]
    pca = PCA(n_components=2, svd_solver="full")
    coords = pca.fit_transform(w)
    return coords, pca.explained_variance_ratio_


def plot_pca(path: str, panels: Dict[str, np.ndarray]) -> None:
    """One scatter panel of 2-D PCA coordinates per label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.6), squeeze=False)
    for ax, (label, xy) in zip(axes[0], panels.items()):
        ax.scatter(xy[:, 0], xy[:, 1], s=3, alpha=0.5)
        ax.set_title(label, fontsize=9)
        ax.set_aspect("equal", adjustable="datalim")
        ax.set_xlabel("PC 1")
        ax.set_ylabel("PC 2")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def spectrum_report(w: np.ndarray, *, sample: int = 0) -> Dict:
    """Singular values (descending), normalised ones, isotropy and ε-effective ranks of W."""
    s = np.linalg.svd(np.asarray(w, np.float64), compute_uv=False)
    return {
        "shape": list(np.shape(w)),
        "singular_values": [float(x) for x in s],
        "normalized_singular_values": [float(x) for x in s / s[0]],
        **isotropy(w, sample=sample),
        "effective_rank": {f"{e:g}": effective_rank(s, e) for e in EFFECTIVE_EPS},
        "pca_explained_variance_ratio": [float(x) for x in pca_2d(w, sample=sample)[1]],
    }


def plot_spectra(path: str, curves: Dict[str, np.ndarray], title: str = "output embedding spectrum") -> None:
    """σ_k/σ_1 against k, log-log, one line per label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, s in curves.items():
        s = np.asarray(s, np.float64)
        ax.loglog(np.arange(1, len(s) + 1), s / s[0], lw=1.4, label=label)
    ax.set_xlabel("index k")
    ax.set_ylabel("σ_k / σ_1")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    p = tool_parser(
        "spectrum",
        __doc__,
        json="one workdir: its report; several: {label: report}",
        png="normalised singular values, log-log, overlaid",
    )
    p.add_argument("--workdir", action="append", required=True, help="repeat to overlay several runs")
    p.add_argument("--label", action="append", default=[], help="legend label per --workdir (default: its name)")
    p.add_argument("--sample", type=int, default=40000, help="words sampled for I1/I2 (0 = all)")
    p.add_argument("--pca-png", default="", help="2-D PCA of the embedding rows, one panel per workdir")
    args = p.parse_args(argv)
    if args.label and len(args.label) != len(args.workdir):
        return fail("spectrum", "give one --label per --workdir")
    setup(args.platform)
    reports, pcas = {}, {}
    for i, wd in enumerate(args.workdir):
        label = args.label[i] if args.label else os.path.basename(os.path.normpath(wd))
        try:
            config, model, step = load_model(wd)
            w, _ = output_embedding(model)
        except (ValueError, FileNotFoundError, KeyError) as e:
            return fail("spectrum", f"{wd}: {e}")
        rep = spectrum_report(w, sample=args.sample)
        if args.pca_png:
            pcas[label] = pca_2d(w, sample=min(args.sample or 5000, 5000))[0]
        rep.update({"workdir": wd, "step": int(step), "output_layer": config.model.get("output_layer", "adaptive")})
        reports[label] = rep
        s = np.asarray(rep["normalized_singular_values"])
        k10 = min(9, len(s) - 1)
        print(
            f"{label}: W {rep['shape'][0]} x {rep['shape'][1]} (step {step})  I1 {rep['I1']:.4f}  I2 {rep['I2']:.4f}  "
            f"σ_{k10 + 1}/σ_1 {s[k10]:.4f}  σ_d/σ_1 {s[-1]:.4f}  effective rank "
            + ", ".join(f"{k}: {v}" for k, v in rep["effective_rank"].items())
        )
    if args.json:
        write_json(args.json, next(iter(reports.values())) if len(reports) == 1 else reports)
    if args.png:
        plot_spectra(args.png, {k: np.asarray(r["singular_values"]) for k, r in reports.items()})
        print(f"png: {args.png}")
    if args.pca_png:
        plot_pca(args.pca_png, pcas)
        print(f"pca png: {args.pca_png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
