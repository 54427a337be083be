"""Issue 48 items 8, 10, 11, 12: every numeric config key and CLI flag has a declared domain checked at load (one
line naming the key or flag and its allowed range, exit 2); systems report what they use (units, their players'
learning rates, the config sections they read); command-line slips get a short, pointed error."""

import glob
import os
import subprocess
import sys

import pytest
from test_train_utils import REPO

from xlgen import config as config_lib
from xlgen import domains

TXL = f"{REPO}/configs/pretrain/txl_tiny.py"
FUNNEL = f"{REPO}/configs/pretrain/funnel_tiny.py"

# (config, key, value, the allowed range the error states)
BAD_KEYS = [
    (TXL, "total_steps", "1e23", "must be > 0 and <= 2147483647"),
    (TXL, "optimizer.b1", "2", "must be >= 0 and < 1"),
    (TXL, "eval_every_steps", "-5", "must be >= -1"),
    (FUNNEL, "model.block_sizes", "(0,)", "each >= 1"),
    (FUNNEL, "model.block_sizes", "()", "at least 1"),
    (TXL, "optimizer.lr_layer_decay_rate", "-0.5", "must be > 0 and <= 1"),
    (TXL, "eval.mem_len", "-5", "must be >= 0"),
    (TXL, "model.dropout", "1.5", "must be >= 0 and < 1"),
    (TXL, "model.vocab_size", "0", "must be > 0"),
    (TXL, "optimizer.min_lr_ratio", "2", "must be >= 0 and <= 1"),
    (TXL, "mesh.data", "0", "must be -1 or >= 1"),
    (TXL, "optimizer.eps", "0", "must be > 0"),
]


@pytest.mark.parametrize("cfg,key,value,want", BAD_KEYS, ids=[f"{k}={v}" for _, k, v, _ in BAD_KEYS])
def test_out_of_domain_config_values_are_one_line_errors(tmp_path, capsys, cfg, key, value, want):
    """Item 11 (and 10: vocab_size=0, model.dropout=1.5): `xlgen train` refuses the value before writing anything."""
    from xlgen.cli import main

    wd = tmp_path / "wd"
    assert main(["train", f"--config={cfg}", f"--config.{key}={value}", f"--workdir={wd}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"xlgen train: error: config key {key}="), err
    assert want in err, err
    assert not wd.exists()


def test_every_numeric_key_of_every_shipped_config_has_a_declared_domain():
    """The domains table covers every numeric key the shipped configs declare (none falls to the finite-only
    default), and every shipped config lies inside its domains."""
    uncovered = set()
    for path in sorted(glob.glob(f"{REPO}/configs/**/*.py", recursive=True)):
        if "def get_config" not in open(path).read():  # helper modules (common.py, models.py, ...)
            continue
        config = config_lib.load_config(path)  # validated: a shipped default outside its domain fails here
        for key, value in config_lib.flat_items(config).items():
            if domains._numeric(value) and domains.domain_of(key) is None:
                uncovered.add(key)
    assert not uncovered, sorted(uncovered)


def test_domain_wording_and_extension():
    r = domains.Range(0, 1, lo_open=True)
    assert (
        r.problem(0) == "must be > 0 and <= 1" and r.problem(1) is None and r.problem(float("nan")) == "must be finite"
    )
    assert domains.OneOf((-1,), domains.Range(1)).problem(0) == "must be -1 or >= 1"
    saved = dict(domains.KEYS)
    try:  # a new key (e.g. a new optimizer's) is one declaration, ahead of the general patterns
        domains.declare("optimizer.trust_ratio", domains.Range(0, 10))
        assert domains.problems({"optimizer.trust_ratio": 11}) == {"optimizer.trust_ratio": "must be >= 0 and <= 10"}
    finally:
        domains.KEYS = saved


BAD_FLAGS = [
    (["generate", "--workdir=W", "--max_new_tokens=-5"], "argument --max_new_tokens: -5: must be >= 1"),
    (["generate", "--workdir=W", "--top_p=2"], "argument --top_p: 2: must be > 0 and <= 1"),
    (["generate", "--workdir=W", "--top_k=-3"], "argument --top_k: -3: must be >= 0"),
    (["generate", "--workdir=W", "--num_samples=0"], "argument --num_samples: 0: must be >= 1"),
    (["train", f"--config={TXL}", "--workdir=W", "--stop_at_step=-3"], "argument --stop_at_step: -3: must be >= 1"),
    (["train", f"--config={TXL}", "--workdir=W", "--platform=quantum"], "--platform=quantum: unknown platform"),
    (["train", f"--config={TXL}", "--work_dir=W"], "unrecognized argument --work_dir (did you mean --workdir?)"),
    (["finetune", f"--config={TXL}", "--work_dir=W"], "unrecognized argument --work_dir (did you mean --workdir?)"),
    (["train", f"--config={TXL}", "--config.total_steps", "--workdir=W"], "--config.total_steps: missing value"),
]


@pytest.mark.parametrize("argv,want", BAD_FLAGS, ids=[a[-1] for a, _ in BAD_FLAGS])
def test_bad_flags_are_one_line_usage_errors(tmp_path, capsys, monkeypatch, argv, want):
    """Items 10, 11, 12: out-of-range flags, an unknown platform, a misspelt flag and a value-less --config.KEY end
    with one error line naming the flag (exit 2) and change nothing."""
    from xlgen.cli import main

    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's usage error
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert want in err.strip().splitlines()[-1], err
    assert os.listdir(tmp_path) == []


def test_platform_without_a_device_is_one_line(tmp_path):
    """Item 10: `--platform=gpu` on a machine without a GPU (a fresh process: the backend is chosen at start-up)."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("JAX_PLATFORMS", None)
    code = "import sys; from xlgen.platforms import setup_runtime; setup_runtime('gpu', 'off')"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    if p.returncode == 0:
        pytest.skip("this machine has a GPU")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("xlgen: error: --platform=gpu: no gpu device is available here"), p.stderr


def test_key_typo_prints_the_suggestion_not_every_key(capsys):
    """Item 12: a misspelt key: the did-you-mean line and a hint, not the 100-line dump; `xlgen config --help`
    is help (exit 0)."""
    from xlgen.cli import main

    assert main(["config", "show", f"--config={TXL}", "--config.optimizer.learnin_rate=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Did you mean optimizer.learning_rate" in err and "xlgen config show" in err, err
    assert main(["config", "--help"]) == 0 and "usage: xlgen config show" in capsys.readouterr().out


SYSTEMS = ["gan/cegan.py", "gan/badgan.py", "ssl/gdan.py", "textgan/initialgan.py", "ssl/planetoid.py"]


@pytest.mark.parametrize("path", SYSTEMS)
def test_systems_report_what_they_use(path, capsys):
    """Item 8: a system's end-of-run advice reads its players' schedules (no "decayed to 0" while they train at 1e-3),
    extending warns only when every rate is 0, its unit is what a step processes, and `config show` leaves out the
    sections it never reads."""
    from xlgen import cli, registry
    from xlgen.train import report

    config = config_lib.load_config(f"{REPO}/configs/{path}")
    total = int(config.total_steps)
    end = cli.end_block({"workdir": "/tmp/w", "step": total}, config)
    note = report.total_steps_note(config, total, total, 2 * total)
    assert "decayed to 0" not in end and "extend:" in end, end
    assert "learn nothing" not in note, note
    assert report.unit(config) == "examples"
    objective = registry.objective(config)
    if objective.build_program is None:  # Planetoid: SGD on config.optimizer, N1 nodes + N2 context pairs a step
        assert objective.tokens_per_step(config) == 400
        assert "continue at the constant learning rate 0.1" in end
        hidden = ("objective_options.",)
    else:
        for name, player in config.players.items():  # at step `total` of 2 x total: not yet decaying
            decaying = float(player.get("decay_fraction", 0.0)) > 0.5
            assert (f"{name} " if decaying else f"{name} {float(player.learning_rate):.3g}") in end, end
        hidden = ("optimizer.", "objective_options.")
    assert cli.main(["config", "show", f"--config={REPO}/configs/{path}"]) == 0
    shown = [line.split(" = ")[0] for line in capsys.readouterr().out.splitlines()]
    assert "total_steps" in shown and not [k for k in shown if k.startswith(hidden)], shown


def test_language_model_reporting_unchanged(capsys):
    """`config show` of a language model lists every key, as before; its unit is tokens."""
    from xlgen import cli
    from xlgen.train import report

    config = config_lib.load_config(TXL)
    assert cli.main(["config", "show", f"--config={TXL}"]) == 0
    out = capsys.readouterr().out
    assert out == "".join(f"{k} = {v!r}\n" for k, v in config_lib.flat_items(config).items())
    assert report.unit(config) == "tokens"


def test_small_graph_and_one_class_runs_get_a_hint(tmp_path):
    """Item 12: Planetoid's default split on a small graph names the flags to lower and the most that fit; a GLUE run
    whose dev predictions are all one class (a paper learning rate on a tiny model) ends with a note saying so."""
    import numpy as np

    from xlgen.finetune.run import one_class_hint
    from xlgen.systems.planetoid.data import DataError, planetoid_split

    y = np.repeat(np.arange(3), 30)  # 90 nodes, 3 classes
    with pytest.raises(DataError, match=r"for this graph set --config.data.num_test=30 or fewer"):
        planetoid_split(y, 20, 1000, 0)
    with pytest.raises(DataError, match="lower --config.data.labels_per_class"):
        planetoid_split(y, 40, 10, 0)
    config = config_lib.load_config(f"{REPO}/configs/finetune/glue.py")
    rows = ["index\tprediction\tlabel", "0\t1\t1", "1\t1\t0", "2\t1\t0"]
    (tmp_path / "dev_predictions.tsv").write_text("\n".join(rows) + "\n")
    hint = one_class_hint(str(tmp_path), config)
    assert hint.startswith("note: every dev prediction is '1' (the labels hold 2 classes)") and "2e-05" in hint
    (tmp_path / "dev_predictions.tsv").write_text("\n".join(rows[:2] + ["1\t0\t0"]) + "\n")
    assert one_class_hint(str(tmp_path), config) is None
