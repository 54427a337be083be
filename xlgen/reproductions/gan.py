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
from typing import Dict, List

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
    """Train (resuming if the workdir has checkpoints) and evaluate; returns eval_results."""
    from xlgen import config as config_lib
    from xlgen.train import loop

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


def cegan(out: str, seeds: List[int], steps: int, sets=("mog4", "biased_mog2", "spirals")) -> Dict:
    runs, table = {}, {}
    for data in sets:
        for variant in ("gan", "egan_const", "egan_ent_vi", "egan_ent_nn"):
            for s in seeds:
                wd = os.path.join(out, "cegan", f"{data}_{variant}_s{s}_{steps}")
                over = {
                    "model.variant": variant,
                    "data.name": data,
                    "seed": s,
                    "data.seed": s,
                    "total_steps": steps,
                    "checkpoint.every_steps": steps,
                }
                runs[f"{data}/{variant}/{s}"] = run_one("configs/gan/cegan.py", over, wd)
            table.setdefault(data, {})[variant] = {
                p: mean_std([runs[f"{data}/{variant}/{s}"][f"kl_{p}"] for s in seeds]) for p in PAIRS
            }
    return {"steps": steps, "seeds": seeds, "runs": runs, "table": table, "paper": PAPER_B2}


BADGAN_ROWS = {
    "supervised": {"model.variant": "supervised"},
    "FM": {"model.variant": "fm"},
    "FM+PT": {"model.variant": "badgan", "model.ent_weight": 0.0, "model.ld_weight": 0.0},
    "FM+LD": {"model.variant": "badgan", "model.ent_weight": 0.0, "model.pt_weight": 0.0},
    "FM+Ent": {"model.variant": "badgan", "model.pt_weight": 0.0, "model.ld_weight": 0.0},
    "FM+PT+LD+Ent (full)": {"model.variant": "badgan"},
}


def badgan(out: str, seeds: List[int], steps: int) -> Dict:
    runs, table = {}, {}
    for row, over in BADGAN_ROWS.items():
        errs = []
        for s in seeds:
            tag = row.replace("+", "_").replace(" ", "").replace("(", "").replace(")", "")
            wd = os.path.join(out, "badgan", f"digits_{tag}_s{s}")
            o = {
                **over,
                "data.name": "digits",
                "data.num_labeled": 100,
                "seed": s,
                "data.seed": s,
                "total_steps": steps,
                "checkpoint.every_steps": steps,
            }
            rec = run_one("configs/gan/badgan.py", o, wd)
            runs[f"{row}/{s}"] = rec
            errs.append(rec["test_error"])
        table[row] = mean_std(errs)
    return {
        "steps": steps,
        "seeds": seeds,
        "dataset": "sklearn digits 8x8 (1,300 train / 497 test), 100 labels",
        "runs": runs,
        "test_error": table,
    }


def casestudy(out: str, seeds: List[int], steps: int, figures: str) -> Dict:
    res = {}
    cases = {
        "four_spins_complement": {"data.name": "four_spins", "model.generator": "complement", "data.num_labeled": 8},
        "four_spins_fm": {"data.name": "four_spins", "model.variant": "fm", "data.num_labeled": 8},
        "two_circles_fm": {"data.name": "two_circles", "model.variant": "fm", "data.num_labeled": 4},
        "four_spins_supervised": {"data.name": "four_spins", "model.variant": "supervised", "data.num_labeled": 8},
    }
    small = {
        "model.disc_hidden": (128, 128),
        "model.gen_hidden": (128, 128),
        "model.noise_dim": 4,
        "model.input_noise": 0.0,
        "model.hidden_noise": 0.0,
        "data.batch_size": 200,
    }
    for name, over in cases.items():
        wd = os.path.join(out, "casestudy", name)
        rec = run_one(
            "configs/gan/badgan.py", {**small, **over, "total_steps": steps, "checkpoint.every_steps": steps}, wd
        )
        res[name] = rec
        src = os.path.join(wd, "eval", "case_study.png")
        if os.path.exists(src):
            shutil.copy(src, os.path.join(figures, f"case_{name}.png"))
    return res


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
    path = os.path.join(figures, "badgan.json")
    if os.path.exists(path):
        r = json.load(open(path))
        out.append(f"\n**{r['dataset']}** ({len(r['seeds'])} seeds, {r['steps']} steps)\n")
        out.append("| setting | test error (%) mean ± std | errors of 497 |")
        out.append("|---|---|---|")
        for row in [k for k in BADGAN_ROWS if k in r["test_error"]]:
            m, sd = r["test_error"][row]
            out.append(f"| {row} | {100 * m:.2f} ± {100 * sd:.2f} | {m * 497:.1f} |")
    path = os.path.join(figures, "casestudy.json")
    if os.path.exists(path):
        r = json.load(open(path))
        out.append("\n| 2-D case | test error (%) |\n|---|---|")
        for k, v in r.items():
            out.append(f"| {k} | {100 * v['test_error']:.2f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m xlgen.reproductions.gan")
    p.add_argument("experiment", choices=("cegan", "badgan", "casestudy", "tables"))
    p.add_argument("--out", default="workdirs/reproductions")
    p.add_argument("--figures", default=os.path.join(REPO, "docs", "reproductions", "gan"))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--data", default="mog4,biased_mog2,spirals", help="cegan: the 2-D sets")
    p.add_argument("--tag", default="", help="suffix of the JSON file name")
    a = p.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    os.makedirs(a.figures, exist_ok=True)
    if a.experiment == "tables":
        print(markdown(a.figures))
        return 0
    if a.experiment == "cegan":
        sets = tuple(a.data.split(","))
        steps = a.steps or 2000
        res = cegan(a.out, seeds, steps, sets)
        for data in sets:
            for v in ("gan", "egan_const", "egan_ent_vi", "egan_ent_nn"):
                src = os.path.join(a.out, "cegan", f"{data}_{v}_s{seeds[0]}_{steps}", "eval", "energies.png")
                if os.path.exists(src):
                    shutil.copy(src, os.path.join(a.figures, f"cegan_{data}_{v}{a.tag}.png"))
    elif a.experiment == "badgan":
        res = badgan(a.out, seeds, a.steps or 1500)
    else:
        res = casestudy(a.out, seeds, a.steps or 2000, a.figures)
    path = os.path.join(a.figures, f"{a.experiment}{a.tag}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
