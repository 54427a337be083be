"""The adaptive softmax's log-normaliser as Pallas kernels for TPU (`xlgen.models.tpu_logsumexp`):

* The kernels (run through JAX, `interpret=True`) equal the XLA form of `adaptive_softmax.logsumexp_rows`, values
  and gradients (dh, dtable, dbias), for vocabularies and row counts that are not multiples of the blocks, float32
  and bfloat16; with targets, the target log-probabilities of `adaptive_softmax.target_log_probs`.
* A Transformer-XL train step with an adaptive softmax traced for TPU (`operands.emulate_tpu`) gives the loss and
  gradients of the CPU program; the CPU program has no kernel.
* Compiled for TPU v3 (libtpu), forward and backward are one custom call each and the HBM bytes are those of the
  table, its gradient and the rows, against the logits blocks the XLA form writes and reads back.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_tpu_shift import assert_tpu_forms_give_the_cpu_step

from xlgen.models import adaptive_softmax as asm
from xlgen.models import operands, tpu_logsumexp


def _case(n, v, d, dtype, seed=0):
    rng = np.random.default_rng(seed)
    h = jnp.asarray(rng.normal(size=(n, d)), dtype)
    table = jnp.asarray(rng.normal(size=(v, d)) * 0.3, jnp.float32)
    bias = jnp.asarray(rng.normal(size=(v,)), jnp.float32)
    g = jnp.asarray(rng.normal(size=(n,)), jnp.float32)
    return h, table, bias, g


@pytest.mark.parametrize(
    "n,v,d,dtype,vocab_block,xla_block",
    [
        (40, 300, 16, jnp.float32, 1024, 32768),  # one vocabulary block, one row block
        (300, 1000, 64, jnp.float32, 256, 384),  # 2 row blocks (the second padded), 4 vocabulary blocks (last: 232)
        (70, 2100, 32, jnp.bfloat16, 1024, 512),  # bfloat16 rows, 3 vocabulary blocks (last: 52)
        (16, 129, 128, jnp.bfloat16, 128, 32768),  # last vocabulary block of one entry
        (100, 700, 256, jnp.float32, 256, 32768),  # 3 vocabulary blocks (last: 188)
    ],
)
def test_kernels_equal_the_xla_logsumexp(monkeypatch, n, v, d, dtype, vocab_block, xla_block):
    monkeypatch.setattr(tpu_logsumexp, "VOCAB_BLOCK", vocab_block)
    h, table, bias, g = _case(n, v, d, dtype)
    target = jnp.asarray(np.random.default_rng(1).integers(0, v, n)).at[:2].set(jnp.asarray([0, v - 1]))

    @jax.jit
    def values_and_grads(h, table, bias):
        """Each form's values and the gradients of <values, g> (dh, dtable, dbias): the log-normaliser, and with
        targets the target log-probabilities; one compiled program."""
        forms = {
            "xla": lambda h, t, b: asm.logsumexp_rows(h, t, b, block=xla_block),
            "kernel": lambda h, t, b: tpu_logsumexp.logsumexp_rows(h, t, b, interpret=True),
            "xla_lp": lambda h, t, b: asm.target_log_probs(h, t, b, target, block=xla_block),
            "kernel_lp": lambda h, t, b: -tpu_logsumexp.nll_rows(h, t, b, target, interpret=True),
        }
        out = {}
        for name, fn in forms.items():

            def loss(h, t, b, fn=fn):
                value = fn(h, t, b)
                return jnp.sum(value * g), value

            (_, value), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(h, table, bias)
            out[name] = (value, grads)
        return out

    got = values_and_grads(h, table, bias)
    # float32: the same sums in another order; bfloat16 rows: dh rounded to bfloat16 (one ulp), the XLA form's
    # backward products take the float32 softmax against bfloat16 operands as the kernel does
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == jnp.float32 else dict(rtol=1e-2, atol=1e-2)
    # the log-normaliser; with targets (every vocabulary block's, the first and last entries among them): the
    # kernels' log-normaliser minus target logit equals the XLA form's gathered target rows minus its log-normaliser
    value_tol = {"kernel": dict(rtol=1e-6, atol=2e-6), "kernel_lp": dict(rtol=1e-5, atol=2e-5)}
    for kernel, xla in (("kernel", "xla"), ("kernel_lp", "xla_lp")):
        (value, grads), (want_value, want_grads) = got[kernel], got[xla]
        np.testing.assert_allclose(value, want_value, **value_tol[kernel])
        for name, a, b in zip(("dh", "dtable", "dbias"), grads, want_grads):
            assert a.dtype == b.dtype, name
            np.testing.assert_allclose(
                np.asarray(a, np.float32), np.asarray(b, np.float32), err_msg=f"{kernel} {name}", **tol
            )


def test_blocks():
    assert tpu_logsumexp.row_blocks(768) == (768, 256)
    assert tpu_logsumexp.row_blocks(70) == (80, 80)
    assert tpu_logsumexp.vocab_block(160000, 64) == 1024
    assert tpu_logsumexp.vocab_block(20003, 1024) == 256  # 1 MiB of float32 table per block
    assert tpu_logsumexp.vocab_block(300, 16) == 300  # one block: the whole vocabulary
    assert tpu_logsumexp.applies(256, 256, jnp.bfloat16)
    assert not tpu_logsumexp.applies(49152, 1024, jnp.bfloat16)  # WikiText-103's head over the global batch


def test_dense_tail_clusters_equal_the_chunked_ones():
    """For TPU every tail cluster runs once over all of a device's tokens (`operands.dense_tail_clusters`); the
    adaptive softmax's NLL and its gradients (rows and every weight) equal the CPU program's chunked tails (chunks of
    4 tokens: several per cluster), ignored labels included."""
    from flax import nnx

    rng = np.random.default_rng(5)
    n, vocab, cutoffs, d = 37, 60, (20, 40), 16
    emb = asm.AdaptiveEmbedding(vocab, d, d, cutoffs, 2, rngs=nnx.Rngs(0))
    softmax = asm.AdaptiveLogSoftmax(
        vocab, d, d, cutoffs, 2, tie_projs=(False, True, True), chunk_size=4, rngs=nnx.Rngs(1)
    )
    graph, state = nnx.split((emb, softmax))
    h = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
    labels = jnp.asarray(rng.integers(-1, vocab, size=n), jnp.int32)

    def loss(state, h):
        e, s = nnx.merge(graph, state)
        return jnp.sum(s.nll(h, labels, e) * jnp.linspace(0.5, 1.5, n))

    assert not operands.dense_tail_clusters(n, (8, 4), jnp.float32)
    want = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(state, h)  # (traced here: the CPU form)
    with operands.emulate_tpu():
        assert operands.dense_tail_clusters(n, (8, 4), jnp.float32)
        got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(state, h)  # (traced here: the TPU form)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_adaptive_train_step_traced_for_tpu_equals_the_cpu_program():
    """Transformer-XL with an adaptive softmax (div_val 2: every tail its own width and projection), float32, dropout
    on: the loss and gradients with the TPU forms (both kernels interpreted) equal the CPU program's."""
    jaxprs = assert_tpu_forms_give_the_cpu_step("txl_tiny.py", {"model.cutoffs": "(20, 40)", "model.div_val": 2})
    assert "pallas_call" not in jaxprs["cpu"]
    kernels = re.findall(r"\bname=(logsumexp_forward|logsumexp_backward)\b", jaxprs["tpu"])
    assert len(kernels) >= 6, kernels  # the head's and the two tails' logsumexp, forward and backward


def test_compiled_for_tpu_the_logits_stay_in_vmem(monkeypatch):
    """A tail cluster at v3 per-core shapes (a chunk of 256 bfloat16 rows, as WikiText-103 large's; a 160,000-entry
    table of width 128, whose `[V, d]` layout XLA keeps as it is): forward and backward are one custom call each,
    moving the table twice, its gradient and the rows once; the XLA form moves ~6.5x those bytes (its `[256, block]`
    float32 logits written and read back in both passes)."""
    from xlgen.plan import topology

    if not topology.libtpu_available():
        pytest.skip("libtpu (the `tpu` extra) compiles for TPU")
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from xlgen.plan import roofline

    mesh = jax.sharding.Mesh(topology.topology_devices("v3:2x2")[:1], ("data",))
    n, v, d = 256, 160000, 128
    shapes = (((n, d), jnp.bfloat16), ((v, d), jnp.float32), ((v,), jnp.float32), ((n,), jnp.float32))
    args = [jax.ShapeDtypeStruct(s, t, sharding=NamedSharding(mesh, P())) for s, t in shapes]

    def step(h, table, bias, g):
        lse, vjp = jax.vjp(lambda *a: asm.logsumexp_rows(*a, block=32768), h, table, bias)
        return lse, vjp(g)

    def hbm(hlo):
        ops = [op for op in roofline.module_ops(hlo)[0] if op.bytes]
        return ops, sum(op.bytes * op.trips for op in ops)

    with jax.set_mesh(mesh):
        kernel_ops, kernel_bytes = hbm(jax.jit(step).lower(*args).compile().as_text())
        monkeypatch.setattr(operands, "fused_logsumexp_rows", lambda *a: None)
        _, xla_bytes = hbm(jax.jit(lambda *a: step(*a)).lower(*args).compile().as_text())  # (a new trace)
    calls = [op for op in kernel_ops if op.opcode == "custom-call"]
    assert sorted(op.flops for op in calls) == [2 * n * v * d, 6 * n * v * d]  # the roofline reads the estimates
    table = v * d * 4
    assert kernel_bytes < 3 * table + 12e6  # the table read twice, its gradient written; rows, bias: < 12 MB
    assert xla_bytes > 6 * kernel_bytes
    print(f"HBM bytes per step: XLA form {xla_bytes / 1e6:.1f} MB, kernels {kernel_bytes / 1e6:.1f} MB")
