"""Issue 48 ("nothing lost, round two"), items 3, 4, 6, 7 and the file-naming parts of 12: rot in a prepared shard
that its cached verification cannot see, divergence judged against a uniform guess with the healthy checkpoint
kept, metrics.jsonl repair that keeps every good record, printed resume commands that run as printed, and read
errors naming the file (and line)."""

import json
import os
import shlex

import numpy as np
import pytest
from test_train_utils import REPO, TINY, compile_cache  # noqa: F401  (fixture)

from data_pipelines import corpus, prepare


def _prepared(tmp_path, monkeypatch):
    """A small prepared char corpus (sentences layout) and the path of its train token shard."""
    monkeypatch.setenv("XLGEN_CACHE_DIR", str(tmp_path / "cache"))
    text = tmp_path / "a.txt"
    text.write_text("the cat sat on the mat.\n\nthe dog sat on the log.\n" * 400)
    out = tmp_path / "out"
    argv = ["corpus", "--train", str(text), "--tokenizer", "char", "--layout", "sentences", "--output", str(out)]
    assert prepare.main(argv + ["--quiet"]) == 0
    shard = json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"][0]
    return out, out / shard["tokens"], argv


def _flip_byte_keeping_mtime(path, offset_from_end):
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(st.st_size - offset_from_end)
        b = f.read(1)
        f.seek(st.st_size - offset_from_end)
        f.write(bytes([b[0] ^ 0x01]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns and os.stat(path).st_size == st.st_size


def test_item3_rot_that_keeps_size_and_mtime_is_caught_where_read_and_by_prepare(tmp_path, monkeypatch, capsys):
    """A flipped bit in a verified (cached) shard, size and mtime kept: opening still hits the cache, but reading
    the rotten block is an error naming the shard; the cached verification is dropped, so the next open names it
    against the manifest's sha256; `xlgen prepare corpus` re-hashes and rewrites it instead of "up to date"."""
    out, path, argv = _prepared(tmp_path, monkeypatch)
    good = path.read_bytes()
    c = corpus.prepared_corpus(str(out), "train")  # verifies the file and caches its digest and block CRCs
    ref = c.tokens(0, c.num_tokens)
    assert np.array_equal(ref, np.load(path)) and np.array_equal(c.tokens(c.num_tokens - 5, 10)[5:], ref[:5])
    _flip_byte_keeping_mtime(path, 3)  # a token near the end of the only block
    c = corpus.prepared_corpus(str(out), "train")  # the cache (path, size, mtime) cannot see it
    with pytest.raises(ValueError, match=rf"^{path}: data bytes 0-\d+ have CRC32 \w+, not the \w+ recorded") as e:
        c.tokens(c.num_tokens - 4, 2)
    assert "\n" not in str(e.value) and "re-run the same `xlgen prepare corpus`" in str(e.value)
    with pytest.raises(ValueError, match=rf"^{path}: sha256 \w+ does not match the manifest's"):
        corpus.prepared_corpus(str(out), "train")

    assert prepare.main(argv + ["--quiet"]) == 0  # rewritten, never "up to date" (sha256 hashed again)
    assert "1 shard(s) written, 0 up to date" in capsys.readouterr().out
    assert path.read_bytes() == good
    _flip_byte_keeping_mtime(path, 3)
    assert prepare.main(argv + ["--quiet"]) == 0
    assert "1 shard(s) written, 0 up to date" in capsys.readouterr().out
    assert path.read_bytes() == good
    assert prepare.main(argv + ["--quiet"]) == 0
    assert "0 shard(s) written, 1 up to date" in capsys.readouterr().out


def test_item3_block_checks_cover_every_read_path():
    """`ChecksummedShard` with small blocks: slices, single items (negative too) and gathers each verify exactly
    the blocks they touch, and return the array's values."""
    data = np.arange(1000, dtype=np.uint16)
    raw = data.view(np.uint8)
    crcs = corpus.shard_block_crcs(raw, 64)
    assert len(crcs) == 32  # 2000 bytes in 64-byte blocks (the last one shorter)
    s = corpus.ChecksummedShard(data, "x.npy", crcs, 64)
    assert np.array_equal(s[10:40], data[10:40]) and s.checked.tolist() == [True, True] + [False] * 30
    assert s[-1] == 999 and s.checked[-1] and s.checked.sum() == 3
    assert np.array_equal(s[np.array([500, -2])], data[[500, -2]]) and s.checked.sum() == 4
    assert np.array_equal(np.asarray(s), data) and s.checked.all()
    rotten = data.copy()
    rotten[700] ^= 4
    r = corpus.ChecksummedShard(rotten, "x.npy", crcs, 64)
    assert np.array_equal(r[:640], data[:640])  # blocks 0..19 are intact
    for read in (lambda: r[690:710], lambda: r[700], lambda: r[np.array([1, 700])], lambda: np.asarray(r)):
        with pytest.raises(ValueError, match=r"x.npy: data bytes 1344-1408 have CRC32"):
            read()


def test_item12_truncated_shard_names_the_file(tmp_path, monkeypatch):
    out, path, _ = _prepared(tmp_path, monkeypatch)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match=rf"^{path}: not a readable .npy shard \(.*truncated\?\)"):
        corpus.prepared_corpus(str(out), "train")


def test_item4_a_loss_worse_than_a_uniform_guess_is_unhealthy_once_beaten():
    """txl_tiny's numbers (V = 74, log V = 4.304): the loss starts near log V (no ceiling yet, so an untrained model
    is healthy); once the best is below 0.9 log V, 5.74 (under 3 x the best 2.72 = 8.16) is unhealthy, the
    checkpoint before it is not proven, and a streak stops the run naming both limits. The guard of a run takes
    log V from the objective and `divergence_factor` from the config, or its one declared default."""
    import math

    from xlgen import config as config_lib
    from xlgen import registry
    from xlgen.train.guards import HealthGuard, TrainingDiverged, health_guard

    g = HealthGuard(3, divergence_factor=3.0, uniform_loss=math.log(74))
    g.watch(4)
    for t, loss in enumerate([4.31, 4.33, 3.5, 2.72], 1):
        g.add(np.bool_(False), np.float32(loss))
    g.check(4)
    assert g.healthy and g.best == pytest.approx(2.72) and g.limit() == pytest.approx(math.log(74))
    g.add(np.bool_(False), np.float32(5.74))
    g.check(5)
    assert not g.healthy and g.proven is None  # checkpoint 4 is never proven by an unhealthy step
    g.add(np.bool_(False), np.float32(5.74))
    g.add(np.bool_(False), np.float32(5.74))
    with pytest.raises(TrainingDiverged, match=r"above divergence_factor=3 x the best loss 2.72 or 4.304, the loss"):
        g.check(7)

    cfg = config_lib.load_config(os.path.join(REPO, "configs/pretrain/txl_tiny.py"), {})
    guard = health_guard(cfg, registry.objective(cfg))
    assert guard.uniform_loss == pytest.approx(math.log(74)) and guard.divergence_factor == 3.0
    stored = config_lib.to_json_dict(cfg)
    del stored["divergence_factor"]  # a stored config.json that predates the key
    old = config_lib.parse_json_config(json.dumps(stored).encode(), "config.json")
    assert (
        health_guard(old, registry.objective(old)).divergence_factor
        == config_lib.base_config().divergence_factor
        == 3.0
    )


def test_item6_metrics_repair_keeps_good_records_and_sets_aside_bad_ones(tmp_path, caplog):
    """A resume's repair of metrics.jsonl: good records up to the checkpoint stay (byte for byte), records after
    it and a last line cut by a kill are dropped, and lines in the middle that are not records (a non-UTF-8 byte,
    garbled JSON) are set aside in metrics.jsonl.bad with a warning naming file and lines; readers (plot) name the
    file and line of a non-UTF-8 byte."""
    from xlgen.analyze.plot import main as plot_main
    from xlgen.train import metrics as metrics_lib

    path = tmp_path / "metrics.jsonl"
    good = [b'{"step": 1, "loss": 2.0}', b'{"step": 4, "loss": 1.7}', b'{"step": 4, "split": "valid", "loss": 1.8}']
    bad = [b'{"step": 2, "lo\xffss": 1.9}', b'{"step": 3, "lo']
    body = [good[0], bad[0], bad[1], good[1], good[2], b'{"step": 9, "loss": 1.0}']
    path.write_bytes(b"\n".join(body) + b'\n{"step": 10, "lo')
    before = path.read_bytes()
    assert plot_main([f"--workdir={tmp_path}"]) == 2  # a read-only command names the line and changes nothing
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["metrics.jsonl"]
    with pytest.raises(ValueError, match=rf"^{path}:2: not UTF-8 text \(byte 0xff at column 16\)$"):
        metrics_lib.read_metrics(str(path))
    with caplog.at_level("WARNING", logger="xlgen"):
        assert metrics_lib.truncate_after(str(path), 4) == 2  # step 9 (after checkpoint 4) and the cut line
    assert path.read_bytes() == b"\n".join(good) + b"\n"
    assert (tmp_path / "metrics.jsonl.bad").read_bytes() == b"\n".join(bad) + b"\n"
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: lines 2, 3 are not a record (line 2: not UTF-8 text (byte 0xff at column 16)); set aside in "
        f"{path}.bad, 3 good records kept"
    ]
    assert [(r["step"], r.get("split")) for r in metrics_lib.read_metrics(str(path))] == [
        (1, None),
        (4, None),
        (4, "valid"),
    ]
    assert metrics_lib.truncate_after(str(path), 4) == 0 and path.read_bytes() == b"\n".join(good) + b"\n"


def test_item12_non_utf8_task_file_names_file_and_line(tmp_path):
    from xlgen.finetune.readers.examples import TaskDataError
    from xlgen.finetune.readers.glue import read_glue

    (tmp_path / "train.tsv").write_bytes(
        b"Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA cat.\tA cat.\n0\t3\t4\tCaf\xe9 noir.\tTea.\n"
    )
    with pytest.raises(TaskDataError, match=rf"^{tmp_path}/train.tsv:3:10: not UTF-8 text \(byte 0xe9\)"):
        read_glue("mrpc", str(tmp_path), "train")


def test_items_4_and_7_a_worse_than_uniform_stretch_keeps_the_good_checkpoint_and_prints_a_runnable_command(
    tmp_path, capsys, monkeypatch, compile_cache
):
    """txl_tiny (log V = 4.304) trained to step 30 (best loss 3.56), resumed with `--workdir` only at a learning
    rate that sends the loss to 4.4-12.7: above a uniform guess, mostly under 3 x the best. No checkpoint is saved
    during the stretch, checkpoint 30 (proven by step 31) survives the rotation (keep=2), and the printed command
    (no `--config=None`: the run had no --config) runs as printed and resumes from 30."""
    from xlgen.cli import main

    monkeypatch.setenv("XLGEN_COMPILATION_CACHE", compile_cache)  # the session's cache, not the user's
    monkeypatch.setenv("XLGEN_COMPILATION_CACHE_MIN_SECS", "0.1")
    wd = str(tmp_path / "wd")
    ck = os.path.join(wd, "checkpoints")
    over = {**TINY, "checkpoint.every_steps": 5, "total_steps": 30, "optimizer.warmup_steps": 5, "mesh.num_devices": 1}
    args = [f"--config={REPO}/configs/pretrain/txl_tiny.py", f"--workdir={wd}"]
    assert main(["train", *args, *(f"--config.{k}={v}" for k, v in over.items())]) == 0
    capsys.readouterr()
    resume = ["--config.optimizer.learning_rate=3", "--config.total_steps=45", "--config.max_nonfinite_steps=5"]
    assert main(["train", f"--workdir={wd}", *resume]) == 1
    out, err = capsys.readouterr()
    assert "had a non-finite or diverging loss (above divergence_factor=3 x the best loss" in err, err
    assert "or 4.304, the loss of a uniform guess" in err and f"proven healthy is {ck}/30." in err
    assert "not saving a checkpoint" in out and sorted(os.listdir(ck)) == ["25", "30"]
    head, cmd = err.strip().splitlines()[-2:]
    assert head == "Resume from checkpoint 30 with a lower learning rate:" and "--config=" not in cmd, cmd
    argv = shlex.split(cmd)
    assert main(argv[argv.index("train") :]) == 0  # as printed (the executable aside: this process is xlgen)
    out = capsys.readouterr().out
    assert f"resumed from {ck}/30" in out and "done: step 45." in out
    with open(os.path.join(wd, "metrics.jsonl")) as f:
        steps = [json.loads(line)["step"] for line in f if '"split"' not in line]
    assert steps == list(range(1, 46))
