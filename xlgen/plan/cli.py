"""`xlgen plan` / `python -m xlgen.plan`: the command line (the method is in the package docstring)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence

from xlgen.plan.render import (
    REMAT_TABLE_BEGIN,
    REMAT_TABLE_END,
    _flops,
    render_remat_table,
    render_table,
    render_text,
    replace_between_markers,
    table_order,
)
from xlgen.plan.report import _write_json, compare_remat, plan, refresh, remat_policy


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xlgen plan",
        description="compile the real sharded train step for a TPU topology on any machine and report whether it fits",
        epilog="Any --config.KEY=VALUE overrides the config as in `xlgen train`.",
    )
    p.add_argument("--config", help="config file (configs/pretrain/*.py)")
    p.add_argument("--topology", help="TPU topology, e.g. v3:16x32, v4:4x4x8, v5e:16x16")
    p.add_argument(
        "--num_slices",
        type=int,
        default=None,
        help="number of slices (multislice over DCN; default: the config's mesh.num_slices, which it sets)",
    )
    p.add_argument(
        "--topologies",
        metavar="A,B,C",
        help="sweep: plan the config on each of these topologies (comma-separated; each with --num_slices slices), "
        "the mesh per topology by the rule of xlgen/plan/runcost.py, and print one row each with the whole run's "
        "time and chip-hours (--json=PATH: a list of reports)",
    )
    p.add_argument(
        "--json_dir",
        metavar="DIR",
        help="with --topologies: also write each topology's report to DIR/<config>_<topology>.json when it is done",
    )
    p.add_argument(
        "--today_table",
        nargs="+",
        metavar="REPORT.json",
        help="render saved --json reports as the markdown run-cost table (docs/pod_scale.md, today's chips) and exit",
    )
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
        "--remat_table",
        nargs="+",
        metavar="REPORT.json",
        help="render the remat_policies rows of saved --json reports as a markdown table and exit",
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
        "--into",
        metavar="DOC.md",
        help="with --table / --remat_table: replace the table between the pod-table / remat-table markers of DOC.md",
    )
    return p


def _sweep(args, config, override_list) -> int:
    from xlgen.plan import topology as topo
    from xlgen.plan.render import render_sweep
    from xlgen.plan.runcost import config_for_topology, sweep

    names = [n.strip() for n in args.topologies.split(",") if n.strip()]
    try:
        for name in names:  # every topology and its mesh checked before the first compile
            topo.parse_topology(name, args.num_slices)
            config_for_topology(config, name, args.num_slices)
    except ValueError as e:
        print(f"xlgen plan: error: --topologies: {e}", file=sys.stderr)
        return 2
    if args.json_dir:
        os.makedirs(args.json_dir, exist_ok=True)
    try:
        reports = sweep(
            args.config, names, args.num_slices, config=config, overrides=override_list, json_dir=args.json_dir or ""
        )
    except RuntimeError as e:
        print(f"xlgen plan: error: {e}", file=sys.stderr)
        return 1
    if args.json and args.json != "-":
        from data_pipelines import paths

        paths.write_json_atomic(args.json, reports)
    elif args.json == "-":
        print(json.dumps(reports, indent=2, sort_keys=True))
        return 0
    print(render_sweep(reports))
    return 0


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
    if args.today_table:
        from xlgen.plan.render import TODAY_TABLE_BEGIN, TODAY_TABLE_END, render_today_table

        reports = []
        for path in args.today_table:
            with open(path) as f:
                reports.append(json.load(f))
        table = render_today_table(reports)
        if args.into:
            replace_between_markers(args.into, table, TODAY_TABLE_BEGIN, TODAY_TABLE_END)
        print(table)
        return 0
    if args.table or args.remat_table:
        reports = []
        for path in args.table or args.remat_table:
            with open(path) as f:
                reports.append(json.load(f))
        if args.table:
            table = render_table(sorted(reports, key=table_order))
        else:
            table = render_remat_table(reports)
        if args.into:
            markers = () if args.table else (REMAT_TABLE_BEGIN, REMAT_TABLE_END)
            replace_between_markers(args.into, table, *markers)
        print(table)
        return 0
    if not args.config or not (args.topology or args.topologies):
        _parser().error("--config and --topology (or --topologies) are required")
    if args.topology and args.topologies:
        _parser().error("give --topology or --topologies, not both")
    try:
        config = load_config(args.config, overrides)
    except ConfigError as e:
        print(f"xlgen plan: error: {e}", file=sys.stderr)
        return 2
    from xlgen.plan import topology as topo

    if args.num_slices is None:  # the run's own: the mesh `xlgen train` builds (xlgen.sharding.make_mesh)
        args.num_slices = int(config.mesh.num_slices)
    elif "num_slices" in config.mesh:
        config.mesh.num_slices = args.num_slices

    if not topo.libtpu_available():
        print(
            "xlgen plan: error: compiling for a TPU topology needs libtpu, which is not installed: "
            "pip install -c constraints.txt -e '.[tpu]'  (or `make test`, which installs it)",
            file=sys.stderr,
        )
        return 2
    override_list = [f"--config.{k}={v}" for k, v in overrides.items()]
    if args.topologies:
        return _sweep(args, config, override_list)
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
