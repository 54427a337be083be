"""Host memory of one finetuning step: full finetuning vs frozen layers vs LoRA (docs/finetuning.md).

    python -m xlgen.reproductions.peft_memory [--out=docs/reproductions/peft_memory.json] [--d_model=512 ...]

Each setting runs in its own process (so one's allocations never count for another) on one CPU device: an XLNet
sequence classifier (d_model 512, 6 layers, vocab 32000: ~37M parameters; flags change it) built by the
finetuning objective from `configs/finetune/tiny.py` with overrides, its train step compiled and run 3 times on a
fixed batch. Reported per setting: the compiled step's `memory_analysis()` (arguments + outputs - aliased +
temporaries: the buffers live during the step), the train state's bytes (parameters, optimizer state, frozen base),
and the process's peak resident set (`resource.getrusage(RUSAGE_SELF).ru_maxrss`, compilation included) measured
before and after the steps.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETTINGS = {
    "full": {},
    "freeze_embeddings_and_half_the_layers": {"finetune.freeze": r"^transformer[.](word_embedding|layers[.][0-2][.])"},
    "lora_r8": {"finetune.lora.rank": "8", "finetune.lora.alpha": "16"},
}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def worker(setting: str, dims: Dict[str, str]) -> Dict[str, float]:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import numpy as np

    from xlgen import finetune as ft
    from xlgen import sharding
    from xlgen.train.program import build_program

    over = {
        "task": "glue/sst2",
        "mesh.num_devices": "1",
        "model.vocab_size": dims["vocab_size"],
        "model.d_model": dims["d_model"],
        "model.n_layer": dims["n_layer"],
        "model.n_head": dims["n_head"],
        "model.d_head": str(int(dims["d_model"]) // int(dims["n_head"])),
        "model.d_inner": str(4 * int(dims["d_model"])),
        "data.max_seq_length": dims["seq"],
        "data.batch_size": dims["batch"],
        **SETTINGS[setting],
    }
    cfg = ft.load_finetune_config(os.path.join(REPO, "configs", "finetune", "tiny.py"), over, "")
    program = build_program(cfg, sharding.make_mesh(cfg.mesh))
    b, L = int(dims["batch"]), int(dims["seq"])
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(5, int(dims["vocab_size"]), size=(b, L)).astype(np.int32),
        "token_type_ids": np.zeros((b, L), np.int32),
        "attention_mask": np.ones((b, L), np.int32),
        "labels": rng.integers(0, 2, size=b).astype(np.int32),
    }
    with jax.set_mesh(program.mesh):
        state, mems = program.init_state()
        batch = jax.device_put(batch, program.batch_shardings)
        compiled = program.train_step.lower(state, batch, mems).compile()
        ma = compiled.memory_analysis()
        step_bytes = (
            ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes + ma.temp_size_in_bytes
        )
        nbytes = lambda tree: int(sum(x.nbytes for x in jax.tree.leaves(tree)))
        out = {
            "parameters": int(sum(x.size for x in jax.tree.leaves(program.params_of(state)))),
            "trainable_parameters": int(sum(x.size for x in jax.tree.leaves(state["params"]))),
            "state_mb": {
                "trainable_params": nbytes(state["params"]) / 2**20,
                "frozen_params": nbytes(state.get("frozen", {})) / 2**20,
                "optimizer_state": nbytes(state["opt_state"]) / 2**20,
            },
            "step_buffers_mb": step_bytes / 2**20,
            "step_temp_mb": ma.temp_size_in_bytes / 2**20,
            "peak_rss_mb_before_steps": _peak_rss_mb(),
        }
        for _ in range(3):
            state, mems, metrics = compiled(state, batch, mems)
        jax.block_until_ready(metrics["loss"])
    out["peak_rss_mb"] = _peak_rss_mb()
    out["loss"] = float(metrics["loss"])
    return out


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(REPO, "docs", "reproductions", "peft_memory.json"))
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    for k, v in dict(vocab_size=32000, d_model=512, n_layer=6, n_head=8, seq=128, batch=8).items():
        p.add_argument(f"--{k}", default=str(v))
    args = p.parse_args(argv)
    dims = {k: getattr(args, k) for k in ("vocab_size", "d_model", "n_layer", "n_head", "seq", "batch")}
    if args.worker:
        print(json.dumps(worker(args.worker, dims)))
        return 0
    results = {}
    for setting in SETTINGS:
        cmd = [sys.executable, "-m", "xlgen.reproductions.peft_memory", f"--worker={setting}"]
        cmd += [f"--{k}={v}" for k, v in dims.items()]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        results[setting] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = results[setting]
        print(
            f"{setting:40s} trainable {r['trainable_parameters']:>11,} / {r['parameters']:,}   "
            f"step buffers {r['step_buffers_mb']:8.1f} MB   optimizer state {r['state_mb']['optimizer_state']:7.1f} MB"
            f"   peak RSS {r['peak_rss_mb']:8.1f} MB",
            flush=True,
        )
    full, lo = results["full"], results["lora_r8"]
    print(
        f"LoRA / full: step buffers {lo['step_buffers_mb'] / full['step_buffers_mb']:.2f}, "
        f"peak RSS {lo['peak_rss_mb'] / full['peak_rss_mb']:.2f}"
    )
    from data_pipelines import paths

    paths.atomic_write_text(args.out, json.dumps({"dims": dims, "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
