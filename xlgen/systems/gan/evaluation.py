"""Evaluation of the adversarial systems (NumPy / scikit-learn / matplotlib; no JAX).

Table B.2 (seed 000 §B.8.2): four distributions on a 100x100 grid over the canvas of the training data (its
bounding box widened by half its half-width on every side, as the paper's code's `create_meshgrid`):

    p_data  the true density at the grid points, normalised over the grid
    p_emp   the 100K training points, each assigned to its nearest grid point, normalised counts
    p_gen   the same histogram of 100K generated points
    p_disc  exp(-c(x)) / Σ_grid exp(-c(x')) from the learned cost (energy) c at the grid points (µ*(x) = 0)

and KL(p‖q) = Σ p log(p / q) between every ordered pair, with ε = 1e-10 added to both sides (empty histogram cells;
the paper does not say how it treats them). `kl_table` returns `kl_<p>_<q>` keys (e.g. `kl_disc_data`).
"""

from __future__ import annotations

import itertools
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
from scipy.special import logsumexp

from data_pipelines import paths

GRID = 100
KL_EPS = 1e-10


def canvas(data: np.ndarray, width: int = GRID) -> Tuple[np.ndarray, np.ndarray]:
    """(xs [W], ys [W]): the grid's coordinates for 2-D `data` [N, 2]."""
    lo, hi = data.min(0).astype(np.float64), data.max(0).astype(np.float64)
    mid = (lo + hi) / 2
    lo, hi = lo + 0.5 * (lo - mid), hi + 0.5 * (hi - mid)
    return np.linspace(lo[0], hi[0], width), np.linspace(lo[1], hi[1], width)


def grid_points(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """[W*W, 2] grid points, row-major over (y, x) as `np.meshgrid(xs, ys)`."""
    gx, gy = np.meshgrid(xs, ys)
    return np.stack([gx.ravel(), gy.ravel()], 1)


def histogram(points: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Normalised counts [W*W] of `points` [N, 2] at their nearest grid point (outside points: the nearest edge)."""
    ix = np.clip(np.rint((points[:, 0] - xs[0]) / (xs[1] - xs[0])), 0, len(xs) - 1).astype(np.int64)
    iy = np.clip(np.rint((points[:, 1] - ys[0]) / (ys[1] - ys[0])), 0, len(ys) - 1).astype(np.int64)
    counts = np.bincount(iy * len(xs) + ix, minlength=len(xs) * len(ys)).astype(np.float64)
    return counts / counts.sum()


def normalise_log(log_w: np.ndarray) -> np.ndarray:
    """exp(log_w) / Σ exp(log_w) over the grid."""
    log_w = np.asarray(log_w, np.float64)
    return np.exp(log_w - logsumexp(log_w))


def kl(p: np.ndarray, q: np.ndarray, eps: float = KL_EPS) -> float:
    """KL(p‖q) = Σ p log((p + ε) / (q + ε)) over the grid."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    return float(np.sum(p * (np.log(p + eps) - np.log(q + eps))))


def kl_table(dists: Dict[str, np.ndarray]) -> Dict[str, float]:
    """`kl_<a>_<b>` = KL(p_a‖p_b) for every ordered pair of the given distributions."""
    return {f"kl_{a}_{b}": kl(dists[a], dists[b]) for a, b in itertools.permutations(sorted(dists), 2)}


def grid_distributions(
    train: np.ndarray,
    generated: np.ndarray,
    energy_fn,
    log_density_fn=None,
    width: int = GRID,
) -> Dict[str, np.ndarray]:
    """{data?, emp, gen, disc} on the grid of `train`; `energy_fn(points [M, 2]) -> c [M]`, `log_density_fn` the
    true log-density (omitted: no p_data)."""
    xs, ys = canvas(train, width)
    pts = grid_points(xs, ys)
    out = {
        "emp": histogram(train, xs, ys),
        "gen": histogram(generated, xs, ys),
        "disc": normalise_log(-np.asarray(energy_fn(pts), np.float64)),
    }
    if log_density_fn is not None:
        out["data"] = normalise_log(log_density_fn(pts))
    return out


# --- figures ------------------------------------------------------------------------------------------------------


def plot_energies(path: str, train: np.ndarray, generated: np.ndarray, dists: Dict[str, np.ndarray], title: str = ""):
    """Figs. B.1-B.3: the learned energy -log p_disc (with the true one if known) and samples (red real, blue
    generated)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs, ys = canvas(train)
    panels = [("disc", "learned energy")] + ([("data", "true energy")] if "data" in dists else [])
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(5 * (len(panels) + 1), 4.6))
    for ax, (k, name) in zip(axes, panels):
        e = -np.log(dists[k] + 1e-30).reshape(len(ys), len(xs))
        ax.pcolormesh(xs, ys, np.minimum(e, np.percentile(e, 95)), shading="auto")
        ax.set_title(name)
    r = np.random.default_rng(0)
    sub = lambda a: a[r.choice(len(a), min(len(a), 2000), replace=False)]  # noqa: E731
    ax = axes[-1]
    ax.plot(*sub(train).T, ".", color="r", alpha=0.3, ms=2, label="real")
    ax.plot(*sub(generated).T, ".", color="b", alpha=0.3, ms=2, label="generated")
    ax.set_xlim(xs[0], xs[-1])
    ax.set_ylim(ys[0], ys[-1])
    ax.legend(loc="upper right")
    ax.set_title("samples")
    fig.suptitle(title)
    fig.tight_layout()
    paths.makedirs(str(paths.as_path(path).parent))
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    paths.atomic_write_bytes(path, buf.getvalue())


def image_grid(images: np.ndarray, rows: int, cols: int, boxed: Optional[np.ndarray] = None) -> np.ndarray:
    """images [N, H, W, 1] -> one [rows*(H+2), cols*(W+2)] canvas; `boxed` [N] bool draws a frame (real images in
    §B.5.2's ranking figures)."""
    n, h, w = images.shape[:3]
    out = np.zeros((rows * (h + 2), cols * (w + 2)), np.float32)
    for i in range(min(n, rows * cols)):
        r, c = divmod(i, cols)
        y, x = r * (h + 2), c * (w + 2)
        if boxed is not None and boxed[i]:
            out[y : y + h + 2, x : x + w + 2] = 0.5
        out[y + 1 : y + 1 + h, x + 1 : x + 1 + w] = images[i, ..., 0]
    return out


def save_gray(path: str, canvas_: np.ndarray, title: str = "") -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(canvas_.shape[1] / 40 + 1, canvas_.shape[0] / 40 + 1))
    plt.imshow(canvas_, cmap="gray", vmin=0, vmax=1)
    plt.axis("off")
    plt.title(title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    paths.atomic_write_bytes(path, buf.getvalue())


def energy_ranking(energies: np.ndarray, is_real: np.ndarray, k: int = 100) -> Dict[str, np.ndarray]:
    """§B.5.2: indices of the `k` lowest-energy (top-ranked) and `k` highest-energy images, and the fraction of
    real images in each."""
    order = np.argsort(energies, kind="stable")
    top, bottom = order[:k], order[::-1][:k]
    return {
        "top": top,
        "bottom": bottom,
        "real_fraction_top": float(np.mean(is_real[top])),
        "real_fraction_bottom": float(np.mean(is_real[bottom])),
    }


def linear_probe(train_f, train_y, test_f, test_y, seed: int = 0, c: float = 1.0) -> float:
    """Table B.3's proxy: test error of a logistic-regression classifier on fixed (standardised) features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    sc = StandardScaler().fit(train_f)
    clf = LogisticRegression(C=c, max_iter=500, random_state=seed)
    clf.fit(sc.transform(train_f), train_y)
    return float(np.mean(clf.predict(sc.transform(test_f)) != test_y))


def decision_map(classify_fn, points: np.ndarray, width: int = 200, pad: float = 0.2):
    """(xs, ys, predicted [W, W]) of a 2-D classifier `classify_fn(points [M, 2]) -> int [M]` over `points`' box."""
    lo, hi = points.min(0), points.max(0)
    span = hi - lo
    xs = np.linspace(lo[0] - pad * span[0], hi[0] + pad * span[0], width)
    ys = np.linspace(lo[1] - pad * span[1], hi[1] + pad * span[1], width)
    pred = np.asarray(classify_fn(grid_points(xs, ys))).reshape(width, width)
    return xs, ys, pred


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    v = np.asarray(values, np.float64)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0
