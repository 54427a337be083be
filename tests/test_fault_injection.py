"""Fault injection (issue 30): what a careful operator does to a run, and that nothing is lost or silently wrong.

Checkpoints: a flipped byte or 4 KB of garbage in a checkpoint's data is detected by the checksums saved with it,
reported with the step and item, and the previous checkpoint used (readers change nothing; `xlgen train` moves the
bad one to corrupt-<step>). An exploding learning rate on resume keeps the good checkpoint and prints a resume
command that works. A config/shape mismatch is an error naming both shapes, changing no file. All checkpoints
unreadable: no silent restart from step 0. `xlgen finetune` into a pretraining workdir leaves it byte-identical.

Tiny Transformer-XL runs through the real CLI sharing the session's compilation cache: one 4-step run (`base`) is
copied by the tests that start from a trained workdir; a command whose stderr carries a logged warning (a failed
verification) runs in a subprocess (its stderr as an operator sees it), the others through `xlgen.cli.main` in this
process (their messages are printed)."""

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import types

import numpy as np
import pytest
from test_train_utils import (  # noqa: F401  (fixture)
    REPO,
    compile_cache,
    run_train,
    train_cmd,
    train_losses,
    xlgen_env,
)
from test_user_edges import _xlgen

RUN = {"total_steps": 4, "checkpoint.every_steps": 2, "eval.steps": 2, "mesh.data": 1, "mesh.num_devices": 1}


@pytest.fixture(scope="module")
def base(tmp_path_factory, compile_cache):  # noqa: F811
    """A finished RUN workdir (checkpoints 2 and 4); tests take a copy (`_copy_base`)."""
    wd = str(tmp_path_factory.mktemp("base") / "wd")
    run_train(wd, compile_cache, overrides=RUN, devices=1)
    return wd


def _copy_base(base, tmp_path) -> str:
    wd = str(tmp_path / "wd")
    shutil.copytree(base, wd)
    return wd


@pytest.fixture
def cli(monkeypatch, capsys, compile_cache):  # noqa: F811
    """`cli(args, expect=0)`: `xlgen.cli.main(args)` in this process with the session's compilation cache ->
    (returncode, stdout, stderr) of the command alone."""
    monkeypatch.setenv("XLGEN_COMPILATION_CACHE", compile_cache)
    monkeypatch.setenv("XLGEN_COMPILATION_CACHE_MIN_SECS", "0.1")

    def run(args, expect=0):
        from xlgen.cli import main

        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        assert code == expect, f"exit {code}\n{out[-3000:]}\n{err[-5000:]}"
        return types.SimpleNamespace(returncode=code, stdout=out, stderr=err)

    return run


def _train_args(wd, over, extra=()):
    return train_cmd(wd, "txl_tiny.py", over, extra)[3:]  # ["train", "--config=...", ...]


def snapshot(root) -> dict:
    """{relative path: sha256} of every file under `root`."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def largest_data_file(item_dir) -> str:
    files = [os.path.join(d, f) for d, _, fs in os.walk(item_dir) for f in fs if os.sep + "d" + os.sep in d + os.sep]
    return max(files, key=os.path.getsize)


def flip_byte(path, offset=None):
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        i = len(data) // 2 if offset is None else offset
        data[i] ^= 0x10
        f.seek(0)
        f.write(data)


def test_bit_flip_and_garbage_are_detected_and_fallen_back(tmp_path, compile_cache, base):  # noqa: F811
    """One flipped byte in the newest checkpoint's OCDBT data: `xlgen eval` reports step 4 and the item in one line,
    evaluates step 2 and changes no checkpoint file; `xlgen train` moves 4 to corrupt-4 and resumes from 2 with the
    reference losses bit for bit. 4 KB of garbage in a memory data file: the same, by the mems checksum."""
    wd = _copy_base(base, tmp_path)
    reference = train_losses(wd)
    ck = os.path.join(wd, "checkpoints")
    assert sorted(os.listdir(ck)) == ["2", "4"]
    flip_byte(largest_data_file(os.path.join(ck, "4", "state")))
    before = snapshot(ck)

    p = _xlgen(["eval", f"--workdir={wd}"], compile_cache)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr[-5000:]
    assert f"checkpoint {ck}/4 failed verification" in lines[0] and "left in place" in lines[0], lines[0]
    assert p.stdout.startswith("eval: step 2 ")
    assert snapshot(ck) == before  # a reader changes nothing
    rec = [json.loads(line) for line in open(os.path.join(wd, "metrics.jsonl"))][-1]
    assert rec["source"] == "xlgen eval" and rec["step"] == 2  # marked: not part of the training curves

    p = run_train(wd, compile_cache, overrides=RUN, devices=1)
    assert f"checkpoint {ck}/4 failed verification" in p.stderr and f"moved it to {ck}/corrupt-4" in p.stderr
    assert f"resumed from {ck}/2" in p.stdout
    assert train_losses(wd) == reference  # resumed exactly from the previous good checkpoint
    assert sorted(os.listdir(ck)) == ["2", "4", "corrupt-4"]

    with open(largest_data_file(os.path.join(ck, "4", "mems")), "r+b") as f:
        f.seek(0)
        f.write(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    p = run_train(wd, compile_cache, overrides={**RUN, "total_steps": 6}, devices=1)
    assert f"checkpoint {ck}/4 failed verification" in p.stderr and f"resumed from {ck}/2" in p.stdout
    assert sorted(os.listdir(ck)) == ["4", "6", "corrupt-4", "corrupt-4-2"]


def test_exploding_learning_rate_keeps_the_good_checkpoint(tmp_path, compile_cache, base, cli):  # noqa: F811
    """Resumed at step 4 with lr=1e30: step 5 (computed on checkpoint 4) is healthy, proving 4; its update blows the
    weights up, every later step is non-finite. Nothing is saved during the streak, 4 survives keep=2 (pinned), the
    unproven 5 is set aside, and the printed command (the checkpoint's own learning rate), run as printed, resumes
    from 4 and finishes with finite losses."""
    wd = _copy_base(base, tmp_path)
    ck = os.path.join(wd, "checkpoints")
    over = {
        **RUN,
        "total_steps": 10,
        "checkpoint.every_steps": 1,
        "optimizer.learning_rate": 1e30,
        "max_nonfinite_steps": 3,
    }
    p = cli(_train_args(wd, over), expect=1)
    assert "3 consecutive steps (up to step 8) had a non-finite loss" in p.stderr, p.stderr[-3000:]
    assert f"The newest checkpoint proven healthy is {ck}/4" in p.stderr
    assert sorted(os.listdir(ck)) == ["4", "diverged-5"], os.listdir(ck)
    cmd = p.stderr.strip().splitlines()[-1].strip()
    assert "Resume from checkpoint 4 with a lower learning rate:" in p.stderr and " train " in cmd, p.stderr
    assert "--config.optimizer.learning_rate=0.002" in cmd  # txl_tiny's own, what checkpoint 4 was trained with
    r = subprocess.run(
        shlex.split(cmd), env=xlgen_env(compile_cache, devices=1), cwd=REPO, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {ck}/4" in r.stdout
    losses = train_losses(wd)
    assert sorted(losses) == list(range(1, 11)) and all(np.isfinite(v) for v in losses.values())


def test_shape_mismatch_is_an_error_and_changes_nothing(tmp_path, compile_cache, base):  # noqa: F811
    """config.json edited (model.d_model 32 -> 48): `xlgen eval` is an error naming both shapes, exit 2, and no file
    of the workdir changes (before: all checkpoints moved to corrupt-*)."""
    wd = _copy_base(base, tmp_path)
    cfg = json.load(open(os.path.join(wd, "config.json")))
    cfg["model"]["d_model"] = 48
    with open(os.path.join(wd, "config.json"), "w") as f:
        json.dump(cfg, f)
    before = snapshot(wd)
    p = _xlgen(["eval", f"--workdir={wd}"], compile_cache, expect=2)
    err = p.stderr.strip()
    assert err.startswith("xlgen eval: error: ") and "does not match the config's model" in err, err[-3000:]
    assert re.search(r"checkpoint \[[\d, ]*32[\d, ]*\] vs config \[[\d, ]*48[\d, ]*\]", err), err
    assert "Traceback" not in err
    assert snapshot(wd) == before


def test_all_checkpoints_unreadable_is_no_silent_restart(tmp_path, base, cli):
    """Every checkpoint corrupt: `xlgen train` sets them aside and stops (exit 2); re-running refuses to start again
    at step 0 over the earlier records; `--restart` does, and metrics.jsonl has each step once."""
    wd = _copy_base(base, tmp_path)
    ck = os.path.join(wd, "checkpoints")
    for step in ("2", "4"):
        flip_byte(largest_data_file(os.path.join(ck, step, "state")))
    p = cli(_train_args(wd, RUN), expect=2)
    assert "no usable checkpoint among steps [2, 4]" in p.stderr, p.stderr[-3000:]
    assert sorted(os.listdir(ck)) == ["corrupt-2", "corrupt-4"]
    p = cli(_train_args(wd, RUN), expect=2)
    assert "not restarting from step 0 silently" in p.stderr and "--restart" in p.stderr, p.stderr[-3000:]
    assert [r["step"] for r in map(json.loads, open(os.path.join(wd, "metrics.jsonl"))) if "split" not in r] == [
        1,
        2,
        3,
        4,
    ]
    cli(_train_args(wd, RUN, ["--restart"]))
    assert [r["step"] for r in map(json.loads, open(os.path.join(wd, "metrics.jsonl"))) if "split" not in r] == [
        1,
        2,
        3,
        4,
    ]


def test_finetune_into_a_pretraining_workdir_changes_nothing(tmp_path, base, cli):
    from xlgen.finetune.readers import synthetic

    wd = _copy_base(base, tmp_path)
    data = tmp_path / "sst2"
    synthetic.write_glue(str(data), "sst2", n_train=8, n_dev=4, n_test=2)
    synthetic.train_sentencepiece(synthetic.corpus_for(str(data)), str(data / "spiece.model"), vocab_size=60)
    before = snapshot(wd)
    p = cli(
        [
            "finetune",
            "--config=configs/finetune/tiny.py",
            "--config.task=glue/sst2",
            f"--config.data_dir={data}",
            f"--config.tokenizer={data / 'spiece.model'}",
            "--config.total_steps=2",
            f"--workdir={wd}",
        ],
        expect=2,
    )
    assert p.stderr.strip() == (
        f"xlgen finetune: error: {wd} holds a pretrain run; `finetune` will not write into it (use another --workdir)"
    ), p.stderr[-3000:]
    assert snapshot(wd) == before


# ---- bad input: one line, exit 2, nothing written (in-process, cheap) --------------------------------------------


BAD_OVERRIDES = [
    ("data.batch_size", "0", "must be > 0"),
    ("data.tgt_len", "0", "must be > 0"),
    ("model.d_model", "0", "must be > 0"),
    ("seed", "1e20", "must be an integer in [0, 2**32)"),
    ("model.dtype", "float8", "expected one of float32, bfloat16, float16"),
    ("total_steps", "-5", "must be > 0"),
    ("optimizer.learning_rate", "-1", "must be a finite number > 0"),
    ("optimizer.learning_rate", "nan", "must be finite"),
    ("optimizer.learning_rate", "inf", "must be finite"),
    ("watchdog.timeout_s", "-1", "must be >= 0"),
    ("checkpoint.local_every_steps", "-2", "must be >= 0"),
    ("mesh.num_slices", "0", "must be >= 1"),
]


def test_bad_config_values_are_one_line_errors(tmp_path, capsys):
    from xlgen.cli import main

    cfg = f"{REPO}/configs/pretrain/txl_tiny.py"
    for key, value, want in BAD_OVERRIDES:
        wd = tmp_path / "wd"
        assert main(["train", f"--config={cfg}", f"--config.{key}={value}", f"--workdir={wd}"]) == 2, key
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"xlgen train: error: config key {key}="), err
        assert want in err, err
        assert not wd.exists()  # nothing written


def test_bad_config_files_are_one_line_errors(tmp_path, capsys):
    from xlgen.cli import main

    raising = tmp_path / "raising.py"
    raising.write_text("def get_config():\n    raise RuntimeError('no such preset')\n")
    wd = tmp_path / "wd"
    cases = [
        (["train", f"--config={raising}"], f"{raising}: get_config: RuntimeError: no such preset"),
        (["train", f"--config={tmp_path}"], f"{tmp_path}: is a directory; --config takes a Python file"),
    ]
    for args, want in cases:
        assert main(args + [f"--workdir={wd}"]) == 2, args
        err = capsys.readouterr().err
        assert err == f"xlgen train: error: {want}\n" or (err.count("\n") == 1 and want in err), err
        assert not wd.exists()
    for content, want in ((b"{}", "not an xlgen run config (no `model` section)"), (b"\xff\xfe{", "not UTF-8")):
        run = tmp_path / "run"
        run.mkdir(exist_ok=True)
        (run / "config.json").write_bytes(content)
        assert main(["eval", f"--workdir={run}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{run}/config.json: " in err and want in err, err
        assert sorted(os.listdir(run)) == ["config.json"]


def test_metrics_partial_line_repaired_and_readers_name_the_line(tmp_path):
    """A record cut by a kill is removed before the next append (the appended record is not lost); a reader names
    file and line of a record that is not JSON; ad-hoc `xlgen eval` records stay out of the training curves."""
    import pytest

    from xlgen.train import metrics as metrics_lib

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    w = metrics_lib.MetricsWriter(str(tmp_path), tensorboard=False)
    w.write({"step": 2, "loss": 1.5})
    w.write({"step": 2, "split": "valid", "loss": 1.7, "source": "xlgen eval"})
    w.close()
    assert [r["step"] for r in metrics_lib.read_metrics(str(path))] == [1, 2]
    assert len(metrics_lib.read_metrics(str(path), adhoc=True)) == 3
    with open(path, "a") as f:
        f.write("{oops\n")
    with pytest.raises(ValueError, match=rf"{path}:4: not a JSON record"):
        metrics_lib.read_metrics(str(path))


def test_kill_before_the_first_checkpoint_leaves_no_duplicate_steps(tmp_path, cli):
    """A run killed before its first checkpoint left records (and a cut last line); the next run starts at step 0
    and metrics.jsonl has each step once."""
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "metrics.jsonl").write_text('{"step": 1, "loss": 4.0}\n{"step": 2, "loss": 3.9}\n{"step": 3, "lo')
    p = cli(_train_args(wd, RUN))
    assert "dropped 3 metric records of an earlier attempt" in p.stdout
    assert [r["step"] for r in map(json.loads, open(wd / "metrics.jsonl")) if "split" not in r] == [1, 2, 3, 4]


def test_corrupt_local_shard_is_an_error_naming_it_and_prepare_rewrites_it(tmp_path, monkeypatch, capsys):
    """Random bytes in a prepared shard (its .npy header intact): opening the corpus is an error naming the shard
    (sha256 against the manifest); `xlgen prepare corpus` re-writes it instead of calling it up to date; token ids
    >= the vocabulary size are an error naming the shard even when the digest is made to agree."""
    import pytest

    from data_pipelines import corpus, prepare

    monkeypatch.setenv("XLGEN_CACHE_DIR", str(tmp_path / "cache"))
    text = tmp_path / "a.txt"
    text.write_text("the cat sat on the mat.\n\nthe dog sat on the log.\n" * 40)
    out = tmp_path / "out"
    argv = ["corpus", "--train", str(text), "--tokenizer", "char", "--output", str(out), "--quiet"]
    assert prepare.main(argv) == 0
    m = json.loads((out / "manifest.json").read_text())
    shard = m["splits"]["train"]["shards"][0]
    path = out / shard["tokens"]
    good = path.read_bytes()
    corpus.prepared_corpus(str(out), "train")  # verifies (and caches the digest)
    header = len(good) - shard["num_tokens"] * np.load(path, mmap_mode="r").dtype.itemsize
    junk = np.random.default_rng(0).integers(0, 256, len(good) - header, dtype=np.uint8).tobytes()
    path.write_bytes(good[:header] + junk)
    with pytest.raises(ValueError, match=rf"{path}: sha256 \w+ does not match the manifest's"):
        corpus.prepared_corpus(str(out), "train")
    capsys.readouterr()
    assert prepare.main(argv) == 0
    assert "1 shard(s) written, 0 up to date" in capsys.readouterr().out
    assert path.read_bytes() == good
    corpus.prepared_corpus(str(out), "train")

    path.write_bytes(good[:header] + junk)  # now make the manifest agree: the ids themselves are checked
    shard["tokens_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=rf"{path}: token id \d+ >= the vocabulary size"):
        corpus.prepared_corpus(str(out), "train")


def test_prepare_bad_output_and_binary_vocab_are_one_line_errors(tmp_path, capsys):
    from data_pipelines import prepare

    text = tmp_path / "a.txt"
    text.write_text("the cat sat on the mat.\n")
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    assert prepare.main(["corpus", "--train", str(text), "--tokenizer", "char", "--output", str(afile)]) == 2
    assert (
        capsys.readouterr().err
        == f"xlgen prepare: error: --output {afile}: is a file; give a directory for the shards and manifest\n"
    )
    assert afile.read_text() == "keep me"
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(b"\x00\x01\xff\xfe\x80binary")
    out = tmp_path / "out"
    argv = ["corpus", "--train", str(text), "--tokenizer", f"wordpiece:{vocab}", "--output", str(out)]
    assert prepare.main(argv) == 2
    assert (
        capsys.readouterr().err
        == f"xlgen prepare: error: {vocab}: not a WordPiece vocab.txt (not UTF-8 text at byte 2)\n"
    )
    assert not out.exists()


def test_health_guard_divergence_and_proof_by_the_next_step():
    """A finite loss far above the best (TXL at lr=1e6: ~1e13, finite) is unhealthy like a skipped update: the
    checkpoint before it is not proven, the one before that is, and `max_consecutive` in a row stop the run."""
    import numpy as np
    import pytest

    from xlgen.train.guards import HealthGuard, TrainingDiverged

    g = HealthGuard(3, divergence_factor=3.0)
    losses = {1: 4.3, 2: 3.0, 3: 2.5, 4: 2.6, 5: 9.0, 6: 1e13, 7: 1e13}
    g.watch(2)
    g.watch(4)
    for t in range(1, 5):
        g.add(np.bool_(False), np.float32(losses[t]))
    g.check(4)
    assert g.healthy and g.proven == 2 and g.best == 2.5
    g.add(np.bool_(False), np.float32(losses[5]))  # 9.0 > 3 x 2.5: step 5 diverges, so checkpoint 4 is not proven
    g.check(5)
    assert not g.healthy and g.proven == 2 and g.total == 0
    g.add(np.bool_(False), np.float32(losses[6]))
    with pytest.raises(TrainingDiverged, match=r"3 consecutive steps \(up to step 7\) had a non-finite or diverging"):
        g.add(np.bool_(True), np.float32("nan"))
        g.check(7)
    # small losses: the floor of 1 keeps a 0.01 -> 0.05 blip healthy
    g = HealthGuard(3, divergence_factor=3.0, best_loss=0.01)
    g.add(np.bool_(False), np.float32(0.05))
    g.check(1)
    assert g.healthy
