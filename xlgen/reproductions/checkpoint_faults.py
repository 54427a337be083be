"""Checkpoint fault sweep (issue 30): flip one byte, or write 4 KB of garbage, at evenly spaced offsets of the newest
checkpoint's OCDBT data files, then run `xlgen eval --workdir` from a given source tree and classify what it did.

    python -m xlgen.reproductions.checkpoint_faults [--tree=DIR] [--flips=8] [--label=NAME] [--out=DIR]

One tiny Transformer-XL run (`configs/pretrain/txl_tiny.py` shrunk as in tests/test_train_utils.py, 4 steps,
checkpoints 2 and 4) is trained with `--tree`'s code; each fault is applied to a fresh copy of it. Outcomes:

  detected   eval fell back to step 2 with a warning naming step 4 (nothing silently wrong)
  silent     eval reported step 4 with a loss that differs from the clean run's (silently wrong)
  unchanged  eval reported step 4 with the clean loss (the bytes did not matter)
  error      eval exited non-zero
and, for every fault, whether a file of checkpoints/ changed (a reader moving a checkpoint aside).
The JSON goes to `<out>/checkpoint_faults_<label>.json` (default out: docs/reproductions).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = {
    "total_steps": 4,
    "checkpoint.every_steps": 2,
    "checkpoint.keep": 2,
    "eval.steps": 2,
    "mesh.data": 1,
    "log_every_steps": 1,
    "eval_every_steps": 0,
    "tensorboard": False,
    "model.d_model": 32,
    "model.d_embed": 32,
    "model.n_head": 2,
    "model.d_head": 16,
    "model.d_inner": 64,
    "model.mem_len": 16,
    "data.batch_size": 8,
    "data.tgt_len": 16,
    "data.eval_batch_size": 8,
    "data.eval_tgt_len": 16,
}


def _env(tree: str, cache: str) -> dict:
    env = dict(os.environ)
    env.update(
        JAX_PLATFORMS="cpu",
        XLGEN_COMPILATION_CACHE=cache,
        XLGEN_COMPILATION_CACHE_MIN_SECS="0",
        XLA_FLAGS="--xla_force_host_platform_device_count=1 --xla_backend_optimization_level=0",
        PYTHONPATH=tree,
    )
    return env


def _xlgen(tree: str, cache: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xlgen.cli", *args], env=_env(tree, cache), cwd=tree, capture_output=True, text=True
    )


def _snapshot(root: str) -> dict:
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                out[os.path.relpath(os.path.join(d, f), root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def _eval(tree: str, cache: str, wd: str):
    p = _xlgen(tree, cache, "eval", f"--workdir={wd}")
    if p.returncode != 0:
        return None, None, p
    first = p.stdout.strip().splitlines()[-1].split()
    vals = dict(zip(first[1::2], first[2::2]))
    return int(vals["step"]), float(vals["loss"]), p


def sweep(tree: str, flips: int, work: str) -> dict:
    cache = os.path.join(work, "cache")
    base = os.path.join(work, "base")
    train = ["train", f"--config={tree}/configs/pretrain/txl_tiny.py", f"--workdir={base}"]
    p = _xlgen(tree, cache, *train, *[f"--config.{k}={v}" for k, v in TINY.items()])
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    step, clean_loss, _ = _eval(tree, cache, base)
    assert step == 4, step
    state = os.path.join(base, "checkpoints", "4", "state")
    data = sorted(
        os.path.relpath(os.path.join(d, f), base)
        for d, _, fs in os.walk(state)
        for f in fs
        if os.sep + "d" + os.sep in d + os.sep
    )
    results = []
    for kind in ("flip", "garbage"):
        for rel in data:
            size = os.path.getsize(os.path.join(base, rel))
            n = flips if kind == "flip" else 1
            for i in range(n):
                wd = os.path.join(work, f"{kind}-{len(results)}")
                shutil.copytree(base, wd)
                path = os.path.join(wd, rel)
                with open(path, "r+b") as f:
                    buf = bytearray(f.read())
                    off = (i + 1) * size // (n + 1)
                    if kind == "flip":
                        buf[off] ^= 0x10
                    else:
                        off = max(0, min(off, size - 4096))
                        buf[off : off + 4096] = os.urandom(min(4096, size))
                    f.seek(0)
                    f.write(buf)
                before = _snapshot(os.path.join(wd, "checkpoints"))
                step, loss, p = _eval(tree, cache, wd)
                changed = _snapshot(os.path.join(wd, "checkpoints")) != before
                if step is None:
                    outcome = "error"
                elif step == 2 and "checkpoints/4" in p.stderr:
                    outcome = "detected"
                elif step == 4 and loss != clean_loss:
                    outcome = "silent"
                elif step == 4:
                    outcome = "unchanged"
                else:
                    outcome = "other"
                results.append(
                    {"kind": kind, "file": rel, "size": size, "offset": off, "outcome": outcome, "moved": changed}
                )
                shutil.rmtree(wd)
                print(f"{kind} {rel}@{off}: {outcome}{' (checkpoints changed)' if changed else ''}", flush=True)
    counts = {}
    for r in results:
        key = f"{r['kind']}:{r['outcome']}"
        counts[key] = counts.get(key, 0) + 1
    counts["reader_moved_files"] = sum(r["moved"] for r in results)
    return {"tree": tree, "clean_loss": clean_loss, "counts": counts, "results": results}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m xlgen.reproductions.checkpoint_faults", description=__doc__)
    p.add_argument("--tree", default=REPO, help="source tree whose xlgen runs (default: this one)")
    p.add_argument("--flips", type=int, default=8, help="byte flips per data file")
    p.add_argument("--label", default="after")
    p.add_argument("--out", default=os.path.join(REPO, "docs", "reproductions"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        out = sweep(os.path.abspath(args.tree), args.flips, work)
    out["label"] = args.label
    path = os.path.join(args.out, f"checkpoint_faults_{args.label}.json")
    os.makedirs(args.out, exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out["counts"]), f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
