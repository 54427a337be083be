"""Plan reports as text (`render_text`, `render_remat`) and as the markdown tables of docs/pod_scale.md: the pod
table (also in the README; `render_table`) and the remat-policy table (`render_remat_table`), each written between
its markers by `replace_between_markers`."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence

from data_pipelines import paths
from xlgen.plan.cost import _remat_on, remat_policy
from xlgen.plan.runcost import DAY

GiB = 1024**3


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
        "state / device    "
        + ", ".join(f"{k} {_gib(v)}" for k, v in r["state_bytes_per_device"].items())
        + (f"  (optimizer {r['optimizer']})" if r.get("optimizer") else ""),
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
    if "roofline_time_s" in r:
        lines += render_roofline(r)
    if "run_time_s" in r:
        lines.append(
            f"whole run         {r['total_steps']} steps >= {r['run_time_s'] / 86400:.2f} days "
            f"({r['run_step_time_s'] * 1e3:.1f} ms per step: {r['run_step_time_source']}); "
            f"{r['chip_hours']:.4g} chip-hours on {r['chips']} chips"
            + (f"; <= {r['tokens_per_chip_s']:.4g} tokens per chip-second" if "tokens_per_chip_s" in r else "")
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
    "comm ≥ | step ≥ (no overlap) | MFU ≤ (with comm) | roofline ≥ (no overlap) | roofline ÷ compute | "
    "roofline MFU ≤ (with comm) | XLA optimal_seconds | compile |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
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
    """comm / device, comm ≥, step ≥ (no overlap), MFU ≤ (with comm); '-' for reports without communication
    figures."""
    if "comm_time_s" not in r:  # a report without collectives: the FSDP ideal only (from --refresh)
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


def _roofline_cells(r: Dict[str, Any]) -> str:
    """roofline ≥ (no overlap), roofline ÷ compute-only bound, roofline MFU ≤ (with comm), XLA optimal_seconds; '-'
    for reports without a roofline."""
    xla = r.get("xla_optimal_seconds")
    loop = r.get("flops_per_step", {}).get("xla_counts_loop_bodies_once")
    xla_cell = "-" if not xla else f"{xla * 1e3:.0f} ms" + (" (loop body once)" if loop else "")
    if "roofline_time_s" not in r:
        return f"- | - | - | {xla_cell}"
    roof = f"{r['roofline_time_s'] * 1e3:.0f} ms"
    mfu = f"{100 * r['roofline_mfu']:.0f}%"
    if "roofline_step_time_no_overlap_s" in r:
        roof += f" ({r['roofline_step_time_no_overlap_s'] * 1e3:.0f} ms)"
        mfu += f" ({100 * r['roofline_mfu_with_comm']:.0f}%)"
    ratio = f"{r['roofline_over_compute_only']:.2f}×" if "roofline_over_compute_only" in r else "-"
    return f"{roof} | {ratio} | {mfu} | {xla_cell}"


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
        f"{_comm_cells(r)} | {_roofline_cells(r)} | {r['compile_time_s']:.0f} s |"
    )


def table_order(r: Dict[str, Any]):
    """Rows grouped by family in the registry's order (`xlgen.registry.SYSTEMS`), then config name, batch and
    topology."""
    from xlgen import registry

    names = registry.names()
    family = r["model"].get("family")
    family = names.index(family) if family in names else len(names)
    return family, os.path.basename(r["config"]), r["global_batch_size"], r["devices"], r["overrides"]


def render_table(reports: Sequence[Dict[str, Any]]) -> str:
    return "\n".join([TABLE_HEADER] + [render_row(r) for r in reports])


TABLE_BEGIN, TABLE_END = (
    "<!-- pod-table:begin (generated by python -m xlgen.plan --table) -->",
    "<!-- pod-table:end -->",
)


def replace_between_markers(path: str, table: str, begin: str = TABLE_BEGIN, end: str = TABLE_END) -> None:
    """Write `table` between the markers `begin` and `end` (default: the pod table's) in the markdown file `path`
    (temp file + rename)."""
    with open(path) as f:
        text = f.read()
    if begin not in text or end not in text:
        raise SystemExit(f"{path}: no table markers ({begin!r} ... {end!r})")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    paths.atomic_write_text(path, f"{head}{begin}\n{table}\n{end}{tail}")


REMAT_TABLE_HEADER = (
    "| config | topology (devices) | model.remat | HBM / device (of) | temporaries | fits | executed FLOPs / step | "
    "compute ≥ | step ≥ (with comm) | MFU ≤ (with comm) | roofline ≥ | compile |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)
REMAT_TABLE_BEGIN, REMAT_TABLE_END = (
    "<!-- remat-table:begin (generated by python -m xlgen.plan --remat_table) -->",
    "<!-- remat-table:end -->",
)


def render_remat_table(reports: Sequence[Dict[str, Any]]) -> str:
    """The `remat_policies` rows of saved `--json` reports as one markdown table: per config and topology, one row
    per policy in `REMAT_POLICIES` order (a policy compiled by several reports is shown once)."""
    from xlgen.models.layers import REMAT_POLICIES

    rows = {}
    for r in reports:
        cfg = os.path.basename(r["config"]).removesuffix(".py")
        for row in r.get("remat_policies", []):
            key = (cfg, r["devices"], r["topology"], REMAT_POLICIES.index(row["policy"]))
            rows.setdefault(key, (r, row))
    lines = [REMAT_TABLE_HEADER]
    for (cfg, _, topo, _), (r, row) in sorted(rows.items()):
        step, mfu = row["step_time_bound_s"], row.get("mfu_with_comm", row["mfu"])
        roof = f"{row['roofline_time_s'] * 1e3:.0f} ms" if row.get("roofline_time_s") else "-"
        lines.append(
            f"| {cfg} | {topo} ({r['devices']}) | {row['policy']} | {_gib(row['hbm_per_device'])} "
            f"({_gib(r['hbm_per_device'])}) | {_gib(row['temp_per_device'])} | {'yes' if row['fits'] else 'no'} | "
            f"{_flops(row['executed_flops_per_step'])} | {row['step_time_s'] * 1e3:.0f} ms | {step * 1e3:.0f} ms | "
            f"{100 * row['mfu']:.0f}% ({100 * mfu:.0f}%) | {roof} | {row['compile_time_s']:.0f} s |"
        )
    return "\n".join(lines)


def render_remat(rows: Sequence[Dict[str, Any]], hbm: int) -> str:
    """The policy comparison as a text table (`xlgen plan --remat_policies=...`)."""
    lines = [
        f"remat policies    (HBM per device of {_gib(hbm)}; step time from executed FLOPs at peak, with comm if measured)",
        f"  {'policy':<14} {'HBM / device':>13} {'temp':>11} {'fits':>5} {'executed FLOPs':>15} {'step >=':>10} "
        f"{'MFU <=':>7} {'roofline >=':>12}",
    ]
    for r in rows:
        lines.append(
            f"  {r['policy']:<14} {_gib(r['hbm_per_device']):>13} {_gib(r['temp_per_device']):>11} "
            f"{'yes' if r['fits'] else 'NO':>5} {_flops(r['executed_flops_per_step']):>15} "
            f"{r['step_time_bound_s'] * 1e3:>8.3g} ms {100 * r['mfu']:>6.1f}% "
            + (f"{r['roofline_time_s'] * 1e3:>9.3g} ms" if r.get("roofline_time_s") else f"{'-':>12}")
        )
    return "\n".join(lines)


def render_roofline(r: Dict[str, Any], top: int = 8) -> list:
    """The roofline lines of the text report: the step's roofline against its compute-only bound and XLA's
    estimate, then the top ops by roofline time with the model source they come from."""
    ro = r["roofline"]
    xla = r.get("xla_optimal_seconds", 0.0)
    loop = (
        " (while-loop bodies counted once: not comparable)"
        if r["flops_per_step"].get("xla_counts_loop_bodies_once")
        else ""
    )
    share = ro["memory_bound_time_s"] / r["roofline_time_s"] if r["roofline_time_s"] else 0.0
    lines = [
        f"roofline          >= {r['roofline_time_s'] * 1e3:.1f} ms per step at {ro['hbm_bytes_per_s'] / 1e9:.0f} GB/s HBM "
        f"per device ({r.get('roofline_over_compute_only', 0.0):.2f}x the compute-only {r['compute_only_time_s'] * 1e3:.1f}"
        f" ms; HBM traffic {_bytes(ro['hbm_bytes'])} = {ro['memory_time_s'] * 1e3:.1f} ms; {100 * share:.0f}% of the "
        f"time in memory-bound ops), roofline MFU <= {100 * r['roofline_mfu']:.1f}%",
        f"XLA estimate      optimal_seconds {xla * 1e3:.1f} ms{loop}",
    ]
    if "roofline_step_time_bound_s" in r:
        lines.append(
            f"roofline + comm   step >= {r['roofline_step_time_bound_s'] * 1e3:.1f} ms (overlapped), "
            f"{r['roofline_step_time_no_overlap_s'] * 1e3:.1f} ms (no overlap); MFU <= "
            f"{100 * r['roofline_mfu_with_comm']:.1f}%"
        )
    if ro.get("unknown_trip_counts"):
        lines.append(f"roofline note     {ro['unknown_trip_counts']} while loop(s) of unknown trip count counted once")
    for i, op in enumerate(r.get("top_ops", [])[:top]):
        where = op["source"] or "-"
        lines.append(
            f"{'top ops' if i == 0 else '':<18}{op['time_s'] * 1e3:8.2f} ms {100 * op['share']:4.1f}% {op['bound']:<7} "
            f"{op['op']:<15} x{op['trips']:<4} {where}  {op['op_name'][-90:]}"
        )
    return lines


# ---- whole-run cost: the sweep's rows and the today's-chips table (xlgen.plan.runcost) ----


def _duration(seconds: float) -> str:
    if seconds >= DAY:
        return f"{seconds / DAY:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min"


def render_sweep(reports: Sequence[Dict[str, Any]]) -> str:
    """The sweep as a text table, one row per topology."""
    head = (
        f"{'topology':<16} {'chips':>6} {'mesh d×f×t':>11} {'fits':>4} {'HBM / device':>21} {'opt state':>10} "
        f"{'step >=':>9} {'MFU <=':>6} {'tok/chip/s':>10} {'run >=':>8} {'chip-hours':>11}"
    )
    lines = [head]
    for r in reports:
        m = r["mesh"]
        slices = f" x{r['num_slices']}" if int(r.get("num_slices", 1)) > 1 else ""
        lines.append(
            f"{r['topology'] + slices:<16} {r['chips']:>6} {m['data']}×{m['fsdp']}×{m['tensor']:<3}".ljust(36)
            + f"{'yes' if r['fits'] else 'NO':>4} "
            f"{_gib(r['memory_per_device']['total']) + ' / ' + _gib(r['hbm_per_device']):>21} "
            f"{_gib(r['state_bytes_per_device'].get('opt_state', 0)):>10} "
            f"{r.get('run_step_time_s', 0) * 1e3:>6.3g} ms {100 * r.get('run_mfu', 0):>5.0f}% "
            f"{r.get('tokens_per_chip_s', 0):>10.4g} {_duration(r.get('run_time_s', 0)):>8} "
            f"{r.get('chip_hours', 0):>11.4g}"
        )
    steps = {r.get("total_steps") for r in reports}
    lines.append(
        f"(whole run = total_steps {', '.join(str(s) for s in sorted(steps, key=str))} at the step bound: roofline "
        "with communication overlapped; all times are lower bounds)"
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- docs/pod_scale.md table

TODAY_TABLE_BEGIN, TODAY_TABLE_END = (
    "<!-- today-table:begin (generated by python -m xlgen.plan --today_table) -->",
    "<!-- today-table:end -->",
)
TODAY_TABLE_HEADER = (
    "| config | topology (chips) | mesh data×fsdp×tensor | batch | optimizer state / device | HBM / device (of) | "
    "fits | roofline ≥ | comm ≥ (bytes × FSDP ideal) | step ≥ (overlapped) | MFU ≤ | tokens / chip·s ≤ | steps | "
    "whole run ≥ | chip-hours ≥ |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)
GENERATIONS = ("v2", "v3", "v4", "v5e", "v5p", "v6e")


def today_order(r: Dict[str, Any]):
    """Rows by setup (`xlgen.plan.render.table_order`), then chip generation, then slices."""
    gen = r["topology"].split(":")[0]
    family, cfg, batch, _, _ = table_order(r)
    return family, cfg, batch, GENERATIONS.index(gen) if gen in GENERATIONS else 99, int(r.get("num_slices", 1))


def _ms(seconds) -> str:
    return "-" if not seconds else f"{seconds * 1e3:.0f} ms"


def render_today_row(r: Dict[str, Any]) -> str:
    m = r["mesh"]
    cfg = os.path.basename(r["config"]).removesuffix(".py")
    extra = [o for o in r["overrides"] if not o.startswith("--config.mesh.")]
    if extra:
        cfg += " " + " ".join(f"`{o.removeprefix('--config.')}`" for o in extra)
    slices = f" ×{r['num_slices']} slices" if int(r.get("num_slices", 1)) > 1 else ""
    fits = "yes" if r["fits"] else f"no (+{r['over_by_bytes'] / GiB:.1f} GiB)"
    return (
        f"| {cfg} | {r['topology']}{slices} ({r['chips']}) | {m['data']}×{m['fsdp']}×{m['tensor']} | "
        f"{r['global_batch_size']} | {_gib(r['state_bytes_per_device'].get('opt_state', 0))} | "
        f"{_gib(r['memory_per_device']['total'])} ({_gib(r['hbm_per_device'])}) | {fits} | "
        f"{_ms(r.get('roofline_time_s'))} | {_ms(r.get('comm_time_s'))} ({_ratio(r)}) | "
        f"{r['run_step_time_s'] * 1e3:.0f} ms | {100 * r['run_mfu']:.0f}% | {r.get('tokens_per_chip_s', 0):,.0f} | "
        f"{int(r['total_steps']):,} | {r['run_days']:.2f} d | {r['chip_hours']:,.0f} |"
    )


def render_today_table(reports: Sequence[Dict[str, Any]]) -> str:
    return "\n".join([TODAY_TABLE_HEADER] + [render_today_row(r) for r in sorted(reports, key=today_order)])
