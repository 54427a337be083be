"""A benchmark side in a process of its own: `python -m xlgen.bench.worker`, driven by `xlgen.bench.compare`.

The first line on stdin is the side's spec (JSON: which side, which kind of benchmark, the config file and
overrides, the options); then each line is a call {"method": ..., keyword arguments} answered by one JSON line
{"ok": result} or {"error": traceback, "message": one line, "bad_input": bool} on the process's original stdout. Everything the side prints (the training
loop's progress) goes to stderr, so the protocol stays clean. `finish` ends the process."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, Dict


def make_side(spec: Dict[str, Any]):
    """The side object of `spec` (the config loaded from its file and overrides; xlgen's sides start JAX's runtime
    first, the Hugging Face sides never import a JAX backend)."""
    from xlgen import config as config_lib

    config = config_lib.load_config(spec["config"], spec.get("overrides") or {})
    opts = dict(spec.get("options") or {})
    if spec["side"] == "xlgen":
        os.environ.setdefault("XLGEN_COMPILATION_CACHE", "off")  # compile times are real, not cache loads
        from xlgen.bench import xlgen_side as sides
        from xlgen.platforms import default_platform, setup_runtime

        setup_runtime(spec.get("platform") or default_platform(), "off")
    elif spec["side"] == "hf":
        from xlgen.bench import hf as sides
    else:
        raise ValueError(f"side {spec['side']!r}: expected xlgen or hf")
    cls = {"train": sides.Train, "eval": sides.Eval, "generate": sides.Generate}[spec["kind"]]
    return cls(config, **opts)


def invoke(side, method: str, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """`side.<method>(**kwargs)` with who ran it and under what load (pid, threads, load average, wall and CPU
    time of the call); a measured block also gets the matmul peak measured right after it (3 repetitions)."""
    t, cpu = time.perf_counter(), time.process_time()
    out = getattr(side, method)(**kwargs)
    from xlgen.bench import measure

    rec = {
        **(out or {}),
        **measure.process_record(),
        "wall_s": round(time.perf_counter() - t, 3),
        "cpu_s": round(time.process_time() - cpu, 3),
    }
    if method == "block":
        rec["matmul_peak_flops_per_sec"] = side.matmul_peak(reps=3)
    return rec


def _bad_input(e: BaseException) -> bool:
    """A config the side cannot measure (ValueError: no counterpart, sizes) rather than a failure of the code."""
    return isinstance(e, ValueError)


def main() -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the side's own output (and C libraries') goes to stderr
    side, method = None, None
    for line in sys.stdin:
        msg = json.loads(line)
        try:
            if side is None:
                side = make_side(msg)
                reply: Dict[str, Any] = {"ok": {"pid": os.getpid()}}
            else:
                method = msg.pop("method")
                reply = {"ok": invoke(side, method, msg)}
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails with it
            reply = {"error": traceback.format_exc(), "message": f"{type(e).__name__}: {e}", "bad_input": _bad_input(e)}
        proto.write(json.dumps(reply, default=float) + "\n")
        if "error" in reply or method == "finish":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
