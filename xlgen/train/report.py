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

import dataclasses
import json
import math
from typing import Any, Callable, Dict, Optional, Tuple

from data_pipelines import paths

SUMMARY = "summary.json"


def parameter_count(program) -> int:
    return int(sum(math.prod(s) for s in program.param_shapes.values()))


def trainable_parameter_count(program) -> int:
    frozen = getattr(program, "frozen", None) or ()
    return int(sum(math.prod(s) for n, s in program.param_shapes.items() if n not in frozen))


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
    objective = program.objective.name or config.objective or "default"
    lines = [f"xlgen train: {family} ({objective} objective), {parameter_count(program):,} parameters"]
    if getattr(program, "frozen", None):
        lines[0] += f" ({trainable_parameter_count(program):,} trainable)"
    n_tok = _dataset_tokens(pipeline)
    data = f"{tps:,} {unit(config)}/step"
    if n_tok:
        data = f"{n_tok:,} training tokens ({config.data.get('source', '')}); " + data
        data += f"; {total} steps = {total * tps / n_tok:.2f} passes over the data"
    lines.append(f"  data      {data}")
    dev = mesh.devices.flat[0]
    axes = " ".join(f"{k}={v}" for k, v in mesh.shape.items())
    lines.append(
        f"  devices   {mesh.devices.size} x {dev.platform} ({jax.process_count()} process"
        f"{'es' if jax.process_count() > 1 else ''}); mesh {axes} (rules {config.mesh.rules}"
        + (f"; data over {slices} slices)" if (slices := int(config.mesh.num_slices)) > 1 else ")")
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
    return [r for r in metrics_lib.read_metrics(p) if metrics_lib.record_kind(r) == "eval"]


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
    peak = float(config.peak_flops_per_device)
    evals = [r for r in _evals(workdir) if isinstance(r.get("loss"), (int, float))]
    out = {
        "family": config.model.family,
        "objective": program.objective.name or config.objective,
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


# ----------------------------------------------------------------------------------------------------------------
# What a system reports (its `Reporting` record): units, learning rates, extend advice, shown keys
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Reporting:
    """How `xlgen train` / `xlgen config show` report a system's runs, a record in `Family.records`
    (`xlgen.registry`); a system without one reports as a language model does (these defaults).

        unit            what `Objective.tokens_per_step` counts: logs print `<unit>/step`, `<unit>/s`
        learning_rates  (config, total_steps) -> {player: step -> learning rate}: the schedules that train the
                        system (a game's players); None = `config.optimizer`'s schedule (xlgen/optim.py), which
                        the end-of-run extend advice and the total_steps-change note read
        unused_keys     config sections (dotted prefixes, e.g. "optimizer", "objective_options") the system never
                        reads: left out of `xlgen config show`
        learning_rate_keys  config -> the dotted config keys of the learning rates that train the system (the
                        divergence advice lowers each); None = ("optimizer.learning_rate",)
    """

    unit: str = "tokens"
    learning_rates: Optional[Callable[[Any, int], Dict[str, Callable[[int], float]]]] = None
    unused_keys: Tuple[str, ...] = ()
    learning_rate_keys: Optional[Callable[[Any], Tuple[str, ...]]] = None


def _reporting(config) -> Reporting:
    from xlgen import registry

    return registry.get(config.model.family).record(Reporting) or Reporting()


def unit(config) -> str:
    """What one training step's count (`tokens_per_step`) counts: "tokens" (language models), "examples", ..."""
    return _reporting(config).unit


def learning_rates(config, total_steps: int) -> Dict[str, Any]:
    """{name: step -> learning rate} of the schedules that train the run: the system's players, or "" for
    `config.optimizer`'s schedule (with the run's schedule_history)."""
    own = _reporting(config).learning_rates
    if own is not None:
        return dict(own(config, int(total_steps)))
    from xlgen.train import optim

    return {"": optim.make_schedule(config.optimizer, int(total_steps))}


def learning_rate_keys(config) -> Tuple[str, ...]:
    """The dotted config keys of the learning rates that train the run (the system's players' own, or
    "optimizer.learning_rate"): what advice to change the learning rate names."""
    own = _reporting(config).learning_rate_keys
    return tuple(own(config)) if own is not None else ("optimizer.learning_rate",)


def _rates(scheds: Dict[str, Any], step: int) -> Dict[str, float]:
    return {name: float(s(step)) for name, s in scheds.items()}


def _named(rates: Dict[str, float]) -> str:
    return ", ".join(f"{name} {v:.3g}" if name else f"{v:.3g}" for name, v in rates.items())


def extend_advice(config, step: int, train_cmd: str) -> list:
    """End-of-run lines about extending a finished run (`train_cmd --config.total_steps=2*step`): from which
    learning rate(s) the extra steps continue, or why there is no extend command (every rate has decayed to 0)."""
    now = _rates(learning_rates(config, int(config.total_steps)), step)
    if not any(v > 0 for v in now.values()):
        if "" in now:
            why = f"the learning rate has decayed to 0 (optimizer.min_lr_ratio={config.optimizer.min_lr_ratio})"
        else:
            why = f"every player's learning rate has decayed to 0 ({_named(now)})"
        return [
            f"  (no extend command: {why}, so more steps would learn nothing; for a longer run use a new "
            "--workdir with a larger --config.total_steps)"
        ]
    lines = [f"  extend:      {train_cmd} --config.total_steps={2 * step}"]
    if "" in now:
        lr = now[""]
        floor = float(config.optimizer.learning_rate) * float(config.optimizer.min_lr_ratio)
        if abs(lr - floor) <= 1e-6 * lr:
            how = f"at the final learning rate {lr:.3g}"
        elif config.optimizer.schedule == "constant":
            how = f"at the constant learning rate {lr:.3g}"
        else:
            how = f"from the current learning rate {lr:.3g}, decaying to {floor:.3g}"
        lines.append(f"               (steps {step}-{2 * step} continue {how}; no re-warm-up)")
        return lines
    later = learning_rates(config, 2 * step)
    lines.append(
        f"               (steps {step}-{2 * step} follow the players' schedules over total_steps={2 * step}: "
        f"{_named(_rates(later, step))} at step {step}; {_named(_rates(later, 2 * step))} at step {2 * step})"
    )
    return lines


def total_steps_note(config, step: int, old_total: int, new_total: int) -> str:
    """The note when a resumed run changes total_steps: the learning rate(s) from `step` to `new_total`, and a
    warning when they are all 0 there (the steps would learn nothing)."""
    scheds = learning_rates(config, new_total)
    at, end = _rates(scheds, step), _rates(scheds, new_total)
    dead = not any(v > 0 for v in at.values())
    if "" in at:
        text = (
            f"the learning rate continues from {at['']:.3g} (its value at step {step}) to {end['']:.3g} at step "
            f"{new_total}, no re-warm-up"
        )
        warn = " — it is 0: these steps learn nothing (the schedule decays to min_lr_ratio=0)"
    else:
        text = f"the players' learning rates go from {_named(at)} at step {step} to {_named(end)} at step {new_total}"
        warn = " — all 0: these steps learn nothing"
    return f"total_steps {old_total} -> {new_total} at step {step}: {text}" + (warn if dead else "")


def shown_items(config) -> Dict[str, Any]:
    """{dotted key: value} that `xlgen config show` prints: every leaf but those of sections the system does not
    read (its `Reporting.unused_keys`)."""
    from xlgen.config import flat_items

    items = flat_items(config)
    family = config.get("model", {}).get("family") if hasattr(config, "get") else None
    from xlgen import registry

    if family not in registry.names():
        return items
    hidden = tuple(_reporting(config).unused_keys)
    return {k: v for k, v in items.items() if not any(k == h or k.startswith(h + ".") for h in hidden)}


def step_size_text(config, program) -> str:
    """`8,192 tokens/step, 1.2e+09 FLOPs/step`: what one step processes, in the system's unit, and its analytic
    FLOPs when the system counts them."""
    text = f"{int(program.tokens_per_step):,} {unit(config)}/step"
    flops = float(program.analytic_flops_per_step or 0.0)
    return text + (f", {flops:.3g} FLOPs/step" if flops else "")
