"""What a new user meets (issue 16), through the real `xlgen` command in subprocesses: no libtpu noise on a machine
without a TPU, the commands printed at the end of a run work pasted into a shell, start block and summary.json, a
corrupt checkpoint reported quietly and moved only by train, `xlgen eval` without `--config`, one live run per workdir,
non-finite updates skipped and counted.

Tiny Transformer-XL runs; every subprocess reuses the session's compilation cache (tests/test_train_utils.py)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from test_train_utils import REPO, compile_cache, run_train, train_cmd, xlgen_env  # noqa: F401  (fixture)

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
        timeout=900,
    )
    assert p.returncode == expect, f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


RUN = {"total_steps": 4, "checkpoint.every_steps": 2, "eval.steps": 2, "mesh.data": 1}
# One layer where the property does not depend on depth and no other test compiles the same program.
RUN1 = {**RUN, "model.n_layer": 1}


def printed_commands(stdout: str) -> dict:
    """{"evaluate": "...", ...} from the end block's "Commands (run from this directory):" section."""
    lines = stdout.split("Commands (run from this directory):\n", 1)[1].splitlines()
    return dict(re.match(r"  (\w+):\s+(.*)$", line).groups() for line in lines if re.match(r"  \w+:", line))


def _shell(cmd, env, timeout=900):
    return subprocess.run(["bash", "-c", cmd], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_start_block_summary_and_printed_commands_work(tmp_path, compile_cache):  # noqa: F811
    """A run prints its start block, writes summary.json, and every command of its end block works pasted into a
    shell in the repository: evaluate, plot, Python (from_pretrained, with libtpu installed and nothing asked: no
    TPU probe, stderr empty), tensorboard, extend."""
    from xlgen import platforms

    wd = str(tmp_path / "run")
    p = run_train(wd, compile_cache, overrides={**RUN, "tensorboard": True, "eval_every_steps": -1}, devices=1)
    head = p.stdout.split("compiling…")[0]
    assert "xlgen train: transformer_xl (txl_lm objective), 21,450 parameters" in head
    assert "128 tokens/step" in head and "training tokens (tinyshakespeare)" in head
    assert "devices   1 x cpu" in head and "mesh data=1 fsdp=1 tensor=1" in head
    summary = json.load(open(os.path.join(wd, "summary.json")))
    assert summary["parameters"] == 21450 and summary["steps"] == 4 and summary["tokens_seen"] == 4 * 128
    assert summary["last_eval"]["step"] == 4 and summary["best_eval"]["loss"] <= summary["last_eval"]["loss"]
    assert summary["tokens_per_sec"] > 0 and summary["wall_time_s"] > 0 and summary["mfu"] is None
    from xlgen.train import tokenizer_store

    assert json.load(open(os.path.join(wd, "config.json")))["xlgen"]["tokenizer"] == "tokenizer/vocab.json"
    tok = tokenizer_store.load(wd)  # what from_pretrained(wd).tokenizer returns
    assert tok.vocab_size == 74 and tok.decode(tok.encode("ROMEO: hi", add_eos=False)) == "ROMEO: hi"
    cmds = printed_commands(p.stdout)
    assert set(cmds) == {"extend", "evaluate", "plot", "tensorboard", "Python"}, cmds
    env = xlgen_env(compile_cache, devices=1)

    r = _shell(cmds["evaluate"], env)
    assert r.returncode == 0 and r.stdout.startswith("eval: step 4 "), r.stderr[-2000:]
    r = _shell(cmds["plot"], env)
    assert r.returncode == 0, r.stderr[-2000:]
    png = r.stdout.strip().split("plot: ")[1]
    assert png == os.path.join(wd, "plots", "training.png")
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    quiet = dict(env)
    quiet.pop("JAX_PLATFORMS")
    quiet["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
    r = _shell(cmds["Python"], quiet)
    assert r.returncode == 0 and r.stdout.strip() == "TransfoXLPretrained", r.stderr[-3000:]
    if platforms.detect() == "cpu":
        assert r.stderr == "", r.stderr[-3000:]  # libtpu installed, no TPU, nothing asked: no probe, no noise
    assert cmds["tensorboard"].endswith(f"tensorboard --logdir {wd}/tensorboard"), cmds["tensorboard"]
    tb = subprocess.Popen(
        ["bash", "-c", "exec " + cmds["tensorboard"] + " --port 0"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out = ""
        deadline = time.time() + 120
        while time.time() < deadline and "http://" not in out and tb.poll() is None:
            out += tb.stdout.readline()
        assert "TensorBoard" in out and "http://" in out, out
    finally:
        tb.kill()
        tb.wait()
    r = _shell(cmds["extend"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {wd}/checkpoints/4" in r.stdout and "done: step 8." in r.stdout
    assert json.load(open(os.path.join(wd, "summary.json")))["steps"] == 8


def test_finetune_platform_cpu_is_quiet(tmp_path, compile_cache):
    """`xlgen finetune --platform=cpu` imports jax before it picks the platform: the platform must still hold."""
    from xlgen.finetune.readers import synthetic

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
        "--config.model.n_layer=1",
        "--config.eval_every_steps=0",
        "--config.checkpoint.every_steps=2",
        "--platform=cpu",
        f"--workdir={tmp_path / 'wd'}",
    ]
    p = _xlgen(args, compile_cache, env=_quiet_env(compile_cache))
    noise = [line for line in p.stderr.splitlines() if any(w in line for w in LIBTPU_NOISE)]
    assert not noise, p.stderr[-3000:]
    assert os.path.exists(tmp_path / "wd" / "eval_results.json")


def test_corrupt_checkpoint_reported_quietly_and_moved_only_by_train(tmp_path, compile_cache):  # noqa: F811
    """The newest checkpoint is unreadable: `xlgen eval --workdir` (no --config) warns in one line, evaluates step 2
    and leaves it in place (a reader changes nothing); `xlgen train` moves it to checkpoints/corrupt-4, resumes from
    2, and `keep` counts only real checkpoints; later loads are silent."""
    wd = str(tmp_path / "wd")
    run_train(wd, compile_cache, overrides=RUN, devices=1)  # the train/eval programs of the test above
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
    assert f"checkpoint {ck}/4 failed verification" in lines[0] and "left in place" in lines[0]
    assert "TensorStore(" not in lines[0] and len(lines[0]) - 3 * len(ck) < 300, lines[0]
    assert p.stdout.startswith("eval: step 2 ")
    assert sorted(os.listdir(ck)) == ["2", "4"]
    recs = [json.loads(line) for line in open(os.path.join(wd, "metrics.jsonl"))]
    assert recs[-1]["split"] == "valid" and recs[-1]["step"] == 2 and np.isfinite(recs[-1]["loss"])
    # training moves it aside and resumes from step 2; keep=2 counts steps 4 and 6 only, the corrupt copy stays
    with open(os.path.join(wd, "config.json")) as f:
        assert json.load(f)["checkpoint"]["keep"] == 2
    p = run_train(
        wd,
        compile_cache,
        overrides={"total_steps": 6, "checkpoint.every_steps": 2, "eval.steps": 2, "mesh.data": 1},
        devices=1,
    )
    assert f"moved it to {ck}/corrupt-4" in p.stderr and f"resumed from {ck}/2" in p.stdout
    assert sorted(os.listdir(ck)) == ["4", "6", "corrupt-4"]
    p = _xlgen(["eval", f"--workdir={wd}", "--config.eval.steps=1"], compile_cache)
    assert p.stderr == "" and p.stdout.startswith("eval: step 6 ")


def test_second_run_on_a_live_workdir_fails_at_once(tmp_path, compile_cache):  # noqa: F811
    """`xlgen train` on a workdir a live run holds exits 2 with a clear error; a SIGKILLed run leaves no stale lock."""
    from xlgen.train import guards

    wd = str(tmp_path / "wd")
    env = xlgen_env(compile_cache, devices=1)
    first = subprocess.Popen(
        train_cmd(wd, overrides={**RUN1, "total_steps": 100000}),
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out = ""
        deadline = time.time() + 240
        while time.time() < deadline and "compiling" not in out and first.poll() is None:
            out += first.stdout.readline()
        assert "compiling" in out, out
        t0 = time.time()
        second = subprocess.run(
            train_cmd(wd, overrides=RUN1), env=env, cwd=REPO, capture_output=True, text=True, timeout=300
        )
        assert second.returncode == 2, second.stderr[-2000:]
        assert second.stderr.startswith(
            f"xlgen train: error: {wd} is in use by a running xlgen process (pid {first.pid}"
        )
        assert "Traceback" not in second.stderr and time.time() - t0 < 120  # no compile, no waiting
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    with guards.WorkdirLock(wd):  # the kernel dropped the killed run's flock
        pass


def test_nonfinite_updates_are_skipped_counted_and_stop_the_run(tmp_path, compile_cache):  # noqa: F811
    """lr=1e30: step 1 is finite (its update blows the weights up to ~1e30), every later loss is NaN. Those updates
    are skipped, counted in metrics.jsonl, and the third in a row stops the run with a clear error. No checkpoint
    is saved during the streak, and checkpoint 1 (its next step was not healthy: never proven) is set aside to
    diverged-1 with its ~1e30 parameters: no checkpoint with them remains to resume from (before issue 30,
    checkpoints 1-3 held them). Re-running does not silently restart at step 0; the printed command has
    --restart."""
    wd = str(tmp_path / "wd")
    over = {
        **RUN1,
        "total_steps": 10,
        "checkpoint.every_steps": 1,
        "checkpoint.keep": 10,
        "optimizer.learning_rate": 1e30,
        "optimizer.warmup_steps": 0,
        "max_nonfinite_steps": 3,
    }
    p = run_train(wd, compile_cache, overrides=over, devices=1, expect=1)
    err = p.stderr.strip().splitlines()
    assert err[-3].startswith("xlgen train: error: 3 consecutive steps (up to step 4) had a non-finite loss"), p.stderr
    assert "No healthy checkpoint remains; the later ones were moved aside (diverged-1)" in err[-3]
    assert err[-2] == "Start again from step 0 with a lower learning rate:" and "--restart" in err[-1]
    assert "--config.optimizer.learning_rate=1e+29" in err[-1]
    recs = [json.loads(line) for line in open(os.path.join(wd, "metrics.jsonl"))]
    assert [r.get("nonfinite_steps", 0) for r in recs] == [0, 1, 1]
    assert recs[0]["loss"] < 5 and recs[1]["loss"] == "nan"
    ck = os.path.join(wd, "checkpoints")
    assert sorted(os.listdir(ck)) == ["diverged-1"]
    assert "step 2: not saving a checkpoint (1 unhealthy steps in a row)" in p.stdout
    p = run_train(wd, compile_cache, overrides={**over, "optimizer.learning_rate": 2e-3}, devices=1, expect=2)
    assert "not restarting from step 0 silently" in p.stderr


# ---- errors, not tracebacks (in-process, cheap) -----------------------------------------------------------------


def test_bad_inputs_are_one_line_errors(tmp_path, capsys):
    """prepare spm with a --vocab_size the corpus cannot fill; a truncated SQuAD file (line, column, character);
    xlgen --version; xlgen config show; train --help names it."""
    from xlgen import __version__
    from xlgen.cli import main
    from xlgen.finetune.readers import synthetic
    from xlgen.finetune.readers.examples import TaskDataError
    from xlgen.finetune.readers.squad import read_squad

    corpus = tmp_path / "small.txt"
    corpus.write_text("\n".join(f"line {i} of a very small corpus about cats and dogs" for i in range(200)))
    assert main(["prepare", "spm", "--input", str(corpus), "--model_prefix", str(tmp_path / "sp")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"xlgen prepare: error: --vocab_size 32000 is too large for this corpus ({corpus}): ")
    assert "pass --vocab_size" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["small.txt"]  # nothing half-written

    synthetic.write_squad(str(tmp_path / "squad"), "v2.0", n_paragraphs=2, context_words=20)
    path = str(tmp_path / "squad" / "dev-v2.0.json")
    text = json.dumps(json.load(open(path)), indent=1)
    cut = len(text) // 2
    with open(path, "w") as f:
        f.write(text[:cut])
    with pytest.raises(TaskDataError) as e:
        read_squad(path, version="v2.0", require_answers=True)
    line = text[:cut].count("\n") + 1
    assert str(e.value).startswith(f"{path}:{line}:")
    assert f"character {cut}" in str(e.value) and "truncated?" in str(e.value)

    assert main(["--version"]) == 0 and capsys.readouterr().out == f"xlgen {__version__}\n"
    assert main(["config", "show", f"--config={REPO}/configs/pretrain/demo.py", "--config.total_steps=7"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert "total_steps = 7" in shown and "model.d_model = 96" in shown and "optimizer.learning_rate = 0.002" in shown
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "xlgen config show --config=PATH" in capsys.readouterr().out


def test_plan_without_libtpu_is_an_error(tmp_path):
    code = (
        "import sys; sys.modules['libtpu'] = None\n"  # as if the `tpu` extra were not installed
        "from xlgen.cli import main\n"
        "sys.exit(main(['plan', '--config=configs/pretrain/txl_tiny.py', '--topology=v3:2x2']))\n"
    )
    env = xlgen_env(str(tmp_path))
    env.pop("TPU_LIBRARY_PATH", None)  # exported by jax when this test process imported it
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr == (
        "xlgen plan: error: compiling for a TPU topology needs libtpu, which is not installed: "
        "pip install -c constraints.txt -e '.[tpu]'  (or `make test`, which installs it)\n"
    )


def test_workdir_keeps_its_tokenizer_and_a_different_one_is_an_error(tmp_path):
    """tokenizer_store: the tokenizer file lands in DIR/tokenizer/ and config.json names it; finetuning from the
    workdir uses it without --config.tokenizer; a different tokenizer (for finetuning or for resuming) is an error
    naming both."""
    from ml_collections import ConfigDict

    from data_pipelines import vocab as vocab_lib
    from xlgen.finetune.data import load_tokenizer
    from xlgen.finetune.readers import synthetic
    from xlgen.train import tokenizer_store

    texts = [f"the {w} sat on the mat near {v}" for w in ("cat", "dog", "cow") for v in ("home", "town", "sea")] * 20
    a, b = str(tmp_path / "a.model"), str(tmp_path / "b.model")
    synthetic.train_sentencepiece(texts, a, vocab_size=60)
    synthetic.train_sentencepiece(texts[:30], b, vocab_size=40)
    va, vb = (vocab_lib.SentencePieceTokenizer(p).vocab_size for p in (a, b))
    wd = tmp_path / "pretrain"
    wd.mkdir()
    (wd / "config.json").write_text(json.dumps({"xlgen": {"kind": "pretrain"}}))
    rec = tokenizer_store.save(str(wd), vocab_lib.SentencePieceTokenizer(a))
    assert rec["tokenizer"] == "tokenizer/spiece.model" and rec["tokenizer_vocab_size"] == va
    assert json.loads((wd / "config.json").read_text())["xlgen"]["tokenizer"] == "tokenizer/spiece.model"
    assert (wd / "tokenizer" / "spiece.model").read_bytes() == open(a, "rb").read()
    assert tokenizer_store.load(str(wd / "checkpoints" / "7")).vocab_size == va  # a checkpoint path names its run
    # resuming with other data/tokenizer
    with pytest.raises(ValueError, match=r"differs from the one this workdir was trained with: .*spiece\.model"):
        tokenizer_store.save(str(wd), vocab_lib.SentencePieceTokenizer(b))
    # finetuning from the workdir: its tokenizer by default; a different one names both files
    cfg = ConfigDict(
        {
            "tokenizer": "",
            "init_from": str(wd),
            "data": {"lower": None},
            "model": {"family": "xlnet", "vocab_size": 100},
        }
    )
    assert load_tokenizer(cfg).vocab_size == va
    cfg.tokenizer = a
    assert load_tokenizer(cfg).vocab_size == va
    cfg.tokenizer = b
    with pytest.raises(ValueError) as e:
        load_tokenizer(cfg)
    msg = str(e.value)
    assert msg.startswith(f"tokenizer mismatch: {b} ({vb} symbols, sha256 ")
    assert f"{wd}/tokenizer/spiece.model ({va} symbols, sha256 " in msg
