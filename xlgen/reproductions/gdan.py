"""GDAN's Table 3.4 layout on the local stand-in data (docs/reproductions.md, "GDAN").

    python -m xlgen.reproductions.gdan [--out=DIR --rates=0.1,0.5 --seeds=0,1,2 --methods=... --steps=N]

The real SQuAD files are not in the repository. Stand-in: `xlgen.systems.gdan.standin` (templated facts; names from
tinyshakespeare's speakers and capitalised words, objects and filler sentences from PTB's validation text), 60
articles of labeled questions and 1,000 unlabeled paragraphs, written once to <out>/data. Every row is the contract
command (in-process): `xlgen train --config=configs/ssl/gdan.py --config.method=M --config.data.labeled=...
--config.data.unlabeled=... --config.data.labeling_rate=R`, then `xlgen eval`; per seed s the reader's and the
generator's initialisation (`seed`) and the batch stream (`data.seed`) are s; the article split is fixed
(split_seed 0). Results: <out>/gdan.json (every run's test / dev EM and F1, mean and std per row), merged into the
file when it exists (runs can be split over several invocations); a finished workdir is only re-evaluated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(REPO, "configs", "ssl", "gdan.py")
TEXT = "/work/shared/data/text"
ROWS = [  # (config.method, Table 3.4's name)
    ("sl", "SL"),
    ("context", "Context"),
    ("context_domain", "Context + domain"),
    ("gen", "Gen"),
    ("gen_domain", "Gen + domain"),
    ("gen_domain_adv", "Gen + domain + adv"),
]
THESIS = {  # Table 3.4, |U| = 50K: (dev F1, test F1, test EM)
    0.1: {"sl": (0.4262, 0.3815, 0.2492), "context": (0.5046, 0.4515, 0.2966),
          "context_domain": (0.5139, 0.4575, 0.3036), "gen": (0.5049, 0.4553, 0.3018),
          "gen_domain": (0.5234, 0.4703, 0.3145), "gen_domain_adv": (0.5313, 0.4802, 0.3218)},
    0.5: {"sl": (0.6280, 0.5722, 0.4187), "context": (0.6300, 0.5740, 0.4195),
          "context_domain": (0.6307, 0.5791, 0.4237), "gen": (0.6237, 0.5717, 0.4155),
          "gen_domain": (0.6378, 0.5826, 0.4261), "gen_domain_adv": (0.6375, 0.5831, 0.4267)},
}  # fmt: skip


def train_eval(workdir: str, over: Dict[str, str]) -> Dict:
    """`xlgen train` then `xlgen eval` in-process."""
    from xlgen import cli

    args = ["--config=" + CONFIG] + [f"--config.{k}={v}" for k, v in over.items()]
    if cli.main(["train", *args, f"--workdir={workdir}"]) != 0 or cli.main(["eval", f"--workdir={workdir}"]) != 0:
        raise SystemExit(f"run failed: {workdir}")
    with open(os.path.join(workdir, "eval_results.json")) as f:
        return json.load(f)


def summarise(runs: Dict) -> Dict:
    out = {}
    for key, per_seed in runs.items():
        vals = list(per_seed.values())
        out[key] = {
            m: {"mean": float(np.mean([v[m] for v in vals])), "std": float(np.std([v[m] for v in vals]))}
            for m in ("f1", "exact", "dev_f1", "dev_exact")
        }
        out[key]["seeds"] = sorted(int(s) for s in per_seed)
    return out


def table(summary: Dict, rates) -> str:
    lines = [
        "| Labeling rate | Method | Dev F1 | Test F1 | Test EM | thesis (50K unlabeled): Dev F1 / Test F1 / Test EM |",
        "|---|---|---|---|---|---|",
    ]
    for r in rates:
        for m, name in ROWS:
            s = summary.get(f"{r}/{m}")
            if s is None:
                continue
            cell = lambda k: f"{s[k]['mean'] / 100:.4f} ± {s[k]['std'] / 100:.4f}"  # noqa: E731
            th = THESIS.get(float(r), {}).get(m)
            ths = " / ".join(f"{v:.4f}" for v in th) if th else "–"
            lines.append(f"| {r} | {name} | {cell('dev_f1')} | {cell('f1')} | {cell('exact')} | {ths} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m xlgen.reproductions.gdan")
    p.add_argument("--out", default="workdirs/reproductions/gdan")
    p.add_argument("--rates", default="0.1,0.5")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--methods", default=",".join(m for m, _ in ROWS))
    p.add_argument("--steps", type=int, default=0, help="total_steps (0: the config's)")
    p.add_argument("--articles", type=int, default=60)
    p.add_argument("--paragraphs", type=int, default=1000)
    p.add_argument("--result", default="", help="results JSON (default <out>/gdan.json)")
    p.add_argument("--platform", default="cpu")
    p.add_argument("--set", action="append", default=[], help="extra K=V config overrides")
    args = p.parse_args(argv)
    from xlgen.platforms import setup_runtime

    setup_runtime(args.platform, "off")
    from xlgen.systems.gdan import standin

    data = os.path.join(args.out, "data")
    if not os.path.exists(os.path.join(data, "unlabeled.txt")):
        standin.generate(
            data,
            names=os.path.join(TEXT, "tinyshakespeare.txt"),
            filler=os.path.join(TEXT, "ptb.valid.txt"),
            articles=args.articles,
            unlabeled=args.paragraphs,
            seed=0,
        )
    result = args.result or os.path.join(args.out, "gdan.json")
    doc = json.load(open(result)) if os.path.exists(result) else {"runs": {}}
    extra = dict(kv.split("=", 1) for kv in args.set)
    if args.steps:
        extra["total_steps"] = str(args.steps)
    rates = args.rates.split(",")
    for s in args.seeds.split(","):  # seed outermost: an interrupted run has every row of the first seeds
        for r in rates:
            for m in args.methods.split(","):
                over = {
                    "method": m,
                    "data.labeled": os.path.join(data, "squad.json"),
                    "data.unlabeled": os.path.join(data, "unlabeled.txt"),
                    "data.labeling_rate": r,
                    "seed": s,
                    "data.seed": s,
                    "mesh.num_devices": "1",
                    "log_every_steps": "100",
                    "checkpoint.every_steps": "100000",
                    **extra,
                }
                t0 = time.time()
                res = train_eval(os.path.join(args.out, "runs", f"rate{r}_{m}_seed{s}"), over)
                res["seconds"] = round(time.time() - t0, 1)
                doc["runs"].setdefault(f"{r}/{m}", {})[s] = res
                print(
                    f"rate {r} {m} seed {s}: F1 {res['f1']:.2f} EM {res['exact']:.2f} ({res['seconds']:.0f}s)",
                    flush=True,
                )
                doc["summary"] = summarise(doc["runs"])
                doc["settings"] = {"articles": args.articles, "paragraphs": args.paragraphs, "overrides": extra}
                tmp = result + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(doc, f, indent=2, sort_keys=True)
                os.replace(tmp, result)
    all_rates = sorted({k.split("/")[0] for k in doc["summary"]}, key=float)
    print(table(doc["summary"], all_rates))
    return 0


if __name__ == "__main__":
    sys.exit(main())
