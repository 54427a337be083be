"""What a whole run costs on a topology, and the sweep over several topologies.

For a plan of the config's train step on a topology, with `total_steps` = T of the config:

    step ≥ s  = the roofline step with communication, overlapped (`roofline_step_time_bound_s` = max(roofline,
                comm)); without a roofline, the compute bound with communication (`step_time_bound_s`), else the
                compute bound (`step_time_s`) — `run_step_time_source` names the one used
    run_time_s        = T · s                                       (whole run, a lower bound: seconds)
    chip_hours        = chips · T · s / 3600                        (chips of all slices)
    tokens_per_chip_s = tokens per step / (chips · s)               (an upper bound)
    run_mfu           = model FLOPs per step / (devices · peak · s)  (an upper bound)

Every term is a bound for the same reasons the step time is (peak FLOP/s and HBM and ICI bandwidths, perfect
overlap of communication with compute, DCN between slices at ICI speed): the run takes at least this long. Restarts,
evaluation, checkpointing and input stalls are not included (`xlgen train` reports them as goodput).

Mesh per topology (`mesh_for_devices`, the sweep's stated rule): the config's `mesh.data / fsdp / tensor` with -1
filling the devices; a fixed axis that does not divide the devices (or, for `data` and `fsdp`, the global batch)
is cut to its largest size that does — e.g. XLNet-Base's `fsdp=8` becomes 4 on a 4-chip slice, the data axis
taking the rest. The FSDP group is a property of the model size (parameters + optimizer state per device), not of
the topology, so it is kept wherever it fits.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Sequence

from data_pipelines import paths

DAY = 86400.0


def add_run_cost(report: Dict[str, Any]) -> Dict[str, Any]:
    """Fill the whole-run fields of the module docstring (in place; returns the report). Needs `total_steps` and
    the step-time fields of `xlgen.plan.cost.derive_timing`; a report without `total_steps` is returned as is."""
    steps = report.get("total_steps")
    if not steps:
        return report
    for key, source in (
        ("roofline_step_time_bound_s", "roofline with communication (overlapped)"),
        ("roofline_time_s", "roofline (communication not measured)"),
        ("step_time_bound_s", "compute with communication (overlapped)"),
        ("step_time_s", "compute"),
    ):
        if report.get(key):
            step = float(report[key])
            break
    else:
        return report
    chips = int(report["chips"])
    run = int(steps) * step
    report["run_step_time_s"] = step
    report["run_step_time_source"] = source
    report["run_time_s"] = run
    report["run_days"] = run / DAY
    report["chip_hours"] = chips * run / 3600.0
    if report.get("tokens_per_step"):
        report["tokens_per_chip_s"] = float(report["tokens_per_step"]) / (chips * step)
    model = report.get("flops_per_step", {}).get("analytic_model")
    if model:
        report["run_mfu"] = float(model) / (report["devices"] * report["peak_bf16_flops_per_device"] * step)
    return report


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def mesh_for_devices(mesh_cfg, num_devices: int, batch_size: int = 0, num_slices: int = 1) -> Dict[str, int]:
    """{data, fsdp, tensor} for `num_devices` by the module docstring's rule: fixed sizes kept where they divide
    the devices (and `data`·`fsdp` the global batch), else cut to the largest size that does; -1 (or the cut
    axes' remainder) fills `data`, which must span `num_slices` slices."""
    sizes = {a: int(mesh_cfg[a]) for a in ("data", "fsdp", "tensor")}
    fill = [a for a, s in sizes.items() if s == -1]
    if len(fill) > 1:
        raise ValueError(f"mesh {sizes}: at most one axis may be -1")
    left = num_devices
    out: Dict[str, int] = {}
    for axis in ("tensor", "fsdp", "data"):
        if sizes[axis] == -1:
            continue
        limit = sizes[axis]
        if axis != "tensor" and batch_size:
            limit = min(limit, math.gcd(batch_size, left))
        out[axis] = _largest_divisor_at_most(left, limit)
        left //= out[axis]
    axis = fill[0] if fill else "data"
    out[axis] = out.get(axis, 1) * left
    if out["data"] % num_slices:
        raise ValueError(
            f"mesh {out} on {num_devices} devices: mesh.data must be a multiple of --num_slices={num_slices}"
        )
    if batch_size and batch_size % (out["data"] * out["fsdp"]):
        raise ValueError(
            f"global batch {batch_size} does not divide over mesh data×fsdp = {out['data']}×{out['fsdp']} "
            f"({num_devices} devices): choose a batch or topology that does"
        )
    return {a: out[a] for a in ("data", "fsdp", "tensor")}


def config_for_topology(config, topology: str, num_slices: int = 1):
    """(config with `mesh.data/fsdp/tensor` set by `mesh_for_devices` for the topology's device count, the
    `--config.mesh.*` overrides that say so). Counts devices without libtpu: chips × cores per device."""
    from xlgen.plan import topology as topo

    t = topo.parse_topology(topology, num_slices)
    per_chip = 2 if t.chip.generation in ("v2", "v3") else 1  # v4/v5p megacore: one device per chip
    batch = int(config.data.get("batch_size", 0) or 0) if "data" in config else 0
    mesh = mesh_for_devices(config.mesh, t.num_chips * per_chip, batch, num_slices)
    config = config.copy_and_resolve_references()
    config.mesh.update(mesh)
    return config, [f"--config.mesh.{a}={v}" for a, v in mesh.items()]


def sweep(
    config_path: str,
    topologies: Sequence[str],
    num_slices: int = 1,
    *,
    config=None,
    overrides: Sequence[str] = (),
    json_dir: str = "",
) -> List[Dict[str, Any]]:
    """One plan per topology, its mesh by `config_for_topology`; each compiled in turn in its own `xlgen plan
    --topology` process (a compile of a paper-sized step holds several GB until the process ends, and JAX's trace
    caches would carry the previous topology's meshes). `config`: the loaded config (default: loaded from
    `config_path` + `overrides`). `json_dir`: also write each report there as `plan_file_name(report)` as soon as it
    is done."""
    import subprocess
    import sys
    import tempfile

    if config is None:
        from xlgen.config import load_config, parse_overrides

        config = load_config(config_path, parse_overrides(list(overrides))[0])
    reports = []
    for name in topologies:
        _, mesh_over = config_for_topology(config, name, num_slices)
        axes = tuple(m.split("=")[0] + "=" for m in mesh_over)
        argv = [f"--config={config_path}", f"--topology={name}", f"--num_slices={num_slices}"]
        argv += [o for o in overrides if not o.startswith(axes)] + mesh_over
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "plan.json")
            p = subprocess.run([sys.executable, "-m", "xlgen.plan", *argv, f"--json={out}"], stdout=subprocess.DEVNULL)
            if p.returncode != 0 or not os.path.exists(out):
                raise RuntimeError(f"xlgen plan {' '.join(argv)}: exit {p.returncode}")
            with open(out) as f:
                r = json.load(f)
        reports.append(r)
        if json_dir:
            paths.write_json_atomic(os.path.join(json_dir, plan_file_name(r)), r)
    return reports


def plan_file_name(r: Dict[str, Any]) -> str:
    cfg = os.path.basename(r["config"]).removesuffix(".py") or "plan"
    slices = f"_x{r['num_slices']}" if int(r.get("num_slices", 1)) > 1 else ""
    return f"{cfg}_{r['topology'].replace(':', '-')}{slices}.json"
