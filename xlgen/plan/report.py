"""The plan of one config on one topology (`plan`), the same step under several remat policies (`compare_remat`),
saved reports re-derived without a compile (`refresh`), and what to change when a step does not fit
(`suggestions`)."""

from __future__ import annotations

import json
import math
import time
from typing import Any, Dict, List, Optional, Sequence

from data_pipelines import paths
from xlgen.plan.cost import _remat_on, derive_timing, remat_policy, traced_matmul_flops
from xlgen.plan.measure import (
    _batch_size,
    _bytes_per_device,
    _log,
    _plain,
    build_mesh,
    compile_and_measure,
    state_breakdown,
)
from xlgen.plan.render import _gib


def plan(
    config, topology: str, num_slices: int = 1, *, config_path: str = "", overrides: Sequence[str] = ()
) -> Dict[str, Any]:
    """Compile the train step of `config` for `topology` and return the report dict (see module docstring)."""
    import jax

    from xlgen.plan import topology as topo

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
        "mesh_rules": _plain(config.mesh.rules),
        "hbm_per_device": hbm,
        "peak_bf16_flops_per_device": peak,
        "total_steps": int(config.total_steps) if "total_steps" in config else None,
        "optimizer": _plain(config.optimizer.get("name", None)) if "optimizer" in config else None,
    }

    t0 = time.perf_counter()
    _log(f"building the train program for {len(devices)} {devices[0].device_kind} devices, mesh {dict(mesh.shape)}")
    program = build_program(config, mesh)
    args = tuple(program.abstract_args())  # (state, batch, mems): the step's full signature
    state, batch = args[0], args[1]
    report["global_batch_size"] = _batch_size(batch)
    breakdown = state_breakdown(state)
    extra = [a for a in args[2:] if a is not None]
    if extra:  # recurrent memory passed next to the state
        total = breakdown.pop("total")
        breakdown["mems"] = _bytes_per_device(extra)
        breakdown["total"] = total + breakdown["mems"]
    report["num_params"] = (
        sum(math.prod(x.shape) for x in jax.tree.leaves((state["params"], state.get("frozen", {}))))
        if isinstance(state, dict) and "params" in state
        else None
    )
    report["state_bytes_per_device"] = breakdown
    report["optimizer_state_bytes_per_device"] = int(breakdown.get("opt_state", 0))
    report["batch_bytes_per_device"] = _bytes_per_device(batch)
    bandwidth = topo.hbm_bytes_per_s_per_device(t, devices)
    report["hbm_bytes_per_s_per_device"] = bandwidth
    report.update(
        compile_and_measure(program.train_step, args, mesh, hbm, label=t.name, peak=peak, hbm_bandwidth=bandwidth)
    )
    # build + trace + lower, everything but XLA's compile
    report["trace_lower_time_s"] = round(time.perf_counter() - t0 - report["compile_time_s"], 2)
    report["flops_per_step"]["analytic_model"] = float(program.analytic_flops_per_step)
    report.pop("_has_while")
    tokens = program.tokens_per_step
    if tokens:
        report["tokens_per_step"] = int(tokens)
    report["ici_bytes_per_s_per_device"] = topo.ici_bytes_per_s_per_device(t, devices)
    add_roofline(report, report.pop("_roofline", None))
    found = report.pop("_collectives", None)
    if found is not None:
        add_communication(report, found, program, config)
    derive_timing(report)
    report["suggestions"] = [] if report["fits"] else suggestions(config, report)
    return report


def add_communication(report: Dict[str, Any], found: Dict[str, Any], program, config) -> Dict[str, Any]:
    """Fill the report's communication fields from the compiled step's collectives (`xlgen.plan.comm.collectives`) and
    the FSDP ideal of the program's parameters (`xlgen.plan.comm.ideal_fsdp_bytes`); in place, returns the report."""
    from xlgen.plan import comm

    ideal = program_fsdp_ideal(program, config)
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


def add_roofline(report: Dict[str, Any], roofline: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Fill the report's roofline fields from `xlgen.plan.roofline.analyse` of the compiled step (in place):
    `roofline_time_s` (per step, communication not included), `top_ops`, and the rest under `roofline`."""
    if roofline is None:
        return report
    roofline = dict(roofline)
    report["roofline_time_s"] = roofline.pop("roofline_time_s")
    report["top_ops"] = roofline.pop("top_ops")
    report["roofline"] = roofline
    return report


def program_fsdp_ideal(program, config) -> Dict[str, float]:
    """`xlgen.plan.comm.ideal_fsdp_bytes` of a built program's parameters under its mesh (see `xlgen.plan.comm`)."""
    from xlgen.plan import comm

    return comm.ideal_fsdp_bytes(
        program.param_shapes,
        program.param_specs,
        dict(program.mesh.shape),
        remat=_remat_on(config.model),
        grad_accum_steps=int(config.optimizer.get("grad_accum_steps", 1)) if "optimizer" in config else 1,
    )


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
                "mfu_with_comm": float(r.get("mfu_with_comm", r["mfu"])),
                "compile_time_s": float(r["compile_time_s"]),
                "roofline_time_s": r.get("roofline_time_s"),
            }
        )
    return rows


def refresh(path: str, ideal: bool = False) -> Dict[str, Any]:
    """Recompute what a saved `--json` report derives from the analytic model and the trace (model FLOPs, matmul
    FLOPs of the traced step, step time, MFU, tokens/s) from its own `config` + `overrides`, without compiling; the
    compiled measurements (memory, fits, XLA's cost analysis, compile time) are kept. Rewrites `path` atomically.
    `ideal`: also (re)compute the FSDP ideal communication for the report's topology (`fsdp_ideal`; needs libtpu for
    the topology's devices, compiles nothing), e.g. for a report without communication figures."""
    from xlgen import registry
    from xlgen.config import load_config, parse_overrides
    from xlgen.models.cost import FlopCount, train_flops_per_step

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
    report["flops_per_step"]["analytic_model"] = train_flops_per_step(
        config, registry.get(config.model.family).record(FlopCount)
    )
    report["flops_per_step"]["matmul_jaxpr"] = traced_matmul_flops(config, _trace_devices(report))
    report["total_steps"] = int(config.total_steps)
    report.setdefault("optimizer", _plain(config.optimizer.get("name", None)))
    report["optimizer_state_bytes_per_device"] = int(report["state_bytes_per_device"].get("opt_state", 0))
    if ideal:
        fsdp, bw = fsdp_ideal(config, report["topology"], int(report.get("num_slices", 1)))
        report["ideal_comm_bytes_per_device"] = float(fsdp["total"])
        report["ideal_comm_breakdown"] = {k: float(v) for k, v in fsdp.items() if k != "total"}
        report["ici_bytes_per_s_per_device"] = bw
    derive_timing(report)
    _write_json(path, report)
    return report


def _trace_devices(report: Dict[str, Any]):
    """One compile-only device of the report's TPU topology (the program is traced as lowered for it), or None
    (a CPU device) without libtpu."""
    from xlgen.plan import topology as topo

    if not report.get("topology") or not topo.libtpu_available():
        return None
    return topo.topology_devices(report["topology"], int(report.get("num_slices", 1)))[:1]


def fsdp_ideal(config, topology: str, num_slices: int = 1):
    """(`xlgen.plan.comm.ideal_fsdp_bytes` of the config's program on `topology`, ICI bytes/s per device); builds the
    program's shardings for the topology's compile-only devices, compiles nothing."""
    from xlgen.plan import topology as topo
    from xlgen.train.program import build_program

    t = topo.parse_topology(topology, num_slices)
    devices = topo.topology_devices(t)
    program = build_program(config, build_mesh(config, devices, num_slices))
    return program_fsdp_ideal(program, config), topo.ici_bytes_per_s_per_device(t, devices)


def _write_json(path: str, report: Dict[str, Any]) -> None:
    paths.write_json_atomic(path, report)


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
        fsdp_hint = "--config.mesh.rules=fsdp" if config.mesh.rules == "dp" else "--config.mesh.rules=fsdp_tp"
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
