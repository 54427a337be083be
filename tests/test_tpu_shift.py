"""The relative shift lowered for TPU (`xlgen.models.tpu_shift`): a Pallas kernel rotating each row in VMEM.

* The kernel (run through JAX, `interpret=True`) equals the XLA shift at every entry whose source exists, bitwise,
  and its derivative is the shift's transpose, for every relative-position kind, strides, bfloat16, and the widths
  it pads in VMEM or in XLA.
* A train step traced for TPU (`operands.emulate_tpu`: the TPU forms, kernels interpreted) gives the loss and
  gradients of the CPU program for Transformer-XL, XLNet and Funnel (`relative_shift`): every caller masks the
  entries without a source.
* Compiled for TPU v3 (libtpu), the shift is one kernel reading the scores once and writing the result once (the
  XLA form moved ~20x those bytes through copy loops).
"""

import contextlib
import functools
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_remat_precision import _CPU_FAST, _batch_and_mems, _grad_fn, _program

from xlgen.models import operands, tpu_shift
from xlgen.models import relative_attention as ra


def _sources(q, r, klen, offset, stride):
    i, j = np.arange(q)[:, None], np.arange(klen)[None]
    src = offset - stride * i + j
    return src, (src >= 0) & (src < r)


@pytest.mark.parametrize(
    "q,r,klen,offset,stride,dtype",
    [
        (32, 64, 64, 31, 1, "float32"),  # Transformer-XL: r = klen, the causal triangle has no source
        (32, 97, 96, 32, 1, "float32"),  # XLNet "uni": r = klen + 1 (padded in XLA: not a multiple of 128)
        (32, 160, 128, 32, 1, "float32"),  # XLNet "bi": r = klen + q (the cotangent padded in VMEM)
        (32, 384, 256, 64, 2, "bfloat16"),  # Funnel's pooled queries, bfloat16 scores
        (48, 248, 200, 48, 1, "float32"),
        (1, 41, 40, 1, 1, "float32"),  # one query (generation)
    ],
)
def test_kernel_equals_the_shift_and_its_transpose(q, r, klen, offset, stride, dtype):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, 3, q, r)), dtype)
    _, valid = _sources(q, r, klen, offset, stride)
    xla = functools.partial(ra.relative_shift, klen=klen, offset=offset, stride=stride)
    kernel = functools.partial(tpu_shift.relative_shift, klen=klen, offset=offset, stride=stride, interpret=True)
    assert tpu_shift.applies(x.shape, klen)
    cotangent = jnp.asarray(np.where(valid, rng.normal(size=(2, 3, q, klen)), 0), dtype)  # callers mask the rest

    @jax.jit
    def shifts_and_transposes(x, cotangent):  # both forms in one compiled program
        out = {}
        for name, f in (("xla", xla), ("kernel", kernel)):
            y, vjp = jax.vjp(f, x)
            out[name] = (y, vjp(cotangent)[0])
        return out

    out = shifts_and_transposes(x, cotangent)
    (want, want_t), (got, got_t) = out["xla"], out["kernel"]
    assert got.shape == want.shape == cotangent.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(
        np.where(valid, np.asarray(got, np.float32), 0), np.where(valid, np.asarray(want, np.float32), 0)
    )
    np.testing.assert_array_equal(np.asarray(got_t), np.asarray(want_t))


def test_roll_rows_definition():
    """y[i, j] = x[i, (j - a_i) mod W] with a_i = start + step * i, over blocks of rows."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 256)).astype(np.float32)
    got = np.asarray(tpu_shift.roll_rows(jnp.asarray(x), width=256, start=5, step=-3, out_width=128, interpret=True))
    for i, j in itertools.product(range(64), range(128)):
        assert got[i, j] == x[i, (j - (5 - 3 * i)) % 256]


def test_block_rows():
    assert tpu_shift.block_rows(768, 1536) == 256  # 256 x 1536 float32 = 1.5 MiB
    assert tpu_shift.block_rows(512, 2048) == 256
    assert tpu_shift.block_rows(100, 512) == 100  # the whole dimension
    assert tpu_shift.block_rows(8, 1024) == 8
    assert tpu_shift.block_rows(1000, 4096) == 0  # no multiple of 16 divides 1000 within 2 MiB: the XLA shift
    assert not tpu_shift.applies((2, 1000, 4000), 4000)


@pytest.mark.parametrize(
    "config_file,over",
    [
        # attention dropout on as in test_tpu_attention's sharded steps: their one-device CPU programs are these
        ("txl_tiny.py", {"model.dropatt": 0.1}),
        pytest.param("xlnet_tiny.py", {"model.dropatt": 0.1}, marks=pytest.mark.slow),
        ("funnel_tiny.py", {"model.attention_type": "relative_shift"}),
        ("funnel_tiny.py", {"model.dropatt": 0.1, "model.attention_type": "factorized"}),
    ],
)
def test_train_step_traced_for_tpu_equals_the_cpu_program(config_file, over):
    """Loss and gradients of a float32 train step (dropout on) with the TPU forms equal the CPU program's."""
    jaxpr = assert_tpu_forms_give_the_cpu_step(config_file, over)["tpu"]
    assert "pallas_call" in jaxpr
    # every family attends through the fused kernels (forward and backward: one cost estimate per query length;
    # XLNet's content and query streams, Funnel's full-length and pooled layers); the adaptive softmax's kernels
    # (`logsumexp_*`) apart
    kernels = re.findall(r"cost_estimate=CostEstimate\(flops=(\d+).*?\bname=(\w+)", jaxpr, re.S)
    fused = {flops for flops, name in kernels if not name.startswith("logsumexp")}
    assert len(fused) == {"txl_tiny.py": 2, "xlnet_tiny.py": 4, "funnel_tiny.py": 4}[config_file], fused


def assert_tpu_forms_give_the_cpu_step(config_file, over, tpu_mesh=None) -> dict:
    """Asserts that a float32 train step (no remat, dropout on) traced with the TPU forms (`operands.emulate_tpu`,
    the kernels interpreted) gives the loss and gradients of the CPU program (one device; the TPU-traced step on the
    mesh of the `tpu_mesh` overrides if given); returns the traced steps' jaxprs (text), by platform."""
    over = {"model.remat": "none", **over}
    programs = {"cpu": _program(config_file, over)}
    programs["tpu"] = programs["cpu"] if tpu_mesh is None else _program(config_file, {**over, **tpu_mesh})
    results, jaxprs, inputs = {}, {}, {}
    for platform, (program, mesh) in programs.items():
        with jax.set_mesh(mesh):
            if id(program) not in inputs:
                inputs[id(program)] = (program.init_state()[0]["params"], *_batch_and_mems(program))
            with operands.emulate_tpu() if platform == "tpu" else contextlib.nullcontext():
                traced = _grad_fn(program).trace(*inputs[id(program)])
            jaxprs[platform] = str(traced.jaxpr)
            compiled = traced.lower().compile(compiler_options=_CPU_FAST)
            results[platform] = jax.tree.map(np.asarray, compiled(*inputs[id(program)]))
    assert "pallas_call" not in jaxprs["cpu"]
    (loss_cpu, g_cpu), (loss_tpu, g_tpu) = results["cpu"], results["tpu"]
    assert np.isfinite(loss_cpu)
    np.testing.assert_allclose(loss_tpu, loss_cpu, rtol=1e-6)
    for name in g_cpu:
        np.testing.assert_allclose(g_tpu[name], g_cpu[name], rtol=1e-5, atol=1e-6, err_msg=name)
    return jaxprs


def test_compiled_for_tpu_the_shift_reads_and_writes_once():
    """v3 per-core shapes of Transformer-XL enwik8-large's position scores (`[2, 8, 768, 1536]` bfloat16): forward
    and backward are one custom call each, their HBM bytes those of reading the input and writing the output."""
    from xlgen.plan import topology

    if not topology.libtpu_available():
        pytest.skip("libtpu (the `tpu` extra) compiles for TPU")
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from xlgen.plan import roofline

    mesh = jax.sharding.Mesh(topology.topology_devices("v3:2x2")[:1], ("data",))
    b, n, q, k = 2, 8, 768, 1536
    x = jax.ShapeDtypeStruct((b, n, q, k), jnp.bfloat16, sharding=NamedSharding(mesh, P()))

    def step(x):
        y, vjp = jax.vjp(lambda x: ra.relative_shift(x, klen=k, offset=q - 1), x)
        return vjp(y)[0]

    with jax.set_mesh(mesh):
        hlo = jax.jit(step).lower(x).compile().as_text()
    ops = [op for op in roofline.module_ops(hlo)[0] if op.bytes]
    assert [op.opcode for op in ops] == ["custom-call", "custom-call"]
    assert all(op.bytes == 2 * (b * n * q * k * 2) for op in ops)  # read [b,n,q,k] bf16, write [b,n,q,k] bf16


def test_shared_position_keys_are_shifted_heads_major():
    """Keys shared by the batch: for TPU the product is shifted in the `[n, b, q, r]` order XLA:TPU emits it
    (`operands.heads_major_position_scores`), with the values and gradients of the XLA form (the layout copies it
    saves are measured by `xlgen plan`, docs/pod_scale.md)."""
    rng = np.random.default_rng(3)
    b, q, n, d, klen = 2, 32, 4, 16, 64
    qh = jnp.asarray(rng.normal(size=(b, q, n, d)), jnp.float32)
    keys = jnp.asarray(rng.normal(size=(klen, n, d)), jnp.float32)
    bias = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
    _, valid = _sources(q, klen, klen, q - 1, 1)
    ct = jnp.asarray(np.where(valid, rng.normal(size=(b, n, q, klen)), 0), jnp.float32)

    def loss(qh, keys):
        return jnp.sum(ra.position_scores(qh, keys, bias, klen=klen, offset=q - 1) * ct)

    assert operands.heads_major_position_scores(qh, keys, klen=klen, offset=q - 1, stride=1) is None  # CPU
    want = jax.value_and_grad(loss, argnums=(0, 1))(qh, keys)
    with operands.emulate_tpu():
        got = jax.value_and_grad(loss, argnums=(0, 1))(qh, keys)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
