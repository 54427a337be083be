"""`xlgen.train.workdir.Workdir`: the one way commands open a run directory (config.json and its kind, the run's
tokenizer named in config.json, checkpoint paths naming their step) and the one atomic-write helper."""

import json
import os

import pytest

from data_pipelines import paths
from xlgen.config import ConfigError, load_config
from xlgen.train import tokenizer_store
from xlgen.train.workdir import Workdir, hf_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_config_kind_tokenizer_and_checkpoint_paths(tmp_path):
    wd = Workdir(str(tmp_path / "run"))
    assert wd.kind is None and wd.read_config() is None and tokenizer_store.file_path(wd.path) is None
    config = load_config(os.path.join(ROOT, "configs/pretrain/txl_tiny.py"), ["--config.seed=7"])
    wd.write_config(config, "pretrain")
    assert wd.kind == "pretrain" and wd.read_config().seed == 7 and hf_config(wd.path) is None
    # the run's tokenizer: stored in DIR/tokenizer/ by the one store, named in config.json, kept when config.json is
    # rewritten, and read back through the Workdir
    from data_pipelines import vocab as vocab_lib

    tok = vocab_lib.SymbolVocab.build("char", ["to be or not to be"])
    rec = tokenizer_store.save(wd.path, tok)
    dest = tokenizer_store.file_path(wd.path)
    assert rec["tokenizer"] == "tokenizer/" + os.path.basename(dest)
    assert os.path.dirname(dest) == os.path.join(wd.path, "tokenizer") and os.path.exists(dest)
    wd.write_config(config, "finetune")
    assert wd.kind == "finetune" and tokenizer_store.file_path(wd.path) == dest
    assert wd.tokenizer().encode("to be") == tok.encode("to be")
    with pytest.raises(ValueError, match="kind='other'"):
        wd.write_config(config, "other")
    # a checkpoint path names its run, step and subdirectory
    for sub in ("checkpoints", "best"):
        run, step, where = Workdir.parse(os.path.join(wd.path, sub, "120"))
        assert (run.path, step, where) == (wd.path, 120, sub)
    assert Workdir.parse(wd.path)[1:] == (None, None)


def test_hf_directory_and_bad_json_are_told_apart(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "xlnet"}))
    assert hf_config(str(tmp_path / "hf")) == {"model_type": "xlnet"} and Workdir(str(tmp_path / "hf")).kind is None
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"bad/config.json: invalid JSON"):
        hf_config(str(tmp_path / "bad"))


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "sub" / "out.json"
    paths.write_json_atomic(str(target), {"b": 1, "a": [1, 2]})  # creates the directory
    assert target.read_text() == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'

    def fail(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        paths.atomic_write_text(str(target), "new")
    assert json.loads(target.read_text()) == {"a": [1, 2], "b": 1}  # the old file, intact
    assert os.listdir(target.parent) == ["out.json"]  # no temp file left behind
