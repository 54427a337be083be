"""The profiler switch: `--config.profile.start_step=S --config.profile.num_steps=N` traces steps S+1 .. S+N of a
run (the updates that start at step S) with `jax.profiler` into `WORKDIR/profile/`, then prints the operations
that took the most time in them, read back from the trace, and the commands that open it.

    profile/plugins/profile/<run>/<host>.xplane.pb       TensorBoard's profile plugin (`tensorboard --logdir`)
    profile/plugins/profile/<run>/perfetto_trace.json.gz the same trace as Chrome-trace JSON (ui.perfetto.dev)
    profile/top_ops.json                                 the summary below, machine-readable

The summary adds up, per compiled operation of the train step (an HLO instruction: a fusion, a dot, a copy, ...),
the device time of its executions in the window (`hlo_op` events of the trace; on XLA:CPU the thunks), and names
each by its opcode, shape and the JAX operation and source line it came from (the `metadata` of the compiled HLO,
which the trace does not carry on CPU). Operations may overlap (XLA:CPU runs independent thunks concurrently), so
the shares are of the summed operation time, not of the wall time.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
from typing import Any, Callable, Dict, List, Optional

import jax

# shape: an array shape or a tuple of them (spaces inside, nested at most twice), then the opcode
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)|\S+)\s+([\w\-]+)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_SOURCE = re.compile(r'source_file="([^"]*)"\s+source_line=(\d+)')


def hlo_metadata(hlo_text: str) -> Dict[str, Dict[str, str]]:
    """{instruction name: {opcode, shape, op_name, source}} of an HLO module's text (every computation)."""
    out = {}
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        name, shape, opcode = m.groups()
        op = _OP_NAME.search(line)
        src = _SOURCE.search(line)
        out[name] = {
            "opcode": opcode,
            "shape": shape,
            "op_name": op.group(1) if op else "",
            "source": f"{_short_path(src.group(1))}:{src.group(2)}" if src else "",
        }
    return out


def _short_path(path: str) -> str:
    for root in ("xlgen/", "data_pipelines/", "site-packages/"):
        if root in path:
            return root + path.split(root, 1)[1] if root != "site-packages/" else path.split(root, 1)[1]
    return path


def trace_files(logdir: str) -> List[str]:
    """The Chrome-trace JSON files (`perfetto_trace.json.gz`) under `logdir`, oldest run first."""
    return sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "perfetto_trace.json.gz")))


def op_times(trace_path: str, module_contains: str = "") -> Dict[str, Dict[str, float]]:
    """{hlo_op: {"time_s", "count"}} summed over the trace's operation events (those with an `hlo_op` argument),
    of the HLO modules whose name contains `module_contains`."""
    with gzip.open(trace_path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    acc: Dict[str, Dict[str, float]] = collections.defaultdict(lambda: {"time_s": 0.0, "count": 0})
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") != "X" or "hlo_op" not in args or module_contains not in args.get("hlo_module", ""):
            continue
        a = acc[args["hlo_op"]]
        a["time_s"] += float(e.get("dur", 0.0)) * 1e-6  # trace times are microseconds
        a["count"] += 1
    return dict(acc)


def top_ops(
    trace_path: str, hlo_text: str = "", *, steps: int = 1, top: int = 12, module_contains: str = ""
) -> Dict[str, Any]:
    """The summary: total operation time per step and the `top` operations by time, each with its share, time
    per step, executions per step and (from `hlo_text`) opcode, shape, JAX op name and source line."""
    times = op_times(trace_path, module_contains)
    meta = hlo_metadata(hlo_text) if hlo_text else {}
    total = sum(t["time_s"] for t in times.values())
    rows = []
    for name, t in sorted(times.items(), key=lambda kv: -kv[1]["time_s"])[: max(top, 0)]:
        m = meta.get(name, {})
        rows.append(
            {
                "op": name,
                "opcode": m.get("opcode", ""),
                "shape": m.get("shape", ""),
                "op_name": m.get("op_name", ""),
                "source": m.get("source", ""),
                "time_per_step_s": t["time_s"] / max(steps, 1),
                "share": t["time_s"] / total if total else 0.0,
                "executions_per_step": t["count"] / max(steps, 1),
            }
        )
    return {"trace": trace_path, "steps": steps, "op_time_per_step_s": total / max(steps, 1), "ops": rows}


def render(summary: Dict[str, Any], logdir: str) -> str:
    lines = [
        f"profile: {summary['steps']} step(s) traced, {1e3 * summary['op_time_per_step_s']:.1f} ms of operation time "
        f"per step; top operations:",
        f"  {'share':>6} {'ms/step':>9} {'runs':>5}  operation",
    ]
    for r in summary["ops"]:
        what = " ".join(x for x in (r["opcode"], r["shape"]) if x)
        jax_op = r["op_name"].rsplit("/", 2)
        jax_op = "/".join(jax_op[-2:]) if len(jax_op) > 1 else r["op_name"]
        where = " ".join(x for x in (jax_op, f"({r['source']})" if r["source"] else "") if x)
        lines.append(
            f"  {100 * r['share']:>5.1f}% {1e3 * r['time_per_step_s']:>9.3f} {r['executions_per_step']:>5.0f}  "
            f"{r['op']} {what}" + (f"  <- {where}" if where else "")
        )
    lines += [
        f"profile: trace in {logdir} (summary: {os.path.join(logdir, 'top_ops.json')})",
        f"  tensorboard --logdir {logdir}   (Profile tab: pip install tensorboard-plugin-profile)",
        f"  or open {summary['trace']} at https://ui.perfetto.dev",
    ]
    return "\n".join(lines)


class StepProfiler:
    """The loop's side of `config.profile`: `before(s)` before running update s (0-based), `after(step, outputs)`
    after it (step = s + 1). Off when `profile.start_step` < 0 or `profile.num_steps` <= 0."""

    def __init__(self, config, workdir: str, *, hlo_text: Callable[[], str], emit: Callable[[str], None]):
        p = config.profile
        self.start, self.num, self.top = int(p.start_step), int(p.num_steps), int(p.top_ops)
        self.logdir = os.path.join(workdir, "profile")
        self.hlo_text, self.emit = hlo_text, emit
        self.active = False
        self.summary: Optional[Dict[str, Any]] = None

    @property
    def enabled(self) -> bool:
        return self.start >= 0 and self.num > 0

    def before(self, s: int, state=None) -> None:
        """Start the trace before update s = start_step, once the previous updates have finished (`state`)."""
        if self.enabled and s == self.start and not self.active:
            jax.block_until_ready(state)
            os.makedirs(self.logdir, exist_ok=True)
            self.previous = set(trace_files(self.logdir))
            jax.profiler.start_trace(self.logdir, create_perfetto_trace=True)
            self.active = True

    def after(self, step: int, outputs) -> None:
        if self.active and (step >= self.start + self.num):
            self.stop(outputs, step - self.start)

    def stop(self, outputs=None, steps: Optional[int] = None) -> None:
        """End the trace (at the end of the window, or of the run when it ends inside it) and summarise it."""
        if not self.active:
            return
        jax.block_until_ready(outputs)
        jax.profiler.stop_trace()
        self.active = False
        new = [f for f in trace_files(self.logdir) if f not in self.previous]
        if not new or jax.process_index() != 0:
            return
        hlo = self.hlo_text()
        m = re.match(r"\s*HloModule\s+([^\s,]+)", hlo)  # the train step's module: its operations only
        self.summary = top_ops(
            new[-1], hlo, steps=steps or self.num, top=self.top, module_contains=m.group(1) if m else ""
        )
        self.summary["module"] = m.group(1) if m else ""
        from data_pipelines import paths

        paths.write_json_atomic(os.path.join(self.logdir, "top_ops.json"), self.summary)
        self.emit(render(self.summary, self.logdir))
