"""Guards of a training run: one live run per workdir, and a stop after too many non-finite updates.

    with WorkdirLock(workdir): ...        a second `xlgen train` on the workdir fails at once (WorkdirBusy)
    guard = NonFiniteGuard(max_consecutive)
    guard.add(metrics["nonfinite"])        per step (a device scalar: no host sync)
    guard.check(step)                      at log/checkpoint steps: counts, raises TrainingDiverged

The lock is `fcntl.flock` on `workdir/.xlgen.lock`: the kernel drops it when the holding process dies (SIGKILL
included), so a killed run never leaves the workdir stuck. Only process 0 of a multi-process run takes it (all
processes of one run share the workdir); `gs://` workdirs are not locked (no flock on object stores).
"""

from __future__ import annotations

import os
from typing import List, Optional

from data_pipelines import paths

LOCK_NAME = ".xlgen.lock"


class WorkdirBusy(RuntimeError):
    """Another live process is training in this workdir."""


class TrainingDiverged(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient norm."""


class WorkdirLock:
    def __init__(self, workdir: str, *, enabled: bool = True):
        self.workdir = workdir
        self.enabled = enabled and not paths.is_remote(workdir)
        self._fd: Optional[int] = None

    def __enter__(self):
        if not self.enabled:
            return self
        import fcntl

        os.makedirs(self.workdir, exist_ok=True)
        path = os.path.join(self.workdir, LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise WorkdirBusy(
                f"{self.workdir} is in use by a running xlgen process ({holder}); wait for it to finish or stop "
                f"it (Ctrl-C / kill <pid> saves a checkpoint), or use another --workdir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {os.uname().nodename}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc):
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None
        return False


class NonFiniteGuard:
    """Counts steps whose update was skipped (non-finite loss or gradient norm, see program.train_step)."""

    def __init__(self, max_consecutive: int):
        self.max_consecutive = int(max_consecutive)
        self.pending: List = []  # device scalars since the last check
        self.consecutive = 0
        self.total = 0
        self.window = 0  # skipped steps since the last logged record

    def add(self, flag) -> None:
        self.pending.append(flag)

    def check(self, step: int) -> None:
        if not self.pending:
            return
        import jax

        flags = [bool(f) for f in jax.device_get(self.pending)]
        first = step - len(flags) + 1
        self.pending = []
        for i, bad in enumerate(flags):
            if bad:
                self.consecutive += 1
                self.total += 1
                self.window += 1
                if 0 < self.max_consecutive <= self.consecutive:
                    raise TrainingDiverged(
                        f"{self.consecutive} consecutive steps (up to step {first + i}) had a non-finite loss or "
                        f"gradient norm; their updates were skipped and the run is stopped (max_nonfinite_steps="
                        f"{self.max_consecutive}). The checkpoints hold the last finite parameters: lower "
                        f"optimizer.learning_rate (or lengthen optimizer.warmup_steps), then re-run to resume."
                    )
            else:
                self.consecutive = 0

    def take_window(self) -> int:
        n, self.window = self.window, 0
        return n
