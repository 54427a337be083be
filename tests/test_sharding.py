"""Mesh sizing and logical-axis rules (xlgen.sharding)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from xlgen import sharding


def test_mesh_shape_fill_and_errors():
    assert sharding.mesh_shape([-1, 1, 1], 8) == (8, 1, 1)
    assert sharding.mesh_shape([2, -1, 2], 8) == (2, 2, 2)
    with pytest.raises(ValueError, match="needs 4 devices, have 8"):
        sharding.mesh_shape([2, 2, 1], 8)
    with pytest.raises(ValueError, match="at most one"):
        sharding.mesh_shape([-1, -1, 1], 8)
    with pytest.raises(ValueError, match="not divisible"):
        sharding.mesh_shape([3, -1, 1], 8)


def test_make_mesh_axis_types_and_num_devices():
    mesh = sharding.make_mesh({"data": 2, "fsdp": -1, "tensor": 2})
    assert mesh.axis_names == ("data", "fsdp", "tensor") and dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert all(t == AxisType.Auto for t in mesh.axis_types)
    one = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1, "num_devices": 1})
    assert one.devices.size == 1 and one.devices.flat[0] == jax.devices()[0]


def test_make_mesh_splits_a_physical_axis_only_when_no_unsplit_layout_exists():
    """data 2 x fsdp 16 over a v6e 4x8 torus needs the 4-long axis split (`jax.make_mesh` refuses it off v5e); a shape
    the torus holds unsplit gets `jax.make_mesh`'s own layout."""
    from xlgen.plan import topology

    v6e = topology.topology_devices("v6e:4x8")
    grid = sharding.make_mesh({"data": 2, "fsdp": 16, "tensor": 1}, v6e).devices
    assert grid.shape == (2, 16, 1) and sorted(d.id for d in grid.flat) == sorted(d.id for d in v6e)
    for name, shape in (("v4:2x2x4", (2, 8, 1)), ("v6e:4x8", (1, 32, 1)), ("v5e:4x8", (2, 16, 1))):
        devices = topology.topology_devices(name)
        ours = sharding.make_mesh(dict(zip(("data", "fsdp", "tensor"), shape)), devices).devices
        assert (ours == jax.make_mesh(shape, sharding.MESH_AXES, devices=devices).devices).all(), name


def test_logical_rules_dedup_divisibility_and_presets():
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    tp = sharding.rules_for("fsdp_tp")
    assert sharding.logical_to_spec(("embed", "heads", "kv"), (64, 4, 16), tp, mesh) == P("fsdp", "tensor", None)
    assert sharding.logical_to_spec(("embed", "embed"), (64, 64), tp, mesh) == P("fsdp", None)  # axis used once
    assert sharding.logical_to_spec(("embed", "heads", "kv"), (64, 3, 16), tp, mesh) == P("fsdp", None, None)
    assert sharding.logical_to_spec(("vocab", "embed"), (74, 64), tp, mesh) == P("tensor", "fsdp")
    assert sharding.logical_to_spec(("vocab", "embed"), (74, 64), sharding.rules_for("dp"), mesh) == P(None, None)
    fsdp = sharding.rules_for("fsdp")
    # fsdp goes where a device's slice pads least in TPU's (8, 128) tiles: [256, 32] -> 256 x 128 elements, [128, 64]
    # -> 128 x 128; the rules' dimension on a tie ([32, 256] and [64, 128]: 8192 each); never the scanned layers
    assert sharding.tiled_size((3, 5, 130)) == 3 * 8 * 256
    assert sharding.logical_to_spec(("mlp", "embed"), (256, 64), fsdp, mesh) == P("fsdp", None)
    assert sharding.logical_to_spec(("embed", "mlp"), (64, 256), fsdp, mesh) == P("fsdp", None)
    assert sharding.logical_to_spec(("layers", "mlp", "embed"), (4, 256, 64), fsdp, mesh) == P(None, "fsdp", None)
    assert sharding.logical_to_spec(("vocab", "embed"), (75, 64), fsdp, mesh) == P(None, "fsdp")  # rows indivisible
    # the rules' dimension indivisible: another that divides (a [68096, 16] cluster over 64 by rows), else whole
    assert sharding.logical_to_spec(("vocab", "embed"), (64, 15), fsdp, mesh) == P("fsdp", None)
    assert sharding.logical_to_spec(("vocab", "embed"), (75, 15), fsdp, mesh) == P(None, None)
    assert sharding.logical_to_spec(("vocab", "embed"), (74, 63), tp, mesh) == P("tensor", None)
    with pytest.raises(ValueError, match="unknown preset"):
        sharding.rules_for("zero3")
    with pytest.raises(ValueError, match="no sharding rule"):
        sharding.logical_to_spec(("banana",), (4,), tp, mesh)


def test_process_rows_single_process():
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    assert sharding.addressable_batch_rows(mesh, 16) == (0, 16)


def test_take_rows_vocabulary_parallel_equals_take():
    """`sharding.take_rows` on a (2, 2, 2) mesh with the `fsdp` rules: a `[32, 8]` table stored by rows over fsdp is
    looked up vocabulary-parallel (a `shard_map`: each device's rows for its fsdp group's ids, summed into its own),
    and equals `jnp.take` in value and in the table's gradient; a table stored otherwise (`dp` rules:
    whole) is a plain take."""
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.normal(size=(32, 8)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, 32, (8, 5)).astype(np.int32)).at[0, :2].set(jnp.asarray([0, 31]))
    weights = jnp.asarray(rng.normal(size=(8, 5, 8)), jnp.float32)

    def loss(fn):
        return jax.jit(jax.value_and_grad(lambda t: jnp.sum(fn(t, ids) * weights)))

    want = loss(lambda t, i: jnp.take(t, i, axis=0))(table)
    for rules, parallel in (("fsdp", True), ("dp", False)):
        with jax.set_mesh(mesh), sharding.activation_rules(rules):
            # fresh functions per rule set: JAX caches traces by function, and the rules are not part of the key
            jaxpr = str(jax.make_jaxpr(lambda t, i: sharding.take_rows(t, i))(table, ids))
            got = loss(lambda t, i: sharding.take_rows(t, i))(table)
        assert ("shard_map" in jaxpr) == parallel, rules
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-6)
        with jax.set_mesh(mesh), sharding.activation_rules(rules):
            looked_up = jax.jit(lambda t, i: sharding.take_rows(t, i))(table, ids)
            np.testing.assert_array_equal(looked_up, jnp.take(table, ids, axis=0))
            rounded = jax.jit(lambda t, i: sharding.take_rows(t, i, jnp.bfloat16))(table, ids)  # summed in bfloat16
            assert rounded.dtype == jnp.bfloat16
            np.testing.assert_array_equal(rounded, jnp.take(table, ids, axis=0).astype(jnp.bfloat16))
