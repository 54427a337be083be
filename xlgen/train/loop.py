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

import logging
import signal
import time
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from data_pipelines import paths
from xlgen import config as config_lib
from xlgen import sharding
from xlgen.checkpointing import Checkpointer
from xlgen.train import guards, report, tokenizer_store
from xlgen.train import metrics as metrics_lib
from xlgen.train.program import Program, abstract_model, build_program, make_eval_step

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
    from xlgen.train.objectives import get_objective

    obj = get_objective(config)
    spec = abstract_model(lambda r: obj.make_model(config, r, True), train=True)
    out = {f"param {k}": v for k, v in spec.shapes.items()}
    out["memory"] = obj.mems_shape(config, "train")
    return out


def check_workdir_compatible(config, workdir: str) -> None:
    """A config that changes parameter or memory shapes against an existing workdir is an error."""
    old = config_lib.read_workdir_config(workdir)
    if old is None or not paths.as_path(workdir).joinpath("checkpoints").is_dir():
        return
    old_model, new_model = old.model.to_dict(), config.model.to_dict()
    changed = sorted(k for k in set(old_model) | set(new_model) if old_model.get(k) != new_model.get(k))
    if old.get("objective") != config.get("objective"):
        changed.append("objective")
    try:
        old_shapes = _shapes(old)
    except Exception as e:  # the stored config no longer builds
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


def eval_data_config(config):
    """The eval pipeline reads its layout from config.data itself (eval_batch_size, eval_tgt_len)."""
    return config.data


def make_pipeline(data_config, split: str):
    import data_pipelines

    return data_pipelines.make_pipeline(
        data_config, split=split, process_index=jax.process_index(), process_count=jax.process_count()
    )


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
    return "  ".join(f"{k} {v:.4f}" for k, v in d.items())


def train(config, workdir: str, *, stop_at: Optional[int] = None) -> Dict[str, Any]:
    """Train (or resume) to config.total_steps. `stop_at` (CLI --stop_at_step) saves and stops early at that step
    without changing the schedule, as an interruption would. Returns a summary dict (step, last record, eval).
    A second live run on the same workdir fails at once (guards.WorkdirBusy)."""
    workdir = paths.display(workdir)  # absolute if local; a URL stays a URL
    with guards.WorkdirLock(workdir, enabled=jax.process_index() == 0):
        return _train(config, workdir, stop_at=stop_at)


def _train(config, workdir: str, *, stop_at: Optional[int] = None) -> Dict[str, Any]:
    t_begin = time.time()
    is_main = jax.process_index() == 0
    check_workdir_compatible(config, workdir)
    if is_main:
        config_lib.write_resolved_config(config, workdir)

    mesh = sharding.make_mesh(config.mesh)
    program = build_program(config, mesh)
    total = int(config.total_steps)
    ckpt_cfg = config.checkpoint
    save_mems = bool(ckpt_cfg.save_mems) and program.mems_shape is not None
    summary: Dict[str, Any] = {"workdir": workdir}

    # The data first: a missing corpus fails before anything is compiled.
    train_pipe = make_pipeline(config.data, "train")
    if is_main:  # the run's tokenizer into workdir/tokenizer/, named in config.json (a different one is an error)
        tokenizer_store.save(workdir, getattr(train_pipe, "tokenizer", None))
    data_vocab = getattr(train_pipe, "vocab_size", None)
    model_vocab = config.model.get("vocab_size")
    if data_vocab and model_vocab and int(model_vocab) < int(data_vocab):
        raise ValueError(
            f"config.model.vocab_size={model_vocab} is smaller than the data's vocabulary "
            f"({data_vocab} symbols, data.source={config.data.get('source')!r})"
        )
    bspec = program.objective.batch_shapes(config, "train")
    gb = next(iter(bspec.values()))[0][0]
    row0, row1 = sharding.addressable_batch_rows(mesh, gb)
    if getattr(train_pipe, "local_batch_size", row1 - row0) != row1 - row0:
        raise ValueError(
            f"the data pipeline gives {train_pipe.local_batch_size} rows per process but the mesh "
            f"places {row1 - row0} rows on process {jax.process_index()}"
        )

    ckpt = Checkpointer(
        paths.join(workdir, "checkpoints"), keep=int(ckpt_cfg.keep), async_save=bool(ckpt_cfg.async_save)
    )
    writer = metrics_lib.MetricsWriter(workdir, enabled=is_main, tensorboard=bool(config.get("tensorboard", True)))
    with jax.set_mesh(mesh):
        restored = ckpt.restore_latest(program.abstract_state(), program.abstract_mems() if save_mems else None)
        if restored is not None:
            state, mems, meta, start = restored
            if program.mems_shape is not None and mems is None:
                log.warning(
                    "checkpoint %d has no memory (checkpoint.save_mems=False): streams restart with empty memory", start
                )
                mems = jnp.zeros(program.mems_shape, program.mems_dtype, device=program.mems_sharding)
            if is_main:
                dropped = metrics_lib.truncate_after(writer.path, start)
                print(
                    f"resumed from {ckpt.directory}/{start}"
                    + (f" (dropped {dropped} metric records logged after it)" if dropped else ""),
                    flush=True,
                )
        else:
            state, mems = program.init_state()
            start = 0
        summary["start_step"] = start

        eval_every = int(config.eval_every_steps)
        eval_pipe = None

        def do_eval(step):
            nonlocal eval_pipe
            if eval_pipe is None:
                eval_pipe = make_pipeline(eval_data_config(config), config.eval.split)
            res = run_eval(program, state["params"], eval_pipe, _eval_steps(config, eval_pipe))
            rec = {"step": step, "split": config.eval.split, **res}
            writer.write(rec)
            progress.message(f"eval @ step {step} ({config.eval.split}): {_fmt_metrics(res)}")
            summary["eval"] = rec

        def save(step):
            meta = {
                "step": step,
                "mems_shape": list(program.mems_shape) if program.mems_shape else None,
                "family": config.model.family,
            }
            writer.flush()  # records up to `step` are durable before its checkpoint can exist (gs://: no append)
            ckpt.save(step, state, mems if save_mems else None, meta)

        stop = _StopFlag()
        stop.install()
        if is_main and start < total:
            print(report.start_block(config, program, mesh, train_pipe, workdir, start), flush=True)
            print("compiling… (XLA compiles the train step before the first one runs)", flush=True)
        progress = metrics_lib.Progress(total, start, enabled=is_main)
        nonfinite = guards.NonFiniteGuard(int(config.get("max_nonfinite_steps", 10)))
        throughput = report.Throughput()
        log_every = max(int(config.log_every_steps), 1)
        every = int(ckpt_cfg.every_steps)
        peak = float(config.get("peak_flops_per_device", 0.0))
        n_dev = len(mesh.devices.flat)
        t_last, s_last = time.time(), start
        record = None
        end = total if stop_at is None else min(int(stop_at), total)
        batches = _train_batches(train_pipe, start, end, int(config.get("prefetch", 2)))
        try:
            for s, local in batches:
                batch = global_batch(local, program.batch_shardings, bspec)
                state, mems, m = program.train_step(state, batch, mems)
                nonfinite.add(m.pop("nonfinite"))
                step = s + 1
                if step == start + 1:  # do not count compilation in the throughput
                    jax.block_until_ready(m)
                    t_last, s_last = time.time(), step
                    progress.reset_clock(step)
                    if is_main:
                        progress.message(
                            f"first step done {t_last - t_begin:.0f}s after start (compiled; {program.tokens_per_step} "
                            f"tokens/step, {program.analytic_flops_per_step:.3g} FLOPs/step)"
                        )
                if step % log_every == 0 or step == total:
                    nonfinite.check(step)
                    vals = {k: float(v) for k, v in jax.device_get(m).items()}
                    now = time.time()
                    n = max(step - s_last, 0)
                    dt = max(now - t_last, 1e-9)
                    record = {"step": step, **vals}
                    if nonfinite.total:
                        record["nonfinite_steps"] = nonfinite.take_window()  # updates skipped since the last record
                    if n:
                        throughput.add(n, dt)
                        record["steps_per_sec"] = n / dt
                        record["tokens_per_sec"] = n * program.tokens_per_step / dt
                        if program.analytic_flops_per_step and peak > 0:
                            record["mfu"] = program.analytic_flops_per_step * n / dt / (n_dev * peak)
                    else:
                        record["tokens_per_sec"] = 0.0
                    writer.write(record)
                    progress.update(step, record)
                    t_last, s_last = time.time(), step
                else:
                    progress.update(step)
                if eval_every > 0 and step % eval_every == 0 and step != total:
                    do_eval(step)
                    t_last = time.time()
                if stop.should_stop(step):
                    save(step)
                    ckpt.wait()
                    progress.message(f"stopped by signal: saved checkpoint {ckpt.directory}/{step}")
                    raise Preempted(step)
                if (every > 0 and step % every == 0) or step == end:
                    nonfinite.check(step)
                    save(step)
            if eval_every != 0 and end > start and end == total:
                do_eval(total)
        finally:
            batches.close()  # stops the prefetch worker
            stop.restore()
            progress.close()
            ckpt.close()
            writer.close()
    summary["step"] = max(end, start)
    summary["last"] = record
    if is_main:
        summary["summary"] = report.write_summary(
            workdir,
            config,
            program,
            step=summary["step"],
            start=start,
            wall_time_s=time.time() - t_begin,
            throughput=throughput,
            last_train=record,
            n_devices=n_dev,
        )
    return summary


def evaluate(config, workdir: str) -> Dict[str, Any]:
    """Evaluate the latest checkpoint of `workdir` on config.eval.split; appends the record to metrics.jsonl."""
    workdir = paths.display(workdir)
    ckpt_dir = paths.join(workdir, "checkpoints")
    if not paths.as_path(ckpt_dir).is_dir():
        raise FileNotFoundError(
            f"{workdir}: no checkpoints/ directory (train first: xlgen train ... --workdir={workdir})"
        )
    check_workdir_compatible(config, workdir)
    mesh = sharding.make_mesh(config.mesh)
    program = build_program(config, mesh)
    ckpt = Checkpointer(ckpt_dir, keep=0, async_save=False)
    with jax.set_mesh(mesh):
        restored = ckpt.restore_latest(program.abstract_state(), None)
        if restored is None:
            raise FileNotFoundError(f"{ckpt_dir}: no checkpoint to evaluate")
        state, _, _, step = restored
        pipe = make_pipeline(eval_data_config(config), config.eval.split)
        res = run_eval(program, state["params"], pipe, _eval_steps(config, pipe))
    ckpt.close()
    rec = {"step": step, "split": config.eval.split, **res}
    if jax.process_index() == 0:
        writer = metrics_lib.MetricsWriter(workdir, tensorboard=False)
        writer.write(rec)
        writer.close()
    return rec
