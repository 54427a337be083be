"""Adam vs LAMB at a large batch on CPU: the same tiny XLNet, the same steps (docs/training.md, "Large-batch
optimizers").

    python -m xlgen.reproductions.large_batch [--out=docs/reproductions/large_batch.json] [--seeds=0,1]
                                              [--steps=150] [--batch_size=128]

`configs/pretrain/xlnet_tiny.py` (2 layers, d_model 64, character-level tinyshakespeare) at a global batch of
`batch_size` rows (16x the config's 8) for `steps` updates, warm-up 10% then linear decay, clipping at global norm 1,
weight decay 0.01; per arm (optimizer, peak learning rate) and seed one `xlgen train` run on one CPU device. Reported:
the training loss of the last logged step and the validation loss of the evaluation at the last step (10 batches),
per run and as the mean over seeds. The arms: AdamW at the config's 1e-3 (tuned at batch 8) and at 4e-3 (√16
scaling), LAMB at 4e-3 and 1e-2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List

from data_pipelines import paths

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARMS = (("adamw", 1e-3), ("adamw", 4e-3), ("lamb", 4e-3), ("lamb", 1e-2))


def run(name: str, lr: float, seed: int, steps: int, batch: int, workdir: str) -> Dict[str, float]:
    over = {
        "optimizer.name": name,
        "optimizer.learning_rate": lr,
        "optimizer.warmup_steps": max(1, steps // 10),
        "data.batch_size": batch,
        "total_steps": steps,
        "eval_every_steps": steps,
        "log_every_steps": 10,
        "checkpoint.every_steps": steps,
        "mesh.num_devices": 1,
        "seed": seed,
        "data.seed": seed,
    }
    cmd = [
        sys.executable,
        "-m",
        "xlgen.cli",
        "train",
        f"--config={REPO}/configs/pretrain/xlnet_tiny.py",
        f"--workdir={workdir}",
        *[f"--config.{k}={v}" for k, v in over.items()],
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-3000:]}")
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    from xlgen.train.metrics import record_kind

    train = [r for r in recs if record_kind(r) == "train"]
    evals = [r for r in recs if record_kind(r) == "eval" and r["step"] == steps]
    return {"train_loss": float(train[-1]["loss"]), "valid_loss": float(evals[-1]["loss"])}


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "reproductions", "large_batch.json"))
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch_size", type=int, default=128)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, lr in ARMS:
            for seed in seeds:
                wd = os.path.join(tmp, f"{name}_{lr:g}_{seed}")
                r = run(name, lr, seed, args.steps, args.batch_size, wd)
                runs.append({"optimizer": name, "learning_rate": lr, "seed": seed, **r})
                print(json.dumps(runs[-1]), flush=True)
    arms = []
    for name, lr in ARMS:
        mine = [r for r in runs if r["optimizer"] == name and r["learning_rate"] == lr]
        arms.append(
            {
                "optimizer": name,
                "learning_rate": lr,
                "mean_train_loss": sum(r["train_loss"] for r in mine) / len(mine),
                "mean_valid_loss": sum(r["valid_loss"] for r in mine) / len(mine),
            }
        )
    result = {
        "config": "configs/pretrain/xlnet_tiny.py",
        "batch_size": args.batch_size,
        "steps": args.steps,
        "seeds": seeds,
        "runs": runs,
        "arms": arms,
    }
    paths.write_json_atomic(args.out, result)
    for a in arms:
        print(
            f"{a['optimizer']:<6} lr {a['learning_rate']:<6g} train {a['mean_train_loss']:.4f} "
            f"valid {a['mean_valid_loss']:.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
