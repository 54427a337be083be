"""`xlgen prepare corpus`: shards + manifest, idempotent re-runs, skip report, bad input, manifest mismatch."""

import json
import os

import numpy as np
import pytest

import data_pipelines as dp
from data_pipelines import prepare, vocab


def _write_docs(path, n_docs, seed):
    r = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
    docs = []
    for _ in range(n_docs):
        lines = [" ".join(r.choice(words, size=r.integers(2, 9))) + "." for _ in range(r.integers(1, 8))]
        docs.append("\n".join(lines))
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture()
def files(tmp_path):
    _write_docs(tmp_path / "a.txt", 120, 0)
    _write_docs(tmp_path / "b.txt", 80, 1)
    _write_docs(tmp_path / "v.txt", 60, 2)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    return tmp_path


def _run(*argv):
    return prepare.main([str(a) for a in argv])


def test_prepare_corpus_sentences_and_pipeline(files, capsys):
    out = files / "out"
    rc = _run(
        "corpus",
        "--train",
        files / "a.txt",
        files / "b.txt",
        files / "empty.txt",
        files / "latin1.txt",
        "--valid",
        files / "v.txt",
        "--tokenizer",
        "char",
        "--layout",
        "sentences",
        "--output",
        out,
        "--workers",
        "2",
        "--quiet",
    )
    assert rc == 0
    err = capsys.readouterr().err
    assert "empty.txt: file is empty" in err and "latin1.txt: not valid UTF-8 (line 1" in err
    m = json.loads((out / "manifest.json").read_text())
    assert len(m["splits"]["train"]["shards"]) == 2 and m["splits"]["train"]["num_documents"] == 200
    assert {os.path.basename(s["file"]) for s in m["skipped"]} == {"empty.txt", "latin1.txt"}
    tok = vocab.load_tokenizer("char", str(out / "vocab.json"))
    # the shards hold exactly the text (one sentence per line + newline, blank line = <eod>)
    shard = m["splits"]["train"]["shards"][0]
    ids = np.load(out / shard["tokens"])
    want = (files / "a.txt").read_text().strip("\n").replace("\n\n", "\n<eod>") + "\n<eod>"
    assert tok.decode(ids) == want
    par = np.load(out / shard["sentences"])
    # parity flips at every line; as in the original, <eod> keeps the parity of the sentence it ends
    assert (np.diff(par.astype(int)) != 0).sum() == want.count("\n") - 1
    # idempotent: nothing rewritten, same manifest
    mtimes = {p: os.stat(p).st_mtime_ns for p in out.rglob("*.npy")}
    assert (
        _run(
            "corpus",
            "--train",
            files / "a.txt",
            files / "b.txt",
            "--valid",
            files / "v.txt",
            "--tokenizer",
            "char",
            "--layout",
            "sentences",
            "--output",
            out,
            "--quiet",
        )
        == 0
    )
    assert "0 shard(s) written, 3 up to date" in capsys.readouterr().out
    assert mtimes == {p: os.stat(p).st_mtime_ns for p in out.rglob("*.npy")}
    assert not list(out.rglob("*.tmp-*"))
    # make_pipeline reads the prepared directory
    cfg = dp.default_config("xlnet")
    cfg.update(dict(source=str(out), batch_size=4, seq_len=64, reuse_len=32, perm_size=32, num_predict=10))
    p = dp.make_pipeline(cfg)
    assert p.vocab_size == tok.vocab_size and p.batch(3)["input_ids"].shape == (4, 64)
    assert dp.make_pipeline(cfg, split="valid").num_steps > 0


def test_prepare_word_vocab_lm_layout_and_min_doc(files, capsys):
    out = files / "w"
    assert (
        _run(
            "corpus",
            "--train",
            files / "a.txt",
            "--tokenizer",
            "word",
            "--min_freq",
            "1",
            "--min_doc_tokens",
            "20",
            "--output",
            out,
            "--quiet",
        )
        == 0
    )
    m = json.loads((out / "manifest.json").read_text())
    tr = m["splits"]["train"]
    assert tr["dropped_documents"] > 0 and tr["num_documents"] + tr["dropped_documents"] == 120
    cfg = dp.default_config("lm")
    cfg.update(dict(source=str(out), batch_size=2, tgt_len=16))
    b = dp.make_pipeline(cfg).batch(0)
    tok = vocab.load_tokenizer("word", str(out / "vocab.json"))
    assert "<eos>" in tok.decode(b["input_ids"][0]) or "\n" in tok.decode(b["input_ids"][0])


def test_strict_and_all_bad(files, capsys):
    out = files / "s"
    assert (
        _run(
            "corpus",
            "--train",
            files / "a.txt",
            files / "latin1.txt",
            "--tokenizer",
            "char",
            "--output",
            out,
            "--strict",
            "--quiet",
        )
        == 2
    )
    assert "latin1.txt: not valid UTF-8" in capsys.readouterr().err
    assert (
        _run("corpus", "--train", files / "empty.txt", "--tokenizer", "char", "--output", files / "e", "--quiet") == 2
    )
    assert "no usable input files" in capsys.readouterr().err
    assert not os.path.exists(out) and not os.path.exists(files / "e")  # a failed command leaves no half-made output
    (files / "kept").mkdir()  # an output directory that existed before the command is kept
    assert _run("corpus", "--train", files / "empty.txt", "--tokenizer", "char", "--output", files / "kept") == 2
    assert os.path.isdir(files / "kept")
    assert _run("corpus", "--train", files / "empty.txt", "--tokenizer", "char", "--output", files / "d/bad_x") == 2
    assert not os.path.exists(files / "d")  # the parents it created too (issue 31: data/bad_* left behind)


def test_manifest_mismatch_errors(files):
    out = files / "m"
    assert _run("corpus", "--train", files / "a.txt", "--tokenizer", "char", "--output", out, "--quiet") == 0
    other = files / "other"
    assert (
        _run(
            "corpus",
            "--train",
            files / "v.txt",
            files / "latin1.txt",
            "--tokenizer",
            "byte",
            "--output",
            other,
            "--quiet",
        )
        == 0
    )
    cfg = dp.default_config("lm")
    cfg.update(dict(source=str(out), batch_size=2, tgt_len=16))
    cfg.vocab_size = 999
    with pytest.raises(ValueError, match="data.vocab_size=999 but .*manifest.json has vocab_size"):
        dp.make_pipeline(cfg)
    cfg.vocab_size = 0
    v2 = vocab.SymbolVocab.build("char", ["xyz"])
    v2.save(str(files))
    cfg.tokenizer = str(files / "vocab.json")
    with pytest.raises(ValueError, match=r"vocabulary mismatch: .*vocab.json .* is not the vocabulary .*manifest"):
        dp.make_pipeline(cfg)
    cfg.tokenizer = ""
    # a vocabulary file swapped under the shards
    (out / "vocab.json").write_text((files / "vocab.json").read_text())
    with pytest.raises(ValueError, match="vocab.json: vocabulary sha256 .* does not match .*manifest.json"):
        dp.make_pipeline(cfg)
    # XLNet needs the sentence layout
    cfg2 = dp.default_config("xlnet")
    cfg2.source = str(other)
    with pytest.raises(ValueError, match="layout 'lm', this pipeline needs 'sentences'"):
        dp.make_pipeline(cfg2)
    with pytest.raises(FileNotFoundError, match="no manifest"):
        cfg.source = str(files)
        dp.make_pipeline(cfg)


def test_show_marks_exactly_the_targets(capsys):
    assert (
        _run(
            "show",
            "--pipeline",
            "xlnet",
            "--row",
            "1",
            "--set",
            "seq_len=64",
            "reuse_len=32",
            "perm_size=16",
            "num_predict=9",
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "forward=False" in out and "targets=9" in out
    body = "\n".join(l for l in out.splitlines() if l.startswith("  ["))
    assert (
        sum(
            tok.startswith("[") and tok.endswith("]")
            for tok in body.split()[1:]
            if tok not in ("[reuse+A]", "[B]", "[cls]")
        )
        == 9
    )
