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
    if old.get("objective") != config.get("objective"):
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
    is_main = jax.process_index() == 0
    mesh = program.mesh
    total = int(config.total_steps)
    ckpt_cfg = config.checkpoint
    save_mems = bool(save_mems) and program.mems_shape is not None
    summary: Dict[str, Any] = {"workdir": wd.path}
    bspec = program.objective.batch_shapes(config, "train")
    gb = next(iter(bspec.values()))[0][0]
    row0, row1 = sharding.addressable_batch_rows(mesh, gb)
    local_rows = getattr(pipeline, "local_batch_size", row1 - row0)
    if local_rows not in (row1 - row0, gb):
        raise ValueError(
            f"the data pipeline gives {local_rows} rows per process but the mesh "
            f"places {row1 - row0} rows on process {jax.process_index()}"
        )

    def own_rows(b):
        if local_rows == gb and row1 - row0 != gb:  # a pipeline of global batches: keep this process's rows
            b = {k: v[row0:row1] for k, v in b.items()}
        return b

    ckpt = wd.checkpointer(keep=int(ckpt_cfg.keep), async_save=bool(ckpt_cfg.async_save))
    local_tier = tiers.local_checkpointer(config, wd)  # checkpoint.local_dir: the frequent, local tier (tiers.py)
    writer = metrics_lib.MetricsWriter(
        wd.path,
        enabled=is_main,
        tensorboard=bool(config.tensorboard),
        trackers=metrics_lib.make_trackers(config, wd.path) if is_main else (),
    )
    best = evaluation.best if evaluation is not None else None
    ledger = goodput.Ledger(t_begin)  # where the wall time goes (host clocks only; xlgen/train/goodput.py)
    with jax.set_mesh(mesh):
        with ledger.timed("checkpoint"):
            restored, restored_from = tiers.restore(wd, program, ckpt, local_tier, mems=save_mems, quarantine=True)
        logged_step = goodput.last_train_step(writer.path) if is_main else None  # before the records are truncated
        best_loss = None
        if restored is not None:
            state, mems, restored_meta, start = restored
            best_loss = restored_meta.get("best_loss")
            if program.mems_shape is not None and mems is None:
                log.warning(
                    "checkpoint %d has no memory (checkpoint.save_mems=False): streams restart with empty memory", start
                )
                mems = jnp.zeros(program.mems_shape, program.mems_dtype, device=program.mems_sharding)
            if is_main:
                dropped = metrics_lib.truncate_after(writer.path, start)
                print(
                    f"resumed from {restored_from}/{start}"
                    + (f" (dropped {dropped} metric records logged after it)" if dropped else ""),
                    flush=True,
                )
        else:
            _check_fresh_start(wd, ckpt, writer.path, restart)
            if is_main:
                dropped = metrics_lib.truncate_after(writer.path, 0)  # a run killed before its first checkpoint
                if dropped:
                    print(f"starting at step 0 (dropped {dropped} metric records of an earlier attempt)", flush=True)
            state, mems = program.init_state()
            start = 0
            if initialize is not None:
                state = initialize(state)
        summary["start_step"] = start

        def do_eval(step):
            with ledger.timed("eval"):
                res = evaluation.fn(state, step)
            rec = {"step": step, "split": evaluation.split, **res}
            writer.write(rec)
            progress.message(f"eval @ step {step} ({evaluation.split}): {_fmt_metrics(res)}")
            summary["eval"] = rec
            if best is not None:
                best.offer(step, state, res, base_meta(step))

        def base_meta(step):
            return {
                "step": step,
                "mems_shape": list(program.mems_shape) if program.mems_shape else None,
                "family": config.model.family,
                "best_loss": health.best,
                "learning_rate": float(config.optimizer.learning_rate),
                "workdir": wd.path,
                **(meta or {}),
            }

        def save(step, target=ckpt):
            """Save `step` to `target` (the workdir's or the local tier) if the run is healthy (never over good
            checkpoints during an unhealthy streak)."""
            health.check(step)
            if health.proven is not None:
                ckpt.pin(health.proven)
            if not health.healthy:
                progress.message(
                    f"step {step}: not saving a checkpoint ({health.consecutive} unhealthy steps in a row); "
                    f"newest proven-good checkpoint: {health.proven if health.proven is not None else 'none'}"
                )
                return False
            writer.flush()  # records up to `step` are durable before its checkpoint can exist (gs://: no append)
            with ledger.timed("checkpoint"):
                target.save(step, state, mems if save_mems else None, base_meta(step))
            ledger.saved(step)
            health.watch(step)
            return True

        stop = _StopFlag()
        stop.install()
        if is_main and start < total:
            print(report.start_block(config, program, mesh, pipeline, wd.path, start), flush=True)
            print("compiling… (XLA compiles the train step before the first one runs)", flush=True)
        progress = metrics_lib.Progress(total, start, enabled=is_main, unit=report.unit(config))
        health = guards.health_guard(config, program.objective, best_loss)
        if restored is not None:
            health.watch(start)
        throughput = report.Throughput()
        log_every = max(int(config.log_every_steps), 1)
        every = int(ckpt_cfg.every_steps)
        eval_every = evaluation.every if evaluation is not None else 0
        peak = float(config.peak_flops_per_device)
        n_dev = len(mesh.devices.flat)
        t_last, s_last = time.time(), start
        record = None
        end = total if stop_at is None else min(int(stop_at), total)
        batches = _train_batches(pipeline, start, end, int(config.prefetch))
        if end > start:  # an attempt that trains: carry the earlier attempts' ledger over, watch for hangs
            ledger.resume(goodput.read_ledger(wd.path) if is_main else None, start, logged_step)
            if is_main and ledger.previous_record is not None:
                writer.write(ledger.previous_record)
        watchdog = Watchdog(
            config, wd.path, ledger, process_index=jax.process_index(), emit=progress.message, enabled=end > start
        ).start()
        profiler = StepProfiler(
            config,
            wd.path,
            hlo_text=lambda: program.train_step.lower(*program.abstract_args()).compile().as_text(),
            emit=progress.message,
        )
        m = None
        try:
            for s, local in ledger.iterate(batches):
                batch = global_batch(own_rows(local), program.batch_shardings, bspec)
                profiler.before(s, state)
                state, mems, m = program.train_step(state, batch, mems)
                profiler.after(s + 1, m)
                health.add(m.pop("nonfinite"), m.get("loss"))
                step = s + 1
                if step == start + 1:  # do not count compilation in the throughput
                    jax.block_until_ready(m)
                    t_last, s_last = time.time(), step
                    progress.reset_clock(step)
                    if is_main:
                        progress.message(
                            f"first step done {t_last - t_begin:.0f}s after start (compiled; "
                            + report.step_size_text(config, program)
                            + ")"
                        )
                ledger.step_done(step)
                if step % log_every == 0 or step == total:
                    health.check(step)
                    vals = {k: float(v) for k, v in jax.device_get(m).items()}
                    now = time.time()
                    n = max(step - s_last, 0)
                    dt = max(now - t_last, 1e-9)
                    record = {"step": step, **vals}
                    if hasattr(pipeline, "source_tokens"):  # a mixture: tokens/<source> read in steps [0, step)
                        record.update(pipeline.source_tokens(step))
                    if health.total:
                        record["nonfinite_steps"] = health.take_window()  # updates skipped since the last record
                    if n:
                        throughput.add(n, dt)
                        record["steps_per_sec"] = n / dt
                        record["tokens_per_sec"] = n * program.tokens_per_step / dt
                        if program.analytic_flops_per_step and peak > 0:
                            record["mfu"] = program.analytic_flops_per_step * n / dt / (n_dev * peak)
                    else:
                        record["tokens_per_sec"] = 0.0
                    writer.write(record)
                    watchdog.logged(s_last + 1, step, dt)  # stragglers; the goodput ledger
                    progress.update(step, record)
                    t_last, s_last = time.time(), step
                else:
                    progress.update(step)
                if eval_every > 0 and step % eval_every == 0 and step != total:
                    do_eval(step)
                    t_last = time.time()
                if stop.should_stop(step):
                    saved = save(step)
                    with ledger.timed("checkpoint"):
                        ckpt.wait()
                    progress.message(
                        f"stopped by signal: saved checkpoint {ckpt.directory}/{step}"
                        if saved
                        else f"stopped by signal at step {step} (not saved: unhealthy)"
                    )
                    writer.write(ledger.end_record(step, "preempted"))
                    watchdog.write_ledger_end("preempted")
                    raise Preempted(step)
                tier = tiers.save_tier(step, every, end, local_tier, int(ckpt_cfg.local_every_steps))
                if tier is not None:
                    save(step, local_tier if tier == "local" else ckpt)
            if evaluation is not None and end == total:
                if (eval_every != 0 and end > start) or (
                    evaluation.always_at_end and (end > start or (best is not None and best.best() is None))
                ):
                    do_eval(max(total, start))
            profiler.stop(m, steps=end - profiler.start)  # the run ended inside the profiled window
            if end > start:
                with ledger.timed("checkpoint"):
                    ckpt.wait()
                writer.write(ledger.end_record(end, "completed" if end == total else "stopped"))
        except guards.TrainingDiverged as e:
            _set_aside_diverged(e, ckpt, health, start if restored is not None else None)
            if local_tier is not None:  # the local tier's steps after the good one would be restored next
                local_tier.set_aside(
                    [t for t in local_tier.all_steps() if e.good_step is None or t > e.good_step], "diverged"
                )
            raise
        finally:
            batches.close()  # stops the prefetch worker
            stop.restore()
            progress.close()
            ckpt.close()
            if local_tier is not None:
                local_tier.close()
            watchdog.stop()  # last: a clean-up that waits on a dead peer is still bounded
            writer.close()
    summary["step"] = max(end, start)
    summary["last"] = record
    if end > start:
        watchdog.write_ledger_end("completed" if end == total else "stopped")
        summary["goodput"] = ledger.summary()
    if is_main and end <= start:  # nothing trained (a re-run of a finished run): summary.json stays as it is
        summary["summary"] = report.read_summary(wd.path)
    elif is_main:
        summary["summary"] = report.write_summary(
            wd.path,
            config,
            program,
            step=summary["step"],
            start=start,
            wall_time_s=time.time() - t_begin,
            throughput=throughput,
            last_train=record,
            n_devices=n_dev,
            extra={**summary["goodput"], "stragglers": watchdog.stragglers},
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
