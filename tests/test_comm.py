"""Communication accounting (`xlgen.plan.comm`) and the logical activation constraints (`xlgen.sharding.constrain`).

CPU only: programs compiled for the 8 simulated host devices; the TPU-topology plans of the three families are in
tests/test_pod_comm.py.
"""

import glob
import os
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from xlgen import sharding
from xlgen.plan import comm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mesh(data, fsdp, tensor):
    return sharding.make_mesh({"data": data, "fsdp": fsdp, "tensor": tensor})


def test_collectives_in_a_scanned_loop_count_once_per_trip_with_ring_bytes():
    """A weight sharded over fsdp=4 is all-gathered in each of the 3 trips of a scan: 3 executions of
    16 KiB * 3/4 each; the scalar loss all-reduce outside the loop runs once."""
    mesh = _mesh(2, 4, 1)

    def f(x, w):
        return jax.lax.scan(lambda h, wl: (jnp.tanh(h @ wl), None), x, w)[0].sum()

    x = jax.ShapeDtypeStruct((8, 64), jnp.float32, sharding=NamedSharding(mesh, P(("data", "fsdp"), None)))
    w = jax.ShapeDtypeStruct((3, 64, 64), jnp.float32, sharding=NamedSharding(mesh, P(None, "fsdp", None)))
    with jax.set_mesh(mesh):
        hlo = jax.jit(f).lower(x, w).compile().as_text()
    found = comm.collectives(hlo, 8)
    s = comm.summary(found)
    assert s["all-gather"] == {"count": 3, "bytes": 3 * 64 * 64 * 4 * 3 / 4}
    assert s["all-reduce"]["count"] == 1 and s["all-reduce"]["bytes"] == pytest.approx(2 * 4 * 7 / 8)
    (gather,) = [c for c in found["list"] if c.kind == "all-gather"]
    assert gather.in_loop and gather.trips == 3 and gather.group == 4
    assert found["unknown_trip_counts"] == 0


def test_hlo_parser_handles_async_tuple_and_replica_group_forms():
    hlo = """HloModule m

%body (p: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %p = (s32[], f32[4,8]) parameter(0)
  %ags = (f32[1,8]{1,0}, f32[4,8]{1,0}) all-gather-start(%x), replica_groups=[2,4]<=[8], dimensions={0}
  %agd = f32[4,8]{1,0} all-gather-done(%ags)
  %ar = (bf16[16]{0}, f32[2]{0}) all-reduce(%a, %b), replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add
  %rs = f32[2,8]{1,0} reduce-scatter(%y), replica_groups={}, dimensions={0}, to_apply=%add
  ROOT %t = (s32[], f32[4,8]) tuple(%i, %agd)
}

%cond (p: (s32[], f32[4,8])) -> pred[] {
  %p = (s32[], f32[4,8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %c = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

ENTRY %main (a: f32[4,8]) -> f32[4,8] {
  %w = (s32[], f32[4,8]) while(%t0), condition=%cond, body=%body
  %cp = f32[4,8]{1,0} collective-permute(%a), source_target_pairs={{0,1},{1,0}}
  ROOT %o = f32[4,8] get-tuple-element(%w), index=1
}
"""
    found = comm.collectives(hlo, 8)
    s = comm.summary(found)
    assert s["all-gather"] == {"count": 5, "bytes": 5 * 128 * 3 / 4}  # async start: gathered result, group 4
    assert s["all-reduce"] == {"count": 5, "bytes": 5 * 2 * (32 + 8) * 1 / 2}  # tuple summed, group 2
    assert s["reduce-scatter"] == {"count": 5, "bytes": 5 * 64 * 7}  # replica_groups={} = all 8 devices
    assert s["collective-permute"] == {"count": 1, "bytes": 128}
    assert found["bytes_per_device"] == pytest.approx(sum(v["bytes"] for v in s.values()))


# XLA:TPU's form of a gradient's reduce-scatter: an all-reduce fused with the slice of each device's rows
ALL_REDUCE_SCATTER_HLO = """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%all-reduce-scatter.1 (input_0: bf16[1024,256], input_1: bf16[1024,128]) -> (bf16[256,256], bf16[256,128]) {
  %input_0 = bf16[1024,256]{1,0:T(8,128)(2,1)} parameter(0)
  %input_1 = bf16[1024,128]{1,0:T(8,128)(2,1)} parameter(1)
  %all-reduce.1 = (bf16[1024,256]{1,0:T(8,128)(2,1)}, bf16[1024,128]{1,0:T(8,128)(2,1)}) all-reduce(%input_0, %input_1), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
  %get-tuple-element.1 = bf16[1024,256]{1,0:T(8,128)(2,1)} get-tuple-element(%all-reduce.1), index=0
  %offset = u32[] partition-id()
  %zero = u32[] constant(0)
  %dynamic-slice.1 = bf16[256,256]{1,0:T(8,128)(2,1)} dynamic-slice(%get-tuple-element.1, %offset, %zero), dynamic_slice_sizes={256,256}
  %get-tuple-element.2 = bf16[1024,128]{1,0:T(8,128)(2,1)} get-tuple-element(%all-reduce.1), index=1
  %dynamic-slice.2 = bf16[256,128]{1,0:T(8,128)(2,1)} dynamic-slice(%get-tuple-element.2, %offset, %zero), dynamic_slice_sizes={256,128}
  ROOT %tuple.1 = (bf16[256,256]{1,0:T(8,128)(2,1)}, bf16[256,128]{1,0:T(8,128)(2,1)}) tuple(%dynamic-slice.1, %dynamic-slice.2)
}

ENTRY %main (g0: bf16[1024,256], g1: bf16[1024,128]) -> (bf16[256,256], bf16[256,128]) {
  %g0 = bf16[1024,256]{1,0:T(8,128)(2,1)} parameter(0)
  %g1 = bf16[1024,128]{1,0:T(8,128)(2,1)} parameter(1)
  ROOT %fusion.1 = (bf16[256,256]{1,0:T(8,128)(2,1)}, bf16[256,128]{1,0:T(8,128)(2,1)}) fusion(%g0, %g1), kind=kCustom, calls=%all-reduce-scatter.1
}
"""


def test_all_reduce_scatter_fusion_is_a_reduce_scatter_and_not_in_the_roofline():
    """Each of the 4 devices of a group receives its quarter of the summed gradients: (g - 1) · buf / g bytes,
    buf = 1024 · 384 bf16; the fusion's HBM traffic belongs to the collective, not to the roofline's kernels."""
    from xlgen.plan import roofline

    s = comm.summary(comm.collectives(ALL_REDUCE_SCATTER_HLO, 8))
    assert s["reduce-scatter"] == {"count": 1, "bytes": 1024 * 384 * 2 * 3 / 4}
    assert s["all-reduce"] == {"count": 0, "bytes": 0.0}
    assert roofline.module_ops(ALL_REDUCE_SCATTER_HLO) == ([], 0)


def test_ideal_fsdp_bytes():
    shapes = {"w": (64, 32), "ln": (64,)}
    specs = {"w": P("fsdp", None), "ln": P(None)}
    ideal = comm.ideal_fsdp_bytes(shapes, specs, {"data": 2, "fsdp": 4, "tensor": 1}, remat=True)
    w, ln = 64 * 32 * 4, 64 * 4
    assert ideal["param_all_gather"] == 3 * w * 3 / 4
    assert ideal["grad_reduce_scatter"] == w * 3 / 4
    assert ideal["grad_all_reduce"] == 2 * (w / 4) * 1 / 2 + 2 * ln * 7 / 8
    no_remat = comm.ideal_fsdp_bytes(shapes, specs, {"data": 2, "fsdp": 4, "tensor": 1}, remat=False)
    assert no_remat["param_all_gather"] == 2 * w * 3 / 4


@pytest.mark.parametrize("preset", ["dp", "fsdp", "fsdp_tp"])
def test_activation_names_map_through_every_preset(preset):
    rules = sharding.rules_for(preset)
    mesh = _mesh(2, 2, 2)
    names = ("activation_batch", "activation_heads", "activation_length", "activation_kv_length")
    spec = sharding.activation_spec(names, (8, 4, 16, 16), rules, mesh)
    assert spec == P(("data", "fsdp"), "tensor" if preset == "fsdp_tp" else None, None, None)
    # divisibility fallback: 3 heads cannot split 2 ways, 2 rows split over data only
    assert sharding.activation_spec(names, (2, 3, 16, 16), rules, mesh) == P("data", None, None, None)
    mlp = sharding.activation_spec(("activation_batch", "activation_length", "activation_mlp"), (4, 8, 64), rules, mesh)
    assert mlp == P(("data", "fsdp"), None, "tensor" if preset == "fsdp_tp" else None)
    with pytest.raises(ValueError, match="no sharding rule"):
        sharding.activation_spec(("activation_nonsense",), (4,), rules, mesh)


def test_constrain_is_a_no_op_outside_a_mesh_and_follows_the_active_rules_inside():
    x = jnp.ones((8, 4, 16))
    names = ("activation_batch", "activation_heads", "activation_length")
    assert sharding.constrain(x, names) is x  # no mesh: untouched (one device, from_pretrained)
    mesh = _mesh(2, 2, 2)

    def shard_of(preset):
        def f(x):
            with sharding.activation_rules(preset):
                return sharding.constrain(x * 2, names)

        with jax.set_mesh(mesh):
            return jax.jit(f)(x).sharding

    def same(sh, spec):
        return sh.is_equivalent_to(NamedSharding(mesh, spec), x.ndim)

    assert same(shard_of("fsdp_tp"), P(("data", "fsdp"), "tensor", None))
    assert same(shard_of("fsdp"), P(("data", "fsdp"), None, None))
    assert not same(shard_of("fsdp"), P(("data", "fsdp"), "tensor", None))
    with jax.set_mesh(mesh):  # no active rules: batch-only mapping
        assert same(jax.jit(lambda x: sharding.constrain(x * 2, names))(x).sharding, P(("data", "fsdp"), None, None))


def test_model_files_name_no_mesh_axis():
    """Models name logical axes only; the rule presets in xlgen/sharding.py say which mesh axes carry them."""
    files = glob.glob(os.path.join(ROOT, "xlgen", "models", "**", "*.py"), recursive=True)
    assert files
    for path in files:
        text = open(path).read()
        for axis in sharding.MESH_AXES:
            assert not re.search(rf"[\"']{axis}[\"']", text), f"{path} names the mesh axis {axis!r}"
