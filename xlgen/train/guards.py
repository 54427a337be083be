"""Guards of a training run: one live run per workdir, and a stop after too many unhealthy steps.

    with WorkdirLock(workdir): ...        a second `xlgen train` on the workdir fails at once (WorkdirBusy)
    guard = HealthGuard(max_consecutive, divergence_factor, best_loss, uniform_loss)
    guard.add(metrics["nonfinite"], metrics["loss"])   per step (device scalars: no host sync)
    guard.check(step)                      at log/checkpoint steps: counts, raises TrainingDiverged
    guard.healthy / guard.watch(c) / guard.proven      save only while healthy; the newest checkpoint proven good

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
    """Too many consecutive unhealthy steps (non-finite loss or gradient norm, or a diverging loss). `good_step`:
    the newest checkpoint proven healthy (set by the loop), None if none was."""

    good_step = None
    good_lr = None  # the learning rate that checkpoint was trained with


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
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # ENOSPC and friends: name the file (the CLI reports a full disk in one line)
            raise OSError(e.errno, e.strerror, path) from None
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


UNIFORM_ARMED = 0.9  # the uniform-guess ceiling applies once the best loss is below this fraction of it


class HealthGuard:
    """Watches every step's update (skipped: non-finite loss or gradient norm, see program.train_step) and loss.

    A step is unhealthy when its update was skipped or its loss diverges: finite but above `divergence_factor` x
    max(best loss so far, 1) (0: off; the floor 1 keeps small finetuning losses from tripping it), or above
    `uniform_loss` (the loss of a uniform guess, log V for a language model; None: no such bound) once the best
    loss has been below UNIFORM_ARMED x it (a model that has learned something and then does worse than guessing).
    `max_consecutive` unhealthy steps in a row raise TrainingDiverged (0: never). The loss of step t is computed on
    the parameters of step t-1, so a checkpoint of step c is proven good when step c+1 is healthy: `watch(c)` for
    each saved or restored checkpoint, `proven` is the newest proven one. `healthy`: the last checked step was.
    Flags and losses stay on the device until `check` (at log and checkpoint steps: no extra host sync)."""

    def __init__(
        self,
        max_consecutive: int,
        divergence_factor: float,
        best_loss: Optional[float] = None,
        uniform_loss: Optional[float] = None,
    ):
        self.max_consecutive = int(max_consecutive)
        self.divergence_factor = float(divergence_factor)
        self.uniform_loss = None if uniform_loss is None else float(uniform_loss)
        self.best = best_loss  # the lowest healthy loss so far (carried across resumes in the checkpoint meta)
        self.pending: List = []  # (skipped flag, loss) device scalars since the last check
        self.consecutive = 0
        self.nonfinite_in_streak = 0
        self.total = 0
        self.window = 0  # skipped steps since the last logged record
        self.watched: List[int] = []
        self.proven: Optional[int] = None

    def add(self, flag, loss=None) -> None:
        self.pending.append((flag, loss))

    def watch(self, step: int) -> None:
        self.watched.append(int(step))

    @property
    def healthy(self) -> bool:
        return self.consecutive == 0

    def limit(self) -> Optional[float]:
        """The loss above which a finite loss is unhealthy now (None: no limit yet)."""
        limits = []
        if self.best is not None and self.divergence_factor > 0:
            limits.append(self.divergence_factor * max(self.best, 1.0))
        if self.best is not None and self.uniform_loss is not None and self.best < UNIFORM_ARMED * self.uniform_loss:
            limits.append(self.uniform_loss)
        return min(limits) if limits else None

    def diverging(self, loss: float) -> bool:
        limit = self.limit()
        return limit is not None and loss > limit

    def describe_limit(self) -> str:
        """What `limit` is, in words (for the message that stops the run)."""
        parts = []
        if self.divergence_factor > 0 and self.best is not None:
            parts.append(f"divergence_factor={self.divergence_factor:g} x the best loss {self.best:.4g}")
        if self.uniform_loss is not None and self.best is not None and self.best < UNIFORM_ARMED * self.uniform_loss:
            parts.append(f"{self.uniform_loss:.4g}, the loss of a uniform guess")
        return " or ".join(parts)

    def check(self, step: int) -> None:
        if not self.pending:
            return
        import math

        import jax

        got = jax.device_get(self.pending)
        first = step - len(got) + 1
        self.pending = []
        for i, (flag, loss) in enumerate(got):
            t = first + i
            skipped = bool(flag)
            loss = None if loss is None else float(loss)
            bad = skipped or (loss is not None and (not math.isfinite(loss) or self.diverging(loss)))
            if t - 1 in self.watched:
                if not bad:
                    self.proven = t - 1
                self.watched = [w for w in self.watched if w > t - 1]
            if skipped:
                self.total += 1
                self.window += 1
            if not bad:
                self.consecutive = self.nonfinite_in_streak = 0
                if loss is not None:
                    self.best = loss if self.best is None else min(self.best, loss)
                continue
            self.consecutive += 1
            self.nonfinite_in_streak += int(skipped)
            if 0 < self.max_consecutive <= self.consecutive:
                if self.nonfinite_in_streak == self.consecutive:
                    what = "had a non-finite loss or gradient norm; their updates were skipped"
                else:
                    what = f"had a non-finite or diverging loss (above {self.describe_limit()}; last {loss:.4g})"
                raise TrainingDiverged(
                    f"{self.consecutive} consecutive steps (up to step {t}) {what} and the run is stopped "
                    f"(max_nonfinite_steps={self.max_consecutive})."
                )

    def take_window(self) -> int:
        n, self.window = self.window, 0
        return n


def health_guard(config, objective, best_loss: Optional[float] = None) -> HealthGuard:
    """The run's HealthGuard: `max_nonfinite_steps` and `divergence_factor` of the config (a stored config that
    predates them has their declared defaults, `xlgen.config.with_declared_defaults`) and the objective's
    uniform-guess loss."""
    uniform = getattr(objective, "uniform_loss", None)
    return HealthGuard(
        int(config.max_nonfinite_steps),
        float(config.divergence_factor),
        best_loss,
        uniform(config) if uniform is not None else None,
    )
