"""The two adversarial systems as games (xlgen.train.game): players, losses in update order, batches, evaluation.

CEGAN (`config.model.family="cegan"`, seed 000 Appendix B), `model.variant`:
    gan          D(x) = sigmoid(o(x)); disc: -E log D(x) - E log(1 - D(G(z))); gen: -E log D(G(z))
    egan_const   cost c(x) = o(x); disc: E_data c - E_gen c (margin m); gen: E_gen c                      (eq. B.8)
    egan_ent_nn  gen: E_gen c + the nearest-neighbour entropy surrogate (eqs. B.10-B.11)
    egan_ent_vi  gen: E_gen c + w_vi U(q) (eq. B.16); players + "infer" (eq. B.26), updated after gen on U(q)
  order: disc, gen[, infer]. EGAN updates are gated as in the paper's code: with gap = E_data c - E_gen c on the
  step's batch, disc updates while gap > gap_bounds[0], gen while gap < gap_bounds[1]. Energy for the evaluation: c = o (EGAN), c = -o (GAN: p_disc ∝ D / (1 - D)).

Bad GAN (`config.model.family="badgan"`, seed 003 §3.1 / seed 000 Appendix C), `model.variant`:
    supervised   disc only: -E_L log P(y|x, y<=K)
    fm           disc: -(eq. C.1); gen: feature matching
    badgan       disc: -(eq. C.5) (w_ent); gen: FM + w_pt PT + w_ld LD (+ w_vi U(q) with the "enc" player); the
                 "density" player (PixelDensity) learns log p(x) on the unlabeled rows (dequantised) and LD uses it
                 (frozen for the generator: only x is differentiated) from step `ld_start` on, with ε the
                 `ld_quantile` quantile of log p over the unlabeled batch (the paper: the 10-quantile, C.6)
  order: disc, gen[, enc][, density]. `model.generator=complement` (2-D sets): no gen player; the disc's generated
  rows are the complement samples of §3.1.4 (uniform in the box minus the manifold).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Callable, Dict, List, Tuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from data_pipelines import paths
from xlgen.models.family import Family, Objective
from xlgen.systems.gan import data as gdata
from xlgen.systems.gan import evaluation as geval
from xlgen.systems.gan import losses
from xlgen.systems.gan import models as gm
from xlgen.train.game import GAME_UNUSED_KEYS, Game, GameProgram, Player, game_objective, player_learning_rate_keys
from xlgen.train.report import Reporting

CEGAN_VARIANTS = ("gan", "egan_const", "egan_ent_nn", "egan_ent_vi")
BADGAN_VARIANTS = ("supervised", "fm", "badgan")


def _tx(opt_config, total_steps: int):
    """Adam with a linear decay to `decay_to` x the rate over the last `decay_fraction` of training."""
    lr = float(opt_config.learning_rate)
    frac = float(opt_config.decay_fraction)
    start = int(total_steps * (1 - frac))
    end_lr = lr * float(opt_config.decay_to)
    sched = optax.join_schedules(
        [optax.constant_schedule(lr), optax.linear_schedule(lr, end_lr, max(total_steps - start, 1))], [start]
    )
    return optax.adam(sched, b1=float(opt_config.b1), b2=float(opt_config.b2)), sched


def learning_rates(config, total_steps: int):
    """{player: schedule} of every configured player (`Reporting.learning_rates`)."""
    return {name: _tx(p, total_steps)[1] for name, p in config.players.items()}


REPORTING = Reporting(
    unit="examples",
    learning_rates=learning_rates,
    unused_keys=GAME_UNUSED_KEYS,
    learning_rate_keys=player_learning_rate_keys,
)


def _player(name, make, config) -> Player:
    tx, sched = _tx(config.players[name], int(config.total_steps))
    return Player(name, make, tx, sched)


# ---------------------------------------------------------------------------------------------------------------
# CEGAN
# ---------------------------------------------------------------------------------------------------------------


def _cegan_nets(config, ds: gdata.Dataset):
    m = config.model
    dz, hid = int(m.noise_dim), int(m.hidden)
    if ds.mixture is not None:  # §B.8.1, 2-D
        return (
            lambda r: gm.MLP(2, (hid, hid), 1, rngs=r),
            lambda r: gm.FCGenerator(dz, (hid, hid), (2,), rngs=r),
            lambda r: gm.Encoder(2, (hid, hid), dz, rngs=r),
        )
    w = float(m.width)
    return (
        lambda r: gm.DCDiscriminator(1, rngs=r, width=w),
        lambda r: gm.DCGenerator(dz, rngs=r, width=w),
        lambda r: gm.Encoder(0, (), dz, rngs=r, body=gm.DCDiscriminator(2 * dz, rngs=r, width=w)),
    )


def cegan_game(config, ds: gdata.Dataset) -> Game:
    m = config.model
    variant = str(m.variant)
    if variant not in CEGAN_VARIANTS:
        raise ValueError(f"model.variant={variant!r}: expected one of {', '.join(CEGAN_VARIANTS)}")
    make_d, make_g, make_i = _cegan_nets(config, ds)
    bsz, dz = int(config.data.batch_size), int(m.noise_dim)
    margin, alpha, w_vi = float(m.margin), float(m.knn_alpha), float(m.vi_weight)
    vi_noise = float(m.vi_noise)
    k = min(int(m.knn_k), bsz - 1)  # neighbours within the batch
    gap_lo, gap_hi = (float(v) for v in m.gap_bounds)

    def noise(key):
        return jax.random.normal(key, (bsz, dz))

    def observed(x, key):
        """x ~ p_gen(x|z) = N(G(z), vi_noise² I), the peaked Gaussian of eq. B.13 (vi_noise 0: x = G(z))"""
        if vi_noise <= 0:
            return x
        return x + vi_noise * jax.random.normal(jax.random.fold_in(key, 1), x.shape)

    def d_loss(models, batch, key, step, ctx):
        x_fake = jax.lax.stop_gradient(models["gen"](noise(key)))
        o_real, o_fake = models["disc"](batch["x"])[0][:, 0], models["disc"](x_fake)[0][:, 0]
        if variant == "gan":
            loss = losses.gan_d_loss(o_real, o_fake)
        else:
            loss = losses.egan_d_loss(o_real, o_fake, margin)
        gap = jnp.mean(o_real) - jnp.mean(o_fake)  # E_data c - E_gen c (EGAN: the discriminator's loss)
        aux = {"out_real": jnp.mean(o_real), "out_fake": jnp.mean(o_fake), "gap": gap}
        if variant != "gan" and gap_lo < gap_hi:  # the paper's code: train D while gap > lbound
            aux["gate"] = jax.lax.stop_gradient(gap) > gap_lo
        return loss, aux

    def g_loss(models, batch, key, step, ctx):
        z = noise(key)
        x = models["gen"](z)
        o = models["disc"](x)[0][:, 0]
        if variant == "gan":
            return losses.gan_g_loss(o), {}
        loss = losses.egan_g_loss(o)
        aux = {"adv": loss}
        if gap_lo < gap_hi:  # ... and G while gap < rbound
            aux["gate"] = ctx["disc"]["gap"] < gap_hi
        if variant == "egan_ent_nn":
            ent = losses.knn_entropy_surrogate(x.reshape(bsz, -1), k, alpha)
            loss = loss + ent
        elif variant == "egan_ent_vi":
            mu, ls = models["infer"](observed(x, key))
            ent = w_vi * losses.vi_entropy_bound(z, mu, ls)
            loss = loss + ent
            aux["vi_bound"] = ent / w_vi
        return loss, aux

    def i_loss(models, batch, key, step, ctx):
        z = noise(key)
        mu, ls = models["infer"](observed(jax.lax.stop_gradient(models["gen"](z)), key))
        return losses.vi_entropy_bound(z, mu, ls), {}

    players = [_player("disc", make_d, config), _player("gen", make_g, config)]
    order = [("disc", d_loss), ("gen", g_loss)]
    if variant == "egan_ent_vi":
        players.append(_player("infer", make_i, config))
        order.append(("infer", i_loss))
    shapes = {"x": ((bsz,) + ds.shape, jnp.float32), "x2": ((bsz,) + ds.shape, jnp.float32)}
    return Game(tuple(players), tuple(order), shapes, bsz)


def cegan_energy(config, program: GameProgram, state) -> Callable[[np.ndarray], np.ndarray]:
    """points [M, ...] -> cost c [M] (numpy), the eval-mode discriminator."""
    disc = program.modules(state)["disc"]
    sign = -1.0 if str(config.model.variant) == "gan" else 1.0
    f = jax.jit(lambda x: sign * disc(x)[0][:, 0])
    return lambda pts: _batched(f, np.asarray(pts, np.float32), 10_000)


def generate(config, program: GameProgram, state, n: int, seed: int = 1) -> np.ndarray:
    """n generated samples (eval-mode generator), drawn in chunks."""
    gen = program.modules(state)["gen"]
    dz = int(config.model.noise_dim)
    uniform = str(config.model.family) == "badgan"
    f = jax.jit(lambda key: gen(jax.random.uniform(key, (1000, dz)) if uniform else jax.random.normal(key, (1000, dz))))
    key = jax.random.key(seed)
    out = [np.asarray(f(jax.random.fold_in(key, i))) for i in range((n + 999) // 1000)]
    return np.concatenate(out)[:n]


def _batched(f, x: np.ndarray, chunk: int) -> np.ndarray:
    return np.concatenate([np.asarray(f(x[i : i + chunk])) for i in range(0, len(x), chunk)])


def cegan_evaluate(config, program: GameProgram, state, ds: gdata.Dataset, out_dir: str, full: bool = True):
    """2-D: Table B.2's KL table (+ the figure); images: the §B.5.2 ranking grids and Table B.3's linear probe."""
    energy = cegan_energy(config, program, state)
    if ds.mixture is not None:
        n = int(config.eval.num_samples) if full else 10_000
        gen = generate(config, program, state, n)
        dists = geval.grid_distributions(ds.train_x, gen, energy, ds.mixture.log_density)
        res = geval.kl_table(dists)
        if full:
            geval.plot_energies(
                os.path.join(out_dir, "energies.png"),
                ds.train_x,
                gen,
                dists,
                f"{config.model.variant} on {config.data.name}",
            )
        return res
    r = np.random.default_rng(0)
    real = ds.test_x[r.choice(len(ds.test_x), min(500, len(ds.test_x)), replace=False)]
    fake = generate(config, program, state, len(real))
    imgs = np.concatenate([real, fake])
    is_real = np.arange(len(imgs)) < len(real)
    rank = geval.energy_ranking(energy(imgs), is_real)
    res = {
        "rank_real_fraction_top": rank["real_fraction_top"],
        "rank_real_fraction_bottom": rank["real_fraction_bottom"],
    }
    if full:
        for which in ("top", "bottom"):
            idx = rank[which]
            geval.save_gray(
                os.path.join(out_dir, f"ranking_{which}.png"),
                geval.image_grid(imgs[idx], 10, 10, is_real[idx]),
                f"{which} 100 by energy (framed: real)",
            )
        disc = program.modules(state)["disc"]
        feat = jax.jit(lambda x: disc(x)[1])
        ntr = min(len(ds.train_x), int(config.eval.probe_train))
        ftr = _batched(feat, ds.train_x[:ntr], 500)
        fte = _batched(feat, ds.test_x, 500)
        res["probe_test_error"] = geval.linear_probe(ftr, ds.train_y[:ntr], fte, ds.test_y)
    return res


# ---------------------------------------------------------------------------------------------------------------
# Bad GAN
# ---------------------------------------------------------------------------------------------------------------


def badgan_game(config, ds: gdata.Dataset) -> Game:
    m = config.model
    variant = str(m.variant)
    if variant not in BADGAN_VARIANTS:
        raise ValueError(f"model.variant={variant!r}: expected one of {', '.join(BADGAN_VARIANTS)}")
    if ds.labeled is None:
        raise ValueError("config.data.num_labeled must be > 0 for the semi-supervised system")
    complement = str(m.generator) == "complement"
    if complement and ds.complement is None:
        raise ValueError(f"model.generator=complement needs a 2-D set (four_spins, two_circles), not {ds.name}")
    d_in = int(np.prod(ds.shape))
    K, dz = ds.num_classes, int(m.noise_dim)
    hidden = tuple(int(h) for h in m.disc_hidden)
    bsz = int(config.data.batch_size)
    lbsz = labeled_batch_size(config.data, ds)
    w_ent, w_pt, w_ld, w_vi = (float(m.ent_weight), float(m.pt_weight), float(m.ld_weight), float(m.vi_weight))
    if variant == "fm":
        w_ent = w_pt = w_ld = w_vi = 0.0
    ld_start, ld_q = int(m.ld_start), float(m.ld_quantile)
    deq = float(m.dequantize)

    def make_d(r):
        return gm.MLP(d_in, hidden, K, rngs=r, input_noise=float(m.input_noise), hidden_noise=float(m.hidden_noise))

    def make_g(r):
        out = "sigmoid" if ds.mixture is None and ds.name in ("digits", "idx") else None
        return gm.FCGenerator(dz, tuple(int(h) for h in m.gen_hidden), ds.shape, rngs=r, act=jax.nn.softplus, out=out)

    def fake_rows(models, batch, key):
        if complement:
            return batch["xc"]
        return models["gen"](jax.random.uniform(key, (bsz, dz)))

    def d_loss(models, batch, key, step, ctx):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        ll, _ = models["disc"](batch["xl"], k1)
        lab = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(ll), batch["yl"][:, None], 1))
        if variant == "supervised":
            return lab, {"lab": lab}
        lu, _ = models["disc"](batch["x"], k2)
        lg, _ = models["disc"](jax.lax.stop_gradient(fake_rows(models, batch, k3)), k4)
        lab, unl, gen = losses.kplus1_terms(ll, batch["yl"], lu, lg)
        loss = lab + unl + gen
        aux = {"lab": lab, "unl": unl, "gen": gen}
        if w_ent:
            ent = losses.conditional_entropy(lu)
            loss = loss + w_ent * ent
            aux["ent"] = ent
        return loss, aux

    def g_loss(models, batch, key, step, ctx):
        k1, k2, k3 = jax.random.split(key, 3)
        z = jax.random.uniform(k1, (bsz, dz))
        x = models["gen"](z)
        _, fg = models["disc"](x, k2)
        _, fu = models["disc"](batch["x2"], k3)
        loss = losses.feature_matching(fg, jax.lax.stop_gradient(fu))
        aux = {"fm": loss}
        if w_pt:
            pt = losses.pull_away(fg)
            loss, aux["pt"] = loss + w_pt * pt, pt
        if w_ld:
            lp_gen = models["density"](x)
            lp_unl = jax.lax.stop_gradient(models["density"](batch["x2"]))
            ld = losses.low_density(lp_gen, jnp.quantile(lp_unl, ld_q))
            loss = loss + jnp.where(step >= ld_start, w_ld, 0.0) * ld
            aux["ld"], aux["max_log_p"] = ld, jnp.max(lp_gen)
        if w_vi:
            mu, ls = models["enc"](x)
            vi = losses.vi_entropy_bound(z, mu, ls)
            loss, aux["vi"] = loss + w_vi * vi, vi
        return loss, aux

    def enc_loss(models, batch, key, step, ctx):
        z = jax.random.uniform(key, (bsz, dz))
        mu, ls = models["enc"](jax.lax.stop_gradient(models["gen"](z)))
        return losses.vi_entropy_bound(z, mu, ls), {}

    def density_loss(models, batch, key, step, ctx):
        x = batch["x"] + deq * jax.random.uniform(key, batch["x"].shape)
        nll = -jnp.mean(models["density"](x))
        return nll, {}

    players = [_player("disc", make_d, config)]
    order: List = [("disc", d_loss)]
    if variant != "supervised" and not complement:
        players.append(_player("gen", make_g, config))
        order.append(("gen", g_loss))
        if w_vi:
            players.append(
                _player("enc", lambda r: gm.Encoder(d_in, (500, 500), dz, rngs=r, max_std=float(m.vi_max_std)), config)
            )
            order.append(("enc", enc_loss))
        if w_ld:
            players.append(_player("density", lambda r: gm.PixelDensity(d_in, int(m.density_hidden), rngs=r), config))
            order.append(("density", density_loss))
    shapes = {
        "x": ((bsz,) + ds.shape, jnp.float32),
        "x2": ((bsz,) + ds.shape, jnp.float32),
        "xl": ((lbsz,) + ds.shape, jnp.float32),
        "yl": ((lbsz,), jnp.int32),
    }
    if complement:
        shapes["xc"] = ((bsz,) + ds.shape, jnp.float32)
    return Game(tuple(players), tuple(order), shapes, bsz + lbsz)


def classify_fn(program: GameProgram, state):
    disc = program.modules(state)["disc"]
    f = jax.jit(lambda x: jnp.argmax(disc(x)[0], -1))
    return lambda x: _batched(f, np.asarray(x, np.float32), 2000)


def badgan_evaluate(config, program: GameProgram, state, ds: gdata.Dataset, out_dir: str, full: bool = True):
    """`test_error` (fraction) on the test split; 2-D sets: the decision-boundary figure (Figs. 3.3-3.5)."""
    pred = classify_fn(program, state)(ds.test_x)
    res = {"test_error": float(np.mean(pred != ds.test_y)), "test_errors": int(np.sum(pred != ds.test_y))}
    if full and ds.name in ("four_spins", "two_circles"):
        _plot_case_study(config, program, state, ds, os.path.join(out_dir, "case_study.png"))
    return res


def _plot_case_study(config, program, state, ds, path):
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mods = program.modules(state)
    disc = mods["disc"]
    logits = jax.jit(lambda x: disc(x)[0])
    xs, ys, pred = geval.decision_map(
        lambda p: np.argmax(_batched(logits, p.astype(np.float32), 10000), -1), ds.train_x
    )
    pts = geval.grid_points(xs, ys).astype(np.float32)
    lg = _batched(logits, pts, 10000)
    fake = (jax.nn.logsumexp(lg, -1) < 0).reshape(len(ys), len(xs))  # P(K+1|x) > 1/2
    if "gen" in mods:
        g = generate(config, program, state, 1000)
    elif ds.complement is not None:
        g = ds.complement[:1000]
    else:
        g = np.zeros((0, 2))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    axes[0].contourf(xs, ys, pred, alpha=0.35, cmap="tab10")
    axes[0].contour(xs, ys, fake.astype(float), levels=[0.5], colors="white")
    axes[0].scatter(*ds.train_x.T, c=ds.train_y, s=2, cmap="tab10")
    lab = ds.labeled
    axes[0].scatter(*ds.train_x[lab].T, c="k", marker="x", s=40)
    axes[0].set_title("class boundaries (white: true/fake boundary)")
    axes[1].contourf(xs, ys, fake.astype(float), alpha=0.35, cmap="gray_r")
    axes[1].scatter(*ds.train_x.T, s=1, c="0.3")
    axes[1].scatter(*g.T, s=2, c="b")
    axes[1].set_title("generated (blue) and the fake region (shaded)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    paths.atomic_write_bytes(path, buf.getvalue())


# ---------------------------------------------------------------------------------------------------------------
# The registry records (xlgen/registry.py: SYSTEMS["cegan"], SYSTEMS["badgan"])
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CeganConfig:
    """`config.model` of configs/gan/cegan.py (minus `family`)."""

    variant: str = "egan_ent_nn"  # gan | egan_const | egan_ent_nn | egan_ent_vi
    noise_dim: int = 4
    hidden: int = 128
    width: float = 1.0  # images: channel multiplier of the DCGAN networks
    margin: float = 0.0  # EGAN discriminator: max(E_data c - c(x~), -margin); 0 = none
    gap_bounds: Tuple[float, float] = (-10.0, 0.1)  # EGAN: disc updates while gap > [0], gen while gap < [1]
    knn_k: int = 20  # EGAN-Ent-NN: neighbours (eq. B.10)
    knn_alpha: float = 0.5  # EGAN-Ent-NN: alpha (eq. B.11)
    vi_weight: float = 1.0  # EGAN-Ent-VI: weight of U(q)
    vi_noise: float = 0.0  # EGAN-Ent-VI: std of p_gen(x|z) = N(G(z), s² I) (eq. B.13); 0: q sees G(z) itself


@dataclasses.dataclass(frozen=True)
class BadganConfig:
    """`config.model` of configs/gan/badgan.py (minus `family`)."""

    variant: str = "badgan"  # supervised | fm | badgan
    generator: str = "learned"  # learned | complement (2-D sets: uniform in the box minus the manifold)
    noise_dim: int = 100
    disc_hidden: Tuple[int, ...] = (500, 250, 250)
    gen_hidden: Tuple[int, ...] = (500, 500)
    input_noise: float = 0.3
    hidden_noise: float = 0.5
    ent_weight: float = 0.1  # conditional entropy (eq. C.5)
    pt_weight: float = 0.8  # pull-away term
    ld_weight: float = 1e-3  # low-density term (eq. C.3)
    ld_start: int = 500  # LD from this step on (the density model trains from step 0)
    ld_quantile: float = 0.1  # epsilon = this quantile of log p over the unlabeled batch
    vi_weight: float = 0.0  # VI entropy (encoder player) if > 0
    vi_max_std: float = 1.0
    density_hidden: int = 256
    dequantize: float = 1.0 / 16  # density model: uniform noise added to the pixels it learns on


@functools.lru_cache(maxsize=4)
def _dataset(data_json: str) -> gdata.Dataset:
    d = ml_collections.ConfigDict(json.loads(data_json))
    return gdata.load(d, int(d.seed))


def dataset(data_config) -> gdata.Dataset:
    """The run's Dataset (cached per data config): `data.seed` draws the batches and, unless `data.label_seed` is
    set, the labeled subset."""
    return _dataset(json.dumps(data_config.to_dict(), sort_keys=True, default=str))


class Pipeline:
    """`batch(step)` = data.batch(dataset, data.seed, step, ...): global rows, a pure function of the step;
    `record(workdir)` writes DIR/labeled.json (the labeled subset of a semi-supervised run)."""

    num_steps = None

    def __init__(self, data_config, split: str = "train", process_index: int = 0, process_count: int = 1):
        self.ds, self.seed = dataset(data_config), int(data_config.seed)
        self.global_batch_size = self.local_batch_size = int(data_config.batch_size)
        self.lbsz = labeled_batch_size(data_config, self.ds)

    def batch(self, step: int) -> Dict[str, np.ndarray]:
        return gdata.batch(self.ds, self.seed, step, self.global_batch_size, self.lbsz)

    def record(self, workdir: str) -> None:
        if self.ds.labeled is None:
            return
        path = os.path.join(workdir, "labeled.json")
        rec = {"dataset": self.ds.name, "indices": [int(i) for i in self.ds.labeled]}
        if paths.as_path(path).exists():
            if json.loads(paths.read_text(path)) != rec:
                raise ValueError(f"{path}: the labeled subset differs from this config's (data.num_labeled / seed)")
            return
        paths.write_json_atomic(path, rec)


def labeled_batch_size(data_config, ds: gdata.Dataset) -> int:
    if ds.labeled is None:
        return 0
    return min(int(data_config.labeled_batch_size) or len(ds.labeled), len(ds.labeled))


def _objective(name: str, make_game, evaluate) -> Objective:
    def game(config) -> Game:
        return make_game(config, dataset(config.data))

    def ev(config, program, state, out_dir, full):
        return evaluate(config, program, state, dataset(config.data), out_dir, full)

    return game_objective(name, game, Pipeline, ev)


CEGAN = Family(
    name="cegan",
    config_class=CeganConfig,
    default_objective="cegan",
    models={"disc": gm.MLP, "gen": gm.FCGenerator, "dc_disc": gm.DCDiscriminator, "dc_gen": gm.DCGenerator},
    objectives={"cegan": _objective("cegan", cegan_game, cegan_evaluate)},
    records=(REPORTING,),
)
BADGAN = Family(
    name="badgan",
    config_class=BadganConfig,
    default_objective="badgan",
    models={"disc": gm.MLP, "gen": gm.FCGenerator, "density": gm.PixelDensity, "enc": gm.Encoder},
    objectives={"badgan": _objective("badgan", badgan_game, badgan_evaluate)},
    records=(REPORTING,),
)
