"""Goodput: where a run's wall time went, per attempt and cumulative across restarts (host-side timers only).

Categories (seconds; they sum to the wall time):
    productive        training steps whose result is kept
    compile           from the command's start to the first completed step (start-up, tracing, XLA compile),
                      less the restore and data time inside it
    data              waiting for the next batch (the prefetch queue was empty)
    checkpoint        restoring, saving (the blocking part of an async save), waiting for saves to finish
    eval              evaluations during and at the end of training
    lost_to_restarts  steps computed after the checkpoint a later attempt resumed from: computed again
    idle              from an attempt's last completed step to the next attempt's start (the failure, its detection,
                      the restart back-off, or an operator's re-run)
    goodput = productive / wall.

The ledger of the run lives in `WORKDIR/goodput.json` (process 0; rewritten atomically by the watchdog thread
while steps advance, and at the end of an attempt): the cumulative seconds so far, the last completed step and its
time, and for each recent checkpoint the productive seconds at its save. An attempt that resumes from checkpoint C
reads the ledger the previous attempt left: the productive seconds after C's save (and the steps after C) move to
`lost_to_restarts` (`lost_steps`), the time from the previous attempt's last step to this start is `idle`, and the
previous attempt's own record goes to metrics.jsonl (it could not write one when it was killed). Each attempt
writes one record to metrics.jsonl:

    {"step", "split": "goodput", "attempt", "end" (completed | stopped | failed), "goodput", "time_s": {...},
     "lost_steps", "wall_s"}

and summary.json the cumulative `goodput`, `time_s`, `attempts`, `lost_steps`. Nothing here touches a device: the
loop calls `step_done(step)` after dispatching each step (a clock read and a few additions) and wraps its phases in
`timed(category)`.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import threading
import time
from typing import Any, Dict, Iterator, Optional

from data_pipelines import paths

CATEGORIES = ("productive", "compile", "data", "checkpoint", "eval", "lost_to_restarts", "idle")
LEDGER = "goodput.json"
_KEEP_SAVES = 16  # productive seconds at the most recent saves (a resume from an older checkpoint is estimated)


def zero() -> Dict[str, float]:
    return {k: 0.0 for k in CATEGORIES}


def goodput_of(time_s: Dict[str, float]) -> Optional[float]:
    wall = sum(time_s.values())
    return time_s["productive"] / wall if wall > 0 else None


def read_ledger(workdir: str) -> Optional[Dict[str, Any]]:
    """The ledger a previous attempt left in `workdir`, None if there is none (or it is unreadable)."""
    try:
        d = json.loads(paths.read_text(paths.join(workdir, LEDGER)))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and isinstance(d.get("time_s"), dict) else None


def last_train_step(metrics_path: str) -> Optional[int]:
    """The highest step of the training records in a metrics.jsonl (None: no file or no record); read before a
    resume truncates the records of steps after its checkpoint."""
    try:
        text = paths.read_text(metrics_path)
    except (OSError, ValueError):
        return None
    best = None
    for line in text.splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and "split" not in r and "source" not in r and isinstance(r.get("step"), int):
            best = r["step"] if best is None else max(best, r["step"])
    return best


def describe(time_s: Dict[str, float], attempts: int = 1, lost_steps: int = 0) -> str:
    """`goodput 93.1%: productive 120s, compile 5.2s, ... (3 attempts, 14 steps recomputed)`."""
    g = goodput_of(time_s)
    parts = ", ".join(f"{k.replace('_', ' ')} {_secs(v)}" for k, v in time_s.items() if v >= 0.05 or k == "productive")
    tail = f" ({attempts} attempts, {lost_steps} steps recomputed)" if attempts > 1 else ""
    return f"goodput {100 * (g or 0.0):.1f}%: {parts}{tail}"


def describe_summary(summary: Dict[str, Any]) -> str:
    """The end-of-run line for `Ledger.summary()`."""
    return describe(summary["time_s"], summary.get("attempts", 1), summary.get("lost_steps", 0))


def _secs(s: float) -> str:
    return f"{s:.1f}s" if s < 100 else f"{s:.0f}s"


class Ledger:
    """The wall-time ledger of one attempt (started at `t_begin`, a `time.time()`), on top of what earlier attempts
    left (`resume`). Categories other than `productive` are added by `timed`; what is left between two completed
    steps is productive, and before the first one it is compilation."""

    def __init__(self, t_begin: float, attempt_start_step: int = 0):
        self.t_begin = t_begin
        self.mono0 = time.monotonic() - (time.time() - t_begin)  # t_begin on the monotonic clock
        self.own = zero()  # this attempt
        self.carried = zero()  # earlier attempts (lost and idle of the last restart included)
        self.attempt = 1
        self.lost_steps = 0  # cumulative
        self.start_step = attempt_start_step
        self.step = attempt_start_step
        self.t_step = self.mono0  # monotonic time of the last completed step (or of the start)
        self._accounted = self.mono0  # monotonic time up to which the wall time is assigned
        self._first = True
        self._saves: Dict[int, float] = {}
        self._lock = threading.Lock()
        self.phase: Optional[str] = None  # the `timed` category running now (read by the watchdog)
        self.last_event = self.mono0  # monotonic time of the last step or phase boundary
        self.gaps: collections.deque = collections.deque(maxlen=256)  # seconds between steps, phases excluded
        self.previous_record: Optional[Dict[str, Any]] = None

    # -- the loop's calls --------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def timed(self, category: str) -> Iterator[None]:
        t0 = time.monotonic()
        outer, self.phase, self.last_event = self.phase, category, t0
        try:
            yield
        finally:
            now = time.monotonic()
            with self._lock:
                self.own[category] += now - t0
                self._pending_other += now - t0
            self.phase, self.last_event = outer, now

    _pending_other = 0.0  # seconds of `timed` phases since the last step (not productive, not compilation)

    def iterate(self, it, category: str = "data"):
        """`it`'s items, the time spent waiting for each counted as `category`."""
        it = iter(it)
        while True:
            with self.timed(category):
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item

    def step_done(self, step: int) -> None:
        """Step `step` was dispatched: the time since the previous one, less its timed phases, is productive (before
        the first step: compilation)."""
        now = time.monotonic()
        with self._lock:
            span = now - self._accounted - self._pending_other
            first = self._first
            self.own["compile" if first else "productive"] += max(span, 0.0)
            self._first = False
            self._accounted, self._pending_other = now, 0.0
            self.step, self.t_step = step, now
            self.last_event = now
            if not first:
                self.gaps.append(span)

    def saved(self, step: int) -> None:
        """A checkpoint of `step` was written (or started): remember the productive seconds it keeps."""
        with self._lock:
            self._saves[int(step)] = self.own["productive"] + self.carried["productive"]
            while len(self._saves) > _KEEP_SAVES:
                self._saves.pop(min(self._saves))

    # -- views -------------------------------------------------------------------------------------------------
    def attempt_time(self, now: Optional[float] = None) -> Dict[str, float]:
        """This attempt's seconds up to `now` (monotonic); the time since the last step is idle (an unfinished
        step, or the end of the attempt)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            out = dict(self.own)
            rest = now - self._accounted - self._pending_other
        out["compile" if self._first else "idle"] += max(rest, 0.0)
        return out

    def cumulative(self, now: Optional[float] = None) -> Dict[str, float]:
        own = self.attempt_time(now)
        return {k: self.carried[k] + own[k] for k in CATEGORIES}

    @property
    def started(self) -> bool:
        """Whether the attempt's first step has completed (compilation is over)."""
        return not self._first

    def snapshot(self, end: Optional[str] = None) -> Dict[str, Any]:
        """The ledger file's content as of the last completed step (what a killed attempt leaves); `end`: how the
        attempt ended when it ended cleanly (completed | stopped | preempted)."""
        with self._lock:
            t_step, step = self.t_step, self.step
            saves = dict(self._saves)
            until = t_step + self._pending_other  # the phases after the last step (a save) are accounted
        if end is not None:  # a clean end: everything to the present time
            t_step = until = time.monotonic()
        time_s = self.cumulative(t_step)
        return {
            "time_s": time_s,
            "attempt": self.attempt,
            "attempt_start_step": self.start_step,
            "attempt_time_s": self.attempt_time(t_step),
            "step": step,
            "last_step_time": self.t_begin + (t_step - self.mono0),
            "accounted_until": self.t_begin + (until - self.mono0),
            "lost_steps": self.lost_steps,
            "saves": {str(k): v for k, v in sorted(saves.items())},
            "pid": os.getpid(),
            "end": end,
        }

    def write(self, workdir: str, end: Optional[str] = None) -> None:
        """Replace the ledger file; a local one by rename without fsync (it must survive the process, not the
        machine, and it is rewritten at every logged step)."""
        snap = self.snapshot(end)
        path = paths.join(workdir, LEDGER)
        if paths.is_remote(workdir):
            paths.write_json_atomic(path, snap)
            return
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(json.dumps(snap))
        os.replace(tmp, path)

    # -- restarts ----------------------------------------------------------------------------------------------
    def resume(self, previous: Optional[Dict[str, Any]], restored_step: int, logged_step: Optional[int] = None):
        """Carry the earlier attempts' seconds over from the ledger `previous` left, this attempt resuming from
        checkpoint `restored_step` (0: from scratch); `logged_step`: the last training step metrics.jsonl held
        before the resume (steps after the checkpoint are recomputed)."""
        self.start_step = self.step = int(restored_step)
        if not previous:
            return
        carried = {k: float(previous["time_s"].get(k, 0.0)) for k in CATEGORIES}
        saves = {int(k): float(v) for k, v in (previous.get("saves") or {}).items()}
        productive_now = carried["productive"]
        ledger_step = int(previous.get("step", restored_step))
        prev_step = max(ledger_step, logged_step if logged_step is not None else ledger_step)
        lost_steps = max(prev_step - int(restored_step), 0)
        own_prev = previous.get("attempt_time_s") or {}
        done = max(ledger_step - int(previous.get("attempt_start_step", 0)), 1)
        per_step = float(own_prev.get("productive", 0.0)) / done  # the previous attempt's mean step
        if lost_steps == 0:
            lost = 0.0
        elif restored_step in saves:  # the productive seconds since that checkpoint's save, + a step not in the ledger
            lost = productive_now - saves[restored_step] + (prev_step - ledger_step) * per_step
        else:  # an older checkpoint than the ledger remembers: the steps at the attempt's mean step time
            lost = lost_steps * per_step
        lost = max(min(lost, productive_now), 0.0)
        carried["productive"] -= lost
        carried["lost_to_restarts"] += lost
        until = previous.get("accounted_until", previous.get("last_step_time", self.t_begin))
        gap = max(self.t_begin - float(until), 0.0)
        if previous.get("end") in ("completed", "stopped"):  # the run was not meant to be running in between
            gap = 0.0
        carried["idle"] += gap
        self.carried = carried
        self.attempt = int(previous.get("attempt", 0)) + 1
        self.lost_steps = int(previous.get("lost_steps", 0)) + lost_steps
        self._saves = {s: v for s, v in saves.items() if s <= restored_step}
        own = {k: float((previous.get("attempt_time_s") or {}).get(k, 0.0)) for k in CATEGORIES}
        own["productive"] -= lost
        own["lost_to_restarts"] += lost
        own["idle"] += gap
        if previous.get("end") is None:  # killed or hung: it could not write its own record
            self.previous_record = record(
                int(restored_step), int(previous.get("attempt", 0)), "failed", own, lost_steps
            )

    def end_record(self, step: int, end: str) -> Dict[str, Any]:
        return record(step, self.attempt, end, self.attempt_time(), None)

    def summary(self) -> Dict[str, Any]:
        time_s = self.cumulative()
        g = goodput_of(time_s)
        return {
            "goodput": None if g is None else round(g, 4),
            "time_s": {k: round(v, 3) for k, v in time_s.items()},
            "attempts": self.attempt,
            "lost_steps": self.lost_steps,
        }


def record(step: int, attempt: int, end: str, time_s: Dict[str, float], lost_steps: Optional[int]) -> Dict:
    g = goodput_of(time_s)
    out = {
        "step": int(step),
        "split": "goodput",
        "attempt": int(attempt),
        "end": end,
        "goodput": None if g is None else round(g, 4),
        "wall_s": round(sum(time_s.values()), 3),
        "time_s": {k: round(v, 3) for k, v in time_s.items()},
    }
    if lost_steps is not None:
        out["lost_steps"] = int(lost_steps)
    return out
