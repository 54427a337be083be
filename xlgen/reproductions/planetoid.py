"""Planetoid's Table 3.6 layout on local stand-in graphs (docs/reproductions.md, "Planetoid").

    python -m xlgen.reproductions.planetoid [--out=DIR --figures=docs --seeds=0,1,2 --steps=3000]

The real Citeseer / Cora / Pubmed files are not in the repository. Stand-ins:
  digits  scikit-learn's 8x8 digits (1,797 nodes, 10 classes, 64 features) with a symmetric 10-nearest-neighbour
          graph over the pixels; per seed s a Planetoid split (20 labels per class, 1,000 test nodes, split seed s)
          written in Planetoid's release format and trained with the same command a user runs on the real files.
  karate  networkx's karate club (34 nodes, 78 edges, two factions, no features), 2 labels per faction, the other
          30 nodes tested: the -G setting only.
Per seed s, every trained method uses init seed s and batch-stream seed s. Results: <out>/planetoid.json and
<figures>/repro_planetoid_embeddings.png (t-SNE of the test nodes' embeddings, GraphEmb vs Planetoid-T/-I, seed 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(REPO, "configs", "ssl", "planetoid.py")
COMMON = {"mesh.num_devices": "1", "log_every_steps": "500", "checkpoint.every_steps": "100000"}
ROWS = [  # (method, inductive?) in Table 3.6's order
    ("Feat", True),
    ("Planetoid-I", True),
    ("LP", False),
    ("GraphEmb", False),
    ("Planetoid-G", False),
    ("Planetoid-T", False),
]


def _config(over: Dict[str, str]):
    from xlgen import config as config_lib

    return config_lib.load_config(CONFIG, {**COMMON, **over})


def _train_eval(workdir: str, over: Dict[str, str]) -> Dict:
    """`xlgen train` then `xlgen eval` in-process (a finished workdir is only re-evaluated)."""
    from xlgen import cli

    args = ["--config=" + CONFIG] + [f"--config.{k}={v}" for k, v in {**COMMON, **over}.items()]
    if cli.main(["train", *args, f"--workdir={workdir}"]) != 0 or cli.main(["eval", f"--workdir={workdir}"]) != 0:
        raise SystemExit(f"run failed: {workdir}")
    with open(os.path.join(workdir, "eval_results.json")) as f:
        return json.load(f)


def run_graph(name: str, directory: str, out: str, seed: int, steps: int, methods: List[str], extra) -> Dict:
    from xlgen.systems.planetoid import baselines, objective

    base = {
        "data.format": "planetoid",
        "data.dir": directory,
        "data.name": name,
        "seed": str(seed),
        "data.seed": str(seed),
        "total_steps": str(steps),
        **extra,
    }
    g = objective.graph_of(_config(base).data)
    res = {}
    for m in methods:
        t0 = time.time()
        if m == "Feat":
            res[m] = baselines.feat(g, seed)
        elif m == "LP":
            res[m] = baselines.label_propagation(g)
        elif m == "GraphEmb":
            res[m] = baselines.graph_embedding(_config(base), seed)
        else:
            v = m.split("-")[1]
            res[m] = _train_eval(os.path.join(out, f"{name}_{v}_seed{seed}"), {**base, "model.variant": v})["accuracy"]
        print(f"{name} seed {seed} {m}: {res[m]:.4f} ({time.time() - t0:.0f}s)", flush=True)
    return res


def plot(out: str, digits_dir: str, path: str, steps: int) -> None:
    """t-SNE of the test nodes' embeddings: GraphEmb-style (context steps only), Planetoid-T, Planetoid-I."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.manifold import TSNE

    from xlgen.systems.planetoid import objective
    from xlgen.train.workdir_model import restore_params

    panels = []
    for v in ("T", "I"):
        config, program, params, _ = restore_params(os.path.join(out, f"digits_{v}_seed0"))
        g = objective.graph_of(config.data)
        x = objective._features(g)[g.test]
        emb = np.asarray(program.make_model(params, train=False).embed(g.test, x))
        panels.append((f"Planetoid-{v}", emb, g.y[g.test]))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4.5))
    for ax, (title, emb, y) in zip(axes, panels):
        xy = TSNE(2, init="pca", random_state=0).fit_transform(emb)
        ax.scatter(xy[:, 0], xy[:, 1], c=y, cmap="tab10", s=5)
        ax.set_title(f"{title}: digits stand-in, test nodes (t-SNE)", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m xlgen.reproductions.planetoid")
    p.add_argument("--out", default="workdirs/reproductions/planetoid")
    p.add_argument("--figures", default="docs")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--karate_steps", type=int, default=1000)
    p.add_argument("--platform", default="cpu")
    args = p.parse_args(argv)
    from xlgen.platforms import setup_runtime

    setup_runtime(args.platform, "off")
    from xlgen.systems.planetoid import data as data_lib

    seeds = [int(s) for s in args.seeds.split(",")]
    os.makedirs(args.out, exist_ok=True)
    results: Dict[str, Dict[str, List[float]]] = {"digits": {}, "karate": {}}
    for s in seeds:
        d = os.path.join(args.out, "graphs", f"digits_split{s}")
        data_lib.write_release(d, "digits", data_lib.digits_knn_graph(k=10, seed=s))
        r = run_graph("digits", d, args.out, s, args.steps, [m for m, _ in ROWS], {})
        for m, v in r.items():
            results["digits"].setdefault(m, []).append(v)
        k = os.path.join(args.out, "graphs", f"karate_split{s}")
        data_lib.write_release(k, "karate", data_lib.karate_graph(labels_per_class=2, seed=s))
        small = {"data.pretrain_steps": "300", "data.eval_batch_size": "30", "data.r2": "0.8"}
        r = run_graph("karate", k, args.out, s, args.karate_steps, ["LP", "GraphEmb", "Planetoid-G"], small)
        for m, v in r.items():
            results["karate"].setdefault(m, []).append(v)
    summary = {
        graph: {m: {"mean": float(np.mean(v)), "std": float(np.std(v)), "runs": v} for m, v in rows.items()}
        for graph, rows in results.items()
    }
    summary["settings"] = {"seeds": seeds, "steps": args.steps, "karate_steps": args.karate_steps}
    with open(os.path.join(args.out, "planetoid.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    print(table(summary))
    plot(args.out, "", os.path.join(args.figures, "repro_planetoid_embeddings.png"), args.steps)
    return 0


def table(summary) -> str:
    lines = ["| Method | digits kNN (stand-in) | karate (-G stand-in) |", "|---|---|---|"]
    for m, inductive in ROWS:
        cells = []
        for graph in ("digits", "karate"):
            r = summary[graph].get(m)
            cells.append(f"{r['mean']:.3f} ± {r['std']:.3f}" if r else "–")
        lines.append(f"| {m} | {' | '.join(cells)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
