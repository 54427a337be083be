"""Config files, `--config.KEY=VALUE` overrides and the clear errors of `xlgen train`."""

import json
import os

import pytest

from xlgen import cli
from xlgen import config as config_lib
from xlgen.config import ConfigError, load_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TXL = os.path.join(REPO, "configs/pretrain/txl_tiny.py")


def test_overrides_are_type_checked():
    c = load_config(
        TXL,
        [
            "--config.optimizer.learning_rate=1",
            "--config.model.n_layer=3",
            "--config.checkpoint.async_save=false",
            "--config.model.cutoffs=(10, 20)",
            "--config.mesh.rules=dp",
            "--config.eval.mem_len=128",
        ],
    )
    assert c.optimizer.learning_rate == 1.0 and isinstance(c.optimizer.learning_rate, float)
    assert c.model.n_layer == 3 and c.checkpoint.async_save is False and tuple(c.model.cutoffs) == (10, 20)
    assert c.mesh.rules == "dp" and c.eval.mem_len == 128
    with pytest.raises(ConfigError, match=r"--config.total_steps=ten: expected an int"):
        load_config(TXL, ["--config.total_steps=ten"])
    with pytest.raises(ConfigError, match="expected a bool"):
        load_config(TXL, ["--config.tensorboard=maybe"])
    with pytest.raises(ConfigError, match="given twice"):
        load_config(TXL, ["--config.seed=1", "--config.seed=2"])


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError) as e:
        load_config(TXL, ["--config.optimizer.learnin_rate=3e-4"])
    msg = str(e.value)
    assert "unknown config key 'optimizer.learnin_rate'" in msg and "Did you mean optimizer.learning_rate" in msg
    assert "Valid keys" not in msg and "xlgen config show" in msg  # the suggestion and a hint, not every key
    with pytest.raises(ConfigError) as e:
        load_config(TXL, ["--config.optimizer.zzzzzzzzzzzzzzz=1"])
    assert "Valid keys of optimizer:" in str(e.value) and "optimizer.b1" in str(e.value)
    assert "mesh.fsdp" not in str(e.value)
    with pytest.raises(ConfigError, match="is a section"):
        load_config(TXL, ["--config.optimizer=adam"])
    with pytest.raises(ConfigError, match="config file not found"):
        load_config("/nonexistent/config.py")


def test_resolved_config_roundtrip(tmp_path):
    c = load_config(TXL, ["--config.model.d_model=48"])
    path = config_lib.write_resolved_config(c, str(tmp_path))
    with open(path) as f:
        d = json.load(f)
    assert d["xlgen"]["kind"] == "pretrain" and d["model"]["d_model"] == 48
    back = config_lib.read_workdir_config(str(tmp_path))
    assert back.model.d_model == 48 and tuple(back.model.cutoffs) == tuple(c.model.cutoffs)


@pytest.fixture
def no_cache(monkeypatch):
    monkeypatch.setenv("XLGEN_COMPILATION_CACHE", "off")


def test_cli_errors_are_clear(tmp_path, capsys, no_cache):
    wd = str(tmp_path / "wd")
    assert cli.main(["train", f"--config={TXL}", "--config.model.d_modle=8", f"--workdir={wd}"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'model.d_modle'" in err and "model.d_model" in err
    missing = str(tmp_path / "no_such_corpus.txt")
    assert cli.main(["train", f"--config={TXL}", f"--config.data.source={missing}", f"--workdir={wd}"]) == 2
    err = capsys.readouterr().err
    assert missing in err


def test_shape_changing_config_on_existing_workdir_is_an_error(tmp_path, capsys, no_cache):
    from xlgen.train.loop import check_workdir_compatible

    wd = str(tmp_path / "wd")
    old = load_config(TXL)
    config_lib.write_resolved_config(old, wd)
    os.makedirs(os.path.join(wd, "checkpoints", "2"))  # a committed step: the run started (outdir.run_started)
    check_workdir_compatible(load_config(TXL, ["--config.model.dropout=0.3", "--config.total_steps=5000"]), wd)
    with pytest.raises(ValueError) as e:
        check_workdir_compatible(load_config(TXL, ["--config.model.d_inner=128"]), wd)
    assert "model.d_inner" in str(e.value) and "layers.0.ff.layer_1.kernel: (64, 256) -> (64, 128)" in str(e.value)
    assert cli.main(["train", f"--config={TXL}", "--config.model.n_layer=3", f"--workdir={wd}"]) == 2
    err = capsys.readouterr().err
    assert "different shapes" in err and "model.n_layer" in err and "param layers.2" in err


def test_parameterised_configs_and_their_file_aliases():
    """`configs/pretrain/funnel.py:B..H.._{mlm,electra}` and `configs/finetune/glue.py:<task>` (config_flags syntax
    `path:arg` -> get_config(arg)); every old file name is an alias giving the identical config."""
    import glob

    aliases = [
        (p, "configs/pretrain/funnel.py:" + os.path.basename(p)[len("funnel_") : -3])
        for p in glob.glob(os.path.join(REPO, "configs/pretrain/funnel_B*H*_*.py"))
    ]
    glue_tasks = ("cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb", "wnli")
    aliases += [(os.path.join(REPO, f"configs/finetune/{t}.py"), f"configs/finetune/glue.py:{t}") for t in glue_tasks]
    aliases += [
        (os.path.join(REPO, f"configs/pretrain/xlnet_{v}.py"), f"configs/pretrain/xlnet.py:{v}")
        for v in ("base", "large", "large_bsz8192", "tiny")
    ]
    assert len(aliases) == 10 + 9 + 4
    for old, new in aliases:
        assert load_config(old).to_dict() == load_config(os.path.join(REPO, new)).to_dict(), (old, new)
    c = load_config(os.path.join(REPO, "configs/pretrain/funnel.py:B6-3x2-3x2H768_electra"), ["--config.seed=3"])
    assert (c.model.block_sizes, c.model.d_model, c.objective, c.seed) == ("6-3x2-3x2", 768, "funnel_electra", 3)
    assert load_config(os.path.join(REPO, "configs/finetune/glue.py")).task == "glue/mrpc"  # no arg: the default
    assert load_config(os.path.join(REPO, "configs/finetune/glue.py:cola")).data.batch_size == 16  # paper preset
    with pytest.raises(ConfigError, match=r"funnel.py:B6H7: get_config: 'B6H7': expected B<blocks>H<d_model>"):
        load_config(os.path.join(REPO, "configs/pretrain/funnel.py:B6H7"))
    with pytest.raises(ConfigError, match=r"glue.py:foo: get_config: unknown GLUE task 'foo'"):
        load_config(os.path.join(REPO, "configs/finetune/glue.py:foo"))


def test_a_stored_config_gets_the_keys_it_predates_at_their_declared_defaults():
    """A config.json written before a key existed reads back with that key at base_config()'s default (so code
    reads every key without a fallback); keys it holds keep their values, and the sections a system sets as a
    whole (model, data, eval) are left as stored."""
    from xlgen.config import base_config, parse_json_config, to_json_dict

    stored = to_json_dict(load_config(os.path.join(REPO, "configs/pretrain/txl_tiny.py"), ["--config.prefetch=0"]))
    for section, key in (("", "divergence_factor"), ("", "trackers"), ("checkpoint", "local_every_steps")):
        del (stored[section] if section else stored)[key]
    del stored["watchdog"], stored["eval"]["metric"], stored["model"]["tie_projs"]
    old = parse_json_config(json.dumps(stored).encode(), "config.json")
    declared = base_config()
    assert old.divergence_factor == declared.divergence_factor == 3.0 and old.trackers == ""
    assert old.checkpoint.local_every_steps == 0 and old.watchdog.to_dict() == declared.watchdog.to_dict()
    assert old.prefetch == 0 and old.checkpoint.every_steps == 100  # stored values kept
    assert "metric" not in old.eval and "tie_projs" not in old.model
