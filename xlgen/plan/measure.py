"""Measure a train step compiled for a TPU topology: the mesh over the topology's compile-only devices, the AOT
compile, `memory_analysis()` / `cost_analysis()`, the per-device bytes of the abstract state, and the compiled
HLO's collectives (`xlgen.plan.comm`)."""

from __future__ import annotations

import math
import re
import sys
import time
from typing import Any, Dict, Optional

from xlgen.plan.cost import jaxpr_matmul_flops

GiB = 1024**3


def _bytes_per_device(tree) -> int:
    """Sum over ShapeDtypeStruct leaves of the bytes one device holds (its shard), given their shardings."""
    import jax
    import numpy as np

    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = tuple(leaf.shape)
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None:
            shape = sharding.shard_shape(shape)
        total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
    return total


def state_breakdown(abstract_state) -> Dict[str, int]:
    """Per-device bytes of the train state split by the top-level field names (params / opt_state / mems / ...)."""
    import jax

    groups: Dict[str, int] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_state)[0]:
        head = _path_head(path)
        groups[head] = groups.get(head, 0) + _bytes_per_device([leaf])
    groups["total"] = sum(groups.values())
    return groups


def _path_head(path) -> str:
    if not path:
        return "state"
    k = path[0]
    for attr in ("name", "key", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


_OOM_RE = re.compile(r"required for .*?\(([\d.]+)([KMGT]?)\)\s*exceeds available HBM \(([\d.]+)([KMGT]?)\)", re.S)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": GiB, "T": 1024**4}


def parse_oom(message: str) -> Optional[Dict[str, int]]:
    """XLA TPU's 'Ran out of memory on HBM ... required (16.02G) exceeds available HBM (15.48G)' -> bytes."""
    m = _OOM_RE.search(message)
    if not m:
        return None
    return {"required": int(float(m[1]) * _UNITS[m[2]]), "available": int(float(m[3]) * _UNITS[m[4]])}


def build_mesh(config, devices, num_slices: int):
    """The trainer's mesh over `devices` (`xlgen.sharding.make_mesh`, the one builder); with several slices the
    `data` axis is laid over DCN (across slices)."""
    from xlgen import sharding

    return sharding.make_mesh(config.mesh, devices, num_slices=num_slices)


def _log(msg: str) -> None:
    print(f"[xlgen plan {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def compile_and_measure(
    jitted, args, mesh, hbm: int, *, label: str = "", peak: float = 0.0, hbm_bandwidth: float = 0.0
) -> Dict[str, Any]:
    """Trace, lower and AOT-compile `jitted(*args)` (abstract args) under `mesh`; memory and FLOPs per device, and
    (given one device's `peak` FLOP/s and `hbm_bandwidth` bytes/s) the roofline of the compiled module
    (`xlgen.plan.roofline.analyse`, under `_roofline`).

    A program XLA refuses for lack of HBM is reported (`fits: false`, required vs available), not raised.
    """
    import jax

    n = mesh.size
    out: Dict[str, Any] = {}
    t0 = time.perf_counter()
    with jax.set_mesh(mesh):
        _log("tracing the train step")
        traced = jitted.trace(*args)
        matmul_flops, has_while = jaxpr_matmul_flops(traced.jaxpr.jaxpr)
        _log("lowering")
        lowered = traced.lower()
        t1 = time.perf_counter()
        _log(f"compiling for {label or mesh.devices.flat[0].device_kind} (trace + lower took {t1 - t0:.0f} s)")
        try:
            compiled = lowered.compile()
            oom = None
        except Exception as e:  # XLA refuses programs that do not fit HBM: that is an answer, not a crash
            oom = parse_oom(str(e))
            if oom is None:
                raise
    out["trace_lower_time_s"] = round(t1 - t0, 2)
    out["compile_time_s"] = round(time.perf_counter() - t1, 2)
    out["flops_per_step"] = {"matmul_jaxpr": matmul_flops}
    out["_has_while"] = has_while
    if oom is not None:
        out["fits"] = False
        out["memory_per_device"] = {"total": oom["required"], "hbm_usable": oom["available"]}
        out["over_by_bytes"] = oom["required"] - oom["available"]
        return out
    ma = compiled.memory_analysis()
    mem = {
        "arguments": int(ma.argument_size_in_bytes),
        "outputs": int(ma.output_size_in_bytes),
        "aliased": int(ma.alias_size_in_bytes),
        "temp": int(ma.temp_size_in_bytes),
        "code": int(ma.generated_code_size_in_bytes),
    }
    mem["total"] = mem["arguments"] + mem["outputs"] - mem["aliased"] + mem["temp"] + mem["code"]
    out["memory_per_device"] = mem
    out["fits"] = mem["total"] <= hbm
    out["over_by_bytes"] = max(0, mem["total"] - hbm)
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, (list, tuple)):  # older jax returned one dict per computation
        cost = cost[0] if cost else {}
    out["flops_per_step"]["xla_cost_analysis"] = float(cost.get("flops", 0.0)) * n
    out["xla_optimal_seconds"] = float(cost.get("optimal_seconds", 0.0) or 0.0)
    try:
        hlo = compiled.as_text()  # seconds for a paper-sized step: read once
    except Exception:  # pragma: no cover - as_text is available for TPU and CPU executables
        hlo = None
    found = analyse_hlo(hlo or "", n, has_while=has_while, peak=peak, hbm_bandwidth=hbm_bandwidth)
    out["flops_per_step"]["xla_counts_loop_bodies_once"] = found.pop("loops")
    out.update(found)
    return out


def analyse_hlo(hlo: str, num_devices: int, *, has_while: bool, peak: float, hbm_bandwidth: float) -> Dict[str, Any]:
    """What the plan reads from the compiled module's text, the module parsed and walked once:

    loops         whether `cost_analysis()` counts loop bodies once (`has_while`, the traced step's, or
                  `_loops_with_matmuls`)
    _collectives  `xlgen.plan.comm.collectives` (absent without a text)
    _roofline     `xlgen.plan.roofline.analyse` at one device's `peak` FLOP/s and `hbm_bandwidth` bytes/s (absent
                  without a text or figures)
    """
    out: Dict[str, Any] = {"loops": bool(has_while)}
    if not hlo:
        return out
    from xlgen.plan import comm, roofline

    costed = peak > 0 and hbm_bandwidth > 0
    need_loops = not has_while and " while(" in hlo
    module = roofline.parse(hlo) if costed or need_loops else None
    walked = module.walk(peak, hbm_bandwidth) if costed else None
    if need_loops:
        # the chip figures choose a conditional's costliest branch; the loop check walks at unit figures
        unit = walked if walked is not None and not module.has_conditional else module.walk()
        out["loops"] = _loops_with_matmuls(*unit)
    out["_collectives"] = comm.collectives(hlo, num_devices)
    if costed:
        out["_roofline"] = roofline.analyse(module, peak, hbm_bandwidth, walked=walked)
    return out


def _loops_with_matmuls(ops, unknown_trip_counts: int) -> bool:
    """Whether the compiled module (`roofline.module_ops`: its executed instructions, loops of unknown trip count)
    runs matmuls in a `while` loop (which `cost_analysis()` counts once) or has a loop of unknown trip count; loops
    of element-wise work only (e.g. XLA:TPU's scatter-add of gathered windows) leave its FLOPs whole."""
    return unknown_trip_counts > 0 or any(op.flops > 0 and op.trips > 1 for op in ops)


def _batch_size(batch) -> int:
    import jax

    leaves = jax.tree.leaves(batch)
    return int(leaves[0].shape[0]) if leaves else 0


def _plain(x):
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "to_dict"):
        return {k: _plain(v) for k, v in x.to_dict().items()}
    return str(x)
