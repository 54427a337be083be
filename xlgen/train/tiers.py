"""The local checkpoint tier: frequent saves to a fast local directory, rarer ones to the workdir.

    --config.checkpoint.local_dir=DIR  --config.checkpoint.local_every_steps=N

Every `checkpoint.every_steps` (and at the end, and on SIGTERM) the run saves to `WORKDIR/checkpoints/` as always;
at the other multiples of `local_every_steps` it saves to `DIR` (an Orbax CheckpointManager of its own, the same
items, checksums and `keep`). A local checkpoint records the workdir it belongs to (`meta["workdir"]`); one of
another run is never restored.

Restore (`restore`): the newest step that reads and verifies in either tier (a step in both: the local copy first),
every process trying the steps in process 0's order (one broadcast), so that all of them restore the same step. A
local checkpoint that fails verification is moved aside to `DIR/corrupt-<step>/` and the next one is tried; an
empty or deleted local tier (a new machine) restores from the workdir. Without a local tier this is
`Workdir.restore` unchanged.
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

import jax

from xlgen.train.checkpointing import CheckpointCorrupt, CheckpointMismatch, short_error
from xlgen.train.workdir import Restored, Workdir

log = logging.getLogger("xlgen")


def local_checkpointer(config, wd: Workdir):
    """The local tier's Checkpointer, or None when `checkpoint.local_dir` / `local_every_steps` is not set."""
    c = config.checkpoint
    local_dir, every = str(c.local_dir), int(c.local_every_steps)
    if not local_dir or every <= 0:
        return None
    from xlgen.train.checkpointing import Checkpointer

    return Checkpointer(local_dir, keep=int(c.keep), async_save=bool(c.async_save))


def save_tier(step: int, every: int, end: int, local, local_every: int):
    """Which tier saves `step`: "workdir" (every_steps, the end), "local" (local_every_steps), or None."""
    if (every > 0 and step % every == 0) or step == end:
        return "workdir"
    if local is not None and local_every > 0 and step % local_every == 0:
        return "local"
    return None


def _agreed(steps):
    """Process 0's list of steps, on every process."""
    if jax.process_count() == 1:
        return steps
    import numpy as np
    from jax.experimental import multihost_utils

    n = int(multihost_utils.broadcast_one_to_all(np.int64(len(steps))))
    arr = np.zeros(max(n, 1), np.int64)
    arr[: len(steps)] = steps[:n]
    return [int(s) for s in multihost_utils.broadcast_one_to_all(arr)[:n]]


def restore(
    wd: Workdir, program, ckpt, local, *, mems: bool, quarantine: bool
) -> Tuple[Optional[Restored], Optional[str]]:
    """(Restored, the directory it came from) of the newest checkpoint that verifies in either tier; (None, None)
    when there is none. Raises CheckpointMismatch at once, CheckpointCorrupt when checkpoints exist but none is
    usable."""
    if local is None:
        r = wd.restore(program, mems=mems, checkpointer=ckpt, quarantine=quarantine)
        return r, (ckpt.directory if r is not None else None)
    abstract_mems = program.abstract_mems() if mems and program.mems_shape is not None else None
    local.manager.reload()
    ckpt.manager.reload()
    own = []
    for s in local.all_steps():
        try:
            if local.read_meta(s).get("workdir") == wd.path:
                own.append(s)
        except Exception:  # noqa: BLE001  (an unreadable meta: a candidate that will fail verification below)
            own.append(s)
    work = ckpt.all_steps()
    candidates = sorted(set(own) | set(work), reverse=True)
    candidates = _agreed(candidates)
    errors = []
    for step in candidates:
        for tier in ([local] if step in own else []) + ([ckpt] if step in work else []):
            try:
                state, m, meta = tier.restore(step, program.abstract_state(), abstract_mems)
            except CheckpointMismatch:
                raise
            except Exception as e:  # unreadable or fails verification: the other tier, else the previous step
                reason = str(e) if isinstance(e, CheckpointCorrupt) else short_error(e)
                errors.append(f"{tier.directory}/{step}: {reason}")
                moved = tier._move_aside(step) if quarantine else None
                log.warning(
                    "checkpoint %s/%d failed verification (%s); %s; falling back",
                    tier.directory,
                    step,
                    reason,
                    f"moved it to {moved}" if moved else "left in place",
                )
                continue
            return Restored(state, m, meta, step), tier.directory
    if candidates:
        raise CheckpointCorrupt(f"no usable checkpoint in {local.directory} or {ckpt.directory}: " + "; ".join(errors))
    return None, None
