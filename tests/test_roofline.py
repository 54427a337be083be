"""`xlgen.plan.roofline`: FLOPs and HBM bytes per instruction of an optimized HLO module, counted by hand.

The module below is written in the form `compiled.as_text()` prints for TPU (tiled layouts, fusions, a `while` loop
from a `scan`); the compiled programs (tests/test_plan.py) check the same counts on real TPU compiles.
"""

import pytest

from xlgen.plan import comm, measure, roofline, topology

BF16_TILE = "{1,0:T(8,128)(2,1)}"
HLO = f"""HloModule jit_step, is_scheduled=true

%fused_dot (param_0: bf16[256,512], param_1: bf16[512,1024]) -> bf16[256,1024] {{
  %param_0 = bf16[256,512]{BF16_TILE} parameter(0)
  %param_1 = bf16[512,1024]{BF16_TILE} parameter(1)
  %convolution.1 = bf16[256,1024]{BF16_TILE} convolution(bf16[256,512]{BF16_TILE} %param_0, bf16[512,1024]{BF16_TILE} %param_1), dim_labels=bf_io->bf
  ROOT %tanh.1 = bf16[256,1024]{BF16_TILE} tanh(bf16[256,1024]{BF16_TILE} %convolution.1)
}}

%fused_add (param_0.1: f32[256,64], param_1.1: f32[256,64]) -> f32[256,64] {{
  %param_0.1 = f32[256,64]{{1,0:T(8,128)}} parameter(0)
  %param_1.1 = f32[256,64]{{1,0:T(8,128)}} parameter(1)
  ROOT %add.1 = f32[256,64]{{1,0:T(8,128)}} add(f32[256,64]{{1,0:T(8,128)}} %param_0.1, f32[256,64]{{1,0:T(8,128)}} %param_1.1)
}}

%fused_ds (param_0.2: bf16[4,512,512], param_1.2: s32[]) -> bf16[512,512] {{
  %param_0.2 = bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}} parameter(0)
  %param_1.2 = s32[] parameter(1)
  %constant.2 = s32[] constant(0)
  %dynamic-slice.2 = bf16[1,512,512]{{2,1,0:T(8,128)(2,1)}} dynamic-slice(bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}} %param_0.2, s32[] %param_1.2, s32[] %constant.2, s32[] %constant.2), dynamic_slice_sizes={{1,512,512}}
  ROOT %bitcast.2 = bf16[512,512]{BF16_TILE} bitcast(bf16[1,512,512]{{2,1,0:T(8,128)(2,1)}} %dynamic-slice.2)
}}

%fused_dus (param_0.3: bf16[4,256,512], param_1.3: bf16[256,512], param_2.3: s32[]) -> bf16[4,256,512] {{
  %param_0.3 = bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}} parameter(0)
  %param_1.3 = bf16[256,512]{BF16_TILE} parameter(1)
  %param_2.3 = s32[] parameter(2)
  %bitcast.3 = bf16[1,256,512]{{2,1,0:T(8,128)(2,1)}} bitcast(bf16[256,512]{BF16_TILE} %param_1.3)
  %constant.3 = s32[] constant(0)
  ROOT %dynamic-update-slice.3 = bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}} dynamic-update-slice(bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}} %param_0.3, bf16[1,256,512]{{2,1,0:T(8,128)(2,1)}} %bitcast.3, s32[] %param_2.3, s32[] %constant.3, s32[] %constant.3)
}}

%fused_layer (param_0.6: bf16[256,512], param_1.6: bf16[4,512,512], param_2.6: s32[]) -> bf16[256,512] {{
  %param_0.6 = bf16[256,512]{BF16_TILE} parameter(0)
  %param_1.6 = bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}} parameter(1)
  %param_2.6 = s32[] parameter(2)
  %fusion.6 = bf16[512,512]{BF16_TILE} fusion(bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}} %param_1.6, s32[] %param_2.6), kind=kLoop, calls=%fused_ds
  %convolution.6 = bf16[256,512]{BF16_TILE} convolution(bf16[256,512]{BF16_TILE} %param_0.6, bf16[512,512]{BF16_TILE} %fusion.6), dim_labels=bf_io->bf
  ROOT %tanh.6 = bf16[256,512]{BF16_TILE} tanh(bf16[256,512]{BF16_TILE} %convolution.6)
}}

%fused_slice (param_0.7: bf16[4,512,512]) -> bf16[512,512] {{
  %param_0.7 = bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}} parameter(0)
  %slice.7 = bf16[1,512,512]{{2,1,0:T(8,128)(2,1)}} slice(bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}} %param_0.7), slice={{[2:3], [0:512], [0:512]}}
  ROOT %bitcast.7 = bf16[512,512]{BF16_TILE} bitcast(bf16[1,512,512]{{2,1,0:T(8,128)(2,1)}} %slice.7)
}}

%fused_third (param_0.8: bf16[256,512], param_1.8: bf16[4,512,512]) -> bf16[256,512] {{
  %param_0.8 = bf16[256,512]{BF16_TILE} parameter(0)
  %param_1.8 = bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}} parameter(1)
  %fusion.8 = bf16[512,512]{BF16_TILE} fusion(bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}} %param_1.8), kind=kLoop, calls=%fused_slice
  ROOT %convolution.8 = bf16[256,512]{BF16_TILE} convolution(bf16[256,512]{BF16_TILE} %param_0.8, bf16[512,512]{BF16_TILE} %fusion.8), dim_labels=bf_io->bf
}}

%body (p.4: (s32[], bf16[4,512,512], bf16[4,256,512], bf16[256,512])) -> (s32[], bf16[4,512,512], bf16[4,256,512], bf16[256,512]) {{
  %p.4 = (s32[], bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}}, bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}}, bf16[256,512]{BF16_TILE}) parameter(0)
  %i.4 = s32[] get-tuple-element((s32[], bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}}, bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}}, bf16[256,512]{BF16_TILE}) %p.4), index=0
  %ws.4 = bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}} get-tuple-element((s32[], bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}}, bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}}, bf16[256,512]{BF16_TILE}) %p.4), index=1
  %acc.4 = bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}} get-tuple-element((s32[], bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}}, bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}}, bf16[256,512]{BF16_TILE}) %p.4), index=2
  %h.4 = bf16[256,512]{BF16_TILE} get-tuple-element((s32[], bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}}, bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}}, bf16[256,512]{BF16_TILE}) %p.4), index=3
  %w.4 = bf16[512,512]{BF16_TILE} fusion(bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}} %ws.4, s32[] %i.4), kind=kLoop, calls=%fused_ds
  %new.4 = bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}} fusion(bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}} %acc.4, bf16[256,512]{BF16_TILE} %h.4, s32[] %i.4), kind=kLoop, calls=%fused_dus, metadata={{op_name="jit(step)/while/body/dynamic_update_slice" source_file="/x/site-packages/xlgen/models/layers.py" source_line=42}}
  %y.4 = bf16[256,512]{BF16_TILE} fusion(bf16[256,512]{BF16_TILE} %h.4, bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}} %ws.4, s32[] %i.4), kind=kOutput, calls=%fused_layer
  %one.4 = s32[] constant(1)
  %next.4 = s32[] add(s32[] %i.4, s32[] %one.4)
  ROOT %t.4 = (s32[], bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}}, bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}}, bf16[256,512]{BF16_TILE}) tuple(s32[] %next.4, bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}} %ws.4, bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}} %new.4, bf16[256,512]{BF16_TILE} %y.4)
}}

%cond (p.5: (s32[], bf16[4,512,512], bf16[4,256,512], bf16[256,512])) -> pred[] {{
  %p.5 = (s32[], bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}}, bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}}, bf16[256,512]{BF16_TILE}) parameter(0)
  %i.5 = s32[] get-tuple-element(%p.5), index=0
  %n.5 = s32[] constant(4)
  ROOT %lt.5 = pred[] compare(%i.5, %n.5), direction=LT
}}

%sum (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}}

ENTRY %main (x: bf16[256,512], w: bf16[512,1024], u: f32[256,64], v: f32[256,64], c: f32[256,128], ws: bf16[4,512,512], h: bf16[256,512]) -> bf16[256,1024] {{
  %x = bf16[256,512]{BF16_TILE} parameter(0)
  %w = bf16[512,1024]{BF16_TILE} parameter(1)
  %u = f32[256,64]{{1,0:T(8,128)}} parameter(2)
  %v = f32[256,64]{{1,0:T(8,128)}} parameter(3)
  %c = f32[256,128]{{1,0:T(8,128)}} parameter(4)
  %ws = bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}} parameter(5)
  %h = bf16[256,512]{BF16_TILE} parameter(6)
  %acc = bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}} custom-call(), custom_call_target="AllocateBuffer"
  %dot.0 = bf16[256,1024]{BF16_TILE} fusion(bf16[256,512]{BF16_TILE} %x, bf16[512,1024]{BF16_TILE} %w), kind=kOutput, calls=%fused_dot, metadata={{op_name="jit(step)/dot_general" source_file="/x/xlgen/models/layers.py" source_line=7}}
  %add.0 = f32[256,64]{{1,0:T(8,128)}} fusion(f32[256,64]{{1,0:T(8,128)}} %u, f32[256,64]{{1,0:T(8,128)}} %v), kind=kLoop, calls=%fused_add
  %copy.0 = f32[256,128]{{1,0:T(8,128)S(1)}} copy(f32[256,128]{{1,0:T(8,128)}} %c)
  %all-reduce.0 = f32[256,128]{{1,0:T(8,128)}} all-reduce(f32[256,128]{{1,0:T(8,128)S(1)}} %copy.0), replica_groups={{}}, to_apply=%sum
  %third = bf16[256,512]{BF16_TILE} fusion(bf16[256,512]{BF16_TILE} %h, bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}} %ws), kind=kOutput, calls=%fused_third
  %zero = s32[] constant(0)
  %init = (s32[], bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}}, bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}}, bf16[256,512]{BF16_TILE}) tuple(s32[] %zero, bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}} %ws, bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}} %acc, bf16[256,512]{BF16_TILE} %h)
  %while.0 = (s32[], bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}}, bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}}, bf16[256,512]{BF16_TILE}) while((s32[], bf16[4,512,512]{{2,1,0:T(8,128)(2,1)}}, bf16[4,256,512]{{2,1,0:T(8,128)(2,1)}}, bf16[256,512]{BF16_TILE}) %init), condition=%cond, body=%body
  ROOT %out = bf16[256,1024]{BF16_TILE} copy(bf16[256,1024]{BF16_TILE} %dot.0)
}}
"""

# Hand count, bytes per execution (bf16 = 2 bytes, f32 = 4, s32 = 4):
DOT = {"flops": 2 * 256 * 1024 * 512, "bytes": 2 * (256 * 512 + 512 * 1024 + 256 * 1024)}  # x, w read; out written
# f32[256,64] is stored in (8,128) tiles: 256 x 128 elements each, two read and one written
ADD = {"flops": 0, "bytes": 3 * 256 * 128 * 4}
COPY_TO_VMEM = {"flops": 0, "bytes": 256 * 128 * 4}  # read from HBM, written to memory space S(1): no HBM write
OUT_COPY = {"flops": 0, "bytes": 2 * 256 * 1024 * 2}
# h @ ws[2] unrolled: ws[2] read through a nested fusion of a static slice (h, the [512, 512] slice, the output)
THIRD = {"flops": 2 * 256 * 512 * 512, "bytes": 256 * 512 * 2 + 512 * 512 * 2 + 256 * 512 * 2}
# the stacked output `acc` starts as an AllocateBuffer custom call: an uninitialised allocation, no traffic
# the loop body, 4 trips: the layer's weights sliced from the stacked [4, 512, 512] array (the slice, not the
# stack, is read; plus the s32 index) and written; the layer's input written in place into [4, 256, 512] (only
# the update: read once, written once; plus the index); the layer tanh(h @ ws[i]), whose fusion reads ws[i]
# through a nested fusion of the dynamic-slice (as XLA:TPU fuses a scanned layer's weights into its matmul):
# h, the slice and the index read, the output written; the counter's scalar add (two s32 read, one written)
SLICE = {"flops": 0, "bytes": 512 * 512 * 2 + 4 + 512 * 512 * 2}
UPDATE = {"flops": 0, "bytes": 256 * 512 * 2 + 4 + 256 * 512 * 2}
LAYER = {"flops": 2 * 256 * 512 * 512, "bytes": 256 * 512 * 2 + 512 * 512 * 2 + 4 + 256 * 512 * 2}
COUNTER = {"flops": 0, "bytes": 3 * 4}
ONCE = [DOT, ADD, COPY_TO_VMEM, OUT_COPY, THIRD]
PER_TRIP = [SLICE, UPDATE, LAYER, COUNTER]
FLOPS = DOT["flops"] + THIRD["flops"] + 4 * LAYER["flops"]


def _hand_time(peak, bw):
    once = sum(max(o["flops"] / peak, o["bytes"] / bw) for o in ONCE)
    return once + 4 * sum(max(o["flops"] / peak, o["bytes"] / bw) for o in PER_TRIP)


def test_instruction_counts_equal_a_hand_count():
    ops, unknown = roofline.module_ops(HLO)
    assert unknown == 0
    got = sorted((o.flops, o.bytes, o.trips) for o in ops)
    want = sorted([(o["flops"], o["bytes"], 1) for o in ONCE] + [(o["flops"], o["bytes"], 4) for o in PER_TRIP])
    assert got == want  # the all-reduce is communication (xlgen.plan.comm), not in the roofline
    by_name = {o.name: o for o in ops}
    assert by_name["dot.0"].opcode == "fusion:kOutput" and by_name["dot.0"].source == "xlgen/models/layers.py:7"
    assert by_name["y.4"].trips == 4 and by_name["y.4"].opcode == "fusion:kOutput"
    assert by_name["new.4"].op_name == "jit(step)/while/body/dynamic_update_slice" and by_name["new.4"].trips == 4


@pytest.mark.parametrize("chip", ["v3", "v4", "v5e", "v5p"])
def test_roofline_time_is_the_sum_of_per_op_maxima(chip):
    peak = topology.CHIPS[chip].peak_bf16_flops
    bw = topology.CHIPS[chip].hbm_bytes_per_s
    r = roofline.analyse(HLO, peak, bw)
    assert r["roofline_time_s"] == pytest.approx(_hand_time(peak, bw), rel=1e-12)
    assert r["flops"] == FLOPS
    assert r["hbm_bytes"] == sum(o["bytes"] for o in ONCE) + 4 * sum(o["bytes"] for o in PER_TRIP)
    assert r["compute_time_s"] == pytest.approx(FLOPS / peak)
    assert r["memory_time_s"] == pytest.approx(r["hbm_bytes"] / bw)
    # the product does 146 FLOP per HBM byte: compute-bound where peak / bandwidth is below that (v3 137), memory-bound
    # above it (v4 229, v5e 241, v5p 166)
    top = {op["name"]: op for op in r["top_ops"]}
    assert top["dot.0"]["bound"] == ("compute" if chip == "v3" else "memory")
    assert top["add.0"]["bound"] == "memory"
    assert top["new.4"]["trips"] == 4 and top["new.4"]["bytes"] == 4 * UPDATE["bytes"]
    assert r["roofline_time_s"] >= max(r["compute_time_s"], r["memory_time_s"]) * (1 - 1e-12)
    assert r["roofline_time_s"] <= r["compute_time_s"] + r["memory_time_s"]


def test_tile_padding_and_memory_spaces():
    assert roofline.array_bytes("bf16", (8, 64), "1,0:T(8,128)(2,1)") == 8 * 128 * 2
    assert roofline.array_bytes("f32", (3, 5, 130), "2,1,0:T(8,128)") == 3 * 8 * 256 * 4
    # minor-to-major {0,1}: dimension 0 is the minor one, padded to 128
    assert roofline.array_bytes("f32", (100, 8), "0,1:T(8,128)") == 128 * 8 * 4
    assert roofline.array_bytes("f32", (100, 8), None) == 100 * 8 * 4
    assert roofline.array_bytes("f32", (256, 128), "1,0:T(8,128)S(1)") == 0
    assert roofline.type_bytes("(f32[4]{0}, s32[], token[])") == 16 + 4


SCATTER_HLO = """HloModule jit_grad, is_scheduled=true

%add_f32 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

%fused_scatter (param_0: f32[1000,128], param_1: s32[64,1], param_2: f32[64,128]) -> f32[1000,128] {
  %param_0 = f32[1000,128]{1,0:T(8,128)} parameter(0)
  %param_1 = s32[64,1]{1,0:T(8,128)} parameter(1)
  %param_2 = f32[64,128]{1,0:T(8,128)} parameter(2)
  ROOT %scatter.1 = f32[1000,128]{1,0:T(8,128)} scatter(f32[1000,128]{1,0:T(8,128)} %param_0, s32[64,1]{1,0:T(8,128)} %param_1, f32[64,128]{1,0:T(8,128)} %param_2), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add_f32
}

ENTRY %main (table: f32[1000,128], ids: s32[64,1], rows: f32[64,128]) -> f32[1000,128] {
  %table = f32[1000,128]{1,0:T(8,128)} parameter(0)
  %ids = s32[64,1]{1,0:T(8,128)} parameter(1)
  %rows = f32[64,128]{1,0:T(8,128)} parameter(2)
  ROOT %grad = f32[1000,128]{1,0:T(8,128)} fusion(f32[1000,128]{1,0:T(8,128)} %table, s32[64,1]{1,0:T(8,128)} %ids, f32[64,128]{1,0:T(8,128)} %rows), kind=kCustom, calls=%fused_scatter
}
"""


# XLA:TPU's form: the scatter in a fusion of its own, nested in the fusion that computes its updates
NESTED_SCATTER_HLO = (
    SCATTER_HLO.replace(
        "  ROOT %scatter.1 = f32[1000,128]{1,0:T(8,128)} scatter(",
        """  ROOT %scatter.1 = f32[1000,128]{1,0:T(8,128)} fusion(f32[1000,128]{1,0:T(8,128)} %param_0, s32[64,1]{1,0:T(8,128)} %param_1, f32[64,128]{1,0:T(8,128)} %negate.1), kind=kCustom, calls=%inner
}

%inner (p0: f32[1000,128], p1: s32[64,1], p2: f32[64,128]) -> f32[1000,128] {
  %p0 = f32[1000,128]{1,0:T(8,128)} parameter(0)
  %p1 = s32[64,1]{1,0:T(8,128)} parameter(1)
  %p2 = f32[64,128]{1,0:T(8,128)} parameter(2)
  ROOT %scatter.2 = f32[1000,128]{1,0:T(8,128)} scatter(""",
    )
    .replace(
        "%param_0, s32[64,1]{1,0:T(8,128)} %param_1, f32[64,128]{1,0:T(8,128)} %param_2), update",
        "%p0, s32[64,1]{1,0:T(8,128)} %p1, f32[64,128]{1,0:T(8,128)} %p2), update",
    )
    .replace(
        "  %param_2 = f32[64,128]{1,0:T(8,128)} parameter(2)\n",
        "  %param_2 = f32[64,128]{1,0:T(8,128)} parameter(2)\n  %negate.1 = f32[64,128]{1,0:T(8,128)} negate(f32[64,128]{1,0:T(8,128)} %param_2)\n",
    )
)


@pytest.mark.parametrize("hlo", [SCATTER_HLO, NESTED_SCATTER_HLO], ids=["scatter", "nested"])
def test_scatter_moves_only_the_rows_it_updates(hlo):
    """An embedding's gradient, 64 rows added into a [1000, 128] table in place: the indices (s32[64, 1], padded to
    128 lanes) and the updates read, the 64 table rows read and written; the table's other rows not touched."""
    (op,), unknown = roofline.module_ops(hlo)
    assert unknown == 0 and op.name == "grad"
    rows = 64 * 128 * 4
    assert op.bytes == 64 * 128 * 4 + rows + 2 * rows


def test_chip_figures_per_device():
    """HBM bandwidth per JAX device: a v3 chip's 900 GB/s is shared by its two TensorCores (each a device)."""
    for gen, bw in {"v3": 9e11, "v4": 1.2e12, "v5e": 8.19e11, "v5p": 2.765e12}.items():
        assert topology.CHIPS[gen].hbm_bytes_per_s == bw
    t = topology.parse_topology("v3:2x2")

    class Core:
        def __init__(self, i):
            self.id, self.coords = i, (i // 2 % 2, i // 4, 0)

    assert topology.hbm_bytes_per_s_per_device(t, [Core(i) for i in range(8)]) == 4.5e11


def test_batched_dot_written_as_a_dilated_convolution():
    """XLA:TPU writes the batched product `bind,bjnd->bnij` as a convolution whose batch dimensions (b, n) are
    windows of size B over the input dilated by B (as `compiled.as_text()` printed it for [8,512,12,64] x
    [8,1408,12,64] bf16 per v3 core): one tap per output element, so the FLOPs are 2 · b·n·i·j · d, as XLA's own
    cost analysis counts them (8,858,370,048), not 96 times that."""
    lhs, rhs = "bf16[8,512,12,64]{1,3,2,0:T(8,128)(2,1)}", "bf16[8,1408,12,64]{1,3,2,0:T(8,128)(2,1)}"
    out = "bf16[8,12,512,1408]{3,2,1,0:T(8,128)(2,1)}"
    hlo = f"""HloModule jit_f, is_scheduled=true

ENTRY %main (q: bf16[8,512,12,64], k: bf16[8,1408,12,64]) -> bf16[8,12,512,1408] {{
  %q = {lhs} parameter(0)
  %k = {rhs} parameter(1)
  ROOT %conv = {out} convolution({lhs} %q, {rhs} %k), window={{size=8x12 stride=7x11 lhs_dilate=8x12}}, dim_labels=0b1f_0o1i->01bf
}}
"""
    (op,), _ = roofline.module_ops(hlo)
    assert op.flops == 2 * 8 * 12 * 512 * 1408 * 64 == 8_858_370_048
    assert op.bytes == 2 * (8 * 512 * 12 * 64 + 8 * 1408 * 12 * 64 + 8 * 12 * 512 * 1408)


def test_pallas_kernel_counts_its_declared_flops_and_bytes():
    """A Mosaic kernel's contents are not HLO: its custom call counts the FLOPs and bytes of its `pl.CostEstimate`
    (the bytes its pipeline copies, e.g. an input block fetched again per head), at least its operands and result."""
    config = '"custom_call_config":{{"body":"TUxJUgAB","cost_estimate":{{"flops":"{f}","transcendentals":"7","bytes_accessed":"{b}"}}}}'
    kernel = f"""HloModule jit_kernel, is_scheduled=true

ENTRY %main (p0: bf16[256,128], p1: bf16[256,128]) -> bf16[256,128] {{
  %p0 = bf16[256,128]{BF16_TILE} parameter(0)
  %p1 = bf16[256,128]{BF16_TILE} parameter(1)
  ROOT %k = bf16[256,128]{BF16_TILE} custom-call(%p0, %p1), custom_call_target="tpu_custom_call", backend_config={{{{CONFIG}}}}
}}
"""
    arrays = 3 * 256 * 128 * 2
    for flops, moved, nbytes in ((123_000_000, 10_000_000, 10_000_000), (5, 0, arrays)):
        text = kernel.replace("{CONFIG}", config.format(f=flops, b=moved))
        (op,) = roofline.module_ops(text, 1.0, 1.0)[0]
        assert (op.opcode, op.flops, op.bytes) == ("custom-call", flops, nbytes)


# a conditional whose costliest branch depends on the chip: 8 trips of a [128,128] f32 matmul (33.6 MFLOP, 1.6 MB)
# or a 4 MiB copy (8.4 MB): at unit figures (max(FLOPs, bytes)) the loop, at a v4's (229 FLOP per byte) the copy
COND_HLO = """HloModule jit_cond, is_scheduled=true

%dot_body (p.1: (s32[], f32[128,128])) -> (s32[], f32[128,128]) {
  %p.1 = (s32[], f32[128,128]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element((s32[], f32[128,128]{1,0}) %p.1), index=0
  %x.1 = f32[128,128]{1,0} get-tuple-element((s32[], f32[128,128]{1,0}) %p.1), index=1
  %y.1 = f32[128,128]{1,0} dot(f32[128,128]{1,0} %x.1, f32[128,128]{1,0} %x.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %one.1 = s32[] constant(1)
  %next.1 = s32[] add(s32[] %i.1, s32[] %one.1)
  ROOT %t.1 = (s32[], f32[128,128]{1,0}) tuple(s32[] %next.1, f32[128,128]{1,0} %y.1)
}

%dot_cond (p.2: (s32[], f32[128,128])) -> pred[] {
  %p.2 = (s32[], f32[128,128]{1,0}) parameter(0)
  %i.2 = s32[] get-tuple-element((s32[], f32[128,128]{1,0}) %p.2), index=0
  %n.2 = s32[] constant(8)
  ROOT %lt.2 = pred[] compare(s32[] %i.2, s32[] %n.2), direction=LT
}

%matmuls (a.3: f32[128,128]) -> f32[128,128] {
  %a.3 = f32[128,128]{1,0} parameter(0)
  %zero.3 = s32[] constant(0)
  %init.3 = (s32[], f32[128,128]{1,0}) tuple(s32[] %zero.3, f32[128,128]{1,0} %a.3)
  %loop.3 = (s32[], f32[128,128]{1,0}) while((s32[], f32[128,128]{1,0}) %init.3), condition=%dot_cond, body=%dot_body
  ROOT %r.3 = f32[128,128]{1,0} get-tuple-element((s32[], f32[128,128]{1,0}) %loop.3), index=1
}

%copies (b.4: f32[1024,1024]) -> f32[1024,1024] {
  %b.4 = f32[1024,1024]{1,0} parameter(0)
  ROOT %c.4 = f32[1024,1024]{1,0} copy(f32[1024,1024]{1,0} %b.4)
}

ENTRY %main (p: pred[], a: f32[128,128], b: f32[1024,1024]) -> f32[128,128] {
  %p = pred[] parameter(0)
  %a = f32[128,128]{1,0} parameter(1)
  %b = f32[1024,1024]{1,0} parameter(2)
  ROOT %r = f32[128,128]{1,0} conditional(pred[] %p, f32[128,128]{1,0} %a, f32[1024,1024]{1,0} %b), true_computation=%matmuls, false_computation=%copies
}
"""


@pytest.mark.parametrize("hlo", [HLO, COND_HLO], ids=["loop", "conditional"])
def test_one_parse_serves_the_loop_check_and_the_roofline(hlo):
    """`xlgen plan` reads the compiled module once (`measure.analyse_hlo`: one `roofline.parse`, walked for both):
    every walk of it equals a fresh `module_ops`, and its results equal the separate analyses, the loop check
    (`cost_analysis()` counts loop bodies once) at unit figures, where a conditional's branch is chosen by them."""
    peak, bw = topology.CHIPS["v4"].peak_bf16_flops, topology.CHIPS["v4"].hbm_bytes_per_s
    module = roofline.parse(hlo)
    for figures in ((1.0, 1.0), (peak, bw), (1.0, 1.0)):
        assert module.walk(*figures) == roofline.module_ops(hlo, *figures)
    got = measure.analyse_hlo(hlo, 4, has_while=False, peak=peak, hbm_bandwidth=bw)
    assert got["_roofline"] == roofline.analyse(hlo, peak, bw)
    assert comm.summary(got["_collectives"]) == comm.summary(comm.collectives(hlo, 4))
    assert got["loops"] is True  # 4 (HLO) or 8 (COND_HLO, the branch at unit figures) trips of a matmul
    if hlo is COND_HLO:
        (copy,), _ = roofline.module_ops(hlo, peak, bw)  # the chip's costliest branch: the copy, no loop
        assert (copy.name, copy.bytes) == ("c.4", 2 * 1024 * 1024 * 4)
        assert got["_roofline"]["roofline_time_s"] == pytest.approx(copy.bytes / bw)
    no_loop = hlo.replace(" while(", " call(")  # the loop as a call: executed once, nothing hidden from XLA
    assert measure.analyse_hlo(no_loop, 4, has_while=False, peak=peak, hbm_bandwidth=bw)["loops"] is False
    assert measure.analyse_hlo(no_loop, 4, has_while=True, peak=peak, hbm_bandwidth=bw)["loops"] is True
