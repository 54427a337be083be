"""What a new user meets (issue 16), through the real `xlgen` command in subprocesses: no libtpu noise on a machine
without a TPU, a corrupt checkpoint moved aside once and quietly, `xlgen eval` without `--config`.

One tiny Transformer-XL run (module fixture) is shared by the tests; every subprocess reuses the session's
compilation cache (tests/test_train_utils.py)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.test_train_utils import REPO, compile_cache, run_train, xlgen_env  # noqa: F401  (fixture)

LIBTPU_NOISE = ("libtpu", "TPU", "host bounds", "InitGoogle", "lockfile")


def _quiet_env(cache):
    """The test environment minus JAX_PLATFORMS: what a user's shell has (libtpu is installed in the venv)."""
    env = xlgen_env(cache, devices=1)
    env.pop("JAX_PLATFORMS", None)
    env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
    return env


def _xlgen(args, cache, env=None, expect=0):
    p = subprocess.run(
        [sys.executable, "-m", "xlgen.cli", *args],
        env=env or xlgen_env(cache, devices=1),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == expect, f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.fixture(scope="module")
def run_wd(tmp_path_factory, compile_cache):  # noqa: F811
    wd = str(tmp_path_factory.mktemp("ux_run"))
    run_train(
        wd,
        compile_cache,
        overrides={"total_steps": 4, "checkpoint.every_steps": 2, "eval.steps": 2, "mesh.data": 1},
        devices=1,
    )
    return wd


def test_from_pretrained_without_tpu_is_quiet(run_wd, compile_cache):
    """libtpu is installed (the `tpu` extra) but there is no TPU and the user asked for nothing: no TPU probe."""
    from xlgen import platforms

    if platforms.detect() != "cpu":
        pytest.skip("this machine has an accelerator")
    code = (
        "import numpy as np, xlgen\n"
        f"m = xlgen.from_pretrained({run_wd!r})\n"
        "out = m(np.zeros((1, 8), np.int32))\n"
        "import jax; print(out.log_probs.shape, jax.default_backend())\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], env=_quiet_env(compile_cache), capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["(1,", "8,", "74)", "cpu"]
    assert p.stderr == "", p.stderr[-3000:]


def test_finetune_platform_cpu_is_quiet(tmp_path, compile_cache):
    """`xlgen finetune --platform=cpu` imports jax before it picks the platform: the platform must still hold."""
    from data_pipelines.tasks import synthetic

    data = tmp_path / "sst2"
    synthetic.write_glue(str(data), "sst2", n_train=32, n_dev=16, n_test=4)
    synthetic.train_sentencepiece(synthetic.corpus_for(str(data)), str(data / "spiece.model"), vocab_size=100)
    args = [
        "finetune",
        "--config=configs/finetune/tiny.py",
        "--config.task=glue/sst2",
        f"--config.data_dir={data}",
        f"--config.tokenizer={data / 'spiece.model'}",
        "--config.total_steps=2",
        "--config.eval_every_steps=0",
        "--config.checkpoint.every_steps=2",
        "--platform=cpu",
        f"--workdir={tmp_path / 'wd'}",
    ]
    p = _xlgen(args, compile_cache, env=_quiet_env(compile_cache))
    noise = [line for line in p.stderr.splitlines() if any(w in line for w in LIBTPU_NOISE)]
    assert not noise, p.stderr[-3000:]
    assert os.path.exists(tmp_path / "wd" / "eval_results.json")


def test_corrupt_checkpoint_moved_aside_once_quietly(run_wd, tmp_path, compile_cache):
    """The newest checkpoint is unreadable: `xlgen eval --workdir` (no --config) warns in one line, moves it to
    checkpoints/corrupt-4, evaluates step 2; later loads do not see it; training resumes from 2 and `keep` counts
    only real checkpoints."""
    wd = str(tmp_path / "wd")
    shutil.copytree(run_wd, wd)
    ck = os.path.join(wd, "checkpoints")
    assert sorted(os.listdir(ck)) == ["2", "4"]
    for root, _, files in os.walk(os.path.join(ck, "4", "state")):
        for f in files:
            if f == "manifest.ocdbt":
                with open(os.path.join(root, f), "w") as fh:
                    fh.write("garbage")
    p = _xlgen(["eval", f"--workdir={wd}"], compile_cache)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr[-5000:]
    assert f"checkpoint {ck}/4 is unreadable" in lines[0] and f"moved it to {ck}/corrupt-4" in lines[0]
    assert "TensorStore(" not in lines[0] and len(lines[0]) - 3 * len(ck) < 300, lines[0]
    assert p.stdout.startswith("eval: step 2 ")
    assert sorted(os.listdir(ck)) == ["2", "corrupt-4"]
    # never retried: the next load is silent
    p = _xlgen(["eval", f"--workdir={wd}"], compile_cache)
    assert p.stderr == "" and p.stdout.startswith("eval: step 2 ")
    # training resumes from step 2; keep=2 counts steps 4 and 6 only, the corrupt copy stays
    with open(os.path.join(wd, "config.json")) as f:
        assert json.load(f)["checkpoint"]["keep"] == 2
    run_train(
        wd,
        compile_cache,
        overrides={"total_steps": 6, "checkpoint.every_steps": 2, "eval.steps": 2, "mesh.data": 1},
        devices=1,
    )
    assert sorted(os.listdir(ck)) == ["4", "6", "corrupt-4"]


def test_eval_without_config_uses_workdir_config(run_wd, compile_cache):
    p = _xlgen(["eval", f"--workdir={run_wd}", "--config.eval.steps=1"], compile_cache)
    assert p.stdout.startswith("eval: step 4 ") and "bpc" in p.stdout
    recs = [json.loads(line) for line in open(os.path.join(run_wd, "metrics.jsonl"))]
    assert recs[-1]["split"] == "valid" and recs[-1]["step"] == 4 and np.isfinite(recs[-1]["loss"])
