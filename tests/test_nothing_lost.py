"""Nothing lost (issue 48): no command deletes or overwrites what it did not create.

* Exports (`xlgen export --to-hf`, `xlgen convert --out`) write a new or empty directory, or replace a previous
  export (its marker `.xlgen-export`); a workdir, a non-empty directory, `.` or a file is refused, unchanged.
* Output paths that cannot be written (a file, under a file, a 300-byte name, a 4,400-byte path, a read-only
  filesystem, an empty `--workdir=`) are one-line errors, exit 2, nothing left behind.
"""

import hashlib
import os
import traceback

import pytest

from xlgen.interop import export
from xlgen.train import outdir


def tree_digest(root):
    """{relative path: sha256 of the bytes (files) | "dir" | "link -> target"} of everything under `root`."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            out[os.path.relpath(p, root)] = "link -> " + os.readlink(p) if os.path.islink(p) else "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            if os.path.islink(p):
                out[os.path.relpath(p, root)] = "link -> " + os.readlink(p)
                continue
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def tiny_txl():
    from flax import nnx

    from xlgen.models.transformer_xl import TransformerXLConfig, TransformerXLLM

    cfg = TransformerXLConfig(
        vocab_size=20, d_model=8, n_head=2, d_head=4, d_inner=16, n_layer=1, mem_len=2, cutoffs=()
    )
    return TransformerXLLM(cfg, rngs=nnx.Rngs(0))


def test_export_writes_only_new_empty_or_its_own_directories(tmp_path, tiny_txl, monkeypatch):
    """Item 1 / item 10 (`--to-hf=<a file>`): a non-empty directory, `.`, a file are refused with nothing changed;
    a new directory, an empty one and a previous export are written (the last replaced whole)."""
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    (busy / "checkpoints").mkdir()
    a_file = tmp_path / "model.bin"
    a_file.write_bytes(b"\x00weights")
    before = tree_digest(tmp_path)
    for target in (busy, a_file, busy / "notes.txt" / "sub"):
        with pytest.raises(outdir.OutputPathError) as e:
            export.export_model(tiny_txl, str(target))
        assert str(target) in str(e.value) and "\n" not in str(e.value)
    monkeypatch.chdir(busy)
    with pytest.raises(outdir.OutputPathError, match="non-empty directory|workdir"):
        export.export_model(tiny_txl, ".")
    assert tree_digest(tmp_path) == before  # nothing changed, no temporary directory left

    new = export.export_model(tiny_txl, str(tmp_path / "new" / "hf"))
    assert sorted(os.listdir(new)) == [".xlgen-export", "config.json", "model.safetensors"]
    empty = tmp_path / "empty"
    empty.mkdir()
    inode = os.stat(empty).st_ino
    assert export.export_model(tiny_txl, str(empty)) == str(empty)
    assert os.stat(empty).st_ino == inode and tree_digest(empty) == tree_digest(new)
    (empty / "model.safetensors").write_bytes(b"stale")  # a previous export is replaced, file for file
    (empty / "extra.json").write_text("{}")
    export.export_model(tiny_txl, str(empty))
    assert tree_digest(empty) == tree_digest(new)
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith(".")) == []  # no temporary siblings


# ----------------------------------------------------------------------------------------------------------------
# One run of every kind, built once (in-process through the CLI's main: tiny configs, 2 steps)
# ----------------------------------------------------------------------------------------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TXL = os.path.join(REPO, "configs", "pretrain", "txl_tiny.py")
FT = os.path.join(REPO, "configs", "finetune", "tiny.py")
PRE_OVERRIDES = {
    "total_steps": 2,
    "log_every_steps": 1,
    "eval_every_steps": 0,
    "tensorboard": False,
    "checkpoint.every_steps": 2,
    "mesh.num_devices": 1,
    "model.n_layer": 1,
    "model.d_model": 32,
    "model.d_embed": 32,
    "model.n_head": 2,
    "model.d_head": 16,
    "model.d_inner": 64,
    "model.mem_len": 8,
    "data.batch_size": 4,
    "data.tgt_len": 8,
    "data.eval_batch_size": 4,
    "data.eval_tgt_len": 8,
}


def flags(overrides):
    return [f"--config.{k}={v}" for k, v in overrides.items()]


def cli(*argv):
    """`xlgen ARGV` in this process: the exit status (an exception escaping main counts as 1)."""
    from xlgen.cli import main

    try:
        return main([str(a) for a in argv])
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except Exception:  # noqa: BLE001  (a traceback: the command failed)
        traceback.print_exc()
        return 1


def train_args(workdir, **over):
    return ["train", f"--config={TXL}", f"--workdir={workdir}", *flags({**PRE_OVERRIDES, **over})]


def finetune_args(workdir, data, **over):
    base = {
        "task": "glue/sst2",
        "data_dir": data,
        "tokenizer": os.path.join(data, "spiece.model"),
        "total_steps": 2,
        "log_every_steps": 1,
        "eval_every_steps": 2,
        "checkpoint.every_steps": 2,
        "mesh.num_devices": 1,
        "eval.predict_test": False,
        "model.n_layer": 1,
        "data.batch_size": 4,
        "data.eval_batch_size": 4,
    }
    return ["finetune", f"--config={FT}", f"--workdir={workdir}", *flags({**base, **over})]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{kind: path}: a pretraining run, a finetuning run, an export, a prepared corpus, a non-empty directory, a
    stand-in for the repository root, and the inputs (`data`: synthetic SST-2 + tokenizer, `conll`, `text`)."""
    from xlgen.finetune.readers import synthetic

    root = tmp_path_factory.mktemp("runs")
    inputs = root / "inputs"
    data = inputs / "sst2"
    synthetic.write_glue(str(data), "sst2", n_train=16, n_dev=8, n_test=0)
    synthetic.train_sentencepiece(synthetic.corpus_for(str(data)), str(data / "spiece.model"), vocab_size=100)
    synthetic.write_conll(str(inputs / "conll"), n_train=8, n_dev=4, n_test=2)
    (inputs / "text.txt").write_text("".join(f"line {i}: the quick brown fox\n" for i in range(50)))
    r = {"data": data, "conll": inputs / "conll", "text": inputs / "text.txt", "root": root}
    r["pretrain"] = root / "pretrain"
    assert cli(*train_args(r["pretrain"])) == 0
    r["finetune"] = root / "finetune"
    assert cli(*finetune_args(r["finetune"], data)) == 0
    r["export"] = root / "export"
    assert cli("export", f"--workdir={r['pretrain']}", f"--to-hf={r['export']}") == 0
    r["corpus"] = root / "corpus"
    assert (
        cli("prepare", "corpus", "--train", r["text"], "--tokenizer", "char", "--output", r["corpus"], "--quiet") == 0
    )
    r["nonempty"] = root / "nonempty"
    (r["nonempty"] / "sub").mkdir(parents=True)
    (r["nonempty"] / "notes.txt").write_text("my notes")
    (r["nonempty"] / "results.json").write_text('{"mine": 1}')
    (r["nonempty"] / "sub" / "figure.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    r["repo"] = root / "repo"  # the repository root's kind of content
    for name in ("README.md", "setup.py", "Makefile", "configs/pretrain/txl_tiny.py", "tests/conftest.py"):
        os.makedirs(os.path.dirname(r["repo"] / name), exist_ok=True)
        with open(os.path.join(REPO, name), "rb") as src, open(r["repo"] / name, "wb") as dst:
            dst.write(src.read())
    return r


def assert_unchanged(root, before, what):
    after = tree_digest(root)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert not changed, f"{what}: changed {changed[:10]}"


def test_metrics_record_kinds_do_not_collide(runs):
    """metrics.jsonl's record kinds (docs/training.md): every record without `split` is a training step with the
    contract's keys; the goodput record of each attempt is told by `kind` (with the contract's `goodput` and
    `time_s`); the last record with a `split` of a run that ended with its final evaluation is that evaluation."""
    import json

    for name in ("finetune", "pretrain"):
        with open(runs[name] / "metrics.jsonl") as f:
            recs = [json.loads(line) for line in f]
        if name == "finetune":  # evaluated at its last step
            last = [r for r in recs if "split" in r][-1]
            assert last["split"] == "dev" and last["step"] == 2 and "accuracy" in last, last
        train = [r for r in recs if "split" not in r]
        assert [r["step"] for r in train] == [1, 2], name
        assert all({"step", "loss", "learning_rate", "tokens_per_sec"} <= r.keys() for r in train), name
        (good,) = [r for r in recs if r.get("kind") == "goodput"]
        assert good["attempt"] == 1 and good["end"] == "completed", good
        assert 0 < good["goodput"] <= 1 and set(good["time_s"]) >= {"productive", "compile", "eval", "idle"}

        from xlgen.train.metrics import record_kind

        assert [record_kind(r) for r in recs].count("train") == 2 and record_kind(good) == "goodput"
        assert [record_kind(r) for r in recs if "split" in r and "kind" not in r] == ["eval"] * (name == "finetune")


def test_every_write_command_against_every_other_kind_changes_nothing(runs, tmp_path, capsys):
    """Acceptance (issue 48): train, finetune, prepare, export, convert, eval and analyze/plot with their outputs,
    pointed at a directory of every other kind (a pretraining run, a finetuning run, an export, a prepared corpus,
    a non-empty directory, the repository root's kind of tree), and with a failing start on an existing run: each
    fails with one line (exit 2) and every existing file keeps its bytes; nothing is added anywhere."""
    r = runs
    kinds = ("pretrain", "finetune", "export", "corpus", "nonempty", "repo")
    data = r["data"]
    before = tree_digest(r["root"])
    a_file = r["nonempty"] / "notes.txt"

    def refused(*argv, what, one_line=True):
        capsys.readouterr()
        rc = cli(*argv)
        err = capsys.readouterr().err
        assert rc == 2, f"{what}: exit {rc}\n{err[-2000:]}"
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert ": error: " in lines[0] and "Traceback" not in err, f"{what}: {err[-2000:]}"
        assert len(lines) == 1 or not one_line, f"{what}: {err[-2000:]}"  # the shape report lists the tensors
        assert_unchanged(r["root"], before, what)
        return lines[0]

    for kind in kinds:
        t = r[kind]
        if kind != "pretrain":
            refused(*train_args(t), what=f"train into {kind}")
            refused("eval", f"--workdir={t}", what=f"eval {kind}") if kind != "finetune" else None
        if kind != "finetune":
            refused(*finetune_args(t, data), what=f"finetune into {kind}")
        if kind != "corpus":
            line = refused(
                "prepare",
                "corpus",
                "--train",
                r["text"],
                "--tokenizer",
                "char",
                "--output",
                t,
                "--quiet",
                what=f"prepare corpus into {kind}",
            )
            assert str(t) in line
        if kind != "export":
            line = refused("export", f"--workdir={r['pretrain']}", f"--to-hf={t}", what=f"export into {kind}")
            assert str(t) in line
            refused(
                "convert",
                "--from-tf=/nonexistent/model.ckpt",
                "--family=xlnet",
                f"--config={TXL}",
                f"--out={t}",
                what=f"convert into {kind}",
            )
        for name in ("config.json", "notes.txt", "README.md", "manifest.json", "model.safetensors"):
            if (t / name).exists():  # a report or figure never replaces another command's or the user's file
                refused("analyze", "rank", f"--workdir={r['pretrain']}", f"--json={t / name}", what=f"rank json {name}")
                refused("analyze", "rank", f"--workdir={r['pretrain']}", f"--png={t / name}", what=f"rank png {name}")
                refused("plot", f"--workdir={r['pretrain']}", f"--out={t / name}", what=f"plot out {name}")
        refused("analyze", "rank", f"--workdir={r['pretrain']}", f"--json={t}", what=f"rank json into dir {kind}")
    refused("export", f"--workdir={r['pretrain']}", f"--to-hf={a_file}", what="export to a file")
    refused(
        "prepare",
        "vocab",
        "--level",
        "char",
        "--input",
        r["text"],
        "--output",
        r["pretrain"] / "config.json",
        what="vocab over a run's config.json",
    )
    refused("prepare", "spm", "--input", r["text"], "--model_prefix", r["finetune"] / "spm", what="spm into a run")

    # failing starts on existing runs: a different model, a tracker whose package is missing, another task
    refused(*train_args(r["pretrain"], **{"model.d_model": 48}), what="train with other shapes", one_line=False)
    try:
        import wandb  # noqa: F401
    except ImportError:
        refused(
            *train_args(r["pretrain"], trackers="wandb", total_steps=4), what="train with a missing tracker package"
        )
    refused(
        *finetune_args(r["finetune"], data, **{"model.d_model": 48}), what="finetune with other shapes", one_line=False
    )
    refused(
        "finetune",
        f"--config={REPO}/configs/finetune/conll2003.py",
        f"--config.data_dir={r['conll']}",
        f"--config.tokenizer={data / 'spiece.model'}",
        f"--workdir={r['finetune']}",
        what="finetune another task",
    )

    # the real repository root: refused before anything is written
    top = sorted(os.listdir(REPO))
    for argv in (
        train_args(REPO),
        finetune_args(REPO, data),
        ["export", f"--workdir={r['pretrain']}", f"--to-hf={REPO}"],
        ["prepare", "corpus", "--train", r["text"], "--tokenizer", "char", "--output", REPO],
    ):
        assert cli(*argv) == 2, argv[:2]
    assert sorted(os.listdir(REPO)) == top
    assert_unchanged(r["root"], before, "the repository root")


def test_failed_finetune_leaves_another_run_byte_identical(runs, capsys):
    """Item 2: a CoNLL-2003 finetune, another GLUE task, or a model of other shapes pointed at an SST-2 finetuning
    run fails before writing anything: the run's files keep their bytes and its own `xlgen eval` still works."""
    r = runs
    before = tree_digest(r["finetune"])
    conll = [
        "finetune",
        f"--config={REPO}/configs/finetune/conll2003.py",
        f"--config.data_dir={r['conll']}",
        f"--config.tokenizer={r['data'] / 'spiece.model'}",
        f"--workdir={r['finetune']}",
    ]
    assert cli(*conll) == 2
    assert "holds a finetune run of task 'glue/sst2'" in capsys.readouterr().err
    assert cli(*finetune_args(r["finetune"], r["data"], task="glue/cola")) == 2
    assert cli(*finetune_args(r["finetune"], r["data"], **{"model.d_inner": 48})) == 2
    assert_unchanged(r["finetune"], before, "finetune run")
    capsys.readouterr()
    assert cli("eval", f"--workdir={r['finetune']}") == 0
    assert "accuracy" in capsys.readouterr().out


def test_failed_start_leaves_nothing_and_a_racing_loser_keeps_the_winner(runs, tmp_path, monkeypatch, capsys):
    """Item 5: a start that fails (a traceback on vocab_size=0; a tracker whose package is missing) leaves no
    directory (nor the parents it made), so the corrected command runs; an empty `--workdir=` is an error; of two
    runs racing for one new workdir, the loser (WorkdirBusy, exit 2) leaves the winner's workdir complete."""
    import threading

    from xlgen.train import guards

    wd = tmp_path / "new" / "run"
    assert cli(*train_args(wd, **{"model.vocab_size": 0})) != 0
    assert not (tmp_path / "new").exists()
    try:
        import wandb  # noqa: F401
    except ImportError:
        assert cli(*train_args(wd, trackers="wandb")) == 2
        assert "wandb is not installed" in capsys.readouterr().err
        assert not (tmp_path / "new").exists()
    capsys.readouterr()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # an empty --workdir= never means the current directory
    for cmd in (train_args(""), ["eval", "--workdir="], finetune_args("", runs["data"])):
        assert cli(*cmd) == 2
        assert "--workdir is empty" in capsys.readouterr().err
    assert os.listdir(cwd) == []
    monkeypatch.chdir(REPO)

    # the loser checks the new workdir first, then waits until the winner holds its lock, then tries it
    enter = guards.WorkdirLock.__enter__
    winner_locked, loser_waiting = threading.Event(), threading.Event()

    def ordered_enter(self):
        if threading.current_thread().name == "loser":
            loser_waiting.set()
            assert winner_locked.wait(300)
            return enter(self)
        out = enter(self)
        winner_locked.set()
        return out

    monkeypatch.setattr(guards.WorkdirLock, "__enter__", ordered_enter)
    codes = {}
    loser = threading.Thread(name="loser", target=lambda: codes.setdefault("loser", cli(*train_args(wd))))
    loser.start()
    assert loser_waiting.wait(300)
    codes["winner"] = cli(*train_args(wd))  # the corrected command of the failed starts above
    loser.join(300)
    assert codes == {"loser": 2, "winner": 0}
    assert outdir.committed_steps(wd / "checkpoints") == [2] and (wd / "summary.json").exists()
    assert "is in use by a running xlgen process" in capsys.readouterr().err


def test_output_paths_that_cannot_be_written_are_one_line_errors(runs, tmp_path, monkeypatch, capsys):
    """Item 10: `--workdir` an existing file, under a file, with a 300-byte name, a 4,400-byte path, on a read-only
    filesystem; `prepare --output` read-only; `metrics.jsonl` a directory: one line naming the path, exit 2,
    nothing left behind."""
    import shutil

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    ro = tmp_path / "ro"
    ro.mkdir()
    cases = {
        a_file: "exists and is not a directory",
        a_file / "wd": f"{a_file} is a file",
        tmp_path / ("n" * 300) / "wd": "is 300 bytes long, beyond the filesystem's limit of 255",
        tmp_path.joinpath(*["p" * 200] * 22): "bytes long, beyond the filesystem's limit of",
    }
    for path, msg in cases.items():
        for argv in (train_args(path), finetune_args(path, runs["data"])):
            assert cli(*argv) == 2
            err = capsys.readouterr().err
            assert msg in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path)) == ["a_file", "ro"]

    # a read-only filesystem (what the kernel reports for it: access(W_OK) fails, statvfs has ST_RDONLY)
    real_access, real_statvfs = os.access, os.statvfs

    def under_ro(p):
        return os.path.abspath(p) == str(ro) or os.path.abspath(p).startswith(str(ro) + os.sep)

    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if under_ro(p) else real_access(p, mode, **kw))
    monkeypatch.setattr(
        os,
        "statvfs",
        lambda p: os.statvfs_result((4096,) * 2 + (0,) * 6 + (os.ST_RDONLY, 255)) if under_ro(p) else real_statvfs(p),
    )
    for argv in (
        train_args(ro / "wd"),
        ["prepare", "corpus", "--train", runs["text"], "--tokenizer", "char", "--output", ro / "corpus"],
        ["export", f"--workdir={runs['pretrain']}", f"--to-hf={ro / 'hf'}"],
    ):
        assert cli(*argv) == 2
        err = capsys.readouterr().err
        assert f"{ro} is on a read-only filesystem" in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.undo()
    assert os.listdir(ro) == []

    # metrics.jsonl a directory: train (resume) and eval name it, the run stays as it was
    wd = tmp_path / "copy"
    shutil.copytree(runs["pretrain"], wd)
    os.remove(wd / "metrics.jsonl")
    os.mkdir(wd / "metrics.jsonl")
    before = tree_digest(wd)
    for argv in (train_args(wd, total_steps=3), ["eval", f"--workdir={wd}"]):
        assert cli(*argv) == 2
        err = capsys.readouterr().err
        assert f"{wd}/metrics.jsonl: is a directory" in err and len(err.strip().splitlines()) == 1, err
    assert_unchanged(wd, before, "metrics.jsonl a directory")


def test_writing_workdir_removes_only_what_its_failed_start_wrote(tmp_path):
    """Item 5, the claim itself: a failed start removes the directory it made (and its parents), empties a
    directory the user made empty (which stays), and leaves a started run (a committed checkpoint) alone."""
    made, empty, started = tmp_path / "a" / "b" / "run", tmp_path / "empty", tmp_path / "started"
    empty.mkdir()
    for wd in (made, empty, started):
        with pytest.raises(RuntimeError, match="failed start"):
            with outdir.writing_workdir(str(wd)):
                (wd / "checkpoints").mkdir()
                (wd / "config.json").write_text("{}")
                if wd == started:
                    (wd / "checkpoints" / "2").mkdir()
                raise RuntimeError("failed start")
    assert sorted(os.listdir(tmp_path)) == ["empty", "started"] and os.listdir(empty) == []
    assert sorted(os.listdir(started)) == [".xlgen.lock", "checkpoints", "config.json"]


def _killed_start(wd, *, commit_checkpoint=False):
    """A process that starts a run in `wd` (writing_workdir: config.json, tokenizer/, an empty checkpoints/, or a
    committed checkpoint) and is SIGKILLed before its command ends: no clean-up runs."""
    import signal
    import subprocess
    import sys

    code = (
        "import os, signal, sys\n"
        "from xlgen.train import outdir\n"
        "wd = sys.argv[1]\n"
        "with outdir.writing_workdir(wd):\n"
        "    open(os.path.join(wd, 'config.json'), 'w').write('{}')\n"
        "    os.makedirs(os.path.join(wd, 'tokenizer'))\n"
        "    os.makedirs(os.path.join(wd, 'checkpoints'))\n"
        f"    if {commit_checkpoint}: os.makedirs(os.path.join(wd, 'checkpoints', '5'))\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    p = subprocess.run([sys.executable, "-c", code, str(wd)], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]


def test_a_start_killed_before_its_first_checkpoint_is_cleared_by_the_next_start(tmp_path):
    """Item 5 under SIGKILL (no clean-up runs): the next start recognises the half-made workdir by the marker the
    killed start left, removes only what a start writes (a file the user added stays) and starts afresh; a start
    killed after its first checkpoint is a run to resume (kept whole, the marker dropped); a directory holding the
    same files without the marker (not provably a killed start) is left byte-identical."""
    half, started, unmarked = tmp_path / "half", tmp_path / "started", tmp_path / "unmarked"
    _killed_start(half)
    _killed_start(started, commit_checkpoint=True)
    assert os.path.isfile(half / "config.json") and os.path.isdir(half / "tokenizer")
    (half / "notes.txt").write_text("the user's")
    unmarked.mkdir()
    (unmarked / "config.json").write_text("{}")
    (unmarked / "tokenizer").mkdir()
    before = tree_digest(unmarked)

    with pytest.raises(outdir.OutputPathError, match="notes.txt"):  # the user's file: not a workdir to start in
        with outdir.writing_workdir(str(half)):
            pass
    assert sorted(os.listdir(half)) == [".xlgen.lock", "notes.txt"]  # the killed start's files are gone
    os.remove(half / "notes.txt")
    with outdir.writing_workdir(str(half)):
        assert sorted(os.listdir(half)) == sorted([".xlgen.lock", outdir.START_MARKER])  # afresh
        (half / "checkpoints").mkdir()
        (half / "checkpoints" / "1").mkdir()
    assert sorted(os.listdir(half)) == [".xlgen.lock", "checkpoints"]

    with outdir.writing_workdir(str(started)):
        assert os.listdir(started / "checkpoints") == ["5"] and (started / "config.json").read_text() == "{}"
    assert sorted(os.listdir(started)) == [".xlgen.lock", "checkpoints", "config.json", "tokenizer"]

    with outdir.writing_workdir(str(unmarked)):
        pass
    after = tree_digest(unmarked)
    assert after.pop(".xlgen.lock") and after == before


def test_a_prepare_racing_for_a_new_output_never_removes_the_others_output(tmp_path, capsys):
    """Item 5's race for `xlgen prepare`: while one prepare holds a new output directory (it took it first, it
    will fail), a second prepare into the same output fails at once with one line and writes nothing; the first's
    failure then removes only what it made. (Before: the second wrote its corpus into the directory and the first's
    clean-up deleted it.)"""
    from data_pipelines import paths, prepare

    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    out = tmp_path / "new" / "corpus"
    args = ["corpus", "--train", str(text), "--tokenizer", "char", "--output", str(out)]
    with pytest.raises(RuntimeError, match="the first prepare fails"):
        with paths.removed_on_failure(str(out)):
            rc = prepare.main(args)  # the second prepare, while the first is running
            err = capsys.readouterr().err
            kept = sorted(os.listdir(out)) if os.path.isdir(out) else []
            raise RuntimeError("the first prepare fails")
    if rc == 0:  # whatever the second prepare completed must still be there
        assert os.path.isdir(out) and sorted(os.listdir(out)) == kept, "the loser's clean-up removed the output"
    assert (
        rc == 2
        and err
        == f"xlgen prepare: error: {out}: another xlgen process is writing into this directory; "
        "wait for it to finish or give another output\n"
    ), err
    assert kept == [] and sorted(os.listdir(tmp_path)) == ["text.txt"]  # the first's failure removed what it made
    assert prepare.main(args) == 0 and os.path.isfile(out / "manifest.json")  # once free, the output is written


def test_sigkill_after_step_kills_a_run_at_its_logged_step(tmp_path):
    """The crash tests' one kill loop (tests/kill_helpers.py): a process logging one training record every 20 ms
    (a half-written line, an evaluation and a goodput record among them, as in a real metrics.jsonl) is killed
    once step >= 5 is logged, dies by SIGKILL, and never reaches step 50; one that finishes first is an error."""
    import sys

    from kill_helpers import last_train_step, sigkill_after_step

    code = (
        "import json, sys, time\n"
        "f = open(sys.argv[1] + '/metrics.jsonl', 'a', buffering=1)\n"
        "f.write(json.dumps({'step': 0, 'split': 'valid', 'loss': 1.0}) + '\\n')\n"
        "f.write(json.dumps({'step': 90, 'kind': 'goodput', 'split': 'goodput', 'goodput': 0.5}) + '\\n')\n"
        "for s in range(1, int(sys.argv[2]) + 1):\n"
        "    f.write(json.dumps({'step': s, 'loss': 1.0 / s}) + '\\n')\n"
        "    time.sleep(0.02)\n"
        "f.write('{\"step\": 99')\n"
    )
    wd = str(tmp_path)
    sigkill_after_step([sys.executable, "-c", code, wd, "50"], wd, 5, env=dict(os.environ), poll=0.005)
    assert 5 <= last_train_step(wd) < 50
    os.remove(tmp_path / "metrics.jsonl")
    with pytest.raises(AssertionError, match="finished before it could be killed"):
        sigkill_after_step([sys.executable, "-c", code, wd, "2"], wd, 5, env=dict(os.environ), poll=0.005)
    assert last_train_step(wd) == 2  # the half-written last line is not a record
