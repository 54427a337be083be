"""The training loop and evaluation (one readable loop for every family).

    train(config, workdir)     resume from workdir/checkpoints if present, train to config.total_steps
    evaluate(config, workdir)  evaluate the latest checkpoint on the eval split

Per step s (0-based): batch = pipeline.batch(s) (a pure function of the step, so resuming needs only the step),
assembled into global arrays with `jax.make_array_from_process_local_data`; `state, mems = train_step(state, batch,
mems)`. Logging every `log_every_steps`, eval every `eval_every_steps`, checkpoints every
`checkpoint.every_steps`, at the end, and on SIGTERM/SIGINT (the current step is saved, then the process exits
with status 143).

`workdir` and `data.source` may be URLs (`gs://bucket/run`): every path goes through etils.epath
(data_pipelines/paths.py); Orbax writes checkpoints there directly; see docs/remote_paths.md.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import signal
import time
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from data_pipelines import paths
from xlgen import registry, sharding
from xlgen.train import goodput, guards, outdir, report, tiers, tokenizer_store
from xlgen.train import metrics as metrics_lib
from xlgen.train.profile import StepProfiler
from xlgen.train.program import Program, TrainProgram, abstract_model, build_program, make_eval_step
from xlgen.train.watchdog import Watchdog
from xlgen.train.workdir import Workdir

log = logging.getLogger("xlgen")

PREEMPTED_EXIT_CODE = 143


class Preempted(SystemExit):
    def __init__(self, step: int):
        super().__init__(PREEMPTED_EXIT_CODE)
        self.step = step


# ----------------------------------------------------------------------------------------------------------------
# Workdir checks
# ----------------------------------------------------------------------------------------------------------------


def _shapes(config) -> Dict[str, Any]:
    obj = registry.objective(config)
    spec = abstract_model(lambda r: obj.make_model(config, r, True), train=True)
    out = {f"param {k}": v for k, v in spec.shapes.items()}
    out["memory"] = obj.mems_shape(config, "train")
    return out


def check_workdir_compatible(config, workdir: str) -> None:
    """A config that changes parameter or memory shapes against an existing workdir is an error."""
    wd = Workdir(workdir)
    old = wd.read_config()
    if old is None or not wd.has_checkpoints():
        return
    if not paths.is_remote(wd.path) and not outdir.committed_steps(wd.checkpoint_dir()):
        return  # no committed checkpoint: nothing of the old model to resume
    old_model, new_model = old.model.to_dict(), config.model.to_dict()
    changed = sorted(k for k in set(old_model) | set(new_model) if old_model.get(k) != new_model.get(k))
    if old.objective != config.objective:
        changed.append("objective")
    try:
        old_shapes = _shapes(old)
    except Exception as e:  # the stored config does not build with this code
        raise ValueError(f"{workdir}/config.json: cannot rebuild the stored model ({e}); use a new --workdir") from e
    new_shapes = _shapes(config)
    diff = [k for k in sorted(set(old_shapes) | set(new_shapes)) if old_shapes.get(k) != new_shapes.get(k)]
    if config.checkpoint.save_mems is False:
        diff = [d for d in diff if d != "memory"]
    if diff:
        detail = "\n  ".join(f"{k}: {old_shapes.get(k)} -> {new_shapes.get(k)}" for k in diff[:20])
        raise ValueError(
            f"{workdir} holds checkpoints of a model with different shapes; the config changes "
            f"{', '.join('model.' + c for c in changed) or 'the batch/memory layout'}:\n  {detail}\n"
            f"Use a new --workdir, or the same model settings to resume."
        )


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def make_pipeline(config, split: str, process: Optional[Tuple[int, int]] = None):
    """This process's rows of the data stream the run's objective reads (`Objective.pipeline`), for `split`; the
    evaluation splits read their layout from config.data itself (eval_batch_size, eval_tgt_len...). `process`:
    (index, count) instead of JAX's (a process that never starts a JAX backend, e.g. the bench's PyTorch side)."""
    import data_pipelines

    index, count = process if process is not None else (jax.process_index(), jax.process_count())
    stream = registry.objective(config).pipeline
    if stream is None:
        raise ValueError(f"objective {registry.objective(config).name!r} reads no data stream of its own")
    if callable(stream):
        return stream(config.data, split, index, count)
    return data_pipelines.make_pipeline(config.data, split=split, process_index=index, process_count=count)


def global_batch(local: Dict[str, np.ndarray], shardings: Dict[str, Any], spec: Dict[str, Any]) -> Dict[str, jax.Array]:
    out = {}
    for k, sh in shardings.items():
        if k not in local:
            raise KeyError(f"the data pipeline's batch has no {k!r} (has {sorted(local)})")
        shape, dtype = spec[k]
        out[k] = jax.make_array_from_process_local_data(sh, np.asarray(local[k], dtype=dtype), shape)
    return out


def _train_batches(pipeline, start: int, end: int, depth: int):
    """(step, pipeline.batch(step)) for start <= step < end, built `depth` steps ahead on a worker thread
    (`data_pipelines.prefetch`) so the input work overlaps the jitted step; depth 0 builds them in line. Batches
    are the same pure functions of the step either way (resume is unchanged)."""
    if depth <= 0 or getattr(pipeline, "num_steps", None) is not None:
        for s in range(start, end):
            yield s, pipeline.batch(s)
        return
    from data_pipelines.prefetch import prefetch

    yield from prefetch(pipeline, start_step=start, num_steps=end - start, depth=depth)


# ----------------------------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------------------------


def run_eval(program: Program, params, pipeline, steps: int) -> Dict[str, float]:
    """Mean eval loss over `steps` batches, carrying (eval-length) memory across them; family metrics."""
    eval_step, zero_mems, shardings = make_eval_step(program)
    spec = program.objective.batch_shapes(program.config, "eval")
    mems = zero_mems()
    total, count = 0.0, 0.0
    for s in range(steps):
        batch = global_batch(pipeline.batch(s), shardings, spec)
        t, c, mems = eval_step(params, batch, mems)
        total += float(t)
        count += float(c)
    loss = total / max(count, 1.0)
    return {k: float(v) for k, v in program.objective.eval_metrics(loss, program.config).items()}


def _eval_steps(config, pipeline) -> int:
    """eval.steps batches (-1 = the whole split), at most the split's `num_steps`."""
    steps = int(config.eval.steps)
    n = getattr(pipeline, "num_steps", None)
    if steps < 0:
        if n is None:
            raise ValueError("eval.steps=-1 (whole split) but the eval pipeline is endless; set eval.steps")
        return int(n)
    return min(steps, int(n)) if n is not None else steps


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------


class _StopFlag:
    """SIGTERM/SIGINT -> finish the current step, save it, exit. Multi-process runs agree on the step through
    JAX's preemption sync point (every process saves the same step)."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def install(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread
                pass

    def _handler(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def should_stop(self, step: int) -> bool:
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            try:
                return bool(multihost_utils.reached_preemption_sync_point(step)) or self.requested
            except Exception:
                return self.requested
        return self.requested

    def restore(self):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _fmt_metrics(d: Dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.4f}" for k, v in d.items() if isinstance(v, float))


# ----------------------------------------------------------------------------------------------------------------
# Hooks: evaluation and the best checkpoint
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Evaluation:
    """An evaluation hook of `run`: `fn(state, step) -> {metric: float}` on `split`, every `every` steps (> 0) and
    at the end of training; `every=-1`: only at the end; `every=0`: never, unless `always_at_end` (finetuning
    evaluates the final model, and a run resumed at its end that has no best checkpoint yet). With `best`, each
    evaluation is offered to the best checkpoint."""

    fn: Callable[[Dict[str, Any], int], Dict[str, float]]
    split: str
    every: int
    always_at_end: bool = False
    best: Optional["BestCheckpoint"] = None


class BestCheckpoint:
    """`DIR/best/`: the best checkpoint by `metric` (`mode` "max" | "min"), kept by Orbax (`best_fn`/`best_mode`,
    one checkpoint; ties keep the earlier step). `on_new_best(step, state, metrics)` runs after a better one is
    saved (finetuning writes eval_results.json and the prediction files there)."""

    def __init__(self, wd: Workdir, metric: str, mode: str = "max", on_new_best: Optional[Callable] = None):
        self.metric, self.mode, self.on_new_best = metric, mode, on_new_best
        sign = 1.0 if mode == "max" else -1.0
        self._key = lambda m: (sign * float(m[metric]), -int(m["step"]))  # larger is better
        self.ckpt = wd.checkpointer("best", keep=1, best_fn=self._key, best_mode="max")

    def best(self) -> Optional[Dict[str, Any]]:
        """The metrics of the best checkpoint so far (with `step`), None if there is none."""
        step = self.ckpt.best_step()
        return None if step is None else self.ckpt.metrics(step)

    def offer(self, step: int, state, metrics: Dict[str, float], meta: Dict[str, Any]) -> bool:
        """Save `state` as the best checkpoint if `metrics` beat it; returns whether they did."""
        metrics = {**metrics, "step": step}
        old = self.best()
        if old is not None and self._key(metrics) <= self._key(old):
            return False
        self.ckpt.save(step, state, None, {**meta, "results": metrics}, metrics=metrics)
        self.ckpt.wait()
        if self.on_new_best is not None:
            self.on_new_best(step, state, metrics)
        return True

    def close(self) -> None:
        self.ckpt.close()


# ----------------------------------------------------------------------------------------------------------------
# The loop (pretraining and finetuning)
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Attempt:
    """What one call of `run` (one attempt of a run) carries from step to step: its inputs, its outputs (checkpoint
    managers, metrics writer, goodput ledger, progress line), the train state and memory, and the step range."""

    config: Any
    wd: Workdir
    program: TrainProgram
    pipeline: Any
    evaluation: Optional[Evaluation]
    meta: Dict[str, Any]
    save_mems: bool
    is_main: bool
    total: int
    batch_spec: Dict[str, Any]
    rows: Optional[Tuple[int, int]]  # this process's rows of a pipeline that gives whole global batches
    ckpt: Any
    local_tier: Any
    writer: metrics_lib.MetricsWriter
    ledger: goodput.Ledger
    summary: Dict[str, Any]
    state: Any = None
    mems: Any = None
    start: int = 0
    end: int = 0
    restored: bool = False
    best_loss: Optional[float] = None
    stop: Optional[_StopFlag] = None
    progress: Any = None
    health: Any = None
    throughput: Any = None
    batches: Any = None
    watchdog: Optional[Watchdog] = None
    profiler: Optional[StepProfiler] = None
    t_last: float = 0.0  # when step s_last was logged (throughput counts the steps since)
    s_last: int = 0
    record: Optional[Dict[str, Any]] = None  # the last logged training record
    final_records: list = dataclasses.field(default_factory=list)  # written after the attempt's goodput record


def run(
    config,
    wd: Workdir,
    program: TrainProgram,
    pipeline,
    *,
    evaluation: Optional[Evaluation] = None,
    initialize: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None,
    stop_at: Optional[int] = None,
    meta: Optional[Dict[str, Any]] = None,
    save_mems: bool = False,
    t_begin: Optional[float] = None,
    restart: bool = False,
) -> Dict[str, Any]:
    """Train `program` on `pipeline` (`pipeline.batch(step)`: this process's rows, or all rows of the global
    batch) from the latest checkpoint of `wd` (else `program.init_state()`, then `initialize(state)`) to
    config.total_steps, or `stop_at` (save and stop early; the schedule is unchanged). Checkpoints every
    `checkpoint.every_steps`, at the end and on SIGTERM/SIGINT (then exits with status 143); metrics every
    `log_every_steps` (tokens/s and MFU exclude compilation); `evaluation` as its hook says. Prints the start-of-run
    block, skips non-finite updates and writes summary.json at the end.

    Health (guards.HealthGuard): checkpoints are saved only while the steps are healthy (no skipped update, no
    loss above `divergence_factor` x the best, or above a uniform guess once the model has beaten it), the newest
    checkpoint proven healthy is pinned through `keep`'s rotation, and `max_nonfinite_steps` unhealthy steps in a
    row stop the run (TrainingDiverged, `good_step` set) after moving the checkpoints newer than the good one to
    `checkpoints/diverged-<step>/`.

    The run is the workdir's writer (the caller holds its lock): a checkpoint that fails verification is moved to
    `checkpoints/corrupt-<step>/`. If checkpoints existed but none is usable and metrics.jsonl holds records, the
    run refuses to start again from step 0 unless `restart`. `t_begin`: when the command started (the first-step
    message counts from it). Returns {workdir, start_step, step, last (record), eval (last eval record), summary}."""
    t_begin = time.time() if t_begin is None else t_begin
    a = _open_attempt(config, wd, program, pipeline, evaluation, meta, save_mems, t_begin)
    with jax.set_mesh(program.mesh):
        logged_step = _restore_or_initialize(a, initialize, restart)
        _prepare_steps(a, stop_at, logged_step)
        m = None
        try:
            m = _train_steps(a, t_begin)
            _finish_steps(a, m)
        except guards.TrainingDiverged as e:
            _set_aside_diverged(e, a.ckpt, a.health, a.start if a.restored else None)
            if a.local_tier is not None:  # the local tier's steps after the good one would be restored next
                a.local_tier.set_aside(
                    [t for t in a.local_tier.all_steps() if e.good_step is None or t > e.good_step], "diverged"
                )
            raise
        finally:
            _close_attempt(a)
    return _summarize(a, t_begin)


def _process_rows(config, program: TrainProgram, pipeline, spec) -> Optional[Tuple[int, int]]:
    """(row0, row1): the rows of the global batch the mesh places on this process, when `pipeline` gives whole
    global batches; None when it gives this process's rows already (any other row count is an error)."""
    gb = next(iter(spec.values()))[0][0]
    row0, row1 = sharding.addressable_batch_rows(program.mesh, gb)
    local_rows = getattr(pipeline, "local_batch_size", row1 - row0)
    if local_rows not in (row1 - row0, gb):
        raise ValueError(
            f"the data pipeline gives {local_rows} rows per process but the mesh "
            f"places {row1 - row0} rows on process {jax.process_index()}"
        )
    return (row0, row1) if local_rows == gb and row1 - row0 != gb else None


def _open_attempt(config, wd, program, pipeline, evaluation, meta, save_mems, t_begin) -> _Attempt:
    """Checks the pipeline's rows against the mesh, then opens the checkpoint managers, the metrics writer and the
    goodput ledger (where the wall time goes; host clocks only, xlgen/train/goodput.py)."""
    is_main = jax.process_index() == 0
    spec = program.objective.batch_shapes(config, "train")
    rows = _process_rows(config, program, pipeline, spec)
    ckpt_cfg = config.checkpoint
    return _Attempt(
        config=config,
        wd=wd,
        program=program,
        pipeline=pipeline,
        evaluation=evaluation,
        meta=meta or {},
        save_mems=bool(save_mems) and program.mems_shape is not None,
        is_main=is_main,
        total=int(config.total_steps),
        batch_spec=spec,
        rows=rows,
        ckpt=wd.checkpointer(keep=int(ckpt_cfg.keep), async_save=bool(ckpt_cfg.async_save)),
        local_tier=tiers.local_checkpointer(config, wd),  # checkpoint.local_dir: the frequent, local tier
        writer=metrics_lib.MetricsWriter(
            wd.path,
            enabled=is_main,
            tensorboard=bool(config.tensorboard),
            trackers=metrics_lib.make_trackers(config, wd.path) if is_main else (),
        ),
        ledger=goodput.Ledger(t_begin),
        summary={"workdir": wd.path},
    )


def _restore_or_initialize(a: _Attempt, initialize, restart: bool) -> Optional[int]:
    """The state and memory to start from: the newest verified checkpoint of either tier (metrics.jsonl records
    after it are dropped), else a fresh `program.init_state()` (then `initialize(state)`). Returns the last
    training step metrics.jsonl held before (the goodput ledger's lost-to-restarts count)."""
    program = a.program
    with a.ledger.timed("checkpoint"):
        restored, restored_from = tiers.restore(a.wd, program, a.ckpt, a.local_tier, mems=a.save_mems, quarantine=True)
    logged_step = goodput.last_train_step(a.writer.path) if a.is_main else None  # before the records are truncated
    if restored is not None:
        a.state, a.mems, restored_meta, a.start = restored
        a.restored = True
        a.best_loss = restored_meta.get("best_loss")
        if program.mems_shape is not None and a.mems is None:
            log.warning(
                "checkpoint %d has no memory (checkpoint.save_mems=False): streams restart with empty memory", a.start
            )
            a.mems = jnp.zeros(program.mems_shape, program.mems_dtype, device=program.mems_sharding)
        if a.is_main:
            dropped = metrics_lib.truncate_after(a.writer.path, a.start)
            print(
                f"resumed from {restored_from}/{a.start}"
                + (f" (dropped {dropped} metric records logged after it)" if dropped else ""),
                flush=True,
            )
    else:
        _check_fresh_start(a.wd, a.ckpt, a.writer.path, restart)
        if a.is_main:
            dropped = metrics_lib.truncate_after(a.writer.path, 0)  # a run killed before its first checkpoint
            if dropped:
                print(f"starting at step 0 (dropped {dropped} metric records of an earlier attempt)", flush=True)
        a.state, a.mems = program.init_state()
        a.start = 0
        if initialize is not None:
            a.state = initialize(a.state)
    a.summary["start_step"] = a.start
    return logged_step


def _compiled_hlo_text(program: TrainProgram) -> str:
    return program.train_step.lower(*program.abstract_args()).compile().as_text()


def _prepare_steps(a: _Attempt, stop_at: Optional[int], logged_step: Optional[int]) -> None:
    """Before the first step: the signal handler, the start-of-run block, the progress line, the health guard, the
    batch stream (prefetched), the goodput ledger of earlier attempts, the hang watchdog and the profiler."""
    config, program = a.config, a.program
    a.stop = _StopFlag()
    a.stop.install()
    if a.is_main and a.start < a.total:
        print(report.start_block(config, program, program.mesh, a.pipeline, a.wd.path, a.start), flush=True)
        print("compiling… (XLA compiles the train step before the first one runs)", flush=True)
    a.progress = metrics_lib.Progress(a.total, a.start, enabled=a.is_main, unit=report.unit(config))
    a.health = guards.health_guard(config, program.objective, a.best_loss)
    if a.restored:
        a.health.watch(a.start)
    a.throughput = report.Throughput()
    a.t_last, a.s_last = time.time(), a.start
    a.end = a.total if stop_at is None else min(int(stop_at), a.total)
    a.batches = _train_batches(a.pipeline, a.start, a.end, int(config.prefetch))
    if a.end > a.start:  # an attempt that trains: carry the earlier attempts' ledger over, watch for hangs
        a.ledger.resume(goodput.read_ledger(a.wd.path) if a.is_main else None, a.start, logged_step)
        if a.is_main and a.ledger.previous_record is not None:
            a.writer.write(a.ledger.previous_record)
    a.watchdog = Watchdog(
        config, a.wd.path, a.ledger, process_index=jax.process_index(), emit=a.progress.message, enabled=a.end > a.start
    ).start()
    a.profiler = StepProfiler(
        config, a.wd.path, hlo_text=functools.partial(_compiled_hlo_text, program), emit=a.progress.message
    )


def _train_steps(a: _Attempt, t_begin: float) -> Optional[Dict[str, Any]]:
    """Steps a.start+1 .. a.end: train, log, evaluate, checkpoint; on a signal save and raise Preempted. Returns
    the last step's metrics (None when no step ran)."""
    config, program = a.config, a.program
    log_every = max(int(config.log_every_steps), 1)
    eval_every = a.evaluation.every if a.evaluation is not None else 0
    every, local_every = int(config.checkpoint.every_steps), int(config.checkpoint.local_every_steps)
    m = None
    for s, local in a.ledger.iterate(a.batches):
        if a.rows is not None:  # a pipeline of global batches: keep this process's rows
            local = {k: v[a.rows[0] : a.rows[1]] for k, v in local.items()}
        batch = global_batch(local, program.batch_shardings, a.batch_spec)
        a.profiler.before(s, a.state)
        a.state, a.mems, m = program.train_step(a.state, batch, a.mems)
        a.profiler.after(s + 1, m)
        a.health.add(m.pop("nonfinite"), m.get("loss"))
        step = s + 1
        if step == a.start + 1:
            _restart_clock_after_compile(a, step, m, t_begin)
        a.ledger.step_done(step)
        if step % log_every == 0 or step == a.total:
            _log_step(a, step, m)
        else:
            a.progress.update(step)
        if eval_every > 0 and step % eval_every == 0 and step != a.total:
            _evaluate(a, step)
            a.t_last = time.time()
        if a.stop.should_stop(step):
            _save_and_exit(a, step)
        tier = tiers.save_tier(step, every, a.end, a.local_tier, local_every)
        if tier is not None:
            _save_checkpoint(a, step, a.local_tier if tier == "local" else a.ckpt)
    return m


def _restart_clock_after_compile(a: _Attempt, step: int, m, t_begin: float) -> None:
    """After the attempt's first step (which includes compilation): throughput counts from here."""
    jax.block_until_ready(m)
    a.t_last, a.s_last = time.time(), step
    a.progress.reset_clock(step)
    if a.is_main:
        a.progress.message(
            f"first step done {a.t_last - t_begin:.0f}s after start (compiled; "
            + report.step_size_text(a.config, a.program)
            + ")"
        )


def _log_step(a: _Attempt, step: int, m) -> None:
    """One metrics.jsonl record: the step's metrics, per-source tokens of a mixture, skipped updates since the last
    record, steps/s, tokens/s and MFU over the steps since the last record."""
    program = a.program
    a.health.check(step)
    vals = {k: float(v) for k, v in jax.device_get(m).items()}
    now = time.time()
    n = max(step - a.s_last, 0)
    dt = max(now - a.t_last, 1e-9)
    record = {"step": step, **vals}
    if hasattr(a.pipeline, "source_tokens"):  # a mixture: tokens/<source> read in steps [0, step)
        record.update(a.pipeline.source_tokens(step))
    if a.health.total:
        record["nonfinite_steps"] = a.health.take_window()  # updates skipped since the last record
    if n:
        a.throughput.add(n, dt)
        record["steps_per_sec"] = n / dt
        record["tokens_per_sec"] = n * program.tokens_per_step / dt
        peak = float(a.config.peak_flops_per_device)
        if program.analytic_flops_per_step and peak > 0:
            record["mfu"] = program.analytic_flops_per_step * n / dt / (len(program.mesh.devices.flat) * peak)
    else:
        record["tokens_per_sec"] = 0.0
    a.writer.write(record)
    a.watchdog.logged(a.s_last + 1, step, dt)  # stragglers; the goodput ledger
    a.progress.update(step, record)
    a.t_last, a.s_last = time.time(), step
    a.record = record


def _evaluate(a: _Attempt, step: int, held: Optional[list] = None) -> None:
    """Run the evaluation hook on the current state; its record goes to metrics.jsonl (or into `held`, written
    later) and to the best checkpoint, if the hook keeps one."""
    evaluation = a.evaluation
    with a.ledger.timed("eval"):
        res = evaluation.fn(a.state, step)
    rec = {"step": step, "split": evaluation.split, **res}
    if held is None:
        a.writer.write(rec)
    else:
        held.append(rec)
    a.progress.message(f"eval @ step {step} ({evaluation.split}): {_fmt_metrics(res)}")
    a.summary["eval"] = rec
    if evaluation.best is not None:
        evaluation.best.offer(step, a.state, res, _checkpoint_meta(a, step))


def _checkpoint_meta(a: _Attempt, step: int) -> Dict[str, Any]:
    program = a.program
    return {
        "step": step,
        "mems_shape": list(program.mems_shape) if program.mems_shape else None,
        "family": a.config.model.family,
        "best_loss": a.health.best,
        "learning_rate": float(a.config.optimizer.learning_rate),
        "workdir": a.wd.path,
        **a.meta,
    }


def _save_checkpoint(a: _Attempt, step: int, target) -> bool:
    """Save `step` to `target` (the workdir's or the local tier) if the run is healthy (never over good
    checkpoints during an unhealthy streak); returns whether it saved."""
    health = a.health
    health.check(step)
    if health.proven is not None:
        a.ckpt.pin(health.proven)
    if not health.healthy:
        a.progress.message(
            f"step {step}: not saving a checkpoint ({health.consecutive} unhealthy steps in a row); "
            f"newest proven-good checkpoint: {health.proven if health.proven is not None else 'none'}"
        )
        return False
    a.writer.flush()  # records up to `step` are durable before its checkpoint can exist (gs://: no append)
    with a.ledger.timed("checkpoint"):
        target.save(step, a.state, a.mems if a.save_mems else None, _checkpoint_meta(a, step))
    a.ledger.saved(step)
    health.watch(step)
    return True


def _save_and_exit(a: _Attempt, step: int) -> None:
    """SIGTERM/SIGINT: save `step` (if healthy), close the attempt's goodput record, raise Preempted."""
    saved = _save_checkpoint(a, step, a.ckpt)
    with a.ledger.timed("checkpoint"):
        a.ckpt.wait()
    a.progress.message(
        f"stopped by signal: saved checkpoint {a.ckpt.directory}/{step}"
        if saved
        else f"stopped by signal at step {step} (not saved: unhealthy)"
    )
    a.writer.write(a.ledger.end_record(step, "preempted"))
    a.watchdog.write_ledger_end("preempted")
    raise Preempted(step)


def _final_evaluation_due(a: _Attempt) -> bool:
    """At the end of training: an evaluation that runs periodically or at the end (when steps ran), or one that
    must run at the end (also for a run resumed at its end with no best checkpoint yet)."""
    ev = a.evaluation
    if ev is None or a.end != a.total:
        return False
    trained = a.end > a.start
    no_best_yet = ev.best is not None and ev.best.best() is None
    return (ev.every != 0 and trained) or (ev.always_at_end and (trained or no_best_yet))


def _finish_steps(a: _Attempt, m) -> None:
    """The final evaluation, the profiler's window, the last checkpoint's commit, the attempt's goodput record; the
    last record with a `split` is the final evaluation (metrics.jsonl's record kinds)."""
    if _final_evaluation_due(a):
        _evaluate(a, max(a.total, a.start), a.final_records)
    a.profiler.stop(m, steps=a.end - a.profiler.start)  # the run ended inside the profiled window
    try:
        if a.end > a.start:
            with a.ledger.timed("checkpoint"):
                a.ckpt.wait()
            a.writer.write(a.ledger.end_record(a.end, "completed" if a.end == a.total else "stopped"))
    finally:
        for rec in a.final_records:
            a.writer.write(rec)


def _close_attempt(a: _Attempt) -> None:
    a.batches.close()  # stops the prefetch worker
    a.stop.restore()
    a.progress.close()
    a.ckpt.close()
    if a.local_tier is not None:
        a.local_tier.close()
    a.watchdog.stop()  # last: a clean-up that waits on a dead peer is still bounded
    a.writer.close()


def _summarize(a: _Attempt, t_begin: float) -> Dict[str, Any]:
    """`run`'s return value; summary.json written (main process) when steps ran, else read as it is."""
    summary = a.summary
    summary["step"] = max(a.end, a.start)
    summary["last"] = a.record
    if a.end > a.start:
        a.watchdog.write_ledger_end("completed" if a.end == a.total else "stopped")
        summary["goodput"] = a.ledger.summary()
    if a.is_main and a.end <= a.start:  # nothing trained (a re-run of a finished run): summary.json stays as it is
        summary["summary"] = report.read_summary(a.wd.path)
    elif a.is_main:
        summary["summary"] = report.write_summary(
            a.wd.path,
            a.config,
            a.program,
            step=summary["step"],
            start=a.start,
            wall_time_s=time.time() - t_begin,
            throughput=a.throughput,
            last_train=a.record,
            n_devices=len(a.program.mesh.devices.flat),
            extra={**summary["goodput"], "stragglers": a.watchdog.stragglers},
        )
        print(goodput.describe_summary(summary["goodput"]), flush=True)
    return summary


def _check_fresh_start(wd: Workdir, ckpt, metrics_path: str, restart: bool) -> None:
    """No usable checkpoint: starting at step 0 is fine for a new run (or one killed before its first
    checkpoint), but not silently for a run whose checkpoints all failed or were set aside."""
    if restart or paths.is_remote(wd.path):
        return
    aside = ("corrupt-", "diverged-")  # what the writer moved aside (not Orbax's tmp dirs of a killed save)
    left = sorted(d for d in os.listdir(ckpt.directory) if d.startswith(aside)) if os.path.isdir(ckpt.directory) else []
    if left and os.path.exists(metrics_path) and os.path.getsize(metrics_path) > 0:
        raise ValueError(
            f"{ckpt.directory} has no usable checkpoint (only {', '.join(left[:6])}) but {metrics_path} holds an "
            f"earlier run's records: not restarting from step 0 silently. Pass --restart to start again from "
            f"step 0 (the records are dropped; the set-aside checkpoints stay), or use another --workdir"
        )


def _set_aside_diverged(e, ckpt, health, restored_step: Optional[int]) -> None:
    """After TrainingDiverged: the checkpoints newer than the newest proven-good one (or, when none was proven,
    those from the restored step on) move to `diverged-<step>/`, so that the next run resumes from the good one;
    `e.good_step` and the message say which one that is."""
    ckpt.wait()
    good = health.proven
    floor = good if good is not None else (restored_step - 1 if restored_step is not None else -1)
    bad = [s for s in ckpt.all_steps() if s > floor]
    moved = ckpt.set_aside(bad, "diverged")
    left = ckpt.all_steps()
    e.good_step = good if good is not None else (left[-1] if left else None)
    if e.good_step is not None:
        try:
            e.good_lr = ckpt.read_meta(e.good_step).get("learning_rate")
        except Exception:  # noqa: BLE001  (an unreadable meta only loses the suggestion)
            e.good_lr = None
    where = ckpt.directory
    if good is not None:
        text = f" The newest checkpoint proven healthy is {where}/{good}"
    elif left:
        text = f" No checkpoint of this run was proven healthy; the newest remaining one is {where}/{left[-1]}"
    else:
        text = " No healthy checkpoint remains"
    if moved:
        text += f"; the later ones were moved aside ({', '.join(os.path.basename(m) for m in moved)})"
    e.args = (str(e.args[0]) + text + ".",)


def train(config, workdir: str, *, stop_at: Optional[int] = None, restart: bool = False) -> Dict[str, Any]:
    """Pretrain (or resume) to config.total_steps. `stop_at` (CLI --stop_at_step) saves and stops early at that
    step without changing the schedule, as an interruption would. `restart`: start at step 0 even though the
    workdir's checkpoints all failed (see `run`). Returns `run`'s summary. A second live run on the same workdir
    fails at once (guards.WorkdirBusy); a workdir of another kind (a finetune run) is an error, left unchanged;
    everything that can be checked (shapes, data, vocabulary, tokenizer, trackers) is checked before config.json
    is written; a workdir this call found absent or empty is removed again when it fails before the run started
    (`outdir.writing_workdir`: nothing half-made is left)."""
    t_begin = time.time()
    if not str(workdir).strip():
        raise outdir.OutputPathError("--workdir is empty: give the run directory")
    wd = Workdir(workdir)
    wd.require_kind("pretrain")
    with outdir.writing_workdir(wd.path, enabled=jax.process_index() == 0):  # a failed start leaves nothing
        return _train(config, wd, stop_at=stop_at, t_begin=t_begin, restart=restart)


def resume_config(config, wd: Workdir):
    """(config to train with, last step to train to or None, notes to print) for `config` against what `wd` holds.

    * A fresh workdir: `config` as given (an `optimizer.schedule_history` copied from another run is dropped).
    * total_steps at or below the latest checkpoint step S: nothing to train; the stored config.json stays as it is
      (re-running `make demo` after an extension, or a command that lost a `--config.total_steps`, changes nothing).
    * total_steps changed against the stored config: from S on the learning rate decays from its value at S to the
      floor at the new total (`optim.continue_schedule`: extending never re-warms)."""
    from xlgen import config as config_lib
    from xlgen.train import optim

    old = wd.read_config()
    step = wd.latest_step() if old is not None else None
    if old is None or not step:
        with config.optimizer.unlocked():
            config.optimizer.schedule_history = ()
        if "sources_history" in config.get("data", {}):
            config.data.sources_history = ()
        return config, None, []
    new_total, old_total = int(config.total_steps), int(old.total_steps)
    if new_total <= step:
        if new_total == old_total == step:
            note = f"{wd.path} is complete (step {step} of {old_total}): nothing to train"
        else:
            note = (
                f"{wd.path} is at step {step}; this config's total_steps={new_total} is not beyond it: nothing to "
                f"train (config.json unchanged: total_steps={old_total})"
            )
        return old, step, [note]
    history = optim.continue_schedule(old.optimizer, old.optimizer.schedule_history, old_total, new_total, step)
    with config.optimizer.unlocked():
        config.optimizer.schedule_history = history
    if "sources_history" in config.get("data", {}):  # a mixture's weights changed: each source continues (mixture.py)
        from data_pipelines.mixture import continue_history

        config.data.sources_history = continue_history(old.data, config.data, step)
    notes = []
    a, b = (json.loads(json.dumps(config_lib.flat_items(c), default=str)) for c in (old, config))  # tuple = list
    changed = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k) and not k.endswith("_history")]
    if changed:
        shown = ", ".join(f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in changed[:8])
        notes.append(f"config changes against {wd.config_path}: {shown}" + (" ..." if len(changed) > 8 else ""))
    if new_total != old_total:
        notes.append(report.total_steps_note(config, step, old_total, new_total))
    return config, None, notes


def _train(config, wd: Workdir, *, stop_at: Optional[int], t_begin: float, restart: bool = False) -> Dict[str, Any]:
    check_workdir_compatible(config, wd.path)
    config, done_at, notes = resume_config(config, wd)
    if done_at is not None:
        stop_at = done_at if stop_at is None else min(int(stop_at), done_at)
    program = build_program(config, sharding.make_mesh(config.mesh))

    # Checked before anything is written: the data (a missing corpus fails before anything is compiled), the
    # vocabulary, the workdir's tokenizer, the trackers' packages.
    train_pipe = make_pipeline(config, "train")
    data_vocab = getattr(train_pipe, "vocab_size", None)
    model_vocab = config.model.get("vocab_size")
    if data_vocab and model_vocab and int(model_vocab) < int(data_vocab):
        raise ValueError(
            f"config.model.vocab_size={model_vocab} is smaller than the data's vocabulary "
            f"({data_vocab} symbols, data.source={config.data.get('source')!r})"
        )
    if jax.process_index() == 0:
        tokenizer_store.check_can_save(wd.path, getattr(train_pipe, "tokenizer", None))
        metrics_lib.check_trackers(config)
        for note in notes:
            print(f"note: {note}", flush=True)
        if done_at is None:
            wd.write_config(config, "pretrain")
        # the run's tokenizer into DIR/tokenizer/, named in config.json
        tokenizer_store.save(wd.path, getattr(train_pipe, "tokenizer", None))
        if hasattr(train_pipe, "record"):  # what the run must keep of its data (e.g. a labeled subset's indices)
            train_pipe.record(wd.path)
    objective = registry.objective(config)
    if objective.evaluate is not None:  # the objective's own metrics (the cheap ones during training)

        def eval_fn(state, step):
            return objective.evaluate(config, program, state, wd.join("eval"), False)

    else:
        eval_pipe = []

        def eval_fn(state, step):
            if not eval_pipe:
                eval_pipe.append(make_pipeline(config, config.eval.split))
            return run_eval(program, program.params_of(state), eval_pipe[0], _eval_steps(config, eval_pipe[0]))

    evaluation = Evaluation(eval_fn, split=config.eval.split, every=int(config.eval_every_steps))
    summary = run(
        config,
        wd,
        program,
        train_pipe,
        evaluation=evaluation,
        stop_at=stop_at,
        save_mems=bool(config.checkpoint.save_mems),
        t_begin=t_begin,
        restart=restart,
    )
    summary["config"] = config  # the config trained with (a finished run: its stored one)
    return summary


def evaluate(config, workdir: str) -> Dict[str, Any]:
    """Evaluate the latest verified checkpoint of `workdir` on config.eval.split (a failed one is reported and
    skipped, nothing in the workdir moves); appends the record to metrics.jsonl marked `"source": "xlgen eval"` so
    it stays out of the training curves. An objective with its own evaluation (`Objective.evaluate`) runs it in
    full and also writes DIR/eval_results.json."""
    wd = Workdir(workdir)
    workdir = wd.path
    outdir.check_workdir_entries(workdir)  # metrics.jsonl (appended to) is a file
    if not wd.has_checkpoints():
        raise FileNotFoundError(
            f"{workdir}: no checkpoints/ directory (train first: xlgen train ... --workdir={workdir})"
        )
    check_workdir_compatible(config, workdir)
    mesh = sharding.make_mesh(config.mesh)
    program = build_program(config, mesh)
    with jax.set_mesh(mesh):
        restored = wd.restore(program)
        if restored is None:
            raise FileNotFoundError(f"{wd.checkpoint_dir()}: no checkpoint to evaluate")
        state, step = restored.state, restored.step
        objective = registry.objective(config)
        if objective.evaluate is not None:
            res = objective.evaluate(config, program, state, wd.join("eval"), True)
        else:
            pipe = make_pipeline(config, config.eval.split)
            res = run_eval(program, program.params_of(state), pipe, _eval_steps(config, pipe))
    rec = {"step": step, "split": config.eval.split, **res, "source": "xlgen eval"}
    if jax.process_index() == 0:
        if objective.evaluate is not None:
            paths.write_json_atomic(wd.join("eval_results.json"), {k: v for k, v in rec.items() if k != "source"})
        writer = metrics_lib.MetricsWriter(workdir, tensorboard=False)
        writer.write(rec)
        writer.close()
    return rec
