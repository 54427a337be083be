"""`xlgen finetune` runs on the trainer's loop: SIGTERM saves the current step and exits 143; re-running the same
command resumes from it and ends with exactly the losses, dev metrics and best checkpoint of an uninterrupted run;
`xlgen eval` on the finetune workdir re-evaluates its best checkpoint."""

import json
import os
import subprocess
import sys

import pytest
from test_train_utils import REPO, compile_cache, sigterm_after_step, train_losses, xlgen_env  # noqa: F401

TOTAL = 120  # steps of a 2-layer d=32 XLNet: the signal (after step 3) arrives mid-run; dev evaluations at 40, 80, 120
EVAL_EVERY = 40


def _cmd(workdir, data):
    over = {
        "task": "glue/sst2",
        "data_dir": data,
        "tokenizer": os.path.join(data, "spiece.model"),
        "total_steps": TOTAL,
        "log_every_steps": 1,
        "eval_every_steps": EVAL_EVERY,
        "checkpoint.every_steps": 1000,  # no periodic save falls due: only the signal and the end save
        "checkpoint.async_save": True,
        "mesh.num_devices": 1,
        "eval.predict_test": False,
    }
    return (
        [sys.executable, "-m", "xlgen.cli", "finetune", f"--config={REPO}/configs/finetune/tiny.py"]
        + [f"--workdir={workdir}"]
        + [f"--config.{k}={v}" for k, v in over.items()]
    )


def _records(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    drop = ("tokens_per_sec", "steps_per_sec", "mfu")  # wall-clock figures
    return [{k: v for k, v in r.items() if k not in drop} for r in recs if "kind" not in r]


@pytest.mark.slow
def test_sigterm_during_finetune_saves_and_resumes_exactly(tmp_path, compile_cache):
    from xlgen.finetune.readers import synthetic

    data = str(tmp_path / "sst2")
    synthetic.write_glue(data, "sst2", n_train=64, n_dev=16, n_test=0)
    synthetic.train_sentencepiece(synthetic.corpus_for(data), os.path.join(data, "spiece.model"), vocab_size=100)
    env = xlgen_env(compile_cache, devices=1)
    ref, wd = str(tmp_path / "ref"), str(tmp_path / "wd")

    p = subprocess.run(_cmd(ref, data), env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]

    proc = subprocess.Popen(
        _cmd(wd, data), env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, last = sigterm_after_step(proc, wd)
    assert last < TOTAL

    p = subprocess.run(_cmd(wd, data), env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"resumed from {wd}/checkpoints/{last}" in p.stdout
    # the same records (losses, learning rates, dev metrics at 40, 80, 120) as the uninterrupted run, bit for bit
    assert _records(wd) == _records(ref)
    assert [r["step"] for r in _records(wd) if "split" in r] == list(range(EVAL_EVERY, TOTAL + 1, EVAL_EVERY))
    results = json.load(open(os.path.join(ref, "eval_results.json")))
    assert json.load(open(os.path.join(wd, "eval_results.json"))) == results
    assert os.listdir(os.path.join(wd, "best")) == [str(results["step"])] == os.listdir(os.path.join(ref, "best"))

    # `xlgen eval` on a finetune workdir: the evaluator of the best checkpoint, called directly
    p = subprocess.run(
        [sys.executable, "-m", "xlgen.cli", "eval", f"--workdir={wd}", "--platform=cpu"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"glue/sst2 @ step {results['step']}: accuracy {results['accuracy']:.4f}" in p.stdout
    assert json.load(open(os.path.join(wd, "eval_results.json"))) == results
