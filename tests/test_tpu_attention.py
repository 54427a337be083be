"""The fused relative-attention kernel for TPU (`xlgen.models.tpu_attention`), run through JAX (`interpret=True`),
against the XLA form of the same equation: outputs and every input's gradient."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlgen.models import layers, tpu_attention
from xlgen.models import relative_attention as ra
from xlgen.models.relative_attention import MASK_VALUE, relative_shift


def reference(q, u, vb, k, v, r, *, shift, scale, ef=None, flags=None, masks=False, dropout=None):
    """The XLA form: scores `[b,n,q,k]` through `relative_shift` (or per-row windows), float32 softmax; qu = q + u,
    qv = q + vb (biases `[n, d]`)."""
    qu, qv = q + u[:, None], q + vb[:, None]
    b, n, q, _ = qu.shape
    klen, rlen = k.shape[2], r.shape[2]
    s = jnp.einsum("bnqd,bnkd->bnqk", qu, k)
    raw = jnp.einsum("bnqd,bnrd->bnqr", qv, jnp.broadcast_to(r, (b,) + r.shape[1:]))
    if shift.starts is None:
        pos = relative_shift(raw, klen=klen, offset=shift.offset, stride=shift.stride)
    else:
        idx = jnp.clip(shift.starts[:, None, :, None] + jnp.arange(klen), 0, rlen - 1)
        pos = jnp.take_along_axis(raw, jnp.broadcast_to(idx, (b, n, q, klen)), axis=-1)
    s = s + pos
    if ef is not None:
        s = s + jnp.where((flags[:, None] & 2) != 0, ef[..., 1:2], ef[..., 0:1])
    s = s * scale
    if masks:
        s = jnp.where((flags[:, None] & 1) != 0, MASK_VALUE, s)
    p = jax.nn.softmax(s, axis=-1)
    if dropout is not None:
        seed, keep_prob = dropout
        keep = layers.hashed_bits(seed, p.shape) < jnp.uint32(min(int(round(keep_prob * 2.0**32)), 2**32 - 1))
        p = jnp.where(keep, p / keep_prob, 0.0)
    return jnp.einsum("bnqk,bnkd->bnqd", p, v)


def merged(x):
    """`[b, n, l, d]` -> the kernel's token-major `[b, l, n·d]`."""
    b, n, l, d = x.shape
    return jnp.swapaxes(x, 1, 2).reshape(b, l, n * d)


def kernel(q, u, vb, k, v, r=None, memory_rows=0, **kw):
    """`tpu_attention.relative_attention` (interpreted) on heads-major operands: `[b, n, q, d]` out; the first
    `memory_rows` keys and values given apart (`memory`)."""
    b, n, qlen, d = q.shape
    r = None if r is None else merged(r)  # with kw["directions"]: [2, n, rlen, d] -> [2, rlen, n·d]
    k, v = merged(k), merged(v)
    if memory_rows:
        kw["memory"] = (k[:, :memory_rows], v[:, :memory_rows])
        k, v = k[:, memory_rows:], v[:, memory_rows:]
    out = tpu_attention.relative_attention(merged(q), u, vb, k, v, r, interpret=True, **kw)
    return jnp.swapaxes(out.reshape(b, qlen, n, d), 1, 2)


def _inputs(seed, b, n, q, klen, rlen, d, shared_r, segments, mask_rows):
    keys = jax.random.split(jax.random.key(seed), 8)
    normal = lambda key, shape: jax.random.normal(key, shape, jnp.float32)
    args = dict(
        q=normal(keys[0], (b, n, q, d)),
        u=normal(keys[1], (n, d)),
        vb=normal(jax.random.fold_in(keys[1], 1), (n, d)),
        k=normal(keys[2], (b, n, klen, d)),
        v=normal(keys[3], (b, n, klen, d)),
        r=normal(keys[4], (1 if shared_r else b, n, rlen, d)),
    )
    masked = jax.random.bernoulli(keys[5], 0.3, (mask_rows, q, klen))
    flags = masked.astype(jnp.int8)
    if segments:
        args["ef"] = normal(keys[6], (b, n, q, 2))
        different = jax.random.bernoulli(keys[7], 0.5, (mask_rows, q, klen))
        flags = flags | (different.astype(jnp.int8) * 2)
    return args, flags


def _output_and_grads(f, xs, cot=None):
    """f(*xs) and the gradients of <f(*xs), cot> (cot: all ones if None) with respect to every x, from ONE compiled
    program (eagerly, each call and its VJP dispatched op by op cost several times more)."""

    def loss(*xs):
        out = f(*xs)
        return jnp.vdot(out, jnp.ones_like(out) if cot is None else cot), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(xs))), has_aux=True))(*xs)
    return out, grads


CASES = {
    # name: (b, n, d, q, klen, rlen, stride, offset, shared_r, segments, mask_rows, dropout, memory rows apart);
    # heads per block of lanes (`heads_per_block`): 2 (d 64: two heads in 128 lanes), 3 (the whole 192 lanes), 1
    "xlnet_bi": (2, 4, 64, 64, 96, 160, 1, 64, False, True, 2, 0.1, 32),
    "txl_shared_keys": (2, 3, 64, 40, 72, 72, 1, 39, True, False, 1, None, 32),
    "funnel_stride2": (1, 2, 64, 32, 64, 128, 2, 64, True, True, 1, None, 0),
    "lane_dense_heads": (2, 2, 128, 32, 48, 80, 1, 32, False, True, 2, 0.1, 0),
    # three blocks of 128 query rows (first, middle, last): BLOCK_BYTES set to one [128, 896] float32 block
    "row_blocks": (1, 1, 64, 384, 512, 896, 1, 384, True, False, 1, 0.2, 128),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_equals_xla_form_and_gradients(case, monkeypatch):
    b, n, d, q, klen, rlen, stride, offset, shared_r, segments, mask_rows, rate, memory_rows = CASES[case]
    args, flags = _inputs(0, b, n, q, klen, rlen, d, shared_r, segments, mask_rows)
    kw = dict(shift=tpu_attention.Shift(offset, stride), scale=0.125, flags=flags, masks=True)
    if rate is not None:
        kw["dropout"] = (jnp.array([12345, 678], jnp.uint32), 1.0 - rate)
    if case == "row_blocks":
        width = tpu_attention.padded_width(rlen, klen)
        monkeypatch.setattr(tpu_attention, "BLOCK_BYTES", 4 * 128 * width)
        assert tpu_attention.block_rows(q, width) == 128 < q  # several query blocks
    names = sorted(args)
    fused = lambda *xs: kernel(**dict(zip(names, xs)), memory_rows=memory_rows, **kw)
    ref = lambda *xs: reference(**dict(zip(names, xs)), **kw)
    xs = [args[key] for key in names]
    cot = jax.random.normal(jax.random.key(1), jax.eval_shape(fused, *xs).shape)
    (out, grads), (ref_out, ref_grads) = _output_and_grads(fused, xs, cot), _output_and_grads(ref, xs, cot)
    np.testing.assert_allclose(out, ref_out, rtol=2e-5, atol=2e-5)
    for name, g, rg in zip(names, grads, ref_grads):
        np.testing.assert_allclose(g, rg, rtol=1e-4, atol=1e-4, err_msg=name)


def test_per_row_starts_equal_windows():
    """XLNet's query stream: targets at sampled positions read their own window of the position scores."""
    b, n, q, klen, rlen = 2, 2, 24, 80, 160
    args, flags = _inputs(3, b, n, q, klen, rlen, 64, False, True, b)
    positions = jax.random.randint(jax.random.key(5), (b, q), 0, klen)
    starts = (klen - positions).astype(jnp.int32)  # "bi" distances klen, ..., -(klen-1): all windows in range
    kw = dict(shift=tpu_attention.Shift(starts=starts), scale=0.125, flags=flags, masks=True)
    names = sorted(args)
    xs = [args[key] for key in names]
    fused = lambda *xs: kernel(**dict(zip(names, xs)), **kw)
    ref = lambda *xs: reference(**dict(zip(names, xs)), **kw)
    (out, grads), (ref_out, ref_grads) = _output_and_grads(fused, xs), _output_and_grads(ref, xs)
    np.testing.assert_allclose(out, ref_out, rtol=2e-5, atol=2e-5)
    for name, g, rg in zip(names, grads, ref_grads):
        np.testing.assert_allclose(g, rg, rtol=1e-4, atol=1e-4, err_msg=name)


def test_directed_keys_equal_per_row_keys():
    """XLNet's bidirectional rows: keys of both directions `[2, r, n·d]` read per row by its direction equal the
    per-row keys r[direction[b]]; the keys' gradient sums each direction's rows."""
    b, n, q, klen, rlen = 3, 4, 24, 40, 80
    args, flags = _inputs(11, b, n, q, klen, rlen, 32, False, True, b)
    args["r"] = args["r"][:2]  # [2, n, rlen, d]: forward and backward keys
    directions = jnp.array([0, 1, 1], jnp.int32)
    kw = dict(shift=tpu_attention.Shift(q, 1), scale=0.125, flags=flags, masks=True)
    kw["dropout"] = (jnp.array([3, 4], jnp.uint32), 0.8)
    names = sorted(args)
    xs = [args[key] for key in names]
    fused = lambda *xs: kernel(**dict(zip(names, xs)), directions=directions, **kw)
    ref = lambda *xs: reference(**dict(zip(names, xs), r=dict(zip(names, xs))["r"][directions]), **kw)
    cot = jax.random.normal(jax.random.key(12), (b, n, q, 32))
    (out, grads), (ref_out, ref_grads) = _output_and_grads(fused, xs, cot), _output_and_grads(ref, xs, cot)
    np.testing.assert_allclose(out, ref_out, rtol=2e-5, atol=2e-5)
    for name, g, rg in zip(names, grads, ref_grads):
        np.testing.assert_allclose(g, rg, rtol=1e-4, atol=1e-4, err_msg=name)


def _two_stream_problem(b=2, n=4, d=32, qlen=24, targets=8, memory=16, rlen=80, seed=21):
    """XLNet's streams, token-major: content queries `[b, qlen, n·d]`, query-stream queries for `targets`
    positions, keys and values of memory and segment apart, position keys of both directions, segment scores,
    masks; the shared inputs under their names, each stream's own as c_*, g_*."""
    keys = iter(jax.random.split(jax.random.key(seed), 16))
    normal = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    klen = memory + qlen
    bits = lambda q: (
        jax.random.bernoulli(next(keys), 0.3, (b, q, klen)).astype(jnp.int8)
        | jax.random.bernoulli(next(keys), 0.5, (b, q, klen)).astype(jnp.int8) * 2
    )
    xs = dict(
        u=normal(n, d), vb=normal(n, d), k=normal(b, qlen, n * d), v=normal(b, qlen, n * d),
        k_mem=normal(b, memory, n * d), v_mem=normal(b, memory, n * d), r=normal(2, rlen, n * d),
        c_q=normal(b, qlen, n * d), c_ef=normal(b, n, qlen, 2), g_q=normal(b, targets, n * d), g_ef=normal(b, n, targets, 2),
    )  # fmt: skip
    starts = jax.random.randint(next(keys), (b, targets), 0, rlen - klen + 1)
    fixed = dict(c_flags=bits(qlen), g_flags=bits(targets), starts=starts, directions=jnp.array([0, 1], jnp.int32))
    return xs, fixed


def _stream_arguments(xs, fixed):
    """The two streams' `relative_attention` arguments (the shared ones the same arrays in both)."""
    shared = dict(u=xs["u"], vb=xs["vb"], k=xs["k"], v=xs["v"], r=xs["r"], memory=(xs["k_mem"], xs["v_mem"]))
    shared.update(directions=fixed["directions"], scale=0.125, masks=True)
    content = dict(shared, q=xs["c_q"], ef=xs["c_ef"], flags=fixed["c_flags"], shift=tpu_attention.Shift(24, 1))
    content["dropout"] = (jnp.array([5, 6], jnp.uint32), 0.9)
    query = dict(
        shared, q=xs["g_q"], ef=xs["g_ef"], flags=fixed["g_flags"], shift=tpu_attention.Shift(starts=fixed["starts"])
    )
    query["dropout"] = (jnp.array([7, 8], jnp.uint32), 0.9)
    return content, query


def test_two_streams_equal_two_calls():
    """XLNet's streams in one call (`two_streams`): outputs and every gradient as two `relative_attention` calls;
    the shared keys', values' (memory and segment), position keys' and biases' gradients summed by the content
    stream's backward kernel onto the query stream's."""
    xs, fixed = _two_stream_problem()
    names = sorted(xs)

    def loss(pair, *values):
        content, query = _stream_arguments(dict(zip(names, values)), fixed)
        out_c, out_g = pair(content, query)
        return jnp.vdot(out_c, jnp.sin(out_c)) + jnp.vdot(out_g, jnp.cos(out_g)), (out_c, out_g)

    one = lambda c, g: tpu_attention.two_streams(c, g, interpret=True)
    two = lambda c, g: (
        tpu_attention.relative_attention(**c, interpret=True),
        tpu_attention.relative_attention(**g, interpret=True),
    )
    values = [xs[name] for name in names]
    argnums = tuple(range(1, len(names) + 1))
    value_and_grads = jax.jit(jax.value_and_grad(loss, argnums, has_aux=True), static_argnums=0)
    (_, outs), grads = value_and_grads(one, *values)
    (_, ref_outs), ref_grads = value_and_grads(two, *values)
    for out, ref in zip(outs, ref_outs):
        np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    for name, g, rg in zip(names, grads, ref_grads):
        assert float(jnp.abs(rg).max()) > 0, name
        np.testing.assert_allclose(g, rg, rtol=1e-5, atol=1e-5, err_msg=name)


def test_in_kernel_keep_mask_is_layers_keep_mask():
    seed = jnp.array([0xDEADBEEF, 0x01234567], jnp.uint32)
    threshold = int(round(0.9 * 2.0**32))
    words = jax.lax.bitcast_convert_type(seed, jnp.int32)
    keep = tpu_attention._keep(words[0], words[1], jnp.int32(3 * 7 * 64), (7, 64), 64, threshold)
    expected = layers.hashed_bits(seed, (4, 7, 64))[3] < jnp.uint32(threshold)
    np.testing.assert_array_equal(keep, expected)


def _factorized_problem(b, n, q=32, klen=64, d=64, width=128):
    """Funnel's fused attention with the factorized position term (pooled queries, <cls> excluded, dropout on) and
    its XLA form: (fused, reference, inputs, names), functions of (q, u, vb, k, v, ef, w), w the `r` projection."""
    args, flags = _inputs(7, b, n, q, klen, klen, d, True, True, b)
    del args["r"]
    keys = jax.random.split(jax.random.key(8), 2)
    r_kernel = jax.random.normal(keys[0], (width, n, d)) * 0.1  # [D, n, d], as the `r` projection
    q_pos = jnp.arange(q) * 2.0  # pooled queries: stride 2
    (phi, pi), (psi, omega) = ra.factorized_position_encodings(q_pos, jnp.arange(klen) * 1.0, width)
    drop = jax.random.bernoulli(keys[1], 0.9, phi.shape)
    phi, pi = jnp.where(drop, phi / 0.9, 0.0), pi  # dropout on the query factors, as Funnel's pos_drop
    half = width // 2
    dropout = (jnp.array([5, 6], jnp.uint32), 0.9)
    keep = np.pad(np.ones((q - 1, klen - 1), bool), ((1, 0), (1, 0)))

    def fused(q, u, vb, k, v, ef, w):
        fact = tpu_attention.Factorized(
            phi=phi[None],
            pi=jnp.concatenate([pi[:, half:], -pi[:, :half]], -1)[None],
            w_r=w.reshape(width, n * d),
            w_s=jnp.concatenate([w[half:], w[:half]], 0).reshape(width, n * d),
            psi=psi,
        )
        return kernel(
            q, u, vb, k, v, factorized=fact, scale=0.125, ef=ef, flags=flags, masks=True, exclude_first=True,
            dropout=dropout,
        )  # fmt: skip

    def ref(q, u, vb, k, v, ef, w):
        qu, q_head = q + u[:, None], jnp.swapaxes(q + vb[:, None], 1, 2)
        pos = ra.rotated_factorized_position_scores(q_head, w, jnp.zeros((n, d)), (phi, pi), (psi, omega))
        seg = jnp.where((flags[:, None] & 2) != 0, ef[..., 1:2], ef[..., 0:1])
        s = (jnp.einsum("bnqd,bnkd->bnqk", qu, k) + jnp.where(keep, pos + seg, 0.0)) * 0.125
        p = jax.nn.softmax(jnp.where((flags[:, None] & 1) != 0, MASK_VALUE, s), axis=-1)
        kept = layers.hashed_bits(dropout[0], p.shape) < jnp.uint32(layers.keep_threshold(dropout[1]))
        return jnp.einsum("bnqk,bnkd->bnqd", jnp.where(kept, p / dropout[1], 0.0), v)

    names = ("q", "u", "vb", "k", "v", "ef")
    return fused, ref, [args[key] for key in names] + [r_kernel], names + ("w",)


def test_factorized_position_term_with_cls_excluded():
    """Funnel: the rotated factorized position term formed in the kernel from qv (`Factorized`), pooled queries,
    no position or segment term on <cls>'s row and column, dropout on: equals the XLA form and its gradients."""
    fused, ref, xs, names = _factorized_problem(2, 2)
    cot = jax.random.normal(jax.random.key(9), xs[0].shape)
    (out, grads), (ref_out, ref_grads) = _output_and_grads(fused, xs, cot), _output_and_grads(ref, xs, cot)
    np.testing.assert_allclose(out, ref_out, rtol=2e-5, atol=2e-5)
    for name, g, rg in zip(names, grads, ref_grads):
        np.testing.assert_allclose(g, rg, rtol=1e-4, atol=1e-4, err_msg=name)


def test_declared_flops_are_the_xla_forms_plus_the_recomputed_scores():
    """The kernels' `pl.CostEstimate` FLOPs (what the plan and the roofline count): the XLA form's products, forward
    and backward, plus the backward kernel's recomputation of the content and position products."""
    from xlgen.plan.cost import jaxpr_matmul_flops

    b, n, q, klen, rlen, stride, offset = 2, 3, 40, 72, 72, 1, 39
    args, flags = _inputs(0, b, n, q, klen, rlen, 64, True, False, 1)
    kw = dict(shift=tpu_attention.Shift(offset, stride), scale=0.125, flags=flags, masks=True)
    names = sorted(args)
    xs = [args[key] for key in names]
    cot = jax.random.normal(jax.random.key(2), (b, n, q, 64))  # (a sum's all-ones cotangent folds a product)
    loss = lambda f: lambda *xs: jnp.vdot(f(**dict(zip(names, xs)), **kw), cot)
    fused = kernel
    step = lambda f: jax.value_and_grad(loss(f), argnums=tuple(range(len(xs))))
    count = lambda f: jaxpr_matmul_flops(jax.make_jaxpr(step(f))(*xs).jaxpr)[0]
    recomputed = b * n * q * 2 * 64 * (klen + rlen)
    assert count(fused) == count(reference) + recomputed


SHARDED = {
    # name: (b, n, shared_r, segments, per-row starts) on a (data 2, fsdp 2, tensor 2) mesh with the fsdp_tp rules,
    # the batch split over data x fsdp (as far as it divides), the heads over tensor (if they divide)
    "txl_shared_keys": (4, 4, True, False, False),  # per device: one batch row, two heads
    "xlnet_query_stream": (4, 4, False, True, True),
    "heads_not_split": (2, 3, True, True, False),  # 2 rows on data only, 3 heads whole: fsdp, tensor replicate
}


def _assert_sharded_equals_one_device(fused, ref, xs, names, local):
    """Output and every gradient of `fused` (jitted; a random cotangent) on a (data 2, fsdp 2, tensor 2) mesh
    with the fsdp_tp rules, where the kernel sees `local` (rows, heads), equal one device's and the XLA form's."""
    from xlgen import sharding

    cot = jax.random.normal(jax.random.key(4), jax.eval_shape(fused, *xs).shape)
    value_and_grads = lambda attend: jax.jit(
        jax.value_and_grad(lambda *xs: jnp.vdot(attend(*xs), cot), argnums=tuple(range(len(xs))))
    )
    one, want = value_and_grads(fused)(*xs), value_and_grads(ref)(*xs)
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    with jax.set_mesh(mesh), sharding.activation_rules("fsdp_tp"):
        jaxpr = str(jax.make_jaxpr(value_and_grads(fused))(*xs))
        got = value_and_grads(fused)(*xs)
    b, n, q, d = cot.shape
    assert "shard_map" in jaxpr and f"f32[{local[0]},{q},{local[1] * d}]" in jaxpr, local
    for label, expected, tol in (("one device", one, 2e-6), ("XLA form", want, 1e-4)):
        np.testing.assert_allclose(got[0], expected[0], rtol=tol, atol=1e-5, err_msg=label)  # a sum of b·n·q·d terms
        for name, g, w in zip(names, got[1], expected[1]):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"{label}: {name}")


@pytest.mark.parametrize("case", sorted(SHARDED))
def test_sharded_kernel_equals_one_device_with_dropout(case):
    """Batch and heads split over the mesh: each device's dropout mask is its block of the global `[b, n, q, k]`
    mask (offsets of its first row and head), the gradient of position keys shared by the batch is summed over the
    devices holding its rows; output and gradients equal the one-device kernel's and the XLA form's."""
    b, n, shared_r, segments, per_row = SHARDED[case]
    q, klen, d = 16, 48, 32
    rlen = klen if shared_r else 2 * klen  # per-row windows start in [1, klen]: all in range
    args, flags = _inputs(2, b, n, q, klen, rlen, d, shared_r, segments, 1 if shared_r and not segments else b)
    if per_row:
        positions = jax.random.randint(jax.random.key(9), (b, q), 0, klen)
        shift = tpu_attention.Shift(starts=(klen - positions).astype(jnp.int32))
    else:
        shift = tpu_attention.Shift(q - 1, 1)
    kw = dict(shift=shift, scale=0.125, flags=flags, masks=True, dropout=(jnp.array([7, 99], jnp.uint32), 0.7))
    names = sorted(args)
    fused = lambda *xs: kernel(**dict(zip(names, xs)), **kw)
    ref = lambda *xs: reference(**dict(zip(names, xs)), **kw)
    local = (1, 2) if n == 4 else (1, 3)  # (rows, heads) per device
    _assert_sharded_equals_one_device(fused, ref, [args[key] for key in names], names, local)


def test_sharded_factorized_kernel_equals_one_device():
    """Funnel's factorized term sharded: W_r (shared by the batch) gets its gradient summed over the batch's
    devices; the query factors (shared) and <cls> exclusion per device as on one."""
    fused, ref, xs, names = _factorized_problem(4, 4, q=16, klen=32, d=32, width=64)
    _assert_sharded_equals_one_device(fused, ref, xs, names, (1, 2))


@pytest.mark.parametrize(
    "config_file,over",
    [
        ("txl_tiny.py", {"model.n_layer": 1}),  # its layers are alike: one shows each layer's kernel sharding
        pytest.param("xlnet_tiny.py", {}, marks=pytest.mark.slow),
        pytest.param("funnel_tiny.py", {"model.attention_type": "factorized"}, marks=pytest.mark.slow),
    ],
)
def test_sharded_train_step_traced_for_tpu_equals_one_device_cpu(config_file, over):
    """A float32 train step (dropout on) traced for TPU (the fused kernel interpreted) on a (data 2, fsdp 2,
    tensor 2) mesh with the fsdp_tp rules, the kernel per device on one batch row and half the heads, gives the
    loss and gradients of the one-device CPU program."""
    from test_remat_precision import SMALL, _program
    from test_tpu_shift import assert_tpu_forms_give_the_cpu_step

    mesh222 = {"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2, "mesh.num_devices": 0, "mesh.rules": "fsdp_tp"}
    jaxpr = assert_tpu_forms_give_the_cpu_step(config_file, {"model.dropatt": 0.1, **over}, tpu_mesh=mesh222)["tpu"]
    assert SMALL[config_file]["data.batch_size"] == 4 and "pallas_call" in jaxpr and "shard_map" in jaxpr
    model = _program(config_file, over)[0].config.model
    width = model.n_head // 2 * model.d_head
    assert re.search(rf"f32\[1,\d+,{width}\]", jaxpr)  # per device: one of 4 batch rows, half the heads
