"""What a run tells its user: the start-of-run block and `summary.json` at its end.

    start_block(config, program, mesh, pipeline, workdir, start)   -> text printed before compiling
    Throughput                                                        steady-state tokens/s of this invocation
    write_summary(workdir, ...)                                       -> workdir/summary.json (atomic)

summary.json: {"parameters", "trainable_parameters" (those the optimizer updates: fewer than "parameters" when some
are frozen, `finetune.freeze` / LoRA), "steps", "start_step", "tokens_per_step", "tokens_seen", "wall_time_s",
"tokens_per_sec", "model_flops_per_sec", "mfu" (null unless config.peak_flops_per_device is set), "last_eval",
"best_eval" (lowest eval loss over the whole metrics.jsonl), "last_train", "family", "objective", and the goodput
ledger's (xlgen/train/goodput.py) cumulative "goodput" (0-1), "time_s" {productive, compile, data, checkpoint, eval,
lost_to_restarts, idle}, "attempts", "lost_steps", plus "stragglers" (steps of this attempt in slow windows)}.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Optional

from data_pipelines import paths

SUMMARY = "summary.json"


def parameter_count(program) -> int:
    return int(sum(math.prod(s) for s in program.train_spec.shapes.values()))


def trainable_parameter_count(program) -> int:
    frozen = getattr(program, "frozen", None) or ()
    return int(sum(math.prod(s) for n, s in program.train_spec.shapes.items() if n not in frozen))


def _dataset_tokens(pipeline) -> Optional[int]:
    corpus = getattr(pipeline, "corpus", None)
    n = getattr(corpus, "num_tokens", None)
    return int(n) if n is not None else None


def start_block(config, program, mesh, pipeline, workdir: str, start: int) -> str:
    """Parameters, tokens per step, dataset size, devices and mesh, in one block."""
    import jax

    total = int(config.total_steps)
    tps = int(program.tokens_per_step)
    family = config.model.family
    objective = getattr(program.objective, "name", None) or config.get("objective") or "default"
    lines = [f"xlgen train: {family} ({objective} objective), {parameter_count(program):,} parameters"]
    if getattr(program, "frozen", None):
        lines[0] += f" ({trainable_parameter_count(program):,} trainable)"
    n_tok = _dataset_tokens(pipeline)
    data = f"{tps:,} tokens/step"
    if n_tok:
        data = f"{n_tok:,} training tokens ({config.data.get('source', '')}); " + data
        data += f"; {total} steps = {total * tps / n_tok:.2f} passes over the data"
    lines.append(f"  data      {data}")
    dev = mesh.devices.flat[0]
    axes = " ".join(f"{k}={v}" for k, v in mesh.shape.items())
    lines.append(
        f"  devices   {mesh.devices.size} x {dev.platform} ({jax.process_count()} process"
        f"{'es' if jax.process_count() > 1 else ''}); mesh {axes} (rules {config.mesh.get('rules', '')}"
        + (f"; data over {slices} slices)" if (slices := int(config.mesh.get("num_slices", 1) or 1)) > 1 else ")")
    )
    lines.append(f"  steps     {start} -> {total}" + (" (resuming)" if start else ""))
    lines.append(f"  workdir   {workdir}")
    return "\n".join(lines)


class Throughput:
    """Steps and seconds of the timed training windows (compilation and evaluations excluded)."""

    def __init__(self):
        self.steps = 0
        self.seconds = 0.0

    def add(self, steps: int, seconds: float) -> None:
        self.steps += int(steps)
        self.seconds += float(seconds)

    def steps_per_sec(self) -> Optional[float]:
        return self.steps / self.seconds if self.steps and self.seconds > 0 else None


def _evals(workdir: str):
    from xlgen.train import metrics as metrics_lib

    p = paths.join(workdir, "metrics.jsonl")
    if not paths.as_path(p).exists():
        return []
    return [r for r in metrics_lib.read_metrics(p) if "split" in r]


def read_summary(workdir: str) -> Optional[Dict[str, Any]]:
    """The workdir's summary.json, None if there is none (or it is unreadable)."""
    try:
        return json.loads(paths.read_text(paths.join(workdir, SUMMARY)))
    except (OSError, ValueError):
        return None


def write_summary(
    workdir: str,
    config,
    program,
    *,
    step: int,
    start: int,
    wall_time_s: float,
    throughput: Throughput,
    last_train: Optional[Dict[str, Any]],
    n_devices: int,
    extra: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    tps = int(program.tokens_per_step)
    sps = throughput.steps_per_sec()
    flops = float(program.analytic_flops_per_step or 0.0)
    peak = float(config.get("peak_flops_per_device", 0.0) or 0.0)
    evals = [r for r in _evals(workdir) if isinstance(r.get("loss"), (int, float))]
    out = {
        "family": config.model.family,
        "objective": getattr(program.objective, "name", None) or config.get("objective") or "",
        "parameters": parameter_count(program),
        "trainable_parameters": trainable_parameter_count(program),
        "steps": int(step),
        "start_step": int(start),
        "total_steps": int(config.total_steps),
        "tokens_per_step": tps,
        "tokens_seen": int(step) * tps,
        "wall_time_s": round(float(wall_time_s), 3),
        "steps_per_sec": sps,
        "tokens_per_sec": sps * tps if sps else None,
        "model_flops_per_sec": sps * flops if sps and flops else None,
        "mfu": sps * flops / (n_devices * peak) if sps and flops and peak > 0 else None,
        "last_eval": evals[-1] if evals else None,
        "best_eval": min(evals, key=lambda r: r["loss"]) if evals else None,
        "last_train": last_train,
        **(extra or {}),
    }
    paths.atomic_write_text(paths.join(workdir, SUMMARY), json.dumps(out, indent=2) + "\n")
    return out
