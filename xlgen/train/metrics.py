"""Metrics: `workdir/metrics.jsonl`, TensorBoard event files and a console progress display.

Only process 0 writes (the writer is a no-op elsewhere). `metrics.jsonl` holds one JSON object per line, of the
kind `record_kind` tells (docs/training.md, "Record kinds"):
  training   {"step", "loss", "learning_rate", "tokens_per_sec", "grad_norm", "steps_per_sec", "mfu", ...}
             (no `split`, no `kind`)
  evaluation {"step", "split": "valid", "loss", "ppl" (LMs), "bpc" (char-level LMs)} (no `kind`)
  goodput    {"step", "kind": "goodput", "split": "goodput", "attempt", "goodput", "time_s", ...} (one per attempt,
             xlgen/train/goodput.py; written before the final evaluation's record)
`step` counts completed optimizer updates, so the training record with step s is the loss of the s-th batch.

The workdir may be a URL (`gs://bucket/run`). Objects on GCS cannot be appended to, so there the writer keeps the
file's text and rewrites `metrics.jsonl` (one atomic object upload) on `flush()` (the trainer flushes before every
checkpoint, so a restored step always has its records), every `flush_secs`, and on close. TensorBoard events go
through tensorboardX's own `gs://` writer (google-cloud-storage); if it cannot be created, TensorBoard is disabled
with a one-line warning.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import uuid
from typing import Any, Dict, Optional, Sequence

from data_pipelines import paths

log = logging.getLogger("xlgen")


def record_kind(rec: Dict[str, Any]) -> str:
    """The kind of a metrics.jsonl record: its `kind` ("goodput"), else "eval" (it has a `split`) or "train". A
    goodput record written before records had a `kind` is the one whose `split` is "goodput"."""
    if "kind" in rec:
        return str(rec["kind"])
    split = rec.get("split")
    if split == "goodput":
        return "goodput"
    return "train" if split is None else "eval"


def parse_record(line: bytes) -> Dict[str, Any]:
    """One metrics.jsonl line (bytes, without its newline) as a record; ValueError saying why it is not one (not
    UTF-8, not JSON, not an object)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte 0x{line[e.start]:02x} at column {e.start + 1})") from None
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not a JSON record ({e.msg} at column {e.colno})") from None
    if not isinstance(rec, dict):
        raise ValueError(f"not a JSON record (a {type(rec).__name__}, not an object)")
    return rec


def truncate_after(path: str, step: int) -> int:
    """Drop records with step > `step` (left by a run that died after its last checkpoint) and a last line cut
    short (a record being written when the run was killed: after its last checkpoint). Every other line that is not
    a record (bad bytes, garbled JSON) is set aside, appended as it was to `<path>.bad`, with a one-line warning
    naming the file and lines; every good record is kept. Atomic rewrites (the set-aside lines first). Returns the
    number of dropped records."""
    p = paths.as_path(path)
    if not p.exists():
        return 0
    lines = paths.read_bytes(path).split(b"\n")
    keep, bad, dropped = [], [], 0
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = parse_record(line)
        except ValueError as e:
            if i == len(lines):  # no newline after it: a record cut short by a kill
                dropped += 1
            else:
                bad.append((i, line, str(e)))
            continue
        try:
            after = int(rec.get("step", 0)) > step
        except (TypeError, ValueError):
            bad.append((i, line, f"step {rec.get('step')!r} is not an integer"))
            continue
        if after:
            dropped += 1
        else:
            keep.append(line + b"\n")
    if bad:
        aside = f"{path}.bad"
        old = paths.read_bytes(aside) if paths.as_path(aside).exists() else b""
        paths.atomic_write_bytes(aside, old + b"".join(line + b"\n" for _, line, _ in bad))
        where = ", ".join(str(i) for i, _, _ in bad[:10]) + (", ..." if len(bad) > 10 else "")
        log.warning(
            "%s: line%s %s not a record (line %d: %s); set aside in %s, %d good records kept",
            path,
            "s" if len(bad) > 1 else "",
            where + (" are" if len(bad) > 1 else " is"),
            bad[0][0],
            bad[0][2],
            aside,
            len(keep),
        )
    if dropped or bad:
        paths.atomic_write_bytes(path, b"".join(keep))
    return dropped


def read_metrics(path: str, *, adhoc: bool = False):
    """The records of a metrics.jsonl; `adhoc`: also those of ad-hoc `xlgen eval` runs (marked "source"), which
    are not part of the training curves. A line that is not a record (not UTF-8, not JSON) is an error naming the
    file and line (`xlgen train` on the workdir sets such lines aside: `truncate_after`)."""
    out = []
    for i, line in enumerate(paths.read_bytes(path).split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            rec = parse_record(line.rstrip(b"\r"))
        except ValueError as e:
            raise ValueError(f"{path}:{i}: {e}") from None
        if adhoc or "source" not in rec:
            out.append(rec)
    return out


def repair_partial_line(path: str) -> bool:
    """Cut a last line without its newline (a record cut by a kill or a full disk) so that appending starts on a
    fresh line; returns whether one was cut."""
    import os

    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return False
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(size - 1, 0))
        if f.read(1) == b"\n":
            return False
        back = min(size, 1 << 20)
        f.seek(size - back)
        tail = f.read(back)
        cut = tail.rfind(b"\n")
        f.truncate(size - back + cut + 1 if cut >= 0 else 0)
    log.warning("%s: its last line was incomplete (a record cut short); removed it before appending", path)
    return True


def _summary_writer(logdir: str):
    """tensorboardX SummaryWriter, or None with a one-line warning if it cannot write to `logdir` (gs:// needs
    google-cloud-storage, installed with `xlgen[gcs]`)."""
    try:
        from tensorboardX import SummaryWriter

        return SummaryWriter(logdir)
    except Exception as e:  # noqa: BLE001  (missing backend / credentials: metrics.jsonl still has everything)
        log.warning(
            "TensorBoard disabled: cannot write events to %s (%s: %s)",
            logdir,
            type(e).__name__,
            str(e).splitlines()[0] if str(e) else "",
        )
        return None


# ---------------------------------------------------------------------------------------------------- trackers
#
# A tracker receives every record MetricsWriter writes (training records under "train/<key>", evaluation records
# under "<split>/<key>", numbers only) plus the run's config once: `log(record)`, `flush()`, `close()`.
# `config.trackers` names the optional ones (comma-separated): wandb (`pip install -e '.[wandb]'`; offline with
# WANDB_MODE=offline) and mlflow (`.[mlflow]`, mlflow-skinny; a local file store WORKDIR/mlruns unless
# `tracking.mlflow_uri` is set). A workdir keeps their run ids in `tracking.json`, so a resumed run continues the
# same W&B / MLflow run. TensorBoard (`config.tensorboard`) and metrics.jsonl are always the built-in ones.

TRACKERS = ("wandb", "mlflow")


def scalars(record: Dict[str, Any]):
    """(tag, value, step) of a metrics record's numbers: "train/loss", "valid/ppl", ..."""
    step = int(record["step"])
    prefix = record.get("split", "train")
    for k, v in record.items():
        if k in ("step", "split") or not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        yield f"{prefix}/{k}", float(v), step


class TensorBoardTracker:
    def __init__(self, logdir: str):
        self.writer = _summary_writer(logdir)

    def log(self, record):
        if self.writer is not None:
            for tag, v, step in scalars(record):
                self.writer.add_scalar(tag, v, step)

    def flush(self):
        if self.writer is not None:
            self.writer.flush()

    def close(self):
        if self.writer is not None:
            self.writer.close()


def _run_ids(workdir: str) -> Dict[str, str]:
    p = paths.as_path(paths.join(workdir, "tracking.json"))
    return json.loads(p.read_text()) if p.exists() else {}


def _save_run_id(workdir: str, name: str, run_id: str) -> None:
    ids = _run_ids(workdir)
    if ids.get(name) != run_id:
        paths.write_json_atomic(paths.join(workdir, "tracking.json"), {**ids, name: run_id})


def _need(module: str, extra: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(f"trackers={extra}: {module} is not installed: pip install -e '.[{extra}]'") from None


class WandbTracker:
    """Weights & Biases: one run per workdir (resumed by id), files under WORKDIR/wandb; WANDB_MODE as set."""

    def __init__(self, workdir: str, config: Dict[str, Any], project: str, name: str):
        wandb = _need("wandb", "wandb")
        run_id = _run_ids(workdir).get("wandb") or uuid.uuid4().hex[:8]
        paths.makedirs(paths.join(workdir, "wandb"))
        self.run = wandb.init(
            project=project,
            name=name or None,
            id=run_id,
            resume="allow",
            dir=workdir,
            config=config,
            reinit="create_new",
        )
        _save_run_id(workdir, "wandb", run_id)

    def log(self, record):
        values = {tag: v for tag, v, _ in scalars(record)}
        if values:
            self.run.log(values, step=int(record["step"]))

    def flush(self):
        pass

    def close(self):
        self.run.finish()


class MlflowTracker:
    """MLflow: one run per workdir (resumed by id) in experiment `project`; a file store WORKDIR/mlruns by default."""

    def __init__(self, workdir: str, config: Dict[str, Any], project: str, name: str, uri: str):
        _need("mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        if not uri:  # the local file store (MLflow 3 keeps it in maintenance mode, behind this switch)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = paths.as_path(paths.join(workdir, "mlruns")).absolute().as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        run_id = _run_ids(workdir).get("mlflow")
        if run_id is None:
            exp = self.client.get_experiment_by_name(project)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(project)
            run_id = self.client.create_run(exp_id, run_name=name or None).info.run_id
            flat = _flatten(config)
            for i in range(0, len(flat), 100):  # MLflow takes at most 100 params per batch
                self.client.log_batch(run_id, params=[_param(k, v) for k, v in list(flat.items())[i : i + 100]])
            _save_run_id(workdir, "mlflow", run_id)
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def log(self, record):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(tag, v, now, step) for tag, v, step in scalars(record)]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def flush(self):
        pass

    def close(self):
        self.client.set_terminated(self.run_id)


def _param(key, value):
    from mlflow.entities import Param

    return Param(key, str(value)[:500])


def _flatten(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_trackers(config) -> list:
    """The tracker names of `config.trackers`; an unknown one or a missing package is an error (checked before
    a run writes anything)."""
    names = [n.strip() for n in str(config.trackers).split(",") if n.strip()]
    unknown = sorted(set(names) - set(TRACKERS))
    if unknown:
        raise ValueError(f"trackers={config.trackers!r}: unknown {unknown}; expected a comma list of {list(TRACKERS)}")
    for n in names:
        _need(n, n)
    return names


def make_trackers(config, workdir: str) -> list:
    """The trackers `config.trackers` names (TensorBoard comes from `config.tensorboard`, see MetricsWriter)."""
    names = check_trackers(config)
    if not names:
        return []
    t = config.tracking
    project, name = t.project or "xlgen", t.run_name
    as_dict = json.loads(config.to_json_best_effort()) if hasattr(config, "to_json_best_effort") else dict(config)
    out = []
    for n in names:
        if n == "wandb":
            out.append(WandbTracker(workdir, as_dict, project, name))
        else:
            out.append(MlflowTracker(workdir, as_dict, project, name, t.mlflow_uri))
    return out


class MetricsWriter:
    """metrics.jsonl + TensorBoard (`tensorboard`) + the given `trackers`: each record goes to all of them."""

    def __init__(
        self,
        workdir: str,
        *,
        enabled: bool = True,
        tensorboard: bool = True,
        flush_secs: float = 30.0,
        trackers: Sequence[Any] = (),
    ):
        self.enabled = enabled
        self.path = paths.join(workdir, "metrics.jsonl")
        self.remote = paths.is_remote(workdir)
        self.flush_secs = flush_secs
        self.trackers = list(trackers) if enabled else []
        self._file = None  # local: opened on the first write (after a resume has truncated stale records)
        self._text = None  # remote: the object's text, read on the first write, rewritten on flush
        self._dirty = False
        self._last_flush = time.time()
        if enabled:
            paths.makedirs(workdir)
            if tensorboard:
                self.trackers.insert(0, TensorBoardTracker(paths.join(workdir, "tensorboard")))

    def write(self, record: Dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in record.items()}
        line = json.dumps(clean) + "\n"
        if self.remote:
            if self._text is None:
                p = paths.as_path(self.path)
                self._text = p.read_text() if p.exists() else ""
                if self._text and not self._text.endswith("\n"):
                    self._text += "\n"
            self._text += line
            self._dirty = True
            if time.time() - self._last_flush >= self.flush_secs:
                self._flush_jsonl()
        else:
            if self._file is None:
                repair_partial_line(self.path)
                self._file = open(self.path, "a")
            self._file.write(line)
            self._file.flush()
        for tracker in self.trackers:
            tracker.log(record)

    def _flush_jsonl(self) -> None:
        if self.remote and self._dirty:
            paths.atomic_write_text(self.path, self._text)
            self._dirty = False
        self._last_flush = time.time()

    def flush(self):
        """Make every record written so far durable (remote: rewrite the object; local lines are flushed on
        write)."""
        if self.enabled:
            self._flush_jsonl()
            for tracker in self.trackers:
                tracker.flush()

    def close(self) -> None:
        if self.enabled:
            self._flush_jsonl()
            if self._file is not None:
                self._file.close()
            for tracker in self.trackers:
                tracker.close()


class Progress:
    """tqdm bar (step, loss, tokens/s, ETA) on a terminal; plain log lines otherwise (only process 0). `unit`: what
    the record's `tokens_per_sec` counts (the system's `Reporting.unit`: tokens, examples, ...)."""

    def __init__(self, total: int, initial: int, *, enabled: bool = True, unit: str = "tokens"):
        self.enabled = enabled
        self.unit = unit
        self.bar = None
        self.total = total
        self.start_time = time.time()
        self.start_step = initial
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="train", dynamic_ncols=True, unit="step")

    def reset_clock(self, step: int) -> None:
        """Measure the ETA from here (after compilation)."""
        self.start_time, self.start_step = time.time(), step

    def update(self, step: int, record: Optional[Dict[str, Any]] = None) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            if record is not None:
                rate = {f"{self.unit[:3]}_s": f"{record.get('tokens_per_sec', 0):.0f}"}
                self.bar.set_postfix(loss=f"{record['loss']:.4f}", **rate)
        elif record is not None:
            done = step - self.start_step
            elapsed = time.time() - self.start_time
            eta = elapsed / max(done, 1) * (self.total - step)
            print(
                f"step {step}/{self.total}  loss {record['loss']:.4f}  lr {record['learning_rate']:.3g}  "
                f"{self.unit}/s {record.get('tokens_per_sec', 0):.0f}  eta {eta:.0f}s",
                flush=True,
            )

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
