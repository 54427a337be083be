"""Small CPU reproductions of the adversarial systems (docs/reproductions.md, "Adversarial systems").

    python -m xlgen.reproductions.gan cegan     [--out=DIR --figures=DIR --seeds=0,1,2 --steps=N]
    python -m xlgen.reproductions.gan badgan    [...]
    python -m xlgen.reproductions.gan casestudy [...]

Every run is `xlgen train` + `xlgen eval` in-process (`xlgen.train.loop.train` / `.evaluate`) on the configs
configs/gan/cegan.py and configs/gan/badgan.py, with the seed as both `seed` (initialisation) and `data.seed`
(batches, labeled subset). Results: `<figures>/<experiment>.json` (every run's eval_results and the mean ± std
tables) and the figures of seed 0 copied to `<figures>/`.

  cegan      Table B.2: GAN, EGAN-Const, EGAN-Ent-VI, EGAN-Ent-NN on mog4, biased_mog2, spirals
  badgan     100 labels on scikit-learn's 8x8 digits: supervised-only, FM, and the full method (FM + PT + LD + Ent),
             plus the ablation rows (+PT, +LD, +Ent separately)
  casestudy  the 2-D case study: complement generator on four_spins, FM on two_circles (figures)
  tables     print the markdown tables of docs/reproductions.md from the JSON files
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from typing import Dict, List, Optional

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMON = {"tensorboard": False, "log_every_steps": 250, "eval_every_steps": -1, "mesh.num_devices": 1}

# Table B.2 of seed 000 (KL divergences), for the table beside ours
PAPER_B2 = {
    "mog4": {
        "gan": dict(
            gen_emp=0.3034,
            emp_gen=0.5024,
            gen_data=0.2498,
            data_gen=0.4807,
            disc_emp=6.7587,
            emp_disc=2.0648,
            disc_data=6.2020,
            data_disc=2.0553,
            gen_disc=2.4596,
            disc_gen=7.0895,
        ),
        "egan_const": dict(
            gen_emp=0.2711,
            emp_gen=0.4888,
            gen_data=0.2239,
            data_gen=0.4735,
            disc_emp=6.7916,
            emp_disc=2.1243,
            disc_data=6.2159,
            data_disc=2.1149,
            gen_disc=2.5062,
            disc_gen=7.0553,
        ),
        "egan_ent_vi": dict(
            gen_emp=0.1422,
            emp_gen=0.1367,
            gen_data=0.0896,
            data_gen=0.1214,
            disc_emp=0.8866,
            emp_disc=0.6532,
            disc_data=0.7215,
            data_disc=0.6442,
            gen_disc=0.7711,
            disc_gen=1.0638,
        ),
        "egan_ent_nn": dict(
            gen_emp=0.1131,
            emp_gen=0.1006,
            gen_data=0.0621,
            data_gen=0.0862,
            disc_emp=0.0993,
            emp_disc=0.1356,
            disc_data=0.0901,
            data_disc=0.1187,
            gen_disc=0.1905,
            disc_gen=0.1208,
        ),
    },
    "biased_mog2": {
        "gan": dict(
            gen_emp=0.0788,
            emp_gen=0.0705,
            gen_data=0.0413,
            data_gen=0.0547,
            disc_emp=7.1539,
            emp_disc=2.5230,
            disc_data=6.4927,
            data_disc=2.5018,
            gen_disc=2.5205,
            disc_gen=7.1140,
        ),
        "egan_const": dict(
            gen_emp=0.1545,
            emp_gen=0.1649,
            gen_data=0.1211,
            data_gen=0.1519,
            disc_emp=7.1568,
            emp_disc=2.5269,
            disc_data=6.4969,
            data_disc=2.5057,
            gen_disc=2.5860,
            disc_gen=7.1995,
        ),
        "egan_ent_vi": dict(
            gen_emp=0.0576,
            emp_gen=0.0668,
            gen_data=0.0303,
            data_gen=0.0518,
            disc_emp=3.9151,
            emp_disc=1.3574,
            disc_data=2.9894,
            data_disc=1.3365,
            gen_disc=1.4052,
            disc_gen=4.0632,
        ),
        "egan_ent_nn": dict(
            gen_emp=0.0784,
            emp_gen=0.0574,
            gen_data=0.0334,
            data_gen=0.0422,
            disc_emp=0.8505,
            emp_disc=0.3480,
            disc_data=0.5199,
            data_disc=0.3299,
            gen_disc=0.3250,
            disc_gen=0.7835,
        ),
    },
    "spirals": {
        "gan": dict(
            gen_emp=0.5297,
            emp_gen=0.2701,
            gen_data=0.3758,
            data_gen=0.7240,
            disc_emp=6.3507,
            emp_disc=1.7180,
            disc_data=4.3818,
            data_disc=1.0866,
            gen_disc=1.6519,
            disc_gen=5.7694,
        ),
        "egan_const": dict(
            gen_emp=0.7473,
            emp_gen=1.0325,
            gen_data=0.7152,
            data_gen=1.6703,
            disc_emp=5.9930,
            emp_disc=1.5732,
            disc_data=3.9749,
            data_disc=0.9703,
            gen_disc=1.8380,
            disc_gen=6.0471,
        ),
        "egan_ent_vi": dict(
            gen_emp=0.2014,
            emp_gen=0.1260,
            gen_data=0.4283,
            data_gen=0.8399,
            disc_emp=1.1099,
            emp_disc=0.3508,
            disc_data=0.3061,
            data_disc=0.4037,
            gen_disc=0.4324,
            disc_gen=0.9917,
        ),
        "egan_ent_nn": dict(
            gen_emp=0.1246,
            emp_gen=0.1147,
            gen_data=0.4475,
            data_gen=1.2435,
            disc_emp=0.1036,
            emp_disc=0.0857,
            disc_data=0.4086,
            data_disc=0.7917,
            gen_disc=0.1365,
            disc_gen=0.1686,
        ),
    },
}
PAIRS = (
    "gen_emp",
    "emp_gen",
    "gen_data",
    "data_gen",
    "disc_emp",
    "emp_disc",
    "disc_data",
    "data_disc",
    "gen_disc",
    "disc_gen",
)


def run_one(config_file: str, over: Dict, workdir: str) -> Dict:
    """Train (resuming if the workdir has checkpoints) and evaluate; returns eval_results (a finished run's
    eval_results.json at its total_steps is reused as it is)."""
    from xlgen import config as config_lib
    from xlgen.train import loop

    done = os.path.join(workdir, "eval_results.json")
    if os.path.exists(done) and json.load(open(done)).get("step") == int(over.get("total_steps", -1)):
        return json.load(open(done))

    c = config_lib.load_config(os.path.join(REPO, config_file), {k: str(v) for k, v in {**COMMON, **over}.items()})
    t = time.time()
    loop.train(c, workdir)
    rec = loop.evaluate(c, workdir)
    rec["wall_s"] = round(time.time() - t, 1)
    print(f"{workdir}: {json.dumps({k: v for k, v in rec.items() if not isinstance(v, dict)})}", flush=True)
    return rec


def mean_std(vals: List[float]):
    v = np.asarray(vals, np.float64)
    return [float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0]


CEGAN_VARIANTS = ("gan", "egan_const", "egan_ent_vi", "egan_ent_nn")


def cegan(
    out: str,
    seeds: List[int],
    steps: int,
    sets=("mog4", "biased_mog2", "spirals"),
    variants=CEGAN_VARIANTS,
    extra: Optional[Dict] = None,
    tag: str = "",
) -> Dict:
    runs, table = {}, {}
    for data in sets:
        for variant in variants:
            for s in seeds:
                wd = os.path.join(out, "cegan", f"{data}_{variant}_s{s}_{steps}{tag}")
                over = {
                    "model.variant": variant,
                    "data.name": data,
                    "seed": s,
                    "data.seed": s,
                    "total_steps": steps,
                    "checkpoint.every_steps": steps,
                    **(extra or {}),
                }
                runs[f"{data}/{variant}/{s}"] = run_one("configs/gan/cegan.py", over, wd)
            table.setdefault(data, {})[variant] = {
                p: mean_std([runs[f"{data}/{variant}/{s}"][f"kl_{p}"] for s in seeds]) for p in PAIRS
            }
    return {"steps": steps, "seeds": seeds, "overrides": extra or {}, "runs": runs, "table": table, "paper": PAPER_B2}


# Table B.3 of seed 000 (MNIST, 10 runs): linear-probe test error (%) on the discriminator's last-layer features
PAPER_B3 = {
    "egan_ent_nn": {"min": 1.160, "mean": 1.190, "std": 0.024},
    "egan_const": {"min": 1.280, "mean": 1.338, "std": 0.044},
    "gan": {"min": 1.220, "mean": 1.259, "std": 0.032},
    "random": {"min": 3.260, "mean": 3.409, "std": 0.124},
}
# the probe runs' DCGAN size (a deviation from §B.8.1's width 1.0, for this CPU; docs/reproductions.md)
PROBE_DEFAULTS = {"model.width": 0.25, "model.noise_dim": 10, "data.batch_size": 64, "eval.probe_train": 10_000}

BADGAN_ROWS = {
    "supervised": {"model.variant": "supervised"},
    "FM": {"model.variant": "fm"},
    "FM+PT": {"model.variant": "badgan", "model.ent_weight": 0.0, "model.ld_weight": 0.0},
    "FM+LD": {"model.variant": "badgan", "model.ent_weight": 0.0, "model.pt_weight": 0.0},
    "FM+Ent": {"model.variant": "badgan", "model.pt_weight": 0.0, "model.ld_weight": 0.0},
    "FM+PT+LD+Ent (full)": {"model.variant": "badgan"},
}


def badgan(
    out: str,
    seeds: List[int],
    steps: int,
    data: str = "digits",
    data_dir: str = "",
    rows=tuple(BADGAN_ROWS),
    extra: Optional[Dict] = None,
) -> Dict:
    """100 labels: the rows of BADGAN_ROWS x seeds on scikit-learn's digits or an IDX directory (Fashion-MNIST)."""
    runs, table = {}, {}
    prefix = "digits" if data == "digits" else os.path.basename(os.path.normpath(data_dir))
    for row in rows:
        errs = []
        for s in seeds:
            tag = row.replace("+", "_").replace(" ", "").replace("(", "").replace(")", "")
            wd = os.path.join(out, "badgan", f"{prefix}_{tag}_s{s}_{steps}")
            o = {
                **BADGAN_ROWS[row],
                "data.name": data,
                "data.dir": data_dir,
                "data.num_labeled": 100,
                "seed": s,
                "data.seed": s,
                "total_steps": steps,
                "checkpoint.every_steps": steps,
                **(extra or {}),
            }
            rec = run_one("configs/gan/badgan.py", o, wd)
            runs[f"{row}/{s}"] = rec
            errs.append(rec["test_error"])
        table[row] = mean_std(errs)
    first = next(iter(runs.values()))
    test_size = round(first["test_errors"] / first["test_error"]) if first["test_error"] else None
    if data == "digits":
        name = "sklearn digits 8x8 (1,300 train / 497 test), 100 labels"
    else:
        name = f"IDX {data_dir} (28x28), 100 labels"
    return {
        "steps": steps,
        "seeds": seeds,
        "dataset": name,
        "test_size": test_size,
        "overrides": extra or {},
        "runs": runs,
        "test_error": table,
    }


def probe(out: str, seeds: List[int], steps: int, data_dir: str, extra: Optional[Dict] = None) -> Dict:
    """Table B.3's proxy on an IDX directory: EGAN-Ent-NN, EGAN-Const, GAN trained on all classes, then a linear
    classifier on the discriminator's last hidden layer (`probe_test_error` of `xlgen eval`); `random`: the same
    evaluation of an untrained discriminator (the seed's initialisation)."""
    import jax

    from xlgen import config as config_lib
    from xlgen import sharding
    from xlgen.systems.gan import system
    from xlgen.train.program import build_program

    base = {"data.name": "idx", "data.dir": data_dir, "total_steps": steps, "checkpoint.every_steps": steps}
    base.update(PROBE_DEFAULTS)
    base.update(extra or {})
    runs, table = {}, {}
    for variant in ("egan_ent_nn", "egan_const", "gan", "random"):
        errs = []
        for s in seeds:
            wd = os.path.join(out, "probe", f"{variant}_s{s}_{steps}")
            over = {**base, "model.variant": "gan" if variant == "random" else variant, "seed": s, "data.seed": s}
            done = os.path.join(wd, "eval_results.json")
            if variant == "random" and os.path.exists(done):
                rec = json.load(open(done))
            elif variant == "random":
                c = config_lib.load_config(
                    os.path.join(REPO, "configs/gan/cegan.py"), {k: str(v) for k, v in {**COMMON, **over}.items()}
                )
                program = build_program(c, sharding.make_mesh(c.mesh))
                os.makedirs(os.path.join(wd, "eval"), exist_ok=True)
                with jax.set_mesh(program.mesh):
                    state, _ = program.init_state()
                    rec = system.cegan_evaluate(c, program, state, system.dataset(c.data), os.path.join(wd, "eval"))
                with open(os.path.join(wd, "eval_results.json"), "w") as f:
                    json.dump({"step": 0, **rec}, f)
                print(f"{wd}: {json.dumps(rec)}", flush=True)
            else:
                rec = run_one("configs/gan/cegan.py", over, wd)
            runs[f"{variant}/{s}"] = rec
            errs.append(rec["probe_test_error"])
        table[variant] = {"min": float(np.min(errs)), "mean_std": mean_std(errs)}
    return {
        "steps": steps,
        "seeds": seeds,
        "settings": base,
        "runs": runs,
        "probe_test_error": table,
        "paper": PAPER_B3,
    }


CASES = {
    "four_spins_complement": {"data.name": "four_spins", "model.generator": "complement", "data.num_labeled": 8},
    "four_spins_fm": {"data.name": "four_spins", "model.variant": "fm", "data.num_labeled": 8},
    "two_circles_fm": {"data.name": "two_circles", "model.variant": "fm", "data.num_labeled": 4},
    "four_spins_supervised": {"data.name": "four_spins", "model.variant": "supervised", "data.num_labeled": 8},
    # two circles: the controls and Fig. 3.4's 2-d feature layer
    "two_circles_supervised": {"data.name": "two_circles", "model.variant": "supervised", "data.num_labeled": 4},
    "two_circles_complement": {"data.name": "two_circles", "model.generator": "complement", "data.num_labeled": 4},
    "two_circles_fm_feat2": {
        "data.name": "two_circles",
        "model.variant": "fm",
        "data.num_labeled": 4,
        "model.disc_hidden": (128, 2),
    },
}


def casestudy(
    out: str, seeds: List[int], steps: int, figures: str, names=tuple(CASES), extra: Optional[Dict] = None, tag=""
) -> Dict:
    res = {}
    cases = {k: CASES[k] for k in names}
    small = {
        "model.disc_hidden": (128, 128),
        "model.gen_hidden": (128, 128),
        "model.noise_dim": 4,
        "model.input_noise": 0.0,
        "model.hidden_noise": 0.0,
        "data.batch_size": 200,
    }
    for name, over in cases.items():
        wd = os.path.join(out, "casestudy", name + tag)
        rec = run_one(
            "configs/gan/badgan.py",
            {**small, **over, "total_steps": steps, "checkpoint.every_steps": steps, **(extra or {})},
            wd,
        )
        if name.startswith("two_circles"):
            rec["diagnostics"] = circles_diagnostics(wd)
        res[name] = rec
        src = os.path.join(wd, "eval", "case_study.png")
        if os.path.exists(src):
            shutil.copy(src, os.path.join(figures, f"case_{name}{tag}.png"))
    return res


# --- diagnostics (what the findings of docs/reproductions.md rest on) ----------------------------------------------


def _pure(module):
    """A module as a pure function (split once, merged inside the traced function)."""
    from flax import nnx

    gd, st = nnx.split(module)
    return lambda *a: nnx.merge(gd, st)(*a)


def cegan_diagnostics(workdir: str, n: int = 10_000) -> Dict:
    """A trained 2-D CEGAN run (eval-mode networks): Fig. B.8's per-sample gradient magnitudes on generated points
    (the energy term ‖∇_x c‖ and the entropy term: VI ‖w ∇_x(-log q(z|x))‖, NN its constant α), the inference
    net's log σ and U(q), and where the discriminator puts its mass: p_disc (and p_gen) outside the empirical
    support (grid cells no training point falls in), the learned energy on the data vs its grid minimum."""
    import jax
    import jax.numpy as jnp

    from xlgen.systems.gan import evaluation as geval
    from xlgen.systems.gan import losses, system
    from xlgen.train.workdir import Workdir

    config, program, restored = Workdir(workdir).open()
    mods = program.modules(restored.state)
    ds = system.dataset(config.data)
    variant, m = str(config.model.variant), config.model
    disc, gen = _pure(mods["disc"]), _pure(mods["gen"])
    sign = -1.0 if variant == "gan" else 1.0
    z = jax.random.normal(jax.random.key(0), (n, int(m.noise_dim)))
    x = gen(z)
    cost = lambda x: sign * disc(x)[0][:, 0]  # noqa: E731
    g_c = jax.grad(lambda x: jnp.sum(cost(x)))(x)  # per-row: c(x_i) depends on x_i only (no batch norm)
    out = {"energy_grad_norm": float(jnp.mean(jnp.linalg.norm(g_c, axis=-1)))}
    if variant == "egan_ent_vi":
        infer, w = _pure(mods["infer"]), float(m.vi_weight)
        nll = lambda x: -losses.gaussian_log_prob(z, *infer(x))  # noqa: E731
        g_u = w * jax.grad(lambda x: jnp.sum(nll(x)))(x)
        mu, ls = infer(x)
        out.update(
            entropy_grad_norm=float(jnp.mean(jnp.linalg.norm(g_u, axis=-1))),
            u_q=float(jnp.mean(nll(x))),
            infer_log_sigma=[float(v) for v in jnp.mean(ls, 0)],
            entropy_over_energy=float(jnp.mean(jnp.linalg.norm(g_u, axis=-1) / jnp.linalg.norm(g_c, axis=-1))),
            cos_entropy_energy=float(
                jnp.mean(
                    jnp.sum(g_u * g_c, -1) / (jnp.linalg.norm(g_u, axis=-1) * jnp.linalg.norm(g_c, axis=-1) + 1e-12)
                )
            ),
        )
    elif variant == "egan_ent_nn":
        out["entropy_grad_norm"] = float(m.knn_alpha)
        out["entropy_over_energy"] = float(jnp.mean(float(m.knn_alpha) / jnp.linalg.norm(g_c, axis=-1)))
    gen_np = np.asarray(system.generate(config, program, restored.state, 100_000))
    energy = system.cegan_energy(config, program, restored.state)
    d = geval.grid_distributions(ds.train_x, gen_np, energy, ds.mixture.log_density)
    off = d["emp"] == 0
    xs, ys = geval.canvas(ds.train_x)
    pts = geval.grid_points(xs, ys)
    c_grid = energy(pts)
    c_data = energy(ds.train_x[:10_000])
    out.update(
        disc_mass_off_support=float(d["disc"][off].sum()),
        gen_mass_off_support=float(d["gen"][off].sum()),
        energy_data_mean=float(np.mean(c_data)),
        energy_grid_min=float(np.min(c_grid)),
        energy_grid_min_at=[float(v) for v in pts[int(np.argmin(c_grid))]],
        energy_grid_max=float(np.max(c_grid)),
        kl_disc_data=geval.kl(d["disc"], d["data"]),
    )
    return out


def circles_diagnostics(workdir: str) -> Dict:
    """A trained two_circles run: where the generated points lie (radius bands: inside the inner circle, on it, in
    the gap, on the outer one, outside), which test and gap points the discriminator calls fake
    (P(K+1|x) > 1/2 <=> logsumexp(l) < 0), and the error per class."""
    import jax

    from xlgen.systems.gan import system
    from xlgen.train.workdir import Workdir

    config, program, restored = Workdir(workdir).open()
    ds = system.dataset(config.data)
    mods = program.modules(restored.state)
    disc = _pure(mods["disc"])
    logits = lambda x: np.asarray(disc(jax.numpy.asarray(x, np.float32))[0])  # noqa: E731
    out = {}
    r = None
    if "gen" in mods:
        r = np.linalg.norm(system.generate(config, program, restored.state, 5000), axis=-1)
    elif str(config.model.generator) == "complement":
        r = np.linalg.norm(ds.complement[:5000], axis=-1)
    bands = {"inside": (0, 0.35), "inner": (0.35, 0.65), "gap": (0.65, 0.85), "outer": (0.85, 1.15), "out": (1.15, 9e9)}
    if r is not None:
        out["generated_radius_fraction"] = {k: float(np.mean((r >= a) & (r < b))) for k, (a, b) in bands.items()}
    lt = logits(ds.test_x)
    fake = jax.nn.logsumexp(lt, -1) < 0
    out["test_called_fake"] = float(np.mean(fake))
    rng = np.random.default_rng(0)
    a, rad = rng.uniform(0, 2 * np.pi, 2000), rng.uniform(0.65, 0.85, 2000)
    gap = np.stack([rad * np.cos(a), rad * np.sin(a)], 1)
    out["gap_called_fake"] = float(np.mean(jax.nn.logsumexp(logits(gap), -1) < 0))
    pred = np.argmax(lt, -1)
    out["error_per_class"] = [float(np.mean(pred[ds.test_y == k] != k)) for k in range(ds.num_classes)]
    return out


def markdown(figures: str) -> str:
    """The tables of docs/reproductions.md from the JSON files in `figures`."""
    out = []
    for path in sorted(p for p in os.listdir(figures) if p.startswith("cegan") and p.endswith(".json")):
        r = json.load(open(os.path.join(figures, path)))
        cols = ("disc_data", "data_disc", "disc_emp", "emp_disc", "gen_data", "data_gen", "gen_emp", "emp_gen")
        for data, rows in r["table"].items():
            out.append(f"\n**{data}** ({len(r['seeds'])} seeds, {r['steps']} steps; ours mean ± std / paper)\n")
            out.append("| model | " + " | ".join(f"KL({c.split('_')[0]}‖{c.split('_')[1]})" for c in cols) + " |")
            out.append("|---" * (len(cols) + 1) + "|")
            for v, row in rows.items():
                paper = r["paper"][data][v]
                cells = [f"{row[c][0]:.3f} ± {row[c][1]:.3f} / {paper[c]:.3f}" for c in cols]
                out.append(f"| {v} | " + " | ".join(cells) + " |")
    for path in sorted(p for p in os.listdir(figures) if p.startswith("badgan") and p.endswith(".json")):
        r = json.load(open(os.path.join(figures, path)))
        n = r.get("test_size") or 497
        out.append(f"\n**{r['dataset']}** ({len(r['seeds'])} seeds, {r['steps']} steps)\n")
        out.append(f"| setting | test error (%) mean ± std | errors of {n} |")
        out.append("|---|---|---|")
        for row in [k for k in BADGAN_ROWS if k in r["test_error"]]:
            m, sd = r["test_error"][row]
            out.append(f"| {row} | {100 * m:.2f} ± {100 * sd:.2f} | {m * n:.1f} |")
    for path in sorted(p for p in os.listdir(figures) if p.startswith("probe") and p.endswith(".json")):
        r = json.load(open(os.path.join(figures, path)))
        out.append(f"\n**Table B.3 probe** ({len(r['seeds'])} seeds, {r['steps']} steps; ours / paper on MNIST)\n")
        out.append("| discriminator | min (%) | mean ± std (%) | paper min | paper mean ± std |")
        out.append("|---|---|---|---|---|")
        for v, row in r["probe_test_error"].items():
            pp = r["paper"][v]
            m, sd = row["mean_std"]
            out.append(
                f"| {v} | {100 * row['min']:.2f} | {100 * m:.2f} ± {100 * sd:.2f} | {pp['min']:.2f} "
                f"| {pp['mean']:.3f} ± {pp['std']:.3f} |"
            )
    for path in sorted(p for p in os.listdir(figures) if p.startswith("casestudy") and p.endswith(".json")):
        r = json.load(open(os.path.join(figures, path)))
        out.append(
            "\n| 2-D case | test error (%) | test called fake | gap called fake | generated: inner / gap / outer / out |"
        )
        out.append("|---|---|---|---|---|")
        for k, v in r.items():
            d = v.get("diagnostics", {})
            g = d.get("generated_radius_fraction")
            cells = [
                f"{100 * v['test_error']:.2f}",
                f"{d['test_called_fake']:.2f}" if d else "",
                f"{d['gap_called_fake']:.2f}" if d else "",
                " / ".join(f"{g[b]:.2f}" for b in ("inner", "gap", "outer", "out")) if g else "",
            ]
            out.append(f"| {k} | " + " | ".join(cells) + " |")
    for path in sorted(p for p in os.listdir(figures) if p.startswith("diagnose") and p.endswith(".json")):
        r = json.load(open(os.path.join(figures, path)))
        keys = (
            "kl_disc_data",
            "disc_mass_off_support",
            "gen_mass_off_support",
            "energy_grad_norm",
            "entropy_grad_norm",
        )
        out.append(f"\n**{path}**\n\n| run | " + " | ".join(keys) + " | log σ of q |")
        out.append("|---" * (len(keys) + 2) + "|")
        for wd, d in r.items():
            ls = d.get("infer_log_sigma")
            cells = [f"{d[k]:.3g}" if k in d else "" for k in keys] + [", ".join(f"{v:.2f}" for v in ls) if ls else ""]
            out.append(f"| {os.path.basename(wd)} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _overrides(items: List[str]) -> Dict:
    out = {}
    for it in items:
        k, _, v = it.partition("=")
        if not _ or not k:
            raise SystemExit(f"--set {it!r}: expected KEY=VALUE")
        out[k] = v
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m xlgen.reproductions.gan")
    p.add_argument("experiment", choices=("cegan", "badgan", "casestudy", "probe", "diagnose", "tables"))
    p.add_argument("--out", default="workdirs/reproductions")
    p.add_argument("--figures", default=os.path.join(REPO, "docs", "reproductions", "gan"))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--data", default="", help="cegan: the 2-D sets (default all three); badgan: digits | idx")
    p.add_argument("--dir", default="/usr/share/datasets/fashion-mnist", help="badgan/probe: the IDX directory")
    p.add_argument("--variants", default=",".join(CEGAN_VARIANTS), help="cegan: the models")
    p.add_argument("--rows", default=",".join(BADGAN_ROWS), help="badgan: the rows")
    p.add_argument("--cases", default=",".join(CASES), help="casestudy: the cases")
    p.add_argument("--set", action="append", default=[], help="a config override KEY=VALUE (repeatable)")
    p.add_argument("--workdirs", default="", help="diagnose: comma-separated CEGAN 2-D workdirs")
    p.add_argument("--tag", default="", help="suffix of the JSON (and workdir) names")
    a = p.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    extra = _overrides(a.set)
    os.makedirs(a.figures, exist_ok=True)
    if a.experiment == "tables":
        print(markdown(a.figures))
        return 0
    if a.experiment == "cegan":
        sets = tuple((a.data or "mog4,biased_mog2,spirals").split(","))
        variants = tuple(a.variants.split(","))
        steps = a.steps or 2000
        res = cegan(a.out, seeds, steps, sets, variants, extra, a.tag)
        for data in sets:
            for v in variants:
                src = os.path.join(a.out, "cegan", f"{data}_{v}_s{seeds[0]}_{steps}{a.tag}", "eval", "energies.png")
                if os.path.exists(src):
                    shutil.copy(src, os.path.join(a.figures, f"cegan_{data}_{v}{a.tag}.png"))
    elif a.experiment == "badgan":
        data = a.data or "digits"
        rows = tuple(r for r in BADGAN_ROWS if r in a.rows.split(","))
        res = badgan(a.out, seeds, a.steps or 1500, data, a.dir if data == "idx" else "", rows, extra)
    elif a.experiment == "probe":
        res = probe(a.out, seeds, a.steps or 1000, a.dir, extra)
    elif a.experiment == "diagnose":
        res = {wd: cegan_diagnostics(wd) for wd in a.workdirs.split(",") if wd}
        for wd, r in res.items():
            print(wd, json.dumps(r), flush=True)
    else:
        res = casestudy(a.out, seeds, a.steps or 2000, a.figures, tuple(a.cases.split(",")), extra, a.tag)
    path = os.path.join(a.figures, f"{a.experiment}{a.tag}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
