"""The adversarial systems' data: 2-D sets with their true densities, MNIST-format IDX files, scikit-learn's 8x8
digits; the labeled subset of semi-supervised runs; batches as pure functions of (seed, step).

CEGAN's synthetic sets (seed 000 §B.5.1, Fig. B.1; parameters as in the paper's code, `synthetic/synthetic_data.py`
of cegan_iclr2017, drawn by the same NumPy RandomState sequence so that the 100K training points are those sets):

    mog4         4 Gaussians, equal weights, means (±v, ±v), v = 10·U(0,1) (RandomState(5)), cov diag(U(0,1)²)·10
    biased_mog2  2 Gaussians, weights 0.1 / 0.9 at (v, v) / (-v, -v), v = 8·U(0,1) (RandomState(2)), cov 5·I
    spirals      200 Gaussians on two spirals, 100 per spiral (the seed's count; the code's default is 50), centres
                 (∓cos t·t, ±sin t·t), t ∈ 120°+[0, 360°], std 0.45 (the code's true energy used std 1; we use the
                 std the samples are drawn with, so p_data is the density of the data)

Bad GAN's case-study sets (seed 003 §3.1.4, Fig. 3.2): `four_spins` (the code's `fourspins`: four arms, tangential
std 0.22, radial std 0.1, rate 0.52, 4 classes) and `two_circles` (2 classes, radii 1 and 0.5, radial noise 0.05:
the seeds give no parameters; these are scikit-learn's `make_circles(factor=0.5, noise=0.05)` in polar form).

Every `sample_*` is a function of its arguments only; `Dataset` holds arrays (train, test, labels) and `batch(step)`
draws rows with `data_pipelines.rng.keyed_rng(seed, PURPOSE_GAN, step)`.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
from typing import Dict, Optional, Tuple

import numpy as np
from scipy.special import logsumexp

from data_pipelines import paths
from data_pipelines.rng import keyed_rng

PURPOSE_GAN = 11
PURPOSE_LABELED = 12
PURPOSE_SPLIT = 13
N_SYNTHETIC = 100_000  # Table B.2: p_emp from 100K training points


# ---------------------------------------------------------------------------------------------------------------
# 2-D mixtures with analytic densities (CEGAN)
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Mixture:
    """A Gaussian mixture in 2-D: weights [C], means [C, 2], covariances [C, 2, 2]."""

    weights: np.ndarray
    means: np.ndarray
    covs: np.ndarray

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """log p_data(x) for x [N, 2]."""
        x = np.asarray(x, np.float64)
        out = []
        for w, m, c in zip(self.weights, self.means, self.covs):
            d = x - m
            inv = np.linalg.inv(c)
            quad = np.einsum("ni,ij,nj->n", d, inv, d)
            out.append(np.log(w) - 0.5 * quad - 0.5 * np.log(np.linalg.det(2 * np.pi * c)))
        return logsumexp(np.stack(out, 0), axis=0)


def mog4(n: int = N_SYNTHETIC) -> Tuple[np.ndarray, Mixture]:
    """Mixture of 4 equally weighted Gaussians (Fig. B.1 left); the training points and the mixture."""
    r = np.random.RandomState(5)
    weights = np.ones(4) / 4
    counts = r.multinomial(n, weights)
    v = r.rand() * 10
    means = np.array([[v, v], [-v, v], [v, -v], [-v, -v]])
    data, covs = [], []
    for mean, k in zip(means, counts):
        cov = np.diag(r.rand(2)) * 10
        data.append(r.multivariate_normal(mean, cov, size=k))
        covs.append(cov)
    return np.concatenate(data).astype(np.float32), Mixture(weights, means, np.array(covs))


def biased_mog2(n: int = N_SYNTHETIC) -> Tuple[np.ndarray, Mixture]:
    """Mixture of 2 Gaussians with weights 0.1 and 0.9 (Fig. B.1 right)."""
    r = np.random.RandomState(2)
    v = r.rand() * 8
    means = np.array([[v, v], [-v, -v]])
    covs = np.array([np.eye(2) * 5.0] * 2)
    weights = np.array([0.1, 0.9])
    counts = r.multinomial(n, weights)
    data = [r.multivariate_normal(m, c, size=k) for m, c, k in zip(means, covs, counts)]
    return np.concatenate(data).astype(np.float32), Mixture(weights, means, covs)


def spirals(n: int = N_SYNTHETIC, components: int = 200, noise: float = 0.45) -> Tuple[np.ndarray, Mixture]:
    """200 Gaussians on two spirals, 100 per spiral (Fig. B.1 middle)."""
    r = np.random.RandomState(12345)
    start, degrees = np.deg2rad(120.0), np.deg2rad(360.0)
    per = (n + components - 1) // components
    half = components // 2
    t = start + np.linspace(0.0, 1.0, half) * degrees
    c1 = np.stack([-np.cos(t) * t, np.sin(t) * t], 1)
    c2 = np.stack([np.cos(t) * t, -np.sin(t) * t], 1)
    centres = np.concatenate([c1, c2])
    pts = np.repeat(centres, per, axis=0) + r.randn(components * per, 2) * noise
    data = pts[r.permutation(len(pts))[:n]]
    covs = np.repeat((np.eye(2) * noise**2)[None], components, 0)
    return data.astype(np.float32), Mixture(np.ones(components) / components, centres, covs)


SYNTHETIC = {"mog4": mog4, "biased_mog2": biased_mog2, "spirals": spirals}


# ---------------------------------------------------------------------------------------------------------------
# 2-D classification sets (bad GAN case study)
# ---------------------------------------------------------------------------------------------------------------


def four_spins(n: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """Four spiral arms (4 classes): x = R(θ_k + 0.52·exp(u)) (u, v), (u, v) ~ N((1, 0), diag(0.22², 0.1²))."""
    r = keyed_rng(seed, PURPOSE_SPLIT, 4)
    per = n // 4
    y = np.repeat(np.arange(4), per)
    p = r.standard_normal((4 * per, 2)) * np.array([0.22, 0.1]) + np.array([1.0, 0.0])
    a = np.linspace(0, 2 * np.pi, 5)[:-1][y] + 0.52 * np.exp(p[:, 0])
    c, s = np.cos(a), np.sin(a)
    x = np.stack([p[:, 0] * c + p[:, 1] * s, -p[:, 0] * s + p[:, 1] * c], 1)  # row vector times [[c, -s], [s, c]]
    return x.astype(np.float32), y.astype(np.int32)


def two_circles(n: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """Two concentric circles (2 classes): radius 1 (class 0) and 0.5 (class 1), Gaussian noise 0.05 per axis."""
    r = keyed_rng(seed, PURPOSE_SPLIT, 2)
    per = n // 2
    y = np.repeat(np.arange(2), per)
    a = r.uniform(0, 2 * np.pi, 2 * per)
    rad = np.where(y == 0, 1.0, 0.5)
    x = np.stack([rad * np.cos(a), rad * np.sin(a)], 1) + r.standard_normal((2 * per, 2)) * 0.05
    return x.astype(np.float32), y.astype(np.int32)


def complement_pool(unlabeled: np.ndarray, n: int, seed: int, margin: float = 0.0) -> np.ndarray:
    """The complement generator of §3.1.4: uniform points in the bounding box of the unlabeled data, minus those on
    the manifold (closer than `margin` to an unlabeled point; default: 2x the 99th percentile of the data's
    nearest-neighbour distances, so that the sparse ends of the manifold are excluded too)."""
    from scipy.spatial import cKDTree

    tree = cKDTree(unlabeled)
    if margin <= 0:
        d, _ = tree.query(unlabeled, k=2)
        margin = 2.0 * float(np.percentile(d[:, 1], 99))
    lo, hi = unlabeled.min(0), unlabeled.max(0)
    pad = 0.1 * (hi - lo)
    r = keyed_rng(seed, PURPOSE_SPLIT, 7)
    out = []
    while sum(len(o) for o in out) < n:
        u = r.uniform(lo - pad, hi + pad, size=(4 * n, 2))
        dist, _ = tree.query(u, k=1)
        out.append(u[dist > margin])
    return np.concatenate(out)[:n].astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------
# Images: IDX files and scikit-learn's digits
# ---------------------------------------------------------------------------------------------------------------


IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4")}


def read_idx(path: str) -> np.ndarray:
    """An IDX array (the MNIST format: 0x0000, dtype code, ndim, big-endian int32 dims, data); gzipped or not."""
    raw = paths.read_bytes(path)
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (magic {raw[:4].hex()})")
    dtype, ndim = np.dtype(_IDX_DTYPES[raw[2]]), raw[3]
    dims = tuple(int(d) for d in np.frombuffer(raw, ">i4", ndim, 4))
    count = int(np.prod(dims))
    off = 4 + 4 * ndim
    if len(raw) - off < count * dtype.itemsize:
        raise ValueError(f"{path}: truncated IDX file ({len(raw) - off} data bytes, dims {dims})")
    return np.frombuffer(raw, dtype, count, off).reshape(dims)


def find_idx(directory: str, stem: str) -> str:
    """`DIR/<stem>` or `DIR/<stem>.gz` (also the `t10k`/`train` names with a dot before `idx`, as some mirrors)."""
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        p = os.path.join(directory, name)
        if paths.as_path(p).exists():
            return p
    raise FileNotFoundError(f"{directory}: no {stem}[.gz] (an IDX directory holds the four standard files)")


def load_idx_dir(directory: str) -> Dict[str, np.ndarray]:
    """{train_x, train_y, test_x, test_y}: images as float32 [N, 28, 28, 1] in [0, 1], labels int32."""
    a = {k: read_idx(find_idx(directory, v)) for k, v in IDX_FILES.items()}
    for split in ("train", "test"):
        if len(a[f"{split}_images"]) != len(a[f"{split}_labels"]):
            raise ValueError(f"{directory}: {split} images and labels differ in count")
    img = lambda x: (x.astype(np.float32) / 255.0)[..., None]  # noqa: E731
    return {
        "train_x": img(a["train_images"]),
        "train_y": a["train_labels"].astype(np.int32),
        "test_x": img(a["test_images"]),
        "test_y": a["test_labels"].astype(np.int32),
    }


def load_digits(test_size: int = 497) -> Dict[str, np.ndarray]:
    """scikit-learn's 1,797 8x8 digits as float32 [N, 8, 8, 1] in [0, 1]; a fixed split (1,300 train, 497 test)."""
    from sklearn.datasets import load_digits as _load

    d = _load()
    x = (d.images.astype(np.float32) / 16.0)[..., None]
    y = d.target.astype(np.int32)
    perm = keyed_rng(0, PURPOSE_SPLIT, 8).permutation(len(y))
    tr, te = perm[test_size:], perm[:test_size]
    return {"train_x": x[tr], "train_y": y[tr], "test_x": x[te], "test_y": y[te]}


def balanced_labeled(labels: np.ndarray, num_labeled: int, seed: int, num_classes: int) -> np.ndarray:
    """`num_labeled` training indices, num_labeled / num_classes per class, chosen by `seed` (sorted)."""
    if num_labeled % num_classes:
        raise ValueError(f"data.num_labeled={num_labeled}: must be a multiple of the {num_classes} classes")
    r = keyed_rng(seed, PURPOSE_LABELED)
    per = num_labeled // num_classes
    out = []
    for k in range(num_classes):
        idx = np.flatnonzero(labels == k)
        if len(idx) < per:
            raise ValueError(f"data.num_labeled={num_labeled}: class {k} has only {len(idx)} training examples")
        out.append(r.choice(idx, per, replace=False))
    return np.sort(np.concatenate(out))


# ---------------------------------------------------------------------------------------------------------------
# Datasets and batches
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Dataset:
    """Arrays of one run: train_x [N, ...] (the unlabeled set), train_y, test_x, test_y, the labeled indices (SSL),
    the true mixture (CEGAN 2-D) and the complement pool (bad GAN 2-D with `generator=complement`)."""

    name: str
    train_x: np.ndarray
    train_y: Optional[np.ndarray] = None
    test_x: Optional[np.ndarray] = None
    test_y: Optional[np.ndarray] = None
    labeled: Optional[np.ndarray] = None
    mixture: Optional[Mixture] = None
    complement: Optional[np.ndarray] = None
    num_classes: int = 0

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self.train_x.shape[1:])


def load(data_config, seed: int) -> Dataset:
    """The Dataset for `config.data` (name, dir, num_labeled, label_seed) and the run seed."""
    name = str(data_config.name)
    label_seed = int(data_config.label_seed)
    label_seed = seed if label_seed < 0 else label_seed
    num_labeled = int(data_config.num_labeled)
    if name in SYNTHETIC:
        x, mix = SYNTHETIC[name]()
        return Dataset(name, x, mixture=mix)
    if name in ("four_spins", "two_circles"):
        fn = four_spins if name == "four_spins" else two_circles
        x, y = fn(int(data_config.num_points), 0)
        tx, ty = fn(int(data_config.num_points), 1)
        k = int(y.max()) + 1
        ds = Dataset(name, x, y, tx, ty, num_classes=k)
    elif name in ("digits", "idx"):
        if name == "idx":
            if not data_config.dir:
                raise ValueError("data.name=idx needs --config.data.dir=DIR (the four *-idx?-ubyte files)")
            a = load_idx_dir(str(data_config.dir))
            digit = int(data_config.digit)
            if digit >= 0:  # §B.5.2: train on one digit
                a = {
                    "train_x": a["train_x"][a["train_y"] == digit],
                    "train_y": a["train_y"][a["train_y"] == digit],
                    "test_x": a["test_x"][a["test_y"] == digit],
                    "test_y": a["test_y"][a["test_y"] == digit],
                }
        else:
            a = load_digits()
        k = int(max(a["train_y"].max(), a["test_y"].max())) + 1
        ds = Dataset(name, a["train_x"], a["train_y"], a["test_x"], a["test_y"], num_classes=k)
    else:
        raise ValueError(
            f"data.name={name!r}: expected one of mog4, spirals, biased_mog2, four_spins, two_circles, digits, idx"
        )
    if num_labeled > 0:
        ds.labeled = balanced_labeled(ds.train_y, num_labeled, label_seed, ds.num_classes)
    if name in ("four_spins", "two_circles"):
        ds.complement = complement_pool(ds.train_x, 20_000, 0)
    return ds


def batch(ds: Dataset, seed: int, step: int, batch_size: int, labeled_batch_size: int = 0) -> Dict[str, np.ndarray]:
    """The training batch of `step`: `x` [B, ...] unlabeled rows drawn with replacement, plus `x2` (a second,
    independent unlabeled draw for the generator's feature matching), with `labeled_batch_size`: `xl`, `yl` from the
    labeled subset, and with a complement pool: `xc` (complement samples). A pure function of (seed, step)."""
    r = keyed_rng(seed, PURPOSE_GAN, step)
    n = len(ds.train_x)
    out = {
        "x": ds.train_x[r.integers(0, n, batch_size)],
        "x2": ds.train_x[r.integers(0, n, batch_size)],
    }
    if labeled_batch_size:
        idx = ds.labeled[r.integers(0, len(ds.labeled), labeled_batch_size)]
        out["xl"], out["yl"] = ds.train_x[idx], ds.train_y[idx]
    if ds.complement is not None:
        out["xc"] = ds.complement[r.integers(0, len(ds.complement), batch_size)]
    return out
