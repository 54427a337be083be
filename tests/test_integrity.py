"""Issue 48 ("nothing lost, round two"), items 3, 4, 6, 7 and the file-naming parts of 12: rot in a prepared shard
that its cached verification cannot see, divergence judged against a uniform guess with the healthy checkpoint
kept, metrics.jsonl repair that keeps every good record, printed resume commands that run as printed, and read
errors naming the file (and line)."""

import json
import os

import numpy as np
import pytest

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
    rotten = data.copy()
    rotten[700] ^= 4
    r = corpus.ChecksummedShard(rotten, "x.npy", crcs, 64)
    assert np.array_equal(r[:640], data[:640])  # blocks 0..19 are intact
    for read in (lambda: r[690:710], lambda: r[700], lambda: r[np.array([1, 700])]):
        with pytest.raises(ValueError, match=r"x.npy: data bytes 1344-1408 have CRC32"):
            read()


def test_item12_truncated_shard_names_the_file(tmp_path, monkeypatch):
    out, path, _ = _prepared(tmp_path, monkeypatch)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match=rf"^{path}: not a readable .npy shard \(.*truncated\?\)"):
        corpus.prepared_corpus(str(out), "train")
