"""Orbax checkpointing facade (the only module that imports orbax, so a move to Orbax's v1 API stays local).

A checkpoint `workdir/checkpoints/<step>/` holds Composite items:
  state  parameters, optimizer state, step, RNG key      (always)
  mems   recurrent memory [n_layer, batch, mem_len, d]   (unless `checkpoint.save_mems=False`)
  meta   JSON: step, memory shape, config fingerprint
The data position is the step itself: batches are pure functions of (seed, step).

Orbax writes a step into a temporary directory and renames it when complete, so a killed process never leaves a
checkpoint that `all_steps()` reports; `restore_latest` additionally falls back to the previous checkpoint if the newest
one cannot be read, moving the unreadable one aside to `checkpoints/corrupt-<step>/` (one warning line). Restoring takes an abstract target whose leaves carry the *current*
shardings, so a checkpoint written on one mesh restores onto another.

`directory` may be a URL (`gs://bucket/run/checkpoints`): Orbax (through etils.epath and TensorStore's own GCS
driver) reads and writes it directly; the finalize-by-rename above is Orbax's commit-success marker on GCS.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import orbax.checkpoint as ocp

from data_pipelines import paths

log = logging.getLogger("xlgen")


class Checkpointer:
    def __init__(
        self,
        directory: str,
        *,
        keep: int = 3,
        async_save: bool = True,
        best_fn: Optional[Callable[[Dict[str, Any]], Any]] = None,
        best_mode: str = "max",
    ):
        """Keep the `keep` newest checkpoints (0: all); with `best_fn` (metrics -> sortable value, Orbax
        `best_fn`/`best_mode`) the `keep` best by the metrics passed to `save(..., metrics=)` instead."""
        self.path = paths.as_path(directory)  # an epath: local (absolute) or gs://, never abspath'ed as a URL
        self.directory = str(self.path)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=int(keep) if keep and keep > 0 else None,
            enable_async_checkpointing=bool(async_save),
            create=True,
            best_fn=best_fn,
            best_mode=best_mode,
        )
        self.manager = ocp.CheckpointManager(self.path, options=options)

    # -- queries ---------------------------------------------------------------------------------------------
    def all_steps(self):
        return sorted(self.manager.all_steps())

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def best_step(self) -> Optional[int]:
        """The best step by `best_fn` (the latest without one); None if there is no checkpoint."""
        return self.manager.best_step()

    def metrics(self, step: int) -> Optional[Dict[str, Any]]:
        """The metrics saved with `step` (None if none were)."""
        return self.manager.metrics(step)

    # -- save ------------------------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        state: Any,
        mems: Optional[jax.Array],
        meta: Dict[str, Any],
        metrics: Optional[Dict[str, Any]] = None,
    ) -> bool:
        """Start an (async) save of `step`; returns False if a checkpoint of that step already exists."""
        if step in self.manager.all_steps():
            return False
        items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta)}
        if mems is not None:
            items["mems"] = ocp.args.StandardSave({"mems": mems})
        return self.manager.save(step, args=ocp.args.Composite(**items), metrics=metrics, force=True)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

    # -- restore ---------------------------------------------------------------------------------------------
    def read_meta(self, step: int) -> Dict[str, Any]:
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def has_mems(self, step: int) -> bool:
        return (self.path / str(step) / "mems").is_dir()

    def restore(
        self, step: int, abstract_state: Any, abstract_mems: Optional[jax.ShapeDtypeStruct]
    ) -> Tuple[Any, Optional[jax.Array], Dict[str, Any]]:
        items = {"state": ocp.args.StandardRestore(abstract_state), "meta": ocp.args.JsonRestore()}
        want_mems = abstract_mems is not None and self.has_mems(step)
        if want_mems:
            items["mems"] = ocp.args.StandardRestore({"mems": abstract_mems})
        out = self.manager.restore(step, args=ocp.args.Composite(**items))
        mems = out["mems"]["mems"] if want_mems else None
        return out["state"], mems, out["meta"]

    def restore_latest(self, abstract_state: Any, abstract_mems: Optional[jax.ShapeDtypeStruct]):
        """Restore the newest readable checkpoint: (state, mems or None, meta, step) or None if there is none.

        A checkpoint that fails to restore is moved aside to `checkpoints/corrupt-<step>` (no longer a step: it is
        not counted toward `keep` and never tried again) with a one-line warning, and the previous one is used."""
        steps = self.all_steps()
        errors = []
        for step in reversed(steps):
            try:
                with _quiet_async_failures():
                    state, mems, meta = self.restore(step, abstract_state, abstract_mems)
            except Exception as e:  # unreadable (truncated files, wrong structure): try the previous one
                reason = short_error(e)
                errors.append(f"step {step}: {reason}")
                moved = self._move_aside(step)
                log.warning(
                    "checkpoint %s/%d is unreadable (%s); %s",
                    self.directory,
                    step,
                    reason,
                    f"moved it to {moved}" if moved else "left in place (could not move it)",
                )
                continue
            return state, mems, meta, step
        if steps:
            raise RuntimeError(f"{self.directory}: no readable checkpoint among steps {steps}:\n" + "\n".join(errors))
        return None

    def _move_aside(self, step: int) -> Optional[str]:
        """Rename `<step>/` to `corrupt-<step>[-N]/` (process 0) and forget it; returns the new path or None."""
        src = self.path / str(step)
        dst = self.path / f"corrupt-{step}"
        n = 1
        while dst.exists():
            n += 1
            dst = self.path / f"corrupt-{step}-{n}"
        moved = None
        if jax.process_index() == 0:
            try:
                src.rename(dst)
                moved = str(dst)
            except Exception as e:  # read-only workdir, remote store without rename: keep going with the previous
                log.warning("could not move %s aside (%s)", src, short_error(e))
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"xlgen_corrupt_checkpoint_{step}")
            moved = str(dst) if not src.exists() else None
        self.manager.reload()
        return moved


def short_error(e: BaseException, limit: int = 200) -> str:
    """`Type: first line of the message`, without TensorStore's spec dumps, at most `limit` characters."""
    text = str(e).split("See full TensorStore details")[0].strip().splitlines()
    text = text[0].rstrip(" .") if text else ""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class _DropAsyncNoise(logging.Filter):
    """asyncio's "Task/Future exception was never retrieved" records of Orbax's cancelled reads."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "exception was never retrieved" not in str(record.msg)


_async_filter = _DropAsyncNoise()
_previous_unraisablehook = None


def _unraisablehook(unraisable) -> None:
    # TensorStore reads that finish after Orbax closed the event loop of a failed restore report
    # `RuntimeError: Event loop is closed` through sys.unraisablehook (~100 tracebacks per failure): drop those only.
    exc = unraisable.exc_value
    if isinstance(exc, RuntimeError) and "Event loop is closed" in str(exc):
        return
    (_previous_unraisablehook or sys.__unraisablehook__)(unraisable)


@contextlib.contextmanager
def _quiet_async_failures():
    """Silence the asyncio noise of a failing restore (for the rest of the process: some arrives late, from
    TensorStore's threads); the error itself still raises from `restore`."""
    global _previous_unraisablehook
    if sys.unraisablehook is not _unraisablehook:  # also during the restore: the first reports come before it raises
        _previous_unraisablehook = sys.unraisablehook
        sys.unraisablehook = _unraisablehook
    try:
        yield
    except Exception:
        logging.getLogger("asyncio").addFilter(_async_filter)
        raise
