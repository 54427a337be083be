"""What a planned step costs in FLOPs and time: the executed matmuls counted on the traced jaxpr (scan-aware, dead
code removed as XLA does, remat recompute included) and the step-time / MFU model derived from them, XLA's
estimate and the communication."""

from __future__ import annotations

import math
from typing import Any, Dict


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
    """Global FLOPs of every `dot_general` in `jaxpr` (2·out·contracted), scan bodies × length, `shard_map` bodies ×
    the devices that run them, cond = max branch, a Pallas kernel's declared FLOPs (`pl.CostEstimate`).

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
        if name == "pallas_call" and eqn.params.get("cost_estimate") is not None:
            total += float(eqn.params["cost_estimate"].flops)  # a kernel's declared matmul FLOPs, its grid included
            continue
        mult = eqn.params.get("length", 1) if name == "scan" else 1
        if name == "shard_map":  # the body's shapes are one device's: every device of its manual axes runs it
            mesh = eqn.params["mesh"]
            mult = math.prod(mesh.shape[a] for a in eqn.params.get("newly_manual_axes", mesh.axis_names))
        saw_while |= name == "while"
        for _, sub in _subjaxprs(eqn.params):
            f, w = _count(sub)
            total += mult * f
            saw_while |= w
    return total, saw_while


def derive_timing(report: Dict[str, Any]) -> Dict[str, Any]:
    """Fill the report's predicted step time, MFU and tokens/s from its FLOP counts (in place; returns it).

    executed FLOPs = the matmuls counted on the traced step (dead code removed, remat recompute included), or XLA's
    cost_analysis when it is larger and no while loop hides work from it; step time >= executed / (devices · peak),
    or XLA's own roofline estimate when larger (same condition). MFU <= model FLOPs (analytic, no remat) /
    (devices · peak · step time): with full remat the executed work is ≈ 4/3 of the model's, so MFU <= ≈ 75%.
    With the compiled step's roofline (`roofline_time_s`): `roofline_mfu` = model FLOPs / (devices · peak · roofline
    time), and the roofline with communication (overlapped: max, not: sum). With `total_steps`: the whole run's
    cost (`xlgen.plan.runcost.add_run_cost`).
    """
    fl = report["flops_per_step"]
    n, peak = report["devices"], report["peak_bf16_flops_per_device"]
    loops = fl.get("xla_counts_loop_bodies_once", True)
    executed = fl["matmul_jaxpr"] if loops else max(fl["matmul_jaxpr"], fl.get("xla_cost_analysis", 0.0))
    step = executed / n / peak
    # the executed matmuls at peak, nothing else (XLA's cost analysis also counts element-wise FLOPs)
    report["compute_only_time_s"] = fl["matmul_jaxpr"] / n / peak
    if not loops and report.get("xla_optimal_seconds", 0.0) > step:
        step = report["xla_optimal_seconds"]
    report["executed_flops_per_step"] = executed
    report["step_time_s"] = step
    # not clipped: an analytic model above the executed work would show here as MFU > 100% (a bug in xlgen.models.cost)
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
    roof = report.get("roofline_time_s")
    if roof:
        # the memory-traffic roofline of the compiled step (`xlgen.plan.roofline`) against its FLOPs at peak
        report["roofline_mfu"] = fl["analytic_model"] / (n * peak * roof)
        report["roofline_over_compute_only"] = roof / report["compute_only_time_s"]
        if "comm_time_s" in report:
            comm_s = report["comm_time_s"]
            report["roofline_step_time_bound_s"] = max(roof, comm_s)
            report["roofline_step_time_no_overlap_s"] = roof + comm_s
            report["roofline_mfu_with_comm"] = fl["analytic_model"] / (n * peak * max(roof, comm_s))
    from xlgen.plan.runcost import add_run_cost

    return add_run_cost(report)  # the whole run's time, chip-hours and tokens per chip-second


def traced_matmul_flops(config, devices=None) -> float:
    """Matmul FLOPs (`jaxpr_matmul_flops`) of the train step of `config`, traced (not compiled) on one device,
    `devices[0]` (default: a CPU device). The traced program's global shapes do not depend on the mesh, but its
    forms may depend on the platform it is lowered for (`xlgen.models.operands`: e.g. Funnel's factorized position
    term contracts over d_model for TPU, over 2·d_model for the CPU), so a TPU plan is traced on one of its
    topology's compile-only devices."""
    import jax

    from xlgen import sharding
    from xlgen.train.program import build_program

    config = config.copy_and_resolve_references()
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 1, 1
    mesh = sharding.make_mesh(config.mesh, list(devices or jax.devices("cpu"))[:1])
    program = build_program(config, mesh)
    with jax.set_mesh(mesh):
        traced = program.train_step.trace(*tuple(program.abstract_args()))
    return jaxpr_matmul_flops(traced.jaxpr.jaxpr)[0]


def _remat_on(model, default: bool = False) -> bool:
    """Whether `model.remat` (a policy name, or a boolean from older configs) rematerialises anything."""
    from xlgen.models.layers import remat_policy

    return remat_policy(model.get("remat", default)) != "none"


def remat_policy(value) -> str:
    from xlgen.models.layers import remat_policy as policy

    return policy(value)
