"""Killing a running `xlgen train` at a chosen training step: the one SIGKILL loop of the crash-resume tests.

sigkill_after_step(cmd, workdir, step, env=...)   start `cmd`, SIGKILL it once its metrics.jsonl holds a
                                                  training step >= `step`
last_train_step(workdir)                          the highest training step logged so far (0: none)
"""

import json
import os
import signal
import subprocess
import time


def last_train_step(workdir) -> int:
    """The highest step of the training records (no `split`, no `kind`) in `workdir/metrics.jsonl`; 0 when there
    is no file or no record yet. A line being written (not yet JSON) is skipped."""
    try:
        with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except FileNotFoundError:
        return 0
    best = 0
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and "split" not in r and "kind" not in r and isinstance(r.get("step"), int):
            best = max(best, r["step"])
    return best


def sigkill_after_step(cmd, workdir, step, *, env, cwd=None, timeout=300.0, poll=0.05, capture=False):
    """Start `cmd` (an `xlgen train ... --workdir=workdir`), wait until its metrics.jsonl holds a training step
    >= `step` — asserting the run is still alive (it must not finish first) and that it gets there within
    `timeout` seconds — then SIGKILL it and assert it died by the signal. Returns (stdout, stderr) as text when
    `capture`, else (None, None) (the output goes to /dev/null)."""
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=out, text=True)
    try:
        deadline = time.monotonic() + timeout
        while last_train_step(workdir) < step:
            if proc.poll() is not None:
                _, err = proc.communicate()
                raise AssertionError(f"the run finished before it could be killed: {(err or '')[-3000:]}")
            assert time.monotonic() < deadline, f"no training step >= {step} within {timeout:g}s"
            time.sleep(poll)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        stdout, stderr = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, stderr)
    return stdout, stderr
