"""Exact resume: train 2k steps in one go vs. train k steps, stop, resume to 2k with the same command -> the
metrics.jsonl losses of steps k+1..2k are bitwise identical, for Transformer-XL and XLNet with memory carried
across steps (and checkpointed). One variant is stopped by SIGKILL mid-run. The uninterrupted Transformer-XL run
(`txl_full`) is the reference of both the stopped and the killed run."""

import json
import math
import os
import shutil
import subprocess

import pytest
from kill_helpers import sigkill_after_step
from test_train_utils import REPO, compile_cache, run_train, train_cmd, train_losses, xlgen_env  # noqa: F401

# Transformer-XL: long enough for the SIGKILL to land mid-run (17 of 40 steps), k = 20; XLNet: k = 4.
TXL = {"total_steps": 40, "checkpoint.every_steps": 5, "mesh.num_devices": 1}
XLNET = {"total_steps": 8, "checkpoint.every_steps": 4, "mesh.num_devices": 1}


@pytest.fixture(scope="module")
def txl_full(tmp_path_factory, compile_cache):  # noqa: F811
    """The uninterrupted TXL run (read only: a test that appends to it takes a copy)."""
    full = str(tmp_path_factory.mktemp("txl") / "full")
    run_train(full, compile_cache, "txl_tiny.py", TXL)
    return full


@pytest.mark.parametrize("config", ["txl_tiny.py", "xlnet_tiny.py"])
def test_resume_is_bitwise_exact(tmp_path, compile_cache, config, request):
    over = TXL if config == "txl_tiny.py" else XLNET
    K = over["total_steps"] // 2
    part = str(tmp_path / "part")
    if config == "txl_tiny.py":
        full = request.getfixturevalue("txl_full")
    else:
        full = str(tmp_path / "full")
        run_train(full, compile_cache, config, over)
    run_train(part, compile_cache, config, over, extra=[f"--stop_at_step={K}"])  # interrupted after k steps
    assert sorted(train_losses(part)) == list(range(1, K + 1))
    out = run_train(part, compile_cache, config, over)  # the same command resumes
    assert f"resumed from {part}/checkpoints/{K}" in out.stdout
    a, b = train_losses(full), train_losses(part)
    assert sorted(b) == list(range(1, 2 * K + 1))
    assert [b[s] for s in range(K + 1, 2 * K + 1)] == [a[s] for s in range(K + 1, 2 * K + 1)]
    if config == "txl_tiny.py":  # `xlgen eval` on the latest checkpoint appends an eval record
        shutil.copytree(full, str(tmp_path / "full"))
        full = str(tmp_path / "full")
        cmd = train_cmd(full, config, dict(over, **{"eval.steps": 3}))
        cmd[3] = "eval"
        p = subprocess.run(cmd, env=xlgen_env(compile_cache), capture_output=True, text=True, cwd=REPO)
        assert p.returncode == 0, p.stderr[-3000:]
        with open(os.path.join(full, "metrics.jsonl")) as f:
            ev = [r for r in map(json.loads, f) if r.get("split") == "valid"][-1]
        assert ev["step"] == 2 * K and ev["split"] == "valid" and math.isfinite(ev["loss"])
        assert (
            abs(ev["ppl"] - math.exp(ev["loss"])) < 1e-6 * ev["ppl"]
            and abs(ev["bpc"] * math.log(2) - ev["loss"]) < 1e-9
        )
    if config == "txl_tiny.py":  # the memory really is state: resuming without it changes the next loss
        nomem = str(tmp_path / "nomem")
        over2 = dict(over, **{"checkpoint.save_mems": False})
        run_train(nomem, compile_cache, config, over2, extra=[f"--stop_at_step={K}"])
        run_train(nomem, compile_cache, config, over2, extra=[f"--stop_at_step={K + 1}"])
        c = train_losses(nomem)
        assert c[K] == a[K] and c[K + 1] != a[K + 1]


@pytest.mark.slow
def test_resume_after_sigkill_mid_run(tmp_path, compile_cache, txl_full):
    over = TXL
    total, every = over["total_steps"], over["checkpoint.every_steps"]
    full, killed = txl_full, str(tmp_path / "killed")
    sigkill_after_step(train_cmd(killed, "txl_tiny.py", over), killed, 3 * every + 2, env=xlgen_env(compile_cache))
    last_logged = max(train_losses(killed))
    assert last_logged < total
    out = run_train(killed, compile_cache, "txl_tiny.py", over)
    resumed = int(out.stdout.split(f"{killed}/checkpoints/")[1].split()[0])
    # the newest *complete* checkpoint: a save still in flight at the kill is not visible (never half-written)
    assert resumed % every == 0 and every <= resumed <= last_logged
    a, b = train_losses(full), train_losses(killed)
    assert sorted(b) == list(range(1, total + 1))  # records logged after the checkpoint were replaced
    assert [b[s] for s in range(resumed + 1, total + 1)] == [a[s] for s in range(resumed + 1, total + 1)]
