"""Orbax checkpointing facade (the only module that imports orbax, so a move to Orbax's v1 API stays local).

A checkpoint `workdir/checkpoints/<step>/` holds Composite items:
  state  parameters, optimizer state, step, RNG key      (always)
  mems   recurrent memory [n_layer, batch, mem_len, d]   (unless `checkpoint.save_mems=False`)
  meta   JSON: step, memory shape, config fingerprint
The data position is the step itself: batches are pure functions of (seed, step).

Orbax writes a step into a temporary directory and renames it when complete, so a killed process never leaves a
checkpoint that `all_steps()` reports. Every saved array is verified: `save` records each array's shape, dtype and a
checksum of its bytes (`checksums`: two 32-bit sums of the array's words, plain and position-weighted, computed on
the devices) in `meta["arrays"]`, committed atomically with the checkpoint; `restore` recomputes them on the restored
arrays. A checkpoint that fails to read or to verify is reported in one line naming its step and item directory, and
`restore_latest` falls back to the previous one. Only the workdir's writer (`xlgen train`, under its lock) passes
`quarantine=True`, which also moves the failed checkpoint aside to `checkpoints/corrupt-<step>/`; readers (eval,
export, generate, from_pretrained) change nothing. A restore target whose shapes differ from the stored ones is a
`CheckpointMismatch` (a config error naming both shapes), never treated as corruption. `pin(step)` keeps a checkpoint
through `keep`'s rotation (the trainer pins the newest one proven healthy). Restoring takes an abstract target whose
leaves carry the *current* shardings, so a checkpoint written on one mesh restores onto another.

`directory` may be a URL (`gs://bucket/run/checkpoints`): Orbax (through etils.epath and TensorStore's own GCS
driver) reads and writes it directly; the finalize-by-rename above is Orbax's commit-success marker on GCS.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import sys
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from data_pipelines import paths

log = logging.getLogger("xlgen")


class CheckpointCorrupt(RuntimeError):
    """A checkpoint's arrays do not match the checksums recorded when it was saved."""


class CheckpointMismatch(ValueError):
    """The restore target's shapes differ from the checkpoint's (a config change, not corruption)."""


def _words(x) -> jax.Array:
    """The bytes of `x` as a flat uint32 vector (1- and 2-byte elements widened, 8-byte ones split)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
    return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32).reshape(-1)


@jax.jit
def _sums(tree):
    def one(x):
        w = _words(x)
        pos = jnp.arange(1, w.size + 1, dtype=jnp.uint32)  # wraps mod 2**32 like the sums: exact in any order
        return jnp.stack([jnp.sum(w, dtype=jnp.uint32), jnp.sum(w * pos, dtype=jnp.uint32)])

    return jax.tree.map(one, tree)


def checksums(tree) -> Dict[str, Dict[str, Any]]:
    """{leaf path: {"shape", "dtype", "sum"}} of a pytree of arrays; "sum" is two 32-bit sums of the leaf's bytes as
    uint32 words (plain, and weighted by position: any changed word changes the first, swapped or shifted words the
    second), computed where the arrays live (no host copy; sharded arrays reduce exactly)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    sums = jax.device_get(_sums([v for _, v in leaves]))
    return {
        jax.tree_util.keystr(k): {
            "shape": list(v.shape),
            "dtype": str(v.dtype),
            "sum": "%08x%08x" % tuple(int(t) for t in s),
        }
        for (k, v), s in zip(leaves, sums)
    }


def _expected_shapes(tree) -> Dict[str, Tuple[list, str]]:
    return {
        jax.tree_util.keystr(k): (list(v.shape), str(v.dtype)) for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


class _Pinned(ocp.checkpoint_managers.PreservationPolicy):
    """Orbax preservation: the `n` newest checkpoints (None: all) and the pinned steps."""

    def __init__(self, n: Optional[int]):
        self.latest = ocp.checkpoint_managers.LatestN(n=n)
        self.steps: set = set()

    def should_preserve(self, checkpoints, *, context):
        latest = self.latest.should_preserve(checkpoints, context=context)
        return [bool(keep) or c.step in self.steps for c, keep in zip(checkpoints, latest)]


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
        n = int(keep) if keep and keep > 0 else None
        self._policy = None if best_fn is not None else _Pinned(n)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=n if best_fn is not None else None,
            enable_async_checkpointing=bool(async_save),
            create=True,
            best_fn=best_fn,
            best_mode=best_mode,
            preservation_policy=self._policy,
        )
        self.manager = ocp.CheckpointManager(self.path, options=options)
        _install_noise_filters()

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

    def pin(self, step: Optional[int]) -> None:
        """Keep `step` through the rotation (replaces the previous pin; None: no pin)."""
        if self._policy is not None:
            self._policy.steps = set() if step is None else {int(step)}

    # -- save ------------------------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        state: Any,
        mems: Optional[jax.Array],
        meta: Dict[str, Any],
        metrics: Optional[Dict[str, Any]] = None,
    ) -> bool:
        """Start an (async) save of `step` with the checksums of its arrays in `meta["arrays"]`; returns False if a
        checkpoint of that step already exists."""
        if step in self.manager.all_steps():
            return False
        arrays = {"state": checksums(state)}
        if mems is not None:
            arrays["mems"] = checksums({"mems": mems})
        meta = {**meta, "arrays": arrays}
        items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta)}
        if mems is not None:
            items["mems"] = ocp.args.StandardSave({"mems": mems})
        with _disk_full_as_oserror():
            return self.manager.save(step, args=ocp.args.Composite(**items), metrics=metrics, force=True)

    def wait(self) -> None:
        with _disk_full_as_oserror():
            self.manager.wait_until_finished()

    def close(self) -> None:
        with _disk_full_as_oserror():
            self.manager.wait_until_finished()
        self.manager.close()

    # -- restore ---------------------------------------------------------------------------------------------
    def read_meta(self, step: int) -> Dict[str, Any]:
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def has_mems(self, step: int) -> bool:
        return (self.path / str(step) / "mems").is_dir()

    def _check_shapes(self, step: int, item: str, recorded: Dict[str, Any], target: Any) -> None:
        """The target's shapes must be the recorded ones: else CheckpointMismatch naming both."""
        want = _expected_shapes(target)
        diff = [
            f"{k}: checkpoint {recorded[k]['shape']} vs config {want[k][0]}"
            for k in sorted(want)
            if k in recorded and list(recorded[k]["shape"]) != want[k][0]
        ]
        missing = sorted(set(want) - set(recorded))
        if diff or missing:
            detail = "; ".join(diff[:5] + [f"{k}: not in the checkpoint" for k in missing[:3]])
            raise CheckpointMismatch(
                f"{self.directory}/{step}/{item} does not match the config's model ({len(diff) + len(missing)} "
                f"arrays differ: {detail}); use the run's own config.json or a new --workdir"
            )

    def _verify(self, step: int, item: str, recorded: Dict[str, Any], restored: Any) -> None:
        got = checksums(restored)
        for k, v in got.items():
            r = recorded.get(k)
            if r is not None and r["dtype"] == v["dtype"] and r["sum"] != v["sum"]:
                raise CheckpointCorrupt(
                    f"{self.directory}/{step}/{item}: array {k} does not match its checksum "
                    f"(saved {r['sum']}, read {v['sum']})"
                )

    def restore(
        self, step: int, abstract_state: Any, abstract_mems: Optional[jax.ShapeDtypeStruct]
    ) -> Tuple[Any, Optional[jax.Array], Dict[str, Any]]:
        """Restore `step` and verify every array against the checksums saved with it (checkpoints written before
        checksums existed are restored unverified). Raises CheckpointMismatch (the target's shapes differ),
        CheckpointCorrupt (a checksum differs) or Orbax/TensorStore's error (unreadable)."""
        meta = self.read_meta(step)
        recorded = meta.get("arrays") or {}
        want_mems = abstract_mems is not None and self.has_mems(step)
        if "state" in recorded:
            self._check_shapes(step, "state", recorded["state"], abstract_state)
        if want_mems and "mems" in recorded:
            self._check_shapes(step, "mems", recorded["mems"], {"mems": abstract_mems})
        items = {"state": ocp.args.StandardRestore(abstract_state), "meta": ocp.args.JsonRestore()}
        if want_mems:
            items["mems"] = ocp.args.StandardRestore({"mems": abstract_mems})
        out = self.manager.restore(step, args=ocp.args.Composite(**items))
        if "state" in recorded:
            self._verify(step, "state", recorded["state"], out["state"])
        if want_mems and "mems" in recorded:
            self._verify(step, "mems", recorded["mems"], out["mems"])
        mems = out["mems"]["mems"] if want_mems else None
        return out["state"], mems, out["meta"]

    def restore_latest(
        self, abstract_state: Any, abstract_mems: Optional[jax.ShapeDtypeStruct], *, quarantine: bool = False
    ):
        """Restore the newest checkpoint that reads and verifies: (state, mems or None, meta, step), or None if
        there is none.

        A checkpoint that fails is reported in one warning line (step, item directory, reason) and the previous one
        is used. With `quarantine` (only the workdir's writer, under its lock) the failed checkpoint is also moved
        to `checkpoints/corrupt-<step>` (out of the step list: not counted toward `keep`, never tried again); without,
        nothing changes on disk. A shape mismatch (CheckpointMismatch) is raised at once: it is not corruption.
        If every checkpoint fails, RuntimeError lists them."""
        for _ in range(5):  # a concurrent writer's rotation can delete a step while it is read: list again
            out = self._restore_newest(abstract_state, abstract_mems, quarantine)
            if out != "rotated":
                return out
        return self._restore_newest(abstract_state, abstract_mems, quarantine)

    def _restore_newest(self, abstract_state, abstract_mems, quarantine: bool):
        self.manager.reload()
        steps = self.all_steps()
        errors = []
        for step in reversed(steps):
            try:
                with _quiet_async_failures():
                    state, mems, meta = self.restore(step, abstract_state, abstract_mems)
            except CheckpointMismatch:
                raise
            except Exception as e:  # unreadable or fails verification: try the previous one
                if not (self.path / str(step)).exists():  # rotated away by the run writing this workdir
                    return "rotated"
                reason = str(e) if isinstance(e, CheckpointCorrupt) else short_error(e)
                errors.append(f"step {step}: {reason}")
                if quarantine:
                    moved = self._move_aside(step)
                    action = f"moved it to {moved}" if moved else "left in place (could not move it)"
                else:
                    action = "left in place (only `xlgen train` moves a checkpoint)"
                log.warning(
                    "checkpoint %s/%d failed verification (%s); %s; falling back to the previous one",
                    self.directory,
                    step,
                    reason,
                    action,
                )
                continue
            return state, mems, meta, step
        if steps:
            raise CheckpointCorrupt(f"{self.directory}: no usable checkpoint among steps {steps}: " + "; ".join(errors))
        return None

    def set_aside(self, steps, why: str) -> list:
        """Move checkpoints `steps` to `<why>-<step>/` (e.g. "diverged"): kept on disk, out of the step list."""
        self.manager.wait_until_finished()
        return [m for m in (self._move_aside(s, why) for s in steps) if m]

    def _move_aside(self, step: int, why: str = "corrupt") -> Optional[str]:
        """Rename `<step>/` to `<why>-<step>[-N]/` (process 0) and forget it; returns the new path or None."""
        src = self.path / str(step)
        dst = self.path / f"{why}-{step}"
        n = 1
        while dst.exists():
            n += 1
            dst = self.path / f"{why}-{step}-{n}"
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


@contextlib.contextmanager
def _disk_full_as_oserror():
    """A full disk during a save (TensorStore's RESOURCE_EXHAUSTED, wrapped by Orbax) -> OSError(ENOSPC, path)."""
    try:
        yield
    except OSError:
        raise
    except Exception as e:
        text = str(e)
        if "RESOURCE_EXHAUSTED" in text or "No space left on device" in text:
            m = re.search(r'local file "([^"]+)"', text) or re.search(r'Error writing "?([^" ]+)', text)
            raise OSError(errno.ENOSPC, "No space left on device", m.group(1) if m else None) from None
        raise


class _DropDiskFullNoise(logging.Filter):
    """Orbax's per-thread error logs (with tracebacks) of a save that hit a full disk: the error itself is raised
    once, as OSError(ENOSPC), from save/wait."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001  (a malformed record is not ours to drop)
            return True
        if record.exc_info and record.exc_info[1] is not None:
            text += str(record.exc_info[1])
        return not ("RESOURCE_EXHAUSTED" in text or "No space left on device" in text)


def _install_noise_filters() -> None:
    global _previous_unraisablehook
    if sys.unraisablehook is not _unraisablehook:
        _previous_unraisablehook = sys.unraisablehook
        sys.unraisablehook = _unraisablehook
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropDiskFullNoise) for f in logger.filters):
            logger.addFilter(_DropDiskFullNoise())
    if _async_filter not in logging.getLogger("asyncio").filters:
        logging.getLogger("asyncio").addFilter(_async_filter)


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
