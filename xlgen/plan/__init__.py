"""`xlgen plan`: compile the real sharded train step for a TPU topology on any machine and report whether it fits.

    xlgen plan --config=configs/pretrain/xlnet_large.py --topology=v3:16x32 [--num_slices=N]
               [--config.KEY=VALUE ...] [--json[=PATH]]

What happens (nothing is allocated, no TPU is needed; `libtpu` from the `tpu` extra provides the compiler):
  1. the config is loaded exactly as `xlgen train` loads it (`xlgen.config.load_config`);
  2. the topology's compile-only devices come from `jax.experimental.topologies` (`xlgen.plan.topology`);
  3. the mesh is built from `config.mesh` over those devices with the trainer's `xlgen.sharding.make_mesh`
     (several slices: `data` spans slices over DCN, the other axes stay inside a slice);
  4. `xlgen.train.build_program(config, mesh)` builds the SAME jitted, sharded, donating train step `xlgen train`
     runs; it is traced and AOT-compiled on `program.abstract_state()` / `program.abstract_batch()`;
  5. the compiled executable's `memory_analysis()` (per device: arguments, outputs, aliased (donated), temporaries,
     code) and `cost_analysis()` are reported with the chip's HBM and peak bf16 FLOP/s.

FLOPs are given three ways: XLA's `cost_analysis()` (per device × devices; note XLA counts the body of a `while`
loop ONCE, so with scan over layers it undercounts and is flagged), the executed matmul FLOPs counted on the traced
jaxpr (scan-aware, dead code removed as XLA does, rematerialisation included), and the analytic model FLOPs of
`xlgen.models.cost` (6·N·D-style: the math of forward + backward, no remat). executed = model + recomputed forward (remat,
≈ 1/3 of the model with every layer rematerialised) + the little work the implementation does beyond the math
(see `xlgen.models.cost`). The predicted step time is the compute-bound time `executed FLOPs per device / peak` (or XLA's
own roofline estimate when it is larger and not loop-affected); MFU = model FLOPs / (devices · peak · step time),
so ≤ ≈ 75% with full remat. Both are optimistic bounds: communication that does not overlap and memory-bound ops
are not modelled beyond XLA's estimate.

Whole run (`xlgen.plan.runcost`): for the config's `total_steps`, `run_time_s` (the roofline step with communication
× steps, a lower bound), `chip_hours`, `tokens_per_chip_s`; `--topologies=A,B,C` plans each topology (its mesh by
the rule of `runcost.mesh_for_devices`) and prints one row each; `--today_table A.json ...` renders saved reports as
the run-cost table of docs/pod_scale.md.

`python -m xlgen.plan --table A.json B.json ... [--into=DOC.md]` renders saved `--json` reports as the markdown pod
table, `--remat_table` their `--remat_policies` rows as the remat-policy table; `python -m xlgen.plan --refresh A.json ...` recomputes their model FLOPs, traced matmul FLOPs, step time and
MFU from each report's own config + overrides (a CPU trace, no compile) and rewrites them in place.

Modules: `measure` (the mesh over the topology's devices, the AOT compile, memory and XLA's cost analysis, the
collectives), `cost` (FLOPs counted on the traced jaxpr, the step-time / MFU model), `report` (one plan, the
remat-policy comparison, refresh of saved reports, suggestions), `render` (text, the pod table, the sweep rows and the run-cost table), `runcost` (the
whole run's cost, the mesh rule, the sweep), `cli` (the command), `topology` (a topology's compile-only devices
and chip figures), `comm` (the collectives of a compiled program and their bytes).
"""

from xlgen.plan.cost import (  # noqa: F401 - the package's API
    _subjaxprs,
    dead_code_eliminated,
    derive_timing,
    jaxpr_matmul_flops,
    traced_matmul_flops,
)
from xlgen.plan.measure import build_mesh, compile_and_measure, parse_oom, state_breakdown  # noqa: F401
from xlgen.plan.render import (  # noqa: F401  # noqa: F401
    REMAT_TABLE_BEGIN,
    REMAT_TABLE_END,
    TABLE_BEGIN,
    TABLE_END,
    TABLE_HEADER,
    TODAY_TABLE_BEGIN,
    TODAY_TABLE_END,
    render_remat,
    render_remat_table,
    render_row,
    render_sweep,
    render_table,
    render_text,
    render_today_table,
    replace_between_markers,
    table_order,
)
from xlgen.plan.report import (  # noqa: F401
    add_communication,
    compare_remat,
    fsdp_ideal,
    plan,
    refresh,
    suggestions,
)
from xlgen.plan.runcost import (  # noqa: F401
    add_run_cost,
    mesh_for_devices,
    sweep,
)


def main(argv=None) -> int:
    from xlgen.plan.cli import main as cli_main

    return cli_main(argv)
