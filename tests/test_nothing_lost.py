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
