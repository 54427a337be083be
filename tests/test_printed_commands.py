"""Issue 31: the commands `xlgen train` prints at the end of a run work exactly as printed, twice in a row, in a
fresh working directory; and the learning-rate semantics of extending a run (xlgen/train/optim.py continue_schedule).

The end-to-end test trains a tiny Transformer-XL with overrides (so that a command that lost one would show), stops
it early, then runs every printed command (resume, evaluate, plot, Python; after the run finishes: extend) twice
through `bash -c`, checking each one's documented effect: resume continues from the saved step with the same stored
config and then has nothing left to do; evaluate appends a record and prints 4-decimal metrics; plot rewrites the
PNG; extend reaches the new step count at the learning rate the end block printed and, run again, changes nothing.
(The TensorBoard line is run by tests/test_user_edges.py.)"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from test_train_utils import REPO, TINY, compile_cache, xlgen_env  # noqa: F401  (fixture)

RUN = {
    **TINY,
    "model.n_layer": 1,  # the commands' effects do not depend on depth (each unrolled layer is compiled)
    "log_every_steps": 2,
    "total_steps": 8,
    "checkpoint.every_steps": 4,
    "eval.steps": 2,
    "eval_every_steps": -1,
    "optimizer.warmup_steps": 2,
    "mesh.data": 1,
}


def printed_commands(stdout: str) -> dict:
    """{label: command} of the end block's "Commands (run from this directory):" lines (`  label:   command`)."""
    lines = stdout.split("Commands (run from this directory):\n", 1)[1].splitlines()
    return dict(m.groups() for m in (re.match(r"  (\w+):\s+(.*)$", line) for line in lines) if m)


def shell(cmd, cwd, env):
    p = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"{cmd}\nexit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def records(wd):
    with open(os.path.join(wd, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def read(path):
    with open(path) as f:
        return f.read()


def test_every_printed_command_works_twice(tmp_path, compile_cache):  # noqa: F811
    cwd = tmp_path / "fresh"
    cwd.mkdir()
    env = xlgen_env(compile_cache, devices=1)
    over = " ".join(f"--config.{k}={v}" for k, v in RUN.items())
    first = shell(
        f"{sys.executable} -m xlgen.cli train --config={REPO}/configs/pretrain/txl_tiny.py {over} "
        "--workdir=run --stop_at_step=4",
        cwd,
        env,
    )
    wd = str(cwd / "run")
    cmds = printed_commands(first.stdout)
    assert set(cmds) == {"resume", "evaluate", "plot", "Python"}, cmds
    assert cmds["resume"].endswith(" train --workdir=run")  # the stored config.json holds every override
    stored = read(os.path.join(wd, "config.json"))
    assert json.loads(stored)["total_steps"] == 8 and json.loads(stored)["model"]["d_model"] == 32

    # resume: continues from step 4 with the same stored config; the second time there is nothing left to train
    r = shell(cmds["resume"], cwd, env)
    assert f"resumed from {wd}/checkpoints/4" in r.stdout and "done: step 8." in r.stdout, r.stdout
    assert read(os.path.join(wd, "config.json")) == stored
    assert [x["step"] for x in records(wd) if "split" not in x] == [2, 4, 6, 8]
    summary = read(os.path.join(wd, "summary.json"))
    r2 = shell(cmds["resume"], cwd, env)
    assert "is complete (step 8 of 8): nothing to train" in r2.stdout and "done: step 8." in r2.stdout, r2.stdout
    assert "compiling" not in r2.stdout
    assert read(os.path.join(wd, "config.json")) == stored and read(os.path.join(wd, "summary.json")) == summary
    assert printed_commands(r2.stdout) == printed_commands(r.stdout)
    done = printed_commands(r.stdout)
    assert set(done) == {"extend", "evaluate", "plot", "Python"}, done

    # evaluate: one record per run, metrics printed with 4 decimals
    for _ in range(2):
        n = len(records(wd))
        e = shell(done["evaluate"], cwd, env)
        assert re.fullmatch(r"eval: step 8  valid  loss \d+\.\d{4}  ppl \d+\.\d{4}  bpc \d+\.\d{4}\n", e.stdout), (
            e.stdout
        )
        assert len(records(wd)) == n + 1 and records(wd)[-1]["split"] == "valid"

    # plot: writes the PNG, then replaces it (issue 31.1: it crashed once the PNG existed); no temp files left
    png = os.path.join(wd, "plots", "training.png")
    inodes = []
    for _ in range(2):
        p = shell(done["plot"], cwd, env)
        assert p.stdout.strip() == f"plot: {png}"
        assert read_bytes_head(png) == b"\x89PNG\r\n\x1a\n"
        inodes.append(os.stat(png).st_ino)
    assert inodes[0] != inodes[1] and os.listdir(os.path.dirname(png)) == ["training.png"]

    # Python: loads the run
    for _ in range(2):
        assert shell(done["Python"], cwd, env).stdout.strip() == "TransfoXLPretrained"

    # extend: steps 9-16 at the learning rate the end block printed (the floor: no re-warm-up); again: no change
    m = re.search(r"\(steps 8-16 continue at the final learning rate ([0-9.e-]+); no re-warm-up\)", r.stdout)
    assert m, r.stdout
    assert done["extend"].endswith(" train --workdir=run --config.total_steps=16")
    x = shell(done["extend"], cwd, env)
    assert f"resumed from {wd}/checkpoints/8" in x.stdout and "done: step 16." in x.stdout, x.stdout
    assert "note: total_steps 8 -> 16 at step 8" in x.stdout
    lrs = {rec["step"]: rec["learning_rate"] for rec in records(wd) if "split" not in rec}
    floor = 2e-3 * 0.1  # txl_tiny: cosine from 2e-3 to min_lr_ratio 0.1
    assert float(m.group(1)) == pytest.approx(floor, rel=1e-3)
    np.testing.assert_allclose([lrs[s] for s in (10, 12, 14, 16)], floor, rtol=1e-5)
    assert lrs[8] >= floor and max(lrs[s] for s in (10, 12, 14, 16)) <= lrs[8]
    extended = read(os.path.join(wd, "config.json"))
    assert json.loads(extended)["total_steps"] == 16
    assert json.loads(extended)["optimizer"]["schedule_history"] == [[8, 8]]
    x2 = shell(done["extend"], cwd, env)
    assert "nothing to train" in x2.stdout and "done: step 16." in x2.stdout, x2.stdout
    assert read(os.path.join(wd, "config.json")) == extended
    assert printed_commands(x2.stdout)["extend"].endswith("--config.total_steps=32")


def read_bytes_head(path, n=8):
    with open(path, "rb") as f:
        return f.read(n)


# ----------------------------------------------------------------------------------------------------------------
# The schedule of a run whose total_steps changes (hand-computed values)
# ----------------------------------------------------------------------------------------------------------------


def _opt(**kw):
    from xlgen.config import base_config

    c = base_config().optimizer
    c.update(kw)
    return c


def _with_history(opt, history):
    with opt.unlocked():
        opt.schedule_history = history
    return opt


def test_extending_a_finished_run_continues_at_its_final_learning_rate():
    """`make demo`'s schedule (cosine 2e-3 -> 1e-4, warm-up 40, 600 steps) extended to 1200: steps 600-1200 at
    1e-4; the stretched schedule (the old behaviour) was back at ~1.04e-3 at step 625."""
    from xlgen.train.optim import continue_schedule, make_schedule

    opt = _opt(learning_rate=2e-3, warmup_steps=40, schedule="cosine", min_lr_ratio=0.05)
    before = make_schedule(opt, 600)
    history = continue_schedule(opt, (), 600, 1200, 600)
    assert history == ((600, 600),)
    after = make_schedule(_with_history(opt, history), 1200)
    for t in (0, 20, 40, 300, 599):
        assert float(after(t)) == float(before(t))
    np.testing.assert_allclose([float(after(t)) for t in (600, 625, 900, 1200)], 1e-4, rtol=1e-6)
    stretched = make_schedule(_opt(learning_rate=2e-3, warmup_steps=40, schedule="cosine", min_lr_ratio=0.05), 1200)
    assert float(stretched(625)) == pytest.approx(1.04e-3, rel=0.01)


def test_changing_total_steps_mid_run_decays_from_the_current_value():
    """Linear 1 -> 0.1 (warm-up 10) over 110 steps, resumed at step 60 with total 210: lr(60) = 0.55 stays, then a
    straight line to 0.1 at step 210 (lr(135) = 0.325); a second change at 135 to 160 continues from 0.325."""
    from xlgen.train.optim import continue_schedule, make_schedule

    opt = _opt(learning_rate=1.0, warmup_steps=10, schedule="linear", min_lr_ratio=0.1)
    h1 = continue_schedule(opt, (), 110, 210, 60)
    s = make_schedule(_with_history(opt, h1), 210)
    assert [round(float(s(t)), 6) for t in (5, 60, 135, 210, 300)] == [0.5, 0.55, 0.325, 0.1, 0.1]
    h2 = continue_schedule(opt, h1, 210, 160, 135)
    assert h2 == ((60, 110), (135, 210))
    s2 = make_schedule(_with_history(opt, h2), 160)
    assert [round(float(s2(t)), 6) for t in (60, 135, 147.5, 160)] == [0.55, 0.325, 0.2125, 0.1]
    # during warm-up no record is needed (every total gives the same warm-up); an unchanged total adds nothing
    assert continue_schedule(opt, (), 110, 210, 5) == ()
    assert continue_schedule(opt, h1, 210, 210, 100) == h1
    # a second change at the same step keeps the first record (the schedule before it is unchanged)
    assert continue_schedule(opt, h1, 210, 400, 60) == h1


def test_a_failed_train_leaves_no_half_made_workdir(tmp_path, compile_cache, monkeypatch, capsys):  # noqa: F811
    """A run that fails before its first checkpoint (here: a vocabulary the data does not fit) removes the workdir it created (it left
    config.json and the lock file behind); `xlgen train --workdir=DIR` without a config.json says what to pass."""
    env = xlgen_env(compile_cache, devices=1)
    base = f"{sys.executable} -m xlgen.cli train"
    p = subprocess.run(
        ["bash", "-c", f"{base} --config={REPO}/configs/pretrain/txl_tiny.py --config.model.vocab_size=10 --workdir=w"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and p.stderr.startswith("xlgen train: error: ") and "vocab_size=10" in p.stderr, p.stderr
    assert os.listdir(tmp_path) == []
    # the usage error comes before anything is imported or set up: xlgen.cli.main in this process, from tmp_path
    from xlgen.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", "--workdir=w"]) == 2
    assert (
        capsys.readouterr().err
        == "xlgen train: error: w: no config.json (not an xlgen workdir); pass --config=PATH to start a run\n"
    )
    assert os.listdir(tmp_path) == []
