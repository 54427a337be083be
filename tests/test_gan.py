"""The adversarial systems (xlgen/systems/gan): each objective against a hand-computed case, the data (the
paper's 2-D sets, IDX files, labeled subsets, pure batches), the grid KL of Table B.2, the multi-player program
(two-player exact resume, 8 devices = 1 device)."""

import gzip
import json
import math
import os
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_train_utils import compile_cache  # noqa: F401  (the session's compilation cache fixture)

from xlgen import config as config_lib
from xlgen.systems.gan import data as gdata
from xlgen.systems.gan import evaluation as geval
from xlgen.systems.gan import losses
from xlgen.systems.gan import models as gm

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- objectives, hand-computed ------------------------------------------------------------------------------------


def test_kplus1_loss_hand_case():
    # K = 2, one row with logits (0, log 3): Σ exp = 4, so with the fake logit 0: P = (1/5, 3/5, 1/5)
    l = jnp.array([[0.0, math.log(3.0)]])
    lab, unl, gen = losses.kplus1_terms(l, jnp.array([1]), l, l)
    assert lab == pytest.approx(-math.log(3 / 4), abs=1e-6)  # -log P(y=2 | x, y <= K)
    assert unl == pytest.approx(-math.log(4 / 5), abs=1e-6)  # -log P(y <= K | x)
    assert gen == pytest.approx(math.log(5), abs=1e-6)  # -log P(K+1 | x)
    ent = losses.conditional_entropy(l)  # -Σ_{k<=2} P log P over the K+1 classes
    assert ent == pytest.approx(-(0.2 * math.log(0.2) + 0.6 * math.log(0.6)), abs=1e-6)
    total = losses.kplus1_d_loss(l, jnp.array([1]), l, l, ent_weight=0.5)
    assert float(total) == pytest.approx(float(lab + unl + gen + 0.5 * ent), abs=1e-6)
    # the same terms from an explicit (K+1)-way softmax with the fake logit appended
    full = jax.nn.log_softmax(jnp.array([0.0, math.log(3.0), 0.0]))
    assert gen == pytest.approx(-float(full[2]), abs=1e-6)


def test_gan_and_egan_losses_hand_case():
    assert losses.gan_d_loss(jnp.zeros(3), jnp.zeros(3)) == pytest.approx(2 * math.log(2), abs=1e-6)
    assert losses.gan_g_loss(jnp.array([0.0])) == pytest.approx(math.log(2), abs=1e-6)
    c_real, c_fake = jnp.array([1.0, 3.0]), jnp.array([10.0, 0.0])
    assert losses.egan_d_loss(c_real, c_fake) == pytest.approx(2.0 - 5.0)
    # margin 4: mean(max(2 - 10, -4), max(2 - 0, -4)) = (-4 + 2) / 2
    assert losses.egan_d_loss(c_real, c_fake, margin=4.0) == pytest.approx(-1.0)
    assert losses.egan_g_loss(c_fake) == pytest.approx(5.0)


def test_nearest_neighbour_entropy_gradient_hand_case():
    # points 0, 1, 3 on a line, k = 1: neighbours' means 1, 0, 1 -> unit directions +1, -1, -1 (eq. B.11)
    x = jnp.array([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]])
    g = losses.knn_entropy_gradient(x, 1, 2.0)
    np.testing.assert_allclose(g, [[2.0, 0.0], [-2.0, 0.0], [-2.0, 0.0]], atol=1e-6)
    # the surrogate's gradient is g / N, so descending it moves each point away from its neighbours
    grad = jax.grad(lambda x: losses.knn_entropy_surrogate(x, 1, 2.0))(x)
    np.testing.assert_allclose(grad, np.asarray(g) / 3, atol=1e-6)
    # k = 2 for the middle point: mean of 0 and 3 = 1.5 -> direction +1
    np.testing.assert_allclose(losses.knn_mean(x, 2)[1], [1.5, 0.0], atol=1e-6)


def test_vi_entropy_bound_hand_case():
    # -log N(0; 0, I_2) = log(2π); with σ = e: -log N(e; 0, e² I_1) = 1/2 + 1 + log(2π)/2
    assert losses.vi_entropy_bound(jnp.zeros((3, 2)), jnp.zeros((3, 2)), jnp.zeros((3, 2))) == pytest.approx(
        math.log(2 * math.pi), abs=1e-6
    )
    z = jnp.full((1, 1), math.e)
    assert losses.vi_entropy_bound(z, jnp.zeros((1, 1)), jnp.ones((1, 1))) == pytest.approx(
        0.5 + 1 + 0.5 * math.log(2 * math.pi), abs=1e-6
    )


def test_feature_matching_pull_away_low_density_hand_cases():
    fg, fu = jnp.array([[1.0, 1.0], [3.0, 3.0]]), jnp.zeros((4, 2))
    assert losses.feature_matching(fg, fu) == pytest.approx(4.0)  # mean((2, 2)²)
    assert losses.pull_away(jnp.array([[1.0, 0.0], [0.0, 2.0]])) == pytest.approx(0.0, abs=1e-7)
    assert losses.pull_away(jnp.array([[1.0, 0.0], [3.0, 0.0]])) == pytest.approx(1.0, abs=1e-6)
    # cos² 1/2 between (1, 0) and (1, 1), 0 and 1/2 with (0, 1): (2 * (1/2 + 0 + 1/2)) / (3 * 2)
    assert losses.pull_away(jnp.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])) == pytest.approx(1 / 3, abs=1e-6)
    lp = jnp.array([1.0, 3.0, -1.0])
    assert losses.low_density(lp, 0.0) == pytest.approx(2.0)  # (1 + 3) / 2 samples above ε
    np.testing.assert_allclose(jax.grad(lambda v: losses.low_density(v, 0.0))(lp), [0.5, 0.5, 0.0])
    assert losses.low_density(lp, 5.0) == 0.0


# --- models --------------------------------------------------------------------------------------------------------


def test_pixel_density_is_autoregressive_and_normalised():
    m = gm.PixelDensity(4, 16, rngs=nnx.Rngs(0))
    x = jnp.array([0.1, 0.5, 0.9, 0.3])

    @nnx.jit
    def conditionals(m, x):  # per-pixel log N(x_i; µ_i(x_<i), σ_i²): the Jacobian must be lower-triangular
        return jax.jacobian(lambda v: m(v[None])[0])(x)

    # d log p / d t along pixel i's direction e_i: one compiled program, e_i an input
    along = nnx.jit(lambda m, e: jax.grad(lambda t: m((x + t * e)[None])[0])(0.0))
    for i in range(4):
        e = jnp.zeros(4).at[i].set(1.0)
        # changing pixel i changes no conditional of an earlier pixel: log p depends on x_i only via terms >= i
        assert jnp.isfinite(along(m, e))
    # 1-D: a density in x_1 with constant (µ, σ): integrates to 1 on a fine grid
    m1 = gm.PixelDensity(1, 8, rngs=nnx.Rngs(1))
    grid = jnp.linspace(-20, 20, 40001)[:, None]
    mass = nnx.jit(lambda m1: jnp.sum(jnp.exp(m1(grid))) * (grid[1, 0] - grid[0, 0]))(m1)
    assert float(mass) == pytest.approx(1.0, abs=1e-3)
    assert conditionals(m, x).shape == (4,)
    # mask strictness: the mean/std layers see only earlier pixels (strictly lower-triangular products)
    mask = m.l1.mask() @ m.l2.mask() @ m.mu.mask()
    assert np.all(np.tril(mask) == 0)  # [input pixel j, output i]: only j < i
    # fewer hidden units than pixels (28x28 images with 256 units): degrees spread over 1..D-1, so the last
    # pixel's conditional sees every earlier pixel, and the products stay strictly lower-triangular
    wide = gm.PixelDensity(10, 4, rngs=nnx.Rngs(2))
    assert wide.l1.deg_out == (1, 4, 6, 9)
    mask = wide.l1.mask() @ wide.l2.mask() @ wide.mu.mask()
    assert np.all(np.tril(mask) == 0) and np.all(mask[:-1, -1] > 0)


def test_networks_shapes_and_batch_stats_are_state():
    g = gm.DCGenerator(10, rngs=nnx.Rngs(0), width=0.125)
    d = gm.DCDiscriminator(1, rngs=nnx.Rngs(1), width=0.125)
    x = nnx.jit(lambda m, z: m(z))(g, jnp.ones((2, 10)))
    assert x.shape == (2, 28, 28, 1) and float(x.min()) >= 0 and float(x.max()) <= 1
    out, feat = nnx.jit(lambda m, x: m(x))(d, x)
    assert out.shape == (2, 1) and feat.shape == (2, 32 * 7 * 7)
    fc = gm.FCGenerator(4, (128, 128), (2,), rngs=nnx.Rngs(0))
    before = jax.tree.map(np.array, nnx.state(fc, nnx.BatchStat))
    fc(jax.random.normal(jax.random.key(0), (16, 4)))
    after = jax.tree.map(np.array, nnx.state(fc, nnx.BatchStat))
    assert not np.allclose(jax.tree.leaves(before)[0], jax.tree.leaves(after)[0])  # train mode updates the stats


# --- data ----------------------------------------------------------------------------------------------------------


def test_synthetic_sets_match_the_paper():
    x, mix = gdata.mog4()
    assert x.shape == (100_000, 2)
    xs, ys = geval.canvas(x)
    pts = geval.grid_points(xs, ys)
    p_data = geval.normalise_log(mix.log_density(pts))
    p_emp = geval.histogram(x, xs, ys)
    # Table B.2 (Gaussian mixture): KL(p_emp || p_data) = 0.0159 with the paper's 100K points
    assert geval.kl(p_emp, p_data) == pytest.approx(0.0159, abs=5e-4)
    xb, mb = gdata.biased_mog2()
    assert np.mean(xb.sum(1) > 0) == pytest.approx(0.1, abs=0.01)  # weight 0.1 at (+v, +v)
    xsp, msp = gdata.spirals()
    assert len(msp.weights) == 200 and xsp.shape == (100_000, 2)


def test_two_d_classification_sets_and_complement():
    x, y = gdata.four_spins(400, 0)
    assert x.shape == (400, 2) and sorted(set(y.tolist())) == [0, 1, 2, 3]
    x2, y2 = gdata.two_circles(400, 0)
    r = np.linalg.norm(x2, axis=1)
    assert abs(r[y2 == 0].mean() - 1.0) < 0.02 and abs(r[y2 == 1].mean() - 0.5) < 0.02
    comp = gdata.complement_pool(x2, 500, 0)
    from scipy.spatial import cKDTree

    d, _ = cKDTree(x2).query(comp)
    assert d.min() > 0.02  # none on the manifold


def _write_idx(path, arr, code, gz):
    dims = arr.shape
    raw = bytes([0, 0, code, len(dims)]) + struct.pack(">" + "i" * len(dims), *dims) + arr.astype(arr.dtype).tobytes()
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(raw)


@pytest.mark.parametrize("gz", [False, True])
def test_idx_directory(tmp_path, gz):
    r = np.random.default_rng(0)
    imgs = r.integers(0, 256, (20, 28, 28), dtype=np.uint8)
    labels = np.arange(20, dtype=np.uint8) % 10
    sfx = ".gz" if gz else ""
    _write_idx(tmp_path / f"train-images-idx3-ubyte{sfx}", imgs, 0x08, gz)
    _write_idx(tmp_path / f"train-labels-idx1-ubyte{sfx}", labels, 0x08, gz)
    _write_idx(tmp_path / f"t10k-images-idx3-ubyte{sfx}", imgs[:10], 0x08, gz)
    _write_idx(tmp_path / f"t10k-labels-idx1-ubyte{sfx}", labels[:10], 0x08, gz)
    a = gdata.load_idx_dir(str(tmp_path))
    assert a["train_x"].shape == (20, 28, 28, 1) and a["test_y"].tolist() == labels[:10].tolist()
    np.testing.assert_array_equal(a["train_x"][3, ..., 0], imgs[3] / np.float32(255))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "train-images-idx3-ubyte").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="not an IDX file"):
        gdata.read_idx(str(tmp_path / "bad" / "train-images-idx3-ubyte"))
    (tmp_path / "missing").mkdir()
    with pytest.raises(FileNotFoundError, match="train-images"):
        gdata.load_idx_dir(str(tmp_path / "missing"))


def test_labeled_subset_and_batches_are_pure():
    d = gdata.load_digits()
    assert len(d["train_x"]) == 1300 and len(d["test_x"]) == 497
    idx = gdata.balanced_labeled(d["train_y"], 100, seed=3, num_classes=10)
    assert np.bincount(d["train_y"][idx], minlength=10).tolist() == [10] * 10
    np.testing.assert_array_equal(idx, gdata.balanced_labeled(d["train_y"], 100, seed=3, num_classes=10))
    assert not np.array_equal(idx, gdata.balanced_labeled(d["train_y"], 100, seed=4, num_classes=10))
    ds = gdata.Dataset("digits", d["train_x"], d["train_y"], labeled=idx, num_classes=10)
    a, b = gdata.batch(ds, 7, 11, 32, 16), gdata.batch(ds, 7, 11, 32, 16)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert set(np.flatnonzero(np.isin(np.arange(1300), idx))) >= set()
    assert not np.array_equal(a["x"], gdata.batch(ds, 7, 12, 32, 16)["x"])


# --- evaluation ----------------------------------------------------------------------------------------------------


def test_grid_kl_on_known_distributions():
    assert geval.kl([0.5, 0.5], [0.25, 0.75]) == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), abs=1e-8)
    assert geval.kl([0.2, 0.8], [0.2, 0.8]) == pytest.approx(0.0, abs=1e-12)
    xs, ys = np.linspace(0, 3, 4), np.linspace(0, 1, 2)
    pts = np.array([[0.1, 0.0], [2.9, 1.0], [3.4, 0.9], [-5, -5]])  # nearest points: (0,0), (3,1), (3,1), (0,0)
    h = geval.histogram(pts, xs, ys)
    assert h.reshape(2, 4)[0, 0] == 0.5 and h.reshape(2, 4)[1, 3] == 0.5
    # p_disc from an energy that is -log p + const recovers p; the table's keys
    p = np.array([0.1, 0.2, 0.3, 0.4])
    np.testing.assert_allclose(geval.normalise_log(-(-np.log(p) + 7.0)), p)
    t = geval.kl_table({"data": p, "disc": p[::-1]})
    assert set(t) == {"kl_data_disc", "kl_disc_data"} and t["kl_disc_data"] == pytest.approx(geval.kl(p[::-1], p))


def test_energy_ranking_and_linear_probe():
    e = np.array([3.0, 1.0, 2.0, 0.0])
    r = geval.energy_ranking(e, np.array([True, False, True, False]), k=2)
    assert r["top"].tolist() == [3, 1] and r["bottom"].tolist() == [0, 2] and r["real_fraction_bottom"] == 1.0
    f = np.concatenate([np.zeros((20, 2)), np.ones((20, 2))]) + np.random.default_rng(0).normal(0, 0.1, (40, 2))
    y = np.repeat([0, 1], 20)
    assert geval.linear_probe(f, y, f, y) == 0.0


# --- the multi-player program ---------------------------------------------------------------------------------------


def _config(family, over):
    return config_lib.load_config(os.path.join(REPO, f"configs/gan/{family}.py"), over)


SMALL_CEGAN = {"data.batch_size": 64, "total_steps": 6, "log_every_steps": 1, "checkpoint.every_steps": 3}
SMALL_BADGAN = {
    "data.batch_size": 32,
    "data.labeled_batch_size": 32,
    "model.disc_hidden": (32, 16),
    "model.gen_hidden": (32,),
    "model.noise_dim": 8,
    "model.density_hidden": 32,
    "model.ld_start": 0,
    "total_steps": 6,
    "log_every_steps": 1,
    "checkpoint.every_steps": 3,
}


def _losses(workdir):
    out = {}
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "split" not in r:
                out[r["step"]] = {k: v for k, v in r.items() if k.endswith("_loss")}
    return out


@pytest.mark.parametrize(
    "family,over",
    [("cegan", {"model.variant": "egan_ent_vi", **SMALL_CEGAN}), ("badgan", {"model.vi_weight": 0.1, **SMALL_BADGAN})],
)
def test_multi_player_resume_is_bitwise_exact(tmp_path, family, over):
    from xlgen.train import loop

    over = {**over, "mesh.num_devices": 1}
    c = _config(family, over)
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    loop.train(c, full)
    loop.train(c, part, stop_at=3)
    assert sorted(_losses(part)) == [1, 2, 3]
    loop.train(c, part)
    a, b = _losses(full), _losses(part)
    assert sorted(b) == list(range(1, 7)) and len(a[6]) >= 3  # every player's loss is logged
    assert [b[s] for s in (4, 5, 6)] == [a[s] for s in (4, 5, 6)]
    if family == "badgan":
        assert (
            json.load(open(os.path.join(part, "labeled.json")))["indices"]
            == json.load(open(os.path.join(full, "labeled.json")))["indices"]
        )
        rec = loop.evaluate(c, part)
        assert 0.0 <= rec["test_error"] <= 1.0
        assert json.load(open(os.path.join(part, "eval_results.json")))["test_error"] == rec["test_error"]


def test_eight_devices_equal_one():
    from xlgen import sharding
    from xlgen.systems.gan.system import Pipeline
    from xlgen.train.program import build_program

    assert jax.device_count() >= 8
    results = []
    for n in (1, 8):
        c = _config("badgan", {**SMALL_BADGAN, "mesh.num_devices": n})
        program = build_program(c, sharding.make_mesh(c.mesh))
        pipe = Pipeline(c.data)
        with jax.set_mesh(program.mesh):
            state, _ = program.init_state()
            losses_ = []
            for s in range(4):
                b = {k: jax.device_put(v, program.batch_shardings[k]) for k, v in pipe.batch(s).items()}
                state, _, m = program.train_step(state, b, None)
                losses_.append([float(m[k]) for k in sorted(m) if k.endswith("_loss")])
        results.append(np.array(losses_))
        assert len(program.mesh.devices.flat) == n
    np.testing.assert_allclose(results[0], results[1], rtol=2e-4, atol=2e-5)


@pytest.mark.slow
def test_cli_sigkill_resume_eval_and_plot(tmp_path, monkeypatch, compile_cache):
    """`xlgen train` (CEGAN, three players) killed by SIGKILL mid-run resumes bitwise-exactly; `xlgen eval --workdir`
    writes Table B.2's keys; `xlgen plot` draws the players' losses."""
    from kill_helpers import sigkill_after_step
    from test_train_utils import run_train, train_cmd, xlgen_env

    from xlgen import cli

    cache = str(tmp_path / "cache")
    cfg = "../gan/cegan.py"
    over = {
        "model.variant": "egan_ent_vi",
        "data.name": "biased_mog2",
        "data.batch_size": 64,
        "total_steps": 300,
        "checkpoint.every_steps": 20,
        "log_every_steps": 1,
        "mesh.num_devices": 1,
        "eval.num_samples": 2000,
    }
    full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
    run_train(full, cache, cfg, over)
    sigkill_after_step(train_cmd(killed, cfg, over), killed, 62, env=xlgen_env(cache), cwd=REPO)
    out = run_train(killed, cache, cfg, over)
    resumed = int(out.stdout.split(f"{killed}/checkpoints/")[1].split()[0])
    a, b = _losses(full), _losses(killed)
    assert resumed % 20 == 0 and resumed >= 20 and sorted(b) == list(range(1, 301))
    assert [b[s] for s in range(resumed + 1, 301)] == [a[s] for s in range(resumed + 1, 301)]
    assert set(a[300]) == {"disc_loss", "gen_loss", "infer_loss"}
    # eval and plot only read the workdir: in-process (`cli.main`, the executable's entry point), the session's cache
    monkeypatch.setenv("XLGEN_COMPILATION_CACHE", compile_cache)
    monkeypatch.setenv("XLGEN_COMPILATION_CACHE_MIN_SECS", "0.1")
    assert cli.main(["eval", f"--workdir={full}"]) == 0
    res = json.load(open(os.path.join(full, "eval_results.json")))
    for pq in ("disc_data", "data_disc", "gen_emp", "emp_gen", "gen_data", "disc_emp", "gen_disc", "disc_gen"):
        assert math.isfinite(res[f"kl_{pq}"])
    assert os.path.exists(os.path.join(full, "eval", "energies.png"))
    assert cli.main(["plot", f"--workdir={full}"]) == 0
    assert os.path.exists(os.path.join(full, "plots", "training.png"))


@pytest.mark.slow
def test_cegan_on_idx_images_ranking_and_probe(tmp_path):
    """The DCGAN path (§B.8.1) on a generated IDX directory: trains, then `xlgen eval` ranks 2x20 images by energy
    and fits the linear probe (Table B.3's proxy) on the discriminator's features."""
    from xlgen.train import loop

    r = np.random.default_rng(0)
    labels = np.arange(60, dtype=np.uint8) % 3
    imgs = np.zeros((60, 28, 28), np.uint8)
    for i, y in enumerate(labels):  # three classes: a bar in a class-specific row band, plus noise
        imgs[i, 4 + 8 * y : 8 + 8 * y, 4:24] = 255
        imgs[i] = np.clip(imgs[i] + r.integers(0, 40, (28, 28)), 0, 255).astype(np.uint8)
    for stem, arr in (
        ("train-images-idx3-ubyte", imgs[:40]),
        ("train-labels-idx1-ubyte", labels[:40]),
        ("t10k-images-idx3-ubyte", imgs[40:]),
        ("t10k-labels-idx1-ubyte", labels[40:]),
    ):
        _write_idx(tmp_path / stem, arr, 0x08, False)
    c = _config(
        "cegan",
        {
            "data.name": "idx",
            "data.dir": str(tmp_path),
            "model.width": 0.0625,
            "model.noise_dim": 10,
            "data.batch_size": 8,
            "total_steps": 2,
            "mesh.num_devices": 1,
            "eval.probe_train": 40,
        },
    )
    wd = str(tmp_path / "run")
    loop.train(c, wd)
    rec = loop.evaluate(c, wd)
    assert 0.0 <= rec["rank_real_fraction_top"] <= 1.0 and 0.0 <= rec["probe_test_error"] <= 0.5
    assert os.path.exists(os.path.join(wd, "eval", "ranking_top.png"))
