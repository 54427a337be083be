"""Metrics: `workdir/metrics.jsonl`, TensorBoard event files and a console progress display.

Only process 0 writes (the writer is a no-op elsewhere). `metrics.jsonl` holds one JSON object per line:
  training   {"step", "loss", "learning_rate", "tokens_per_sec", "grad_norm", "steps_per_sec", "mfu", ...}
  evaluation {"step", "split": "valid", "loss", "ppl" (LMs), "bpc" (char-level LMs)}
`step` counts completed optimizer updates, so the training record with step s is the loss of the s-th batch.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from typing import Any, Dict, Optional

log = logging.getLogger("xlgen")


def truncate_after(path: str, step: int) -> int:
    """Drop records with step > `step` (left by a run that died after its last checkpoint); atomic rewrite.
    Returns the number of dropped records."""
    if not os.path.exists(path):
        return 0
    keep, dropped = [], 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill: drop it
                dropped += 1
                continue
            if int(rec.get("step", 0)) > step:
                dropped += 1
            else:
                keep.append(line if line.endswith("\n") else line + "\n")
    if dropped:
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.writelines(keep)
        os.replace(tmp, path)
    return dropped


def read_metrics(path: str):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class MetricsWriter:
    def __init__(self, workdir: str, *, enabled: bool = True, tensorboard: bool = True):
        self.enabled = enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._tb = None
        self._file = None  # opened on the first write (after a resume has truncated stale records)
        if enabled:
            os.makedirs(workdir, exist_ok=True)
            if tensorboard:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, record: Dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in record.items()}
        if self._file is None:
            self._file = open(self.path, "a")
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        if self._tb is not None:
            step = int(record["step"])
            prefix = record.get("split", "train")
            for k, v in record.items():
                if k in ("step", "split") or not isinstance(v, (int, float)) or isinstance(v, bool):
                    continue
                self._tb.add_scalar(f"{prefix}/{k}", v, step)

    def flush(self):
        if self.enabled and self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self.enabled:
            if self._file is not None:
                self._file.close()
            if self._tb is not None:
                self._tb.close()


class Progress:
    """tqdm bar (step, loss, tokens/s, ETA) on a terminal; plain log lines otherwise (only process 0)."""

    def __init__(self, total: int, initial: int, *, enabled: bool = True):
        self.enabled = enabled
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
                self.bar.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{record.get('tokens_per_sec', 0):.0f}")
        elif record is not None:
            done = step - self.start_step
            elapsed = time.time() - self.start_time
            eta = elapsed / max(done, 1) * (self.total - step)
            print(f"step {step}/{self.total}  loss {record['loss']:.4f}  lr {record['learning_rate']:.3g}  "
                  f"tokens/s {record.get('tokens_per_sec', 0):.0f}  eta {eta:.0f}s", flush=True)

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
