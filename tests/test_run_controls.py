"""Run controls of issue 37: the profiler switch (`profile.*`) and the trackers (`trackers=wandb,mlflow`).

* Profiler: a real `xlgen train` run with `--config.profile.start_step/num_steps` leaves a jax.profiler trace in
  WORKDIR/profile, prints the top operations and the TensorBoard command; the summary's operations and times are
  the trace's own (aggregated here independently), and its largest matrix product is the model's largest one (the
  FFN's `[rows, d_inner]` product, with d_inner widened so that it dominates).
* Trackers: W&B (offline mode) and MLflow (local file store) receive what MetricsWriter writes, read back from their
  own files; a resumed writer continues the same run. Skipped when the extra is not installed.
"""

import collections
import glob
import gzip
import json
import os
import struct

import pytest
from test_train_utils import TINY, compile_cache, run_train  # noqa: F401

from xlgen.train import metrics as metrics_lib
from xlgen.train import profile as profile_lib

# ------------------------------------------------------------------------------------------------ profiler


def test_hlo_metadata_and_op_times_hand_made():
    hlo = "\n".join(
        [
            "HloModule jit_train_step",
            "fused_computation.3 {",
            "  %p = f32[8,16]{1,0} parameter(0)",
            "}",
            "ENTRY main {",
            "  %dot.7 = f32[8,32]{1,0} dot(f32[8,16]{1,0} %a, f32[16,32]{1,0} %b), lhs_contracting_dims={1}, "
            'metadata={op_name="jit(train_step)/jvp()/dot_general" source_file="/x/xlgen/models/layers.py" '
            "source_line=212}",
            "  ROOT %fusion.3 = f32[8,16]{1,0} fusion(%p), kind=kLoop, calls=%fused_computation.3",
            "}",
        ]
    )
    meta = profile_lib.hlo_metadata(hlo)
    assert meta["dot.7"] == {
        "opcode": "dot",
        "shape": "f32[8,32]{1,0}",
        "op_name": "jit(train_step)/jvp()/dot_general",
        "source": "xlgen/models/layers.py:212",
    }
    assert meta["fusion.3"]["opcode"] == "fusion" and meta["fusion.3"]["op_name"] == ""

    def ev(op, dur, module="jit_train_step"):
        return {"ph": "X", "name": op, "dur": dur, "args": {"hlo_op": op, "hlo_module": module}}

    events = [ev("dot.7", 300.0), ev("dot.7", 100.0), ev("fusion.3", 100.0), ev("fusion.1", 999.0, "jit_eval")]
    events += [{"ph": "X", "name": "PjitFunction(train_step)", "dur": 5000.0, "args": {}}]
    trace = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"xlgen_trace_{os.getpid()}.json.gz")
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)
    s = profile_lib.top_ops(trace, hlo, steps=2, module_contains="train_step")
    os.remove(trace)
    assert s["op_time_per_step_s"] == pytest.approx(250e-6)  # (400 + 100) us over 2 steps; other modules ignored
    (top, second) = s["ops"]
    assert (top["op"], top["opcode"], second["op"]) == ("dot.7", "dot", "fusion.3")
    assert top["share"] == pytest.approx(0.8) and top["time_per_step_s"] == pytest.approx(200e-6)
    assert top["executions_per_step"] == 1.0


D_INNER = 1024


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory, compile_cache):
    wd = str(tmp_path_factory.mktemp("profiled"))
    over = {
        **TINY,
        "model.d_inner": D_INNER,
        "total_steps": 5,
        "checkpoint.every_steps": 0,
        "profile.start_step": 2,
        "profile.num_steps": 2,
        "profile.top_ops": 40,  # enough rows to reach the products past the tiny model's copies and selects
    }
    p = run_train(wd, compile_cache, overrides=over, devices=1)
    return wd, p.stdout


def test_profiler_writes_the_trace_and_names_the_largest_operation(profiled_run):
    wd, out = profiled_run
    logdir = os.path.join(wd, "profile")
    assert glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))  # TensorBoard's profile
    (trace,) = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "perfetto_trace.json.gz"))
    summary = json.load(open(os.path.join(logdir, "top_ops.json")))
    assert summary["steps"] == 2 and summary["trace"] == trace and summary["module"]

    # the trace's own numbers, aggregated here: the summary lists the train step's operations in that order
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    times = collections.Counter()
    for e in events:
        a = e.get("args") or {}
        if e.get("ph") == "X" and "hlo_op" in a and summary["module"] in a.get("hlo_module", ""):
            times[a["hlo_op"]] += e["dur"] * 1e-6
    ranked = [op for op, _ in times.most_common(len(summary["ops"]))]
    assert [r["op"] for r in summary["ops"]] == ranked
    assert summary["ops"][0]["time_per_step_s"] == pytest.approx(times[ranked[0]] / 2)
    assert summary["op_time_per_step_s"] == pytest.approx(sum(times.values()) / 2)
    assert all(r["opcode"] for r in summary["ops"])  # every operation found in the compiled step's HLO

    # the largest matrix product the summary lists (by its HLO opcode: XLA:CPU's op_name metadata of a product may
    # name the transpose its layout came from) is one of the model's FFN products, [rows, d_inner] or its transpose
    dots = [r for r in summary["ops"] if r["opcode"] == "dot"]
    assert dots and (f",{D_INNER}]" in dots[0]["shape"] or f"[{D_INNER}," in dots[0]["shape"]), summary["ops"][:3]

    # printed: the summary's lines and the commands that open the trace
    assert "top operations" in out and summary["ops"][0]["op"] in out
    assert f"tensorboard --logdir {logdir}" in out


# ------------------------------------------------------------------------------------------------ trackers

RECORDS = [
    {"step": 1, "loss": 4.25, "learning_rate": 1e-3, "tokens_per_sec": 100.0},
    {"step": 2, "loss": 3.5, "learning_rate": 2e-3, "tokens_per_sec": 120.0},
    {"step": 2, "split": "valid", "loss": 3.75, "ppl": 42.5},
]
RESUMED = {"step": 3, "loss": 3.0, "learning_rate": 3e-3, "tokens_per_sec": 130.0}


def _config(trackers):
    from test_train_utils import REPO

    from xlgen.config import load_config

    return load_config(f"{REPO}/configs/pretrain/txl_tiny.py", {"trackers": trackers, "tracking.project": "t37"})


def _log(workdir, trackers, records):
    w = metrics_lib.MetricsWriter(
        workdir, tensorboard=False, trackers=metrics_lib.make_trackers(_config(trackers), workdir)
    )
    for r in records:
        w.write(r)
    w.close()


def test_unknown_tracker_is_an_error_naming_the_choices(tmp_path):
    with pytest.raises(ValueError, match=r"unknown \['neptune'\].*wandb.*mlflow"):
        metrics_lib.make_trackers(_config("neptune"), str(tmp_path))


def _wandb_records(path):
    """Records of a W&B transaction log (`run-<id>.wandb`): LevelDB-log framing (7-byte file header, 32 KiB
    blocks, chunks with a 7-byte crc/length/type header) around `wandb_internal_pb2.Record` messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, block, buf, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            break
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def test_wandb_offline_round_trip(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install -e '.[wandb]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wd = str(tmp_path)
    _log(wd, "wandb", RECORDS)
    _log(wd, "wandb", [RESUMED])  # a resumed run: the same W&B run id
    run_id = json.load(open(tmp_path / "tracking.json"))["wandb"]
    files = sorted(glob.glob(str(tmp_path / "wandb" / "offline-run-*" / f"run-{run_id}.wandb")))
    assert len(files) == 2
    history, runs = {}, set()
    for f in files:
        for rec in _wandb_records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                runs.add((rec.run.run_id, rec.run.project))
            elif kind == "history":
                h = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
                if "_step" in h:
                    history.setdefault(h["_step"], {}).update(h)
    assert runs == {(run_id, "t37")}
    assert history[1]["train/loss"] == 4.25 and history[1]["train/learning_rate"] == 1e-3
    assert history[2]["train/loss"] == 3.5 and history[2]["valid/ppl"] == 42.5 and history[2]["valid/loss"] == 3.75
    assert history[3]["train/loss"] == 3.0


def test_mlflow_file_store_round_trip(tmp_path):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed (pip install -e '.[mlflow]')")
    from mlflow.tracking import MlflowClient

    wd = str(tmp_path)
    _log(wd, "mlflow", RECORDS)
    _log(wd, "mlflow", [RESUMED])
    run_id = json.load(open(tmp_path / "tracking.json"))["mlflow"]
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == "t37"
    assert run.data.params["model.family"] == "transformer_xl" and run.data.params["trackers"] == "mlflow"
    assert run.info.status == "FINISHED"
    loss = [(m.step, m.value) for m in client.get_metric_history(run_id, "train/loss")]
    assert sorted(loss) == [(1, 4.25), (2, 3.5), (3, 3.0)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "valid/ppl")] == [(2, 42.5)]
    assert len(client.search_runs([run.info.experiment_id])) == 1  # resumed, not a second run
