"""Preemption and multi-host: SIGTERM during training leaves a complete checkpoint at the current step (then the
same command resumes from it), and 2 processes x 4 devices (jax.distributed over localhost, gloo collectives,
launch/local_multiprocess.sh) reproduce the single-process 8-device losses."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from test_train_utils import (  # noqa: F401
    REPO,
    compile_cache,
    run_train,
    sigterm_after_step,
    train_cmd,
    train_losses,
    xlgen_env,
)


@pytest.mark.slow
def test_sigterm_saves_the_current_step_and_resumes(tmp_path, compile_cache):
    wd = str(tmp_path / "wd")
    over = {"total_steps": 400, "checkpoint.every_steps": 1000, "mesh.num_devices": 1}
    proc = subprocess.Popen(
        train_cmd(wd, "txl_tiny.py", over),
        env=xlgen_env(compile_cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, last = sigterm_after_step(proc, wd, timeout=400)
    assert last < 400  # the step it was at; no periodic save was due
    out = run_train(wd, compile_cache, "txl_tiny.py", over, extra=[f"--stop_at_step={last + 2}"]).stdout
    assert f"resumed from {wd}/checkpoints/{last}" in out
    assert sorted(train_losses(wd)) == list(range(1, last + 3))


@pytest.mark.slow
def test_two_processes_reproduce_single_process_losses(tmp_path, compile_cache):
    over = {
        "total_steps": 6,
        "checkpoint.every_steps": 3,
        "mesh.data": 2,
        "mesh.fsdp": 2,
        "mesh.tensor": 2,
        "mesh.rules": "fsdp_tp",
    }
    single, multi = str(tmp_path / "single"), str(tmp_path / "multi")
    run_train(single, compile_cache, "txl_tiny.py", over)
    env = xlgen_env(compile_cache, devices=4)
    env.update(
        {
            "DEVICES_PER_PROCESS": "4",
            "XLGEN_XLA_FLAGS": "--xla_backend_optimization_level=0",
            "XLGEN_LOG_DIR": str(tmp_path / "logs"),
            "XLGEN_PYTHON": sys.executable,  # this interpreter (a checkout without .venv/ would fall back to python3)
        }
    )
    cmd = ["bash", os.path.join(REPO, "launch/local_multiprocess.sh"), "2"] + train_cmd(multi, "txl_tiny.py", over)[3:]
    p = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    logs = "".join(
        open(os.path.join(tmp_path, "logs", f)).read()[-2000:] for f in sorted(os.listdir(tmp_path / "logs"))
    )
    assert p.returncode == 0, logs
    a, b = train_losses(single), train_losses(multi)
    assert sorted(b) == list(range(1, 7))
    np.testing.assert_allclose([b[s] for s in range(1, 7)], [a[s] for s in range(1, 7)], rtol=1e-6, atol=0)
    with open(os.path.join(multi, "metrics.jsonl")) as f:  # only process 0 wrote metrics
        assert len([r for r in map(json.loads, f) if "split" not in r]) == 6
    assert sorted(int(d) for d in os.listdir(os.path.join(multi, "checkpoints")) if d.isdigit()) == [3, 6]
