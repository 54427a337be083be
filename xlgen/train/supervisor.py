"""`xlgen train ... --max_restarts=N`: run the training command as a child process and re-run it from its latest good
checkpoint when it fails, until it finishes (exit 0) or N restarts are spent.

    supervise(child_argv, max_restarts, backoff_s) -> exit status

The supervisor never starts JAX (a pod host's accelerators stay free for the child). Restarted: a child killed by a
signal (preemption, the OOM killer, SIGKILL), one that hung (the watchdog's status 3, `xlgen.train.watchdog`), one
stopped by SIGTERM (143), or any status but these three: 0 (done), 1 (the run's own error, e.g. diverged training:
a restart would repeat it) and 2 (a usage error). The wait before restart k is `backoff_s` x 2^(k-1), at most 300 s.
Every child resumes from the workdir's newest checkpoint that verifies (the ordinary resume), so the result equals
an uninterrupted run's; the goodput ledger (xlgen/train/goodput.py) counts the recomputed steps and the time between
attempts. SIGTERM / SIGINT to the supervisor go to the child and end supervision (no restart).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import List, Optional, Sequence

NOT_RETRIED = {0: "finished", 1: "failed (the run's own error)", 2: "usage error"}
MAX_BACKOFF_S = 300.0


def describe_status(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if code == 3:
        return "hung (watchdog, status 3)"
    if code == 143:
        return "stopped by SIGTERM (status 143)"
    return f"exited with status {code}"


def child_command(argv: Sequence[str]) -> List[str]:
    """The child's command line: this interpreter running `xlgen.cli` with `argv` minus the supervisor's flags."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--max_restarts", "--restart_backoff"):
            skip = True
            continue
        if a.startswith(("--max_restarts=", "--restart_backoff=")):
            continue
        out.append(a)
    return [sys.executable, "-m", "xlgen.cli", *out]


def supervise(argv: Sequence[str], max_restarts: int, backoff_s: float = 10.0, *, log=None) -> int:
    """Run `xlgen <argv>` (minus --max_restarts/--restart_backoff) until it finishes; returns its last status (a
    signal -N as 128 + N)."""
    log = log or (lambda text: print(f"supervisor: {text}", file=sys.stderr, flush=True))
    cmd = child_command(argv)
    env = dict(os.environ, XLGEN_SUPERVISED="1")
    child: Optional[subprocess.Popen] = None
    stopping = []

    def forward(signum, frame):
        stopping.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        restarts = 0
        while True:
            attempt = restarts + 1
            env["XLGEN_ATTEMPT"] = str(attempt)
            child = subprocess.Popen(cmd, env=env)
            log(f"attempt {attempt} (pid {child.pid})")
            code = child.wait()
            if code == 0 or code in NOT_RETRIED or stopping:
                if code != 0:
                    log(f"attempt {attempt} {describe_status(code)}; not restarting")
                return code if code >= 0 else 128 - code
            if restarts >= max_restarts:
                log(f"attempt {attempt} {describe_status(code)}; all {max_restarts} restarts spent, giving up")
                return code if code >= 0 else 128 - code
            restarts += 1
            delay = min(backoff_s * 2 ** (restarts - 1), MAX_BACKOFF_S) if backoff_s > 0 else 0.0
            log(
                f"attempt {attempt} {describe_status(code)}; restart {restarts} of {max_restarts} in {delay:.0f}s "
                f"(resumes from the newest good checkpoint)"
            )
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline and not stopping:
                time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))
            if stopping:
                return 128 + int(stopping[0])
    finally:
        for s, h in old.items():
            signal.signal(s, h)
