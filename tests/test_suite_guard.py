"""The suite's time guard (tests/suite_guard.py) on a toy suite run in a subprocess: the summary gives the wall time
and names exactly the tests over the budget, with and without pytest-xdist (where only the controller prints)."""

import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOY = """
def test_quick():
    pass

def test_slower():
    sum(range(3_000_000))
"""


def _run(tmp_path, budget, *args):
    (tmp_path / "test_toy.py").write_text(TOY)
    env = dict(os.environ, PYTHONPATH=HERE, XLGEN_TEST_BUDGET_S=str(budget), XLGEN_FILE_TIMES="1")
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "suite_guard", "-p", "no:cacheprovider", "-c", os.devnull, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_over_budget_tests_are_named_after_the_wall_time(tmp_path):
    out = _run(tmp_path, 0, "test_toy.py")
    assert re.search(r"suite wall time \d+ s; 2 test\(s\) over the 0 s budget", out), out
    assert re.search(r"\d+\.\ds  test_toy.py::test_slower", out) and "test_toy.py::test_quick" in out, out
    assert re.search(r"\d+\.\ds\s+2 tests  test_toy.py", out), out  # the per-file sum
    out = _run(tmp_path, 1000, "test_toy.py")
    assert "0 test(s) over the 1000 s budget" in out and "::test_" not in out.split("over the 1000 s budget")[1], out


def test_under_xdist_the_controller_prints_one_summary(tmp_path):
    out = _run(tmp_path, 0, "-n", "2", "test_toy.py")
    assert out.count("suite wall time") == 1 and "2 test(s) over the 0 s budget" in out, out
    assert "test_toy.py::test_slower" in out, out
