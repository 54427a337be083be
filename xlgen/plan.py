"""`xlgen plan`: compile the real sharded train step for a TPU topology on any machine and report whether it fits.

    xlgen plan --config=configs/pretrain/xlnet_large.py --topology=v3:16x32 [--num_slices=N]
               [--config.KEY=VALUE ...] [--json[=PATH]]

What happens (nothing is allocated, no TPU is needed; `libtpu` from the `tpu` extra provides the compiler):
  1. the config is loaded exactly as `xlgen train` loads it (`xlgen.config.load_config`);
  2. the topology's compile-only devices come from `jax.experimental.topologies` (`xlgen.topology`);
  3. the mesh is built from `config.mesh` over those devices with the trainer's `xlgen.sharding.make_mesh`
     (several slices: `data` spans slices over DCN, the other axes stay inside a slice);
  4. `xlgen.train.build_program(config, mesh)` builds the SAME jitted, sharded, donating train step `xlgen train`
     runs; it is traced and AOT-compiled on `program.abstract_state()` / `program.abstract_batch()`;
  5. the compiled executable's `memory_analysis()` (per device: arguments, outputs, aliased (donated), temporaries,
     code) and `cost_analysis()` are reported with the chip's HBM and peak bf16 FLOP/s.

FLOPs are given three ways: XLA's `cost_analysis()` (per device × devices; note XLA counts the body of a `while`
loop ONCE, so with scan over layers it undercounts and is flagged), the executed matmul FLOPs counted on the traced
jaxpr (scan-aware, dead code removed as XLA does, rematerialisation included), and the analytic model FLOPs of
`xlgen.flops` (6·N·D-style: the math of forward + backward, no remat). executed = model + recomputed forward (remat,
≈ 1/3 of the model with every layer rematerialised) + the little work the implementation does beyond the math
(see `xlgen.flops`). The predicted step time is the compute-bound time `executed FLOPs per device / peak` (or XLA's
own roofline estimate when it is larger and not loop-affected); MFU = model FLOPs / (devices · peak · step time),
so ≤ ≈ 75% with full remat. Both are optimistic bounds: communication that does not overlap and memory-bound ops
are not modelled beyond XLA's estimate.

`python -m xlgen.plan --table A.json B.json ... [--into=DOC.md]` renders saved `--json` reports as the markdown pod
table; `python -m xlgen.plan --refresh A.json ...` recomputes their model FLOPs, traced matmul FLOPs, step time and
MFU from each report's own config + overrides (a CPU trace, no compile) and rewrites them in place.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from data_pipelines import paths

GiB = 1024**3


# ----------------------------------------------------------------------------------------------------- FLOP counting


def _subjaxprs(params: Dict[str, Any]):
    """(param name, jaxpr) for every sub-jaxpr in an equation's params."""
    from jax.extend import core

    for key, val in params.items():
        vals = val if isinstance(val, (list, tuple)) else [val]
        for v in vals:
            if isinstance(v, core.ClosedJaxpr):
                yield key, v.jaxpr
            elif isinstance(v, core.Jaxpr):
                yield key, v


def dead_code_eliminated(jaxpr):
    """`jaxpr` without the equations no output depends on (JAX's own DCE, recursing into scan/cond/remat/jit
    bodies), as XLA removes them before executing: e.g. XLNet's last content stream when only the query stream is
    predicted. Returns `jaxpr` unchanged if JAX's (internal) DCE is unavailable."""
    try:
        from jax._src.interpreters import partial_eval as pe

        return pe.dce_jaxpr_consts(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)[0]
    except Exception:  # noqa: BLE001 - an internal API: counting without DCE only overcounts
        return jaxpr


def jaxpr_matmul_flops(jaxpr, *, dce: bool = True) -> tuple[float, bool]:
    """Global FLOPs of every `dot_general` in `jaxpr` (2·out·contracted), scan bodies × length, cond = max branch.

    With `dce` (the default) dead equations are removed first (`dead_code_eliminated`), as XLA does, so the count
    is of the matmuls the compiled step executes. Remat recompute IS counted (it is executed work); so is work whose
    result is partly discarded (a gradient computed for all rows, then sliced: XLA keeps the full matmul), and a
    data-dependent `cond`/`switch` counts its costliest branch. Returns (flops, saw_while_loop) — a `while` with
    unknown trip count is counted once and flagged.
    """
    if dce:
        jaxpr = dead_code_eliminated(jaxpr)
    return _count(jaxpr)


def _count(jaxpr) -> tuple[float, bool]:
    total, saw_while = 0.0, False
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval
            out = eqn.outvars[0].aval
            total += 2.0 * math.prod(out.shape) * math.prod(lhs.shape[d] for d in lhs_contract)
            continue
        if name == "cond":
            branch = [_count(b.jaxpr) for b in eqn.params["branches"]]
            total += max(f for f, _ in branch)
            saw_while |= any(w for _, w in branch)
            continue
        mult = eqn.params.get("length", 1) if name == "scan" else 1
        saw_while |= name == "while"
        for _, sub in _subjaxprs(eqn.params):
            f, w = _count(sub)
            total += mult * f
            saw_while |= w
    return total, saw_while


# ----------------------------------------------------------------------------------------------------- memory helpers


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


# ----------------------------------------------------------------------------------------------------- the plan


def build_mesh(config, devices, num_slices: int):
    """The trainer's mesh over `devices`; with several slices the `data` axis is laid over DCN (across slices)."""
    from xlgen import sharding

    if num_slices == 1:
        return sharding.make_mesh(config.mesh, devices)
    import jax
    from jax.experimental import mesh_utils

    shape = sharding.mesh_shape([config.mesh.data, config.mesh.fsdp, config.mesh.tensor], len(devices))
    if shape[0] % num_slices:
        raise ValueError(
            f"mesh.data={shape[0]} must be a multiple of --num_slices={num_slices} (data parallelism "
            f"spans slices over DCN; fsdp and tensor stay inside a slice)"
        )
    ici = (shape[0] // num_slices, shape[1], shape[2])
    dcn = (num_slices, 1, 1)
    grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices)
    try:  # the same axis types as `xlgen train`'s mesh (built over one slice's devices)
        slice0 = [d for d in devices if getattr(d, "slice_index", 0) == 0]
        axis_types = sharding.make_mesh({"data": ici[0], "fsdp": ici[1], "tensor": ici[2]}, slice0).axis_types
    except Exception:  # noqa: BLE001 - fall back to the trainer's documented choice
        axis_types = (jax.sharding.AxisType.Auto,) * 3
    return jax.sharding.Mesh(grid, sharding.MESH_AXES, axis_types=axis_types)


def _log(msg: str) -> None:
    print(f"[xlgen plan {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def plan(
    config, topology: str, num_slices: int = 1, *, config_path: str = "", overrides: Sequence[str] = ()
) -> Dict[str, Any]:
    """Compile the train step of `config` for `topology` and return the report dict (see module docstring)."""
    import jax

    from xlgen import topology as topo

    try:
        from xlgen.train import build_program
    except ImportError:
        from xlgen.train.program import build_program

    t = topo.parse_topology(topology, num_slices)
    devices = topo.topology_devices(t)
    hbm, peak = topo.per_device(t, devices)
    mesh = build_mesh(config, devices, num_slices)
    report: Dict[str, Any] = {
        "config": config_path,
        "overrides": list(overrides),
        "model": {k: _plain(config.model[k]) for k in config.model.keys()},
        "topology": t.name,
        "num_slices": t.num_slices,
        "device_kind": devices[0].device_kind,
        "chips": t.num_chips,
        "devices": len(devices),
        "mesh": dict(mesh.shape),
        "mesh_rules": _plain(config.mesh.get("rules", None)),
        "hbm_per_device": hbm,
        "peak_bf16_flops_per_device": peak,
    }

    t0 = time.perf_counter()
    _log(f"building the train program for {len(devices)} {devices[0].device_kind} devices, mesh {dict(mesh.shape)}")
    program = build_program(config, mesh)
    if hasattr(program, "abstract_args"):  # (state, batch, mems): the step's full signature
        args = tuple(program.abstract_args())
    else:
        args = (program.abstract_state(), program.abstract_batch())
    state, batch = args[0], args[1]
    report["global_batch_size"] = _batch_size(batch)
    breakdown = state_breakdown(state)
    extra = [a for a in args[2:] if a is not None]
    if extra:  # recurrent memory passed next to the state
        total = breakdown.pop("total")
        breakdown["mems"] = _bytes_per_device(extra)
        breakdown["total"] = total + breakdown["mems"]
    report["num_params"] = (
        sum(math.prod(x.shape) for x in jax.tree.leaves(state["params"]))
        if isinstance(state, dict) and "params" in state
        else None
    )
    report["state_bytes_per_device"] = breakdown
    report["batch_bytes_per_device"] = _bytes_per_device(batch)
    report.update(compile_and_measure(program.train_step, args, mesh, hbm, label=t.name))
    # build + trace + lower, everything but XLA's compile
    report["trace_lower_time_s"] = round(time.perf_counter() - t0 - report["compile_time_s"], 2)
    report["flops_per_step"]["analytic_model"] = float(program.analytic_flops_per_step)
    report.pop("_has_while")
    tokens = getattr(program, "tokens_per_step", None)
    if tokens:
        report["tokens_per_step"] = int(tokens)
    report["ici_bytes_per_s_per_device"] = topo.ici_bytes_per_s_per_device(t, devices)
    found = report.pop("_collectives", None)
    if found is not None:
        add_communication(report, found, program, config)
    derive_timing(report)
    report["suggestions"] = [] if report["fits"] else suggestions(config, report)
    return report


def add_communication(report: Dict[str, Any], found: Dict[str, Any], program, config) -> Dict[str, Any]:
    """Fill the report's communication fields from the compiled step's collectives (`xlgen.comm.collectives`) and
    the FSDP ideal of the program's parameters (`xlgen.comm.ideal_fsdp_bytes`); in place, returns the report."""
    from xlgen import comm

    shapes = program.train_spec.shapes
    ideal = comm.ideal_fsdp_bytes(
        shapes,
        program.param_specs,
        dict(program.mesh.shape),
        remat=_remat_on(config.model),
        grad_accum_steps=int(config.optimizer.get("grad_accum_steps", 1)) if "optimizer" in config else 1,
    )
    report["collectives"] = comm.summary(found)
    report["comm_bytes_per_device"] = float(found["bytes_per_device"])
    report["ideal_comm_bytes_per_device"] = float(ideal["total"])
    report["ideal_comm_breakdown"] = {k: float(v) for k, v in ideal.items() if k != "total"}
    report["top_collectives"] = comm.top(found, 8)
    in_loop = [c for c in found["list"] if c.in_loop]
    if in_loop:  # activations moved inside the layer loop show here (batch x length x d_model elements or more)
        big = max(in_loop, key=lambda c: c.largest_elements)
        report["largest_in_loop_collective"] = {
            "kind": big.kind,
            "elements": int(big.largest_elements),
            "trips": big.trips,
            "op_name": big.op_name[-160:],
        }
    report["collective_loops_unknown_trip_count"] = int(found["unknown_trip_counts"])
    return report


def _remat_on(model, default: bool = False) -> bool:
    """Whether `model.remat` (a policy name, or a boolean from older configs) rematerialises anything."""
    from xlgen.models.layers import remat_policy

    return remat_policy(model.get("remat", default)) != "none"


def remat_policy(value) -> str:
    from xlgen.models.layers import remat_policy as policy

    return policy(value)


def compare_remat(
    config,
    topology: str,
    num_slices: int,
    policies: Sequence[str],
    *,
    base: Optional[Dict[str, Any]] = None,
    config_path: str = "",
    overrides: Sequence[str] = (),
) -> List[Dict[str, Any]]:
    """One row per rematerialisation policy (`xlgen.models.layers.REMAT_POLICIES`): the train step compiled with
    `model.remat=<policy>` for `topology`; HBM per device (and whether it fits), executed FLOPs per step (the
    recomputed forward included) and the predicted step time / MFU. `base`: a report already compiled for the
    config's own policy (reused, not compiled again)."""
    import copy

    from xlgen.config import ConfigDict

    rows = []
    for name in policies:
        name = remat_policy(name)
        if base is not None and remat_policy(config.model.get("remat", False)) == name:
            r = base
        else:
            c = copy.deepcopy(config)
            c.model = ConfigDict({**c.model.to_dict(), "remat": name}, type_safe=True)  # a bool-declared key too
            r = plan(
                c, topology, num_slices, config_path=config_path, overrides=[*overrides, f"--config.model.remat={name}"]
            )
        mem = r["memory_per_device"]
        rows.append(
            {
                "policy": name,
                "fits": bool(r["fits"]),
                "hbm_per_device": int(mem["total"]),
                "temp_per_device": int(mem.get("temp", 0)),
                "executed_flops_per_step": float(r["executed_flops_per_step"]),
                "step_time_s": float(r["step_time_s"]),
                "step_time_bound_s": float(r.get("step_time_bound_s", r["step_time_s"])),
                "mfu": float(r["mfu"]),
                "compile_time_s": float(r["compile_time_s"]),
            }
        )
    return rows


def render_remat(rows: Sequence[Dict[str, Any]], hbm: int) -> str:
    """The policy comparison as a text table (`xlgen plan --remat_policies=...`)."""
    lines = [
        f"remat policies    (HBM per device of {_gib(hbm)}; step time from executed FLOPs at peak, with comm if measured)",
        f"  {'policy':<14} {'HBM / device':>13} {'temp':>11} {'fits':>5} {'executed FLOPs':>15} {'step >=':>10} "
        f"{'MFU <=':>7}",
    ]
    for r in rows:
        lines.append(
            f"  {r['policy']:<14} {_gib(r['hbm_per_device']):>13} {_gib(r['temp_per_device']):>11} "
            f"{'yes' if r['fits'] else 'NO':>5} {_flops(r['executed_flops_per_step']):>15} "
            f"{r['step_time_bound_s'] * 1e3:>8.3g} ms {100 * r['mfu']:>6.1f}%"
        )
    return "\n".join(lines)


def derive_timing(report: Dict[str, Any]) -> Dict[str, Any]:
    """Fill the report's predicted step time, MFU and tokens/s from its FLOP counts (in place; returns it).

    executed FLOPs = the matmuls counted on the traced step (dead code removed, remat recompute included), or XLA's
    cost_analysis when it is larger and no while loop hides work from it; step time >= executed / (devices · peak),
    or XLA's own roofline estimate when larger (same condition). MFU <= model FLOPs (analytic, no remat) /
    (devices · peak · step time): with full remat the executed work is ≈ 4/3 of the model's, so MFU <= ≈ 75%.
    """
    fl = report["flops_per_step"]
    n, peak = report["devices"], report["peak_bf16_flops_per_device"]
    loops = fl.get("xla_counts_loop_bodies_once", True)
    executed = fl["matmul_jaxpr"] if loops else max(fl["matmul_jaxpr"], fl.get("xla_cost_analysis", 0.0))
    step = executed / n / peak
    if not loops and report.get("xla_optimal_seconds", 0.0) > step:
        step = report["xla_optimal_seconds"]
    report["executed_flops_per_step"] = executed
    report["step_time_s"] = step
    # not clipped: an analytic model above the executed work would show here as MFU > 100% (a bug in xlgen.flops)
    report["mfu"] = fl["analytic_model"] / (n * peak * step) if step > 0 else 0.0
    if report.get("tokens_per_step"):
        report["tokens_per_sec"] = report["tokens_per_step"] / step
    bw = report.get("ici_bytes_per_s_per_device")
    if report.get("ideal_comm_bytes_per_device") and bw:
        report["ideal_comm_time_s"] = report["ideal_comm_bytes_per_device"] / bw
    if "comm_bytes_per_device" in report and bw:
        # communication at the ICI bandwidth of one axis ring; the step needs at least max(compute, comm) (perfect
        # overlap) and at most about compute + comm (no overlap)
        comm_s = report["comm_bytes_per_device"] / bw
        report["comm_time_s"] = comm_s
        report["step_time_bound_s"] = max(step, comm_s)
        report["step_time_no_overlap_s"] = step + comm_s
        bound = report["step_time_bound_s"]
        report["mfu_with_comm"] = fl["analytic_model"] / (n * peak * bound) if bound > 0 else 0.0
        report["mfu_no_overlap"] = fl["analytic_model"] / (n * peak * report["step_time_no_overlap_s"])
    return report


def traced_matmul_flops(config) -> float:
    """Matmul FLOPs (`jaxpr_matmul_flops`) of the train step of `config`, traced on one CPU device: the traced
    program's global shapes do not depend on the mesh, so no TPU topology (and no compile) is needed."""
    import jax

    from xlgen import sharding
    from xlgen.train.program import build_program

    config = config.copy_and_resolve_references()
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 1, 1
    cpu = jax.devices("cpu")[:1]
    mesh = sharding.make_mesh(config.mesh, cpu)
    program = build_program(config, mesh)
    with jax.set_mesh(mesh):
        traced = program.train_step.trace(*tuple(program.abstract_args()))
    return jaxpr_matmul_flops(traced.jaxpr.jaxpr)[0]


def refresh(path: str, ideal: bool = False) -> Dict[str, Any]:
    """Recompute what a saved `--json` report derives from the analytic model and the trace (model FLOPs, matmul
    FLOPs of the traced step, step time, MFU, tokens/s) from its own `config` + `overrides`, without compiling; the
    compiled measurements (memory, fits, XLA's cost analysis, compile time) are kept. Rewrites `path` atomically.
    `ideal`: also (re)compute the FSDP ideal communication for the report's topology (`fsdp_ideal`; needs libtpu for
    the topology's devices, compiles nothing), e.g. for plans compiled before communication was measured."""
    from xlgen import flops
    from xlgen.config import load_config, parse_overrides

    with open(path) as f:
        report = json.load(f)
    for key in ("config", "overrides", "flops_per_step", "devices", "peak_bf16_flops_per_device"):
        if key not in report:
            raise SystemExit(f"{path}: not an `xlgen plan --json` report (no {key!r})")
    from xlgen.config import ConfigError

    try:
        overrides, rest = parse_overrides(list(report["overrides"]))
        if rest:
            raise ConfigError(f"overrides {rest} are not --config.KEY=VALUE")
        config = load_config(report["config"], overrides)
    except (ConfigError, OSError) as e:
        raise SystemExit(f"{path}: cannot reload its config {report['config']!r}: {e}") from e
    report["flops_per_step"]["analytic_model"] = float(flops.train_flops_per_step(config))
    report["flops_per_step"]["matmul_jaxpr"] = traced_matmul_flops(config)
    if ideal:
        fsdp, bw = fsdp_ideal(config, report["topology"], int(report.get("num_slices", 1)))
        report["ideal_comm_bytes_per_device"] = float(fsdp["total"])
        report["ideal_comm_breakdown"] = {k: float(v) for k, v in fsdp.items() if k != "total"}
        report["ici_bytes_per_s_per_device"] = bw
    derive_timing(report)
    _write_json(path, report)
    return report


def fsdp_ideal(config, topology: str, num_slices: int = 1):
    """(`xlgen.comm.ideal_fsdp_bytes` of the config's program on `topology`, ICI bytes/s per device); builds the
    program's shardings for the topology's compile-only devices, compiles nothing."""
    from xlgen import comm
    from xlgen import topology as topo
    from xlgen.train.program import build_program

    t = topo.parse_topology(topology, num_slices)
    devices = topo.topology_devices(t)
    program = build_program(config, build_mesh(config, devices, num_slices))
    ideal = comm.ideal_fsdp_bytes(
        program.train_spec.shapes,
        program.param_specs,
        dict(program.mesh.shape),
        remat=_remat_on(config.model),
        grad_accum_steps=int(config.optimizer.get("grad_accum_steps", 1)) if "optimizer" in config else 1,
    )
    return ideal, topo.ici_bytes_per_s_per_device(t, devices)


def _write_json(path: str, report: Dict[str, Any]) -> None:
    paths.write_json_atomic(path, report)


def compile_and_measure(jitted, args, mesh, hbm: int, *, label: str = "") -> Dict[str, Any]:
    """Trace, lower and AOT-compile `jitted(*args)` (abstract args) under `mesh`; memory and FLOPs per device.

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
    out["flops_per_step"]["xla_counts_loop_bodies_once"] = bool(has_while or _has_while(compiled))
    out["xla_optimal_seconds"] = float(cost.get("optimal_seconds", 0.0) or 0.0)
    try:
        hlo = compiled.as_text()
    except Exception:  # pragma: no cover - as_text is available for TPU and CPU executables
        hlo = None
    if hlo:
        from xlgen import comm

        out["_collectives"] = comm.collectives(hlo, n)
    return out


def _has_while(compiled) -> bool:
    try:
        return " while(" in compiled.as_text()
    except Exception:  # pragma: no cover
        return False


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


def suggestions(config, report: Dict[str, Any]) -> List[str]:
    """What to change when the step does not fit, most effective first, with the config keys to set."""
    out = []
    state = report["state_bytes_per_device"]
    mesh = report["mesh"]
    hbm = report["hbm_per_device"]
    total = report["memory_per_device"]["total"]
    over = report["over_by_bytes"]
    model = config.model
    out.append(f"needs {_gib(total)} per device, has {_gib(hbm)} (over by {_gib(over)})")
    params_like = state["total"] - state.get("mems", 0)
    if params_like > 0.2 * total:
        fsdp_hint = "--config.mesh.rules=fsdp" if config.mesh.get("rules") == "dp" else "--config.mesh.rules=fsdp_tp"
        out.append(
            f"parameters + optimizer state take {_gib(params_like)} per device: shard them — raise "
            f"--config.mesh.fsdp (now {mesh['fsdp']}) and lower mesh.data, {fsdp_hint}"
        )
    if not _remat_on(model, default=True):
        out.append(
            "recompute activations in the backward pass: --config.model.remat=True (= full; or a policy that keeps "
            "more, e.g. dots_no_batch: compare them with --remat_policies=none,full,dots_no_batch) "
            "(with --config.model.scan_layers=True to compile once per layer)"
        )
    if model.get("dtype", "bfloat16") == "float32":
        out.append("compute in bfloat16 (parameters stay float32): --config.model.dtype=bfloat16")
    dp = mesh["data"] * mesh["fsdp"]
    accum = int(config.optimizer.get("grad_accum_steps", 1)) if "optimizer" in config else 1
    out.append(
        f"smaller per-device batch: --config.optimizer.grad_accum_steps={2 * accum} (same global batch "
        f"{report.get('global_batch_size')} over {dp} batch shards) or a larger topology"
    )
    if state.get("mems", 0) > 0:
        out.append(
            f"recurrent memory takes {_gib(state['mems'])} per device; a shorter --config.model.mem_len "
            "shrinks it and the attention over it"
        )
    return out


# ----------------------------------------------------------------------------------------------------- rendering


def _gib(b: float) -> str:
    if abs(b) < GiB:
        return f"{b / 1024**2:.1f} MiB"
    return f"{b / GiB:.2f} GiB"


def _flops(f: Optional[float]) -> str:
    if f is None:
        return "-"
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if f >= scale:
            return f"{f / scale:.2f} {unit}"
    return f"{f:.3g} FLOP"


def render_text(r: Dict[str, Any]) -> str:
    m, mem, fl = r["mesh"], r["memory_per_device"], r["flops_per_step"]
    lines = [
        f"config            {r['config']} {' '.join(r['overrides'])}",
        f"topology          {r['topology']} x{r['num_slices']} slice(s): {r['chips']} chips, {r['devices']} devices "
        f"({r['device_kind']})",
        f"mesh              data={m['data']} fsdp={m['fsdp']} tensor={m['tensor']}  rules={r['mesh_rules']}",
        f"global batch      {r['global_batch_size']}",
        "state / device    " + ", ".join(f"{k} {_gib(v)}" for k, v in r["state_bytes_per_device"].items()),
    ]
    if "arguments" in mem:
        lines.append(
            f"HBM / device      arguments {_gib(mem['arguments'])} + outputs {_gib(mem['outputs'])} "
            f"- aliased {_gib(mem['aliased'])} + temp {_gib(mem['temp'])} + code {_gib(mem['code'])}"
        )
    lines.append(
        f"total / capacity  {_gib(mem['total'])} / {_gib(r['hbm_per_device'])}  -> "
        + ("FITS" if r["fits"] else f"DOES NOT FIT (over by {_gib(r['over_by_bytes'])})")
    )
    xla = fl.get("xla_cost_analysis")
    note = " (while-loop bodies counted once)" if fl.get("xla_counts_loop_bodies_once") else ""
    lines += [
        f"FLOPs / step      model {_flops(fl['analytic_model'])}, matmuls (jaxpr) {_flops(fl['matmul_jaxpr'])}, "
        f"XLA cost_analysis {_flops(xla)}{note}",
        f"step time         >= {r['step_time_s'] * 1e3:.1f} ms (peak {r['peak_bf16_flops_per_device'] / 1e12:.1f}"
        f" TFLOP/s bf16 per device), MFU <= {100 * r['mfu']:.1f}%"
        + (f", {r['tokens_per_sec']:.3g} tokens/s" if "tokens_per_sec" in r else ""),
    ]
    if "comm_bytes_per_device" in r:
        kinds = ", ".join(f"{k} {v['count']}x {_bytes(v['bytes'])}" for k, v in r["collectives"].items() if v["count"])
        lines += [
            f"communication     {_bytes(r['comm_bytes_per_device'])} / device / step ({kinds}); FSDP ideal "
            f"{_bytes(r['ideal_comm_bytes_per_device'])} ({_ratio(r)} of ideal)",
        ]
        if "comm_time_s" in r:
            lines.append(
                f"comm time         >= {r['comm_time_s'] * 1e3:.1f} ms at {r['ici_bytes_per_s_per_device'] / 1e9:.0f} GB/s"
                f" ICI per device; step >= {r['step_time_bound_s'] * 1e3:.1f} ms (overlapped), "
                f"{r['step_time_no_overlap_s'] * 1e3:.1f} ms (no overlap); MFU with comm <= "
                f"{100 * r['mfu_with_comm']:.1f}% ({100 * r['mfu_no_overlap']:.1f}% no overlap)"
            )
    lines.append(f"compile           {r['compile_time_s']:.1f} s (trace+lower {r['trace_lower_time_s']:.1f} s)")
    for s in r.get("suggestions", []):
        lines.append(f"suggestion        {s}")
    if r.get("remat_policies"):
        lines.append(render_remat(r["remat_policies"], r["hbm_per_device"]))
    return "\n".join(lines)


TABLE_HEADER = (
    "| config | topology (devices) | mesh data×fsdp×tensor | rules | execution | batch | params | "
    "state / device | HBM / device (of) | fits | model FLOPs / step | compute ≥ | comm / device (× FSDP ideal) | "
    "comm ≥ | step ≥ (no overlap) | MFU ≤ (with comm) | compile |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _bytes(b: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


def _ratio(r: Dict[str, Any]) -> str:
    ideal = r.get("ideal_comm_bytes_per_device") or 0.0
    return f"{r['comm_bytes_per_device'] / ideal:.2f}×" if ideal else "-"


def _comm_cells(r: Dict[str, Any]) -> str:
    """comm / device, comm ≥, step ≥ (no overlap), MFU ≤ (with comm); '-' for plans compiled before comm was
    measured."""
    if "comm_time_s" not in r:  # compiled before collectives were measured: the FSDP ideal only (from --refresh)
        if "ideal_comm_time_s" in r:
            return (
                f"not measured (ideal {_bytes(r['ideal_comm_bytes_per_device'])}) | ideal "
                f"{r['ideal_comm_time_s'] * 1e3:.0f} ms | {r['step_time_s'] * 1e3:.0f} ms (-) | {100 * r['mfu']:.0f}% (-)"
            )
        return f"- | - | {r['step_time_s'] * 1e3:.0f} ms (-) | {100 * r['mfu']:.0f}% (-)"
    return (
        f"{_bytes(r['comm_bytes_per_device'])} ({_ratio(r)}) | {r['comm_time_s'] * 1e3:.0f} ms | "
        f"{r['step_time_bound_s'] * 1e3:.0f} ms ({r['step_time_no_overlap_s'] * 1e3:.0f} ms) | "
        f"{100 * r['mfu']:.0f}% ({100 * r['mfu_with_comm']:.0f}%)"
    )


def _execution(model: Dict[str, Any]) -> str:
    parts = [str(model.get("dtype", "float32")).replace("bfloat16", "bf16").replace("float32", "f32")]
    if _remat_on(model):
        policy = remat_policy(model["remat"])
        parts.append("remat" if policy == "full" else f"remat={policy}")
    if model.get("scan_layers"):
        parts.append("scan")
    return ", ".join(parts)


def render_row(r: Dict[str, Any]) -> str:
    m = r["mesh"]
    cfg = os.path.basename(r["config"]).removesuffix(".py")
    if r["overrides"]:
        cfg += " " + " ".join(f"`{o.removeprefix('--config.')}`" for o in r["overrides"])
    fits = "yes" if r["fits"] else f"no (+{r['over_by_bytes'] / GiB:.1f} GiB)"
    params = f"{r['num_params'] / 1e6:.0f}M" if r.get("num_params") else "-"
    return (
        f"| {cfg} | {r['topology']} ({r['devices']}) | {m['data']}×{m['fsdp']}×{m['tensor']} | {r['mesh_rules']} | "
        f"{_execution(r['model'])} | {r['global_batch_size']} | {params} | "
        f"{_gib(r['state_bytes_per_device']['total'])} | "
        f"{_gib(r['memory_per_device']['total'])} ({_gib(r['hbm_per_device'])}) | {fits} | "
        f"{_flops(r['flops_per_step']['analytic_model'])} | {r['step_time_s'] * 1e3:.0f} ms | "
        f"{_comm_cells(r)} | {r['compile_time_s']:.0f} s |"
    )


def table_order(r: Dict[str, Any]):
    """Rows grouped by family (XLNet, Transformer-XL, Funnel), then config name, batch and topology."""
    family = {"xlnet": 0, "transformer_xl": 1, "funnel": 2}.get(r["model"].get("family"), 3)
    return family, os.path.basename(r["config"]), r["global_batch_size"], r["devices"], r["overrides"]


def render_table(reports: Sequence[Dict[str, Any]]) -> str:
    return "\n".join([TABLE_HEADER] + [render_row(r) for r in reports])


TABLE_BEGIN, TABLE_END = (
    "<!-- pod-table:begin (generated by python -m xlgen.plan --table) -->",
    "<!-- pod-table:end -->",
)


def replace_between_markers(path: str, table: str) -> None:
    """Write `table` between TABLE_BEGIN and TABLE_END in the markdown file `path` (temp file + rename)."""
    with open(path) as f:
        text = f.read()
    if TABLE_BEGIN not in text or TABLE_END not in text:
        raise SystemExit(f"{path}: no pod-table markers ({TABLE_BEGIN!r} ... {TABLE_END!r})")
    head, rest = text.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    paths.atomic_write_text(path, f"{head}{TABLE_BEGIN}\n{table}\n{TABLE_END}{tail}")


# ----------------------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xlgen plan",
        description=__doc__.split("\n\n")[0],
        epilog="Any --config.KEY=VALUE overrides the config as in `xlgen train`.",
    )
    p.add_argument("--config", help="config file (configs/pretrain/*.py)")
    p.add_argument("--topology", help="TPU topology, e.g. v3:16x32, v4:4x4x8, v5e:16x16")
    p.add_argument("--num_slices", type=int, default=1, help="number of slices (multislice over DCN)")
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="write the report as JSON to PATH (or stdout with no PATH)",
    )
    p.add_argument(
        "--remat_policies",
        metavar="NAMES",
        help="also compile with each of these model.remat policies (comma-separated, e.g. none,full,dots_no_batch; "
        "'all' = every policy) and print HBM / step time side by side (JSON: remat_policies)",
    )
    p.add_argument(
        "--table", nargs="+", metavar="REPORT.json", help="render saved --json reports as a markdown table and exit"
    )
    p.add_argument(
        "--refresh",
        nargs="+",
        metavar="REPORT.json",
        help="recompute the model FLOPs, traced matmul FLOPs, step time and MFU of saved --json reports "
        "from their config + overrides (no compile; compiled measurements kept) and exit",
    )
    p.add_argument(
        "--ideal",
        action="store_true",
        help="with --refresh: also compute the FSDP ideal communication for the report's topology (needs libtpu; "
        "no compile)",
    )
    p.add_argument(
        "--into", metavar="DOC.md", help="with --table: replace the table between the pod-table markers of DOC.md"
    )
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    # Off a TPU host the default backend must be the CPU: the TPU plugin is only used to compile for the topology.
    if not (os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0")):
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from xlgen.config import ConfigError, load_config, parse_overrides

    argv = list(sys.argv[1:] if argv is None else argv)
    overrides, rest = parse_overrides(argv)
    args = _parser().parse_args(rest)
    if args.refresh:
        for path in args.refresh:
            r = refresh(path, ideal=args.ideal)
            fl = r["flops_per_step"]
            print(
                f"{path}: model {_flops(fl['analytic_model'])}, matmuls (jaxpr) {_flops(fl['matmul_jaxpr'])}, "
                f"step >= {r['step_time_s'] * 1e3:.1f} ms, MFU <= {100 * r['mfu']:.1f}%"
            )
        return 0
    if args.table:
        reports = []
        for path in args.table:
            with open(path) as f:
                reports.append(json.load(f))
        table = render_table(sorted(reports, key=table_order))
        if args.into:
            replace_between_markers(args.into, table)
        print(table)
        return 0
    if not args.config or not args.topology:
        _parser().error("--config and --topology are required")
    try:
        config = load_config(args.config, overrides)
    except ConfigError as e:
        print(f"xlgen plan: error: {e}", file=sys.stderr)
        return 2
    from xlgen import topology as topo

    if not topo.libtpu_available():
        print(
            "xlgen plan: error: compiling for a TPU topology needs libtpu, which is not installed: "
            "pip install -c constraints.txt -e '.[tpu]'  (or `make test`, which installs it)",
            file=sys.stderr,
        )
        return 2
    override_list = [f"--config.{k}={v}" for k, v in overrides.items()]
    report = plan(config, args.topology, args.num_slices, config_path=args.config, overrides=override_list)
    if args.remat_policies:
        from xlgen.models.layers import REMAT_POLICIES

        names = REMAT_POLICIES if args.remat_policies == "all" else [n for n in args.remat_policies.split(",") if n]
        try:
            names = [remat_policy(n) for n in names]
        except ValueError as e:
            print(f"xlgen plan: error: --remat_policies: {e}", file=sys.stderr)
            return 2
        report["remat_policies"] = compare_remat(
            config, args.topology, args.num_slices, names, base=report, config_path=args.config, overrides=override_list
        )
    if args.json is None:
        print(render_text(report))
    else:
        text = json.dumps(report, indent=2, sort_keys=True)
        if args.json == "-":
            print(text)
        else:
            _write_json(args.json, report)
            print(render_text(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
