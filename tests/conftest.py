"""Test-wide settings: 8 simulated CPU devices (for real sharded meshes), float32 matmuls at full precision, thread
pools sized for blocking collectives; and the suite's time guard.

Time guard: the run ends with its wall time and names every test whose setup + call + teardown took longer than
`XLGEN_TEST_BUDGET_S` seconds (default 60; a module fixture's cost is charged to the first test that uses it).
`XLGEN_FILE_TIMES=1` adds the per-file sums, slowest first. Both work under pytest-xdist: workers send their test
reports to the controller, which prints the summary.
"""

import os
import time
from collections import defaultdict

from test_train_utils import CPU_COLLECTIVE_TIMEOUTS, cpu_thread_pool_env

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ["XLA_FLAGS"] += " " + CPU_COLLECTIVE_TIMEOUTS
os.environ.setdefault("JAX_PLATFORMS", "cpu")
for _name, _value in cpu_thread_pool_env(8).items():
    os.environ.setdefault(_name, _value)

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

TEST_BUDGET_S = float(os.environ.get("XLGEN_TEST_BUDGET_S", "60"))
_test_seconds: dict = defaultdict(float)  # nodeid -> setup + call + teardown seconds
_session_start = [time.monotonic()]


def pytest_sessionstart(session):
    _session_start[0] = time.monotonic()


def pytest_runtest_logreport(report):
    _test_seconds[report.nodeid] += report.duration


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller reports
        return
    wall = time.monotonic() - _session_start[0]
    over = sorted(((s, n) for n, s in _test_seconds.items() if s > TEST_BUDGET_S), reverse=True)
    tr = terminalreporter
    if os.environ.get("XLGEN_FILE_TIMES"):
        per_file: dict = defaultdict(lambda: [0.0, 0])
        for nodeid, seconds in _test_seconds.items():
            entry = per_file[nodeid.split("::")[0]]
            entry[0] += seconds
            entry[1] += 1
        tr.write_sep("-", "seconds per file (setup + call + teardown of its tests)")
        for path, (seconds, count) in sorted(per_file.items(), key=lambda kv: -kv[1][0]):
            tr.write_line(f"{seconds:8.1f}s {count:4d} tests  {path}")
    tr.write_sep("=", f"suite wall time {wall:.0f} s; {len(over)} test(s) over the {TEST_BUDGET_S:.0f} s budget")
    for seconds, nodeid in over:
        tr.write_line(f"{seconds:8.1f}s  {nodeid}")
