"""The suite's time guard (a pytest plugin, loaded by tests/conftest.py): the run ends with its wall time and names
every test whose setup + call + teardown took longer than `XLGEN_TEST_BUDGET_S` seconds (default 60; a module
fixture's cost is charged to the first test that uses it). `XLGEN_FILE_TIMES=1` adds the per-file sums, slowest
first. Under pytest-xdist the workers send their test reports to the controller, which alone prints the summary."""

import os
import time
from collections import defaultdict

import pytest

DEFAULT_BUDGET_S = 60.0
_test_seconds: dict = defaultdict(float)  # nodeid -> setup + call + teardown seconds
_session_start = [time.monotonic()]


def budget_s() -> float:
    return float(os.environ.get("XLGEN_TEST_BUDGET_S", DEFAULT_BUDGET_S))


def pytest_sessionstart():
    _session_start[0] = time.monotonic()


def pytest_runtest_logreport(report):
    _test_seconds[report.nodeid] += report.duration


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller reports
        return
    wall, budget = time.monotonic() - _session_start[0], budget_s()
    over = sorted(((s, n) for n, s in _test_seconds.items() if s > budget), reverse=True)
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
    tr.write_sep("=", f"suite wall time {wall:.0f} s; {len(over)} test(s) over the {budget:g} s budget")
    for seconds, nodeid in over:
        tr.write_line(f"{seconds:8.1f}s  {nodeid}")
