"""Hang and straggler watchdog of a training run (a daemon thread; nothing on the step's path but the ledger's
clock reads, `xlgen.train.goodput.Ledger.step_done`).

    wd = Watchdog(config, workdir, ledger); wd.start()   ...   wd.stop()

Bound: `watchdog.timeout_s` seconds without a completed step (0 = derived: `watchdog.factor` x the longest of the
last 256 gaps between steps, at least `watchdog.min_timeout_s`; the longest gap, not the median, because the host
runs ahead of the devices and waits for them at the logged steps). Compilation (until the first step), evaluations
and checkpoint saves/restores are bounded by `watchdog.phase_timeout_s` instead. Waiting for data counts as the step.

A hang (the bound passed): every thread's stack and the step are printed to stderr, `WORKDIR/hang-process<i>.json`
is written (time, process, step, phase, bound, reason), the goodput ledger is written, and the process exits with
status 3 after one last line naming the reason, so that a supervisor (`xlgen train --max_restarts=N`) restarts it.
In a multi-process run a process whose peer died waits in a collective: no step completes, and it exits the same way
within the bound.

Stragglers: `window(steps, seconds)` at each logged step; a window whose time per step is above `watchdog.
straggler_factor` x the median of the earlier windows is counted and reported in one line.

The goodput ledger (`WORKDIR/goodput.json`, process 0) is written at every logged step for a local workdir (by the
main thread, right after the metrics record: a few hundred bytes renamed into place, no fsync), every 30 s by the
thread for a remote one, and on a hang.
"""

from __future__ import annotations

import faulthandler
import json
import os
import statistics
import sys
import threading
import time
from typing import Dict, Optional

from data_pipelines import paths

HANG_EXIT_CODE = 3
LONG_PHASES = ("eval", "checkpoint")


def settings(config) -> Dict[str, float]:
    """`config.watchdog` as floats (timeout_s, factor, min_timeout_s, phase_timeout_s, straggler_factor)."""
    return {k: float(v) for k, v in config.watchdog.items()}


class Watchdog:
    def __init__(self, config, workdir: str, ledger, *, process_index: int = 0, emit=None, enabled: bool = True):
        self.s = settings(config)
        self.workdir = workdir
        self.ledger = ledger
        self.process_index = process_index
        self.is_main = process_index == 0
        self.emit = emit or (lambda text: print(text, flush=True))
        self.enabled = enabled
        self.remote = paths.is_remote(workdir)
        self.stragglers = 0
        self._windows: list = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._written = None

    # -- bounds ------------------------------------------------------------------------------------------------
    def step_bound(self) -> float:
        if self.s["timeout_s"] > 0:
            return self.s["timeout_s"]
        gaps = list(self.ledger.gaps)
        ref = max(gaps) if gaps else 0.0
        return max(self.s["min_timeout_s"], self.s["factor"] * ref)

    def current_bound(self):
        """(seconds, what) of the bound that applies now."""
        if self.ledger.phase in LONG_PHASES:
            return max(self.s["phase_timeout_s"], self.step_bound()), self.ledger.phase
        if not self.ledger.started:
            return max(self.s["phase_timeout_s"], self.step_bound()), "compilation"
        return self.step_bound(), "training step"

    # -- at logged steps (main thread) -------------------------------------------------------------------------
    def logged(self, first_step: int, last_step: int, seconds: float) -> None:
        """Steps first_step..last_step were logged after `seconds`: check for stragglers; write the ledger (a local
        workdir: a few hundred bytes, renamed into place; a remote one: the thread, every 30 s)."""
        self.window(first_step, last_step, seconds)
        if not self.remote:
            self.write_ledger()  # exact at a kill: the steps and seconds after the last checkpoint

    def window(self, first_step: int, last_step: int, seconds: float) -> bool:
        """The steps first_step..last_step took `seconds`; returns whether they were stragglers."""
        n = last_step - first_step + 1
        if n <= 0 or seconds <= 0:
            return False
        per = seconds / n
        slow = False
        if len(self._windows) >= 5:
            med = statistics.median(self._windows)
            if med > 0 and per > self.s["straggler_factor"] * med:
                slow = True
                self.stragglers += n
                span = f"step {last_step}" if n == 1 else f"steps {first_step}-{last_step}"
                self.emit(f"straggler: {span} took {per:.3g}s per step, {per / med:.1f}x the median {med:.3g}s")
        self._windows.append(per)
        del self._windows[:-100]
        return slow

    # -- the thread --------------------------------------------------------------------------------------------
    def start(self) -> "Watchdog":
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="xlgen-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        last_write = 0.0
        while not self._stop.wait(0.25):
            now = time.monotonic()
            bound, what = self.current_bound()
            if now - self.ledger.last_event > bound:
                self._hang(bound, what, now - self.ledger.last_event)
                return
            if self.is_main and self.remote and now - last_write >= 30.0:
                key = (self.ledger.step, self.ledger.phase)
                if key != self._written:
                    self.write_ledger()
                    self._written = key
                last_write = now

    def write_ledger_end(self, end: str) -> None:
        """The ledger of an attempt that ended cleanly (completed | stopped | preempted)."""
        self.write_ledger(end)

    def write_ledger(self, end: Optional[str] = None) -> None:
        if not self.is_main or not self.enabled:
            return
        try:
            self.ledger.write(self.workdir, end=end)
        except Exception as e:  # noqa: BLE001  (a full disk or a flaky store must not stop training)
            print(f"warning: could not write the goodput ledger: {e}", file=sys.stderr, flush=True)

    def _hang(self, bound: float, what: str, waited: float) -> None:
        step = self.ledger.step
        reason = (
            f"no {what} completed within {bound:.0f}s (waited {waited:.0f}s; process {self.process_index}, "
            f"last completed step {step})"
        )
        try:
            sys.stdout.flush()
            print(f"\nwatchdog: {reason}; stacks of every thread:", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            print(f"watchdog: step {step}", file=sys.stderr, flush=True)
            marker = {
                "time": time.time(),
                "process": self.process_index,
                "pid": os.getpid(),
                "step": step,
                "phase": what,
                "bound_s": round(bound, 3),
                "waited_s": round(waited, 3),
                "reason": reason,
            }
            paths.atomic_write_text(
                paths.join(self.workdir, f"hang-process{self.process_index}.json"), json.dumps(marker) + "\n"
            )
            self.write_ledger()
        except Exception as e:  # noqa: BLE001  (exit with the status whatever else fails)
            print(f"watchdog: could not write the marker ({e})", file=sys.stderr, flush=True)
        print(f"xlgen train: hung: {reason}; exiting with status {HANG_EXIT_CODE}", file=sys.stderr, flush=True)
        os._exit(HANG_EXIT_CODE)


def exit_orphaned(error: BaseException, workdir: str, process_index: int) -> None:
    """A multi-process run whose collective failed (a peer died: gloo / the coordination service raise instead of
    hanging): print every thread's stack, write the marker, and exit with status 3 after one line naming the reason,
    without running jax.distributed's exit barrier (it would abort waiting for the dead peer)."""
    from xlgen.train.checkpointing import short_error

    reason = f"a collective failed in process {process_index} (a peer process died?): {short_error(error, 300)}"
    try:
        sys.stdout.flush()
        print(f"\nwatchdog: {reason}; stacks of every thread:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        marker = {"time": time.time(), "process": process_index, "pid": os.getpid(), "reason": reason}
        paths.atomic_write_text(paths.join(workdir, f"hang-process{process_index}.json"), json.dumps(marker) + "\n")
    except Exception:  # noqa: BLE001  (exit with the status whatever else fails)
        pass
    print(f"xlgen train: orphaned: {reason}; exiting with status {HANG_EXIT_CODE}", file=sys.stderr, flush=True)
    os._exit(HANG_EXIT_CODE)
