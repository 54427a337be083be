"""The issue-35 analyses on cases with known answers: the multi-seed comparison (mean ± std, Wilcoxon rank-sum),
the expected pairwise KLD, Press-rank robustness (001 Algorithms 5.1/5.2), 2-D PCA, and the linear Q-spectrum plot."""

import json
import math

import numpy as np
import pytest

from xlgen import analyze
from xlgen.analyze import compare, kld, rank, robustness, spectrum

PNG = b"\x89PNG\r\n\x1a\n"


def _png(path):
    with open(path, "rb") as f:
        return f.read(8) == PNG


def test_compare_mean_std_and_rank_sum_by_hand(tmp_path):
    """x = (1, 2, 3) vs y = (4, 5, 6): rank sum W = 6, E[W] = n1(n1+n2+1)/2 = 10.5, Var = n1 n2 (n+1)/12 = 5.25,
    z = -4.5/√5.25, two-sided p = erfc(|z|/√2) = 0.0495; mean 2, sample std 1."""
    z = -4.5 / math.sqrt(5.25)
    res = compare.compare({"a": [1, 2, 3], "b": [4, 5, 6]}, baseline="b")
    assert res["groups"]["a"]["mean"] == 2.0 and res["groups"]["a"]["std"] == 1.0
    np.testing.assert_allclose(res["rank_sum"]["a"]["statistic"], z, rtol=1e-12)
    np.testing.assert_allclose(res["rank_sum"]["a"]["p_value"], math.erfc(abs(z) / math.sqrt(2)), rtol=1e-12)
    # from workdirs: the last eval record of metrics.jsonl
    dirs = []
    for i, loss in enumerate((1.0, 2.0, 3.0)):
        d = tmp_path / f"run{i}"
        d.mkdir()
        recs = [
            {"step": 1, "loss": 9.0},
            {"step": 2, "split": "valid", "loss": 7.0},
            {"step": 4, "split": "valid", "loss": loss},
        ]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        dirs.append(str(d))
    out, png = str(tmp_path / "c.json"), str(tmp_path / "c.png")
    argv = ["compare", "--group=runs=" + ",".join(dirs), "--values=ref=4,5,6", "--baseline=ref", f"--json={out}"]
    assert analyze.main(argv + [f"--png={png}"]) == 0
    with open(out) as f:
        got = json.load(f)
    assert got["groups"]["runs"]["values"] == [1.0, 2.0, 3.0]
    np.testing.assert_allclose(got["rank_sum"]["runs"]["p_value"], res["rank_sum"]["a"]["p_value"])
    assert _png(png)
    assert analyze.main(["compare", "--group=x=" + str(tmp_path / "missing")]) == 2


def test_expected_pairwise_kld_by_hand():
    """P1 = (0.5, 0.5), P2 = (0.9, 0.1): KL(P1‖P2) = 0.5 ln(5/9) + 0.5 ln 5, KL(P2‖P1) = 0.9 ln 1.8 + 0.1 ln 0.2;
    the expectation over ordered pairs c != c' is their mean; identical contexts give 0."""
    p = np.array([[0.5, 0.5], [0.9, 0.1]])
    k12 = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    k21 = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    k = kld.pairwise_kld(np.log(p))
    np.testing.assert_allclose(k, [[0, k12], [k21, 0]], atol=1e-12)
    np.testing.assert_allclose(kld.kld_report(np.log(p))["expected_pairwise_kld"], (k12 + k21) / 2, rtol=1e-12)
    same = np.log(np.tile([[0.2, 0.3, 0.5]], (4, 1)))
    assert abs(kld.kld_report(same)["expected_pairwise_kld"]) < 1e-12
    big = np.log(np.random.default_rng(0).dirichlet(np.ones(7), size=5))
    ref = np.array([[np.sum(np.exp(a) * (a - b)) for b in big] for a in big])
    np.testing.assert_allclose(kld.pairwise_kld(big, block=2), ref, atol=1e-12)


def test_press_rank_robustness_algorithms():
    """A rank-3 truncation of a random 80 x 50 Q: Algorithm 5.1 keeps Press rank 3 at every iteration with a tiny
    drift; Algorithm 5.2: noise far below the float64 tolerance keeps 3, noise far above gives full rank 50, and
    the ε-effective rank (1e-3) stays 3 while the Press rank is already full (001 Tables 5.11-5.13)."""
    q = np.random.default_rng(0).normal(size=(80, 50))
    rep = robustness.robustness_report(q, keep=3, iterations=4, noise=(1e-30, 1e-6, 1e3), seed=1)
    assert rep["press_rank_of_q"] == 50 and rep["press_rank_of_truncated"] == 3
    assert [r["press_rank"] for r in rep["reconstruction"]] == [3, 3, 3, 3]
    assert all(r["error"] < 1e-25 for r in rep["reconstruction"])
    by_c = {r["c"]: r for r in rep["noise"]}
    assert by_c[1e-30]["press_rank"] == 3 and by_c[1e-6]["press_rank"] == 50 and by_c[1e3]["press_rank"] == 50
    assert by_c[1e-6]["effective_rank"]["0.001"] == 3
    with pytest.raises(ValueError, match="m >= n"):
        robustness.robustness_report(q.T)


def test_robustness_cli_from_npy(tmp_path):
    q = np.random.default_rng(0).normal(size=(30, 20))
    np.save(tmp_path / "q.npy", q)
    out, png = str(tmp_path / "r.json"), str(tmp_path / "r.png")
    argv = ["robustness", f"--npy={tmp_path / 'q.npy'}", "--keep=2", "--iterations=2", "--noise=1e-30,10"]
    assert analyze.main(argv + [f"--json={out}", f"--png={png}"]) == 0
    with open(out) as f:
        rep = json.load(f)
    assert [r["press_rank"] for r in rep["noise"]] == [2, 20] and _png(png)


def test_pca_2d_and_linear_q_spectrum_plot(tmp_path):
    """Rows on a line through the origin: PC1 explains everything; rows in a 2-D plane: the two PCs explain all."""
    rng = np.random.default_rng(0)
    u, v = np.linalg.qr(rng.normal(size=(6, 2)))[0].T
    line = rng.normal(size=(100, 1)) * u
    _, ratio = spectrum.pca_2d(line)
    np.testing.assert_allclose(ratio, [1.0, 0.0], atol=1e-12)
    plane = rng.normal(size=(100, 1)) * u + 0.5 * rng.normal(size=(100, 1)) * v
    coords, ratio = spectrum.pca_2d(plane)
    np.testing.assert_allclose(ratio.sum(), 1.0, atol=1e-12)
    assert ratio[0] > ratio[1] > 0 and coords.shape == (100, 2)
    assert spectrum.spectrum_report(plane)["pca_explained_variance_ratio"] == pytest.approx(list(ratio))
    path = str(tmp_path / "pca.png")
    spectrum.plot_pca(path, {"plane": coords, "line": spectrum.pca_2d(line)[0]})
    assert _png(path)
    path = str(tmp_path / "q.png")
    rank.plot_linear(path, {"a": np.linspace(1, 0, 600), "b": np.geomspace(1, 1e-3, 50)})
    assert _png(path)
