"""The shared relative-attention core against naive O(q·k) references."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlgen.models import operands
from xlgen.models import relative_attention as ra


def _naive_position_scores(q, w_r, r_r_bias, qlen, mlen, d_model, clamp_len, negate=False):
    """(q_i + v)·W_r sinusoid(dist(i, j)) with dist = mlen + i - j computed per (i, j) pair."""
    klen = mlen + qlen
    i = np.arange(qlen)[:, None]
    j = np.arange(klen)[None, :]
    dist = (mlen + i - j).astype(np.float32)
    if clamp_len:
        dist = np.clip(dist, -clamp_len, clamp_len)
    if negate:
        dist = -dist
    emb = np.asarray(ra.sinusoid_embedding(jnp.asarray(dist), d_model))  # [q, k, d]
    kr = np.einsum("ijd,dnh->ijnh", emb, w_r)
    return np.einsum("binh,ijnh->bnij", q + r_r_bias, kr)


@pytest.mark.parametrize(
    "kind,qlen,mlen,clamp",
    [
        ("txl", 5, 0, None),
        ("txl", 5, 7, None),
        ("txl", 4, 3, 2),
        ("uni", 6, 0, None),
        ("uni", 3, 8, None),
        ("bi", 5, 0, None),
        ("bi", 4, 6, None),
        ("bi", 7, 2, 3),
    ],
)
def test_position_scores_match_naive(kind, qlen, mlen, clamp):
    rng = np.random.default_rng(0)
    b, n, dh, d = 3, 2, 4, 8
    klen = mlen + qlen
    q = rng.normal(size=(b, qlen, n, dh)).astype(np.float32)
    w_r = rng.normal(size=(d, n, dh)).astype(np.float32)
    v_bias = rng.normal(size=(n, dh)).astype(np.float32)

    @jax.jit  # one program (op-by-op dispatch compiles each primitive for this case's shapes)
    def position_scores(q, w_r, v_bias):
        pos_seq = ra.relative_position_sequence(qlen, klen, kind, clamp)
        k_r = jnp.einsum("rd,dnh->rnh", ra.sinusoid_embedding(pos_seq, d), w_r)
        return ra.position_scores(q, k_r, v_bias, klen=klen, offset=ra.shift_offset(qlen, kind))

    got = np.asarray(position_scores(q, w_r, v_bias))
    want = _naive_position_scores(q, w_r, v_bias, qlen, mlen, d, clamp)
    valid = np.ones((qlen, klen), bool)
    if kind in ("txl", "uni"):  # causal kinds only define distances >= 0
        valid = (mlen + np.arange(qlen)[:, None] - np.arange(klen)[None, :]) >= 0
    np.testing.assert_allclose(got[..., valid], want[..., valid], atol=1e-4, rtol=1e-5)


def test_per_example_direction_equals_negated_distances():
    """bi_data: a [b, r, n, d] position-key tensor with per-row direction equals negated distances per row."""
    rng = np.random.default_rng(1)
    b, n, dh, d, qlen, mlen = 4, 2, 4, 8, 5, 3
    klen = qlen + mlen
    q = rng.normal(size=(b, qlen, n, dh)).astype(np.float32)
    w_r = rng.normal(size=(d, n, dh)).astype(np.float32)
    v_bias = rng.normal(size=(n, dh)).astype(np.float32)
    forward = np.array([True, False, False, True])
    pos_seq = ra.relative_position_sequence(qlen, klen, "bi")
    pos_b = jnp.where(forward[:, None], pos_seq[None], -pos_seq[None])
    k_r = jnp.einsum("brd,dnh->brnh", ra.sinusoid_embedding(pos_b, d), w_r)
    got = np.asarray(
        ra.position_scores(jnp.asarray(q), k_r, jnp.asarray(v_bias), klen=klen, offset=ra.shift_offset(qlen, "bi"))
    )
    for row in range(b):
        want = _naive_position_scores(q[row : row + 1], w_r, v_bias, qlen, mlen, d, None, negate=not forward[row])
        np.testing.assert_allclose(got[row : row + 1], want, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(
    "q,r,klen,offset,stride",
    [
        (4, 9, 6, 3, 1),
        (4, 9, 6, 4, 1),
        (3, 12, 8, 4, 2),
        (2, 20, 8, 6, 3),
        (5, 6, 6, 4, 1),
        (1, 4, 4, 0, 1),
    ],
)
def test_relative_shift_definition(q, r, klen, offset, stride):
    x = np.random.default_rng(2).normal(size=(2, 3, q, r)).astype(np.float32)
    got = np.asarray(ra.relative_shift(jnp.asarray(x), klen=klen, offset=offset, stride=stride))
    assert got.shape == (2, 3, q, klen)
    for i, j in itertools.product(range(q), range(klen)):
        src = offset - stride * i + j
        if 0 <= src < r:
            np.testing.assert_array_equal(got[..., i, j], x[..., i, src])


@pytest.mark.parametrize(
    "q,r,klen,offset,stride",
    [(4, 9, 6, 3, 1), (4, 15, 8, 3, 1), (3, 14, 8, 4, 2), (8, 16, 8, 8, 1), (2, 20, 8, 6, 3)],
)
def test_relative_shift_derivatives(q, r, klen, offset, stride):
    """Reverse and forward mode of the shift (on CPU its tangent is built with another row width than the primal,
    `operands.tangent_row_width`) equal the map's definition at every entry whose source exists: the vjp scatters the cotangent
    back to x[i, offset - stride*i + j], the jvp shifts the tangent."""
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=(2, q, r)).astype(np.float32))
    valid = np.zeros((q, klen), bool)
    want = np.zeros((2, q, r), np.float32)
    g = rng.normal(size=(2, q, klen)).astype(np.float32)
    for i, j in itertools.product(range(q), range(klen)):
        src = offset - stride * i + j
        if 0 <= src < r:
            valid[i, j] = True
            want[:, i, src] += g[:, i, j]
    g = np.where(valid, g, 0.0)  # callers mask the entries without a source
    shift = functools.partial(ra.relative_shift, klen=klen, offset=offset, stride=stride)
    _, vjp = jax.vjp(jax.jit(shift), x)
    np.testing.assert_allclose(np.asarray(vjp(jnp.asarray(g))[0]), want, rtol=0, atol=1e-6)
    t = jnp.asarray(rng.normal(size=(2, q, r)).astype(np.float32))
    primal, tangent = jax.jvp(shift, (x,), (t,))
    np.testing.assert_array_equal(np.where(valid, np.asarray(tangent), 0), np.where(valid, np.asarray(shift(t)), 0))
    np.testing.assert_array_equal(np.asarray(primal), np.asarray(shift(x)))


def test_relative_shift_tangent_width_is_cpu_only():
    """The backward pass's power-of-two rows (`operands.tangent_row_width`) are an XLA:CPU choice: lowered for TPU (as
    `xlgen plan` compiles pod steps on a CPU host) the transposed skew keeps the smallest width."""
    grad = jax.jit(jax.grad(lambda x: jnp.sum(ra.relative_shift(x, klen=512, offset=512) ** 2)))
    x = jax.ShapeDtypeStruct((2, 512, 1024), jnp.float32)
    cpu = grad.trace(x).lower(lowering_platforms=("cpu",)).as_text()
    tpu = grad.trace(x).lower(lowering_platforms=("tpu",)).as_text()
    assert "512x1025" in cpu and "512x1025" not in tpu


def test_shared_position_key_gradient_is_a_product_over_the_batch():
    """Position keys shared by the batch `[r,n,d]`: their gradient sums the batch through a matrix-vector product,
    not a `reduce` over the short leading axis (YNNPACK ran that 40x slower at Funnel's `[4,1024,4,64]`), and
    the gradients equal those of an explicit per-example copy of the keys."""
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(3, 4, 2, 8)), jnp.float32)
    keys = jnp.asarray(rng.normal(size=(8, 2, 8)), jnp.float32)

    def loss(q, keys, per_example):
        k = jnp.broadcast_to(keys, (q.shape[0],) + keys.shape) if per_example else keys
        return jnp.sum(ra.position_contraction(q, k) ** 2)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
    hlo = grad.lower(q, keys, False).as_text()
    assert "stablehlo.reduce" not in hlo and "dot_general" in hlo
    for ours, ref in zip(grad(q, keys, False), grad(q, keys, True)):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), rtol=1e-6, atol=1e-5)


def test_position_key_operand_layouts_agree():
    """Shared keys, per-example keys and XLNet's [2,r,n,d] keys with a one-hot direction give the same position
    scores as the plain einsum over per-example keys."""
    rng = np.random.default_rng(2)
    b, q, r, n, d = 4, 5, 9, 2, 3
    qv = jnp.asarray(rng.normal(size=(b, q, n, d)), jnp.float32)
    two = jnp.asarray(rng.normal(size=(2, r, n, d)), jnp.float32)
    forward = np.array([True, False, False, True])
    per_example = jnp.where(forward[:, None, None, None], two[0], two[1])
    want = np.einsum("bind,bjnd->bnij", np.asarray(qv), np.asarray(per_example))
    direction = jax.nn.one_hot(jnp.where(forward, 0, 1), 2)
    for keys in (
        per_example,
        operands.position_key_operand(two, b, direction),
        operands.position_key_operand(per_example, b),
    ):
        np.testing.assert_allclose(np.asarray(ra.position_contraction(qv, keys)), want, rtol=1e-5, atol=1e-5)
    shared = np.einsum("bind,jnd->bnij", np.asarray(qv), np.asarray(two[0]))
    np.testing.assert_allclose(np.asarray(ra.position_contraction(qv, two[0])), shared, rtol=1e-5, atol=1e-5)


def test_position_key_gradient_is_formed_as_d_by_r():
    """The keys enter the position product as `[b,n,d,r]`, so XLA:CPU forms their gradient as (q+v)^T dS with
    `[d, r]` outputs; the `[r, d]` orientation (dS^T (q+v), what a `[b,r,n,d]` operand gives) ran 2.8x slower
    at Funnel's seq-512 shapes."""
    q = jax.ShapeDtypeStruct((2, 64, 2, 16), jnp.float32)
    keys = jax.ShapeDtypeStruct((128, 2, 16), jnp.float32)
    grad = jax.jit(jax.grad(lambda q, k: jnp.sum(ra.position_contraction(q, k) ** 2), argnums=1))
    dots = [line for line in grad.lower(q, keys).compile().as_text().splitlines() if " dot(" in line]
    assert any("f32[2,2,16,128]" in line.split("=")[1] for line in dots), dots
    assert not any("f32[2,2,128,16]" in line.split("=")[1] for line in dots), dots


def test_content_keys_operand_in_training_only():
    """In training the key heads enter the content product as `[b,n,d,k]` (their gradient then has `[d,k]`
    outputs); in evaluation, with no backward pass, they stay as they are. Scores agree either way."""
    from flax import nnx

    attn = ra.RelativeMultiHeadAttention(16, 2, 8, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(3)
    k = jnp.asarray(rng.normal(size=(2, 32, 2, 8)), jnp.float32)
    q = jnp.asarray(rng.normal(size=(2, 16, 2, 8)), jnp.float32)
    u = jnp.zeros((2, 8), jnp.float32)
    attn.eval()
    assert attn.content_keys(k) is k
    attn.train()
    op = attn.content_keys(k)
    assert isinstance(op, ra.ContentKeyOperand) and attn.content_keys(op) is op
    np.testing.assert_allclose(
        np.asarray(ra.content_scores(q, op, u)), np.asarray(ra.content_scores(q, k, u)), rtol=1e-6, atol=1e-6
    )
    grad = jax.jit(jax.grad(lambda k: jnp.sum(ra.content_scores(q, operands.content_key_operand(k), u) ** 2)))
    dots = [line for line in grad.lower(k).compile().as_text().splitlines() if " dot(" in line]
    assert any("f32[2,2,8,32]" in line.split("=")[1] for line in dots), dots


def _lowered_for(platform: str):
    """A context in which traced code sees `platform` as its lowering target, as under `jax.set_mesh` with that
    platform's devices (an abstract one-device mesh: no such device needed)."""
    device = jax.sharding.AbstractDevice(device_kind=platform, num_cores=None, platform=platform)
    return jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("data",), abstract_device=device))


def test_operand_layouts_are_for_xla_cpu_only():
    """The XLA:CPU operand layouts apply to programs lowered for the CPU (the mesh's devices decide, so a TPU plan
    traced on a CPU host gets none): for TPU the keys enter the products as they are, with no optimization barrier
    in the lowered program, and every form gives the same scores."""
    rng = np.random.default_rng(4)
    b, q, r, n, d = 4, 5, 9, 2, 3
    qv = jnp.asarray(rng.normal(size=(b, q, n, d)), jnp.float32)
    two = jnp.asarray(rng.normal(size=(2, r, n, d)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, r, n, d)), jnp.float32)
    direction = jax.nn.one_hot(jnp.array([0, 1, 1, 0]), 2)
    shared = two[0]
    cases = ((two, direction), (shared, None), (k, None))

    def loss(q, k, keys):
        scores = ra.content_scores(q, operands.content_keys(k), jnp.zeros((n, d))) + ra.position_contraction(q, keys)
        return jnp.sum(scores**2)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    assert operands.cpu_layouts()  # this session runs on the CPU, no mesh: the default backend decides
    assert isinstance(operands.content_keys(k), ra.ContentKeyOperand)
    cpu = [ra.position_contraction(qv, operands.position_keys(x, b, dr)) for x, dr in cases]
    assert "optimization_barrier" in grad.trace(qv, k, shared).lower().as_text()
    with _lowered_for("tpu"):
        assert not operands.cpu_layouts() and operands.content_keys(k) is k
        assert operands.position_keys(shared, b) is shared
        tpu = [ra.position_contraction(qv, operands.position_keys(x, b, dr)) for x, dr in cases]
        lowered = grad.trace(qv, k, shared).lower(lowering_platforms=("tpu",))
        assert "optimization_barrier" not in lowered.as_text()
    for a, c in zip(cpu, tpu):
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["bi", "uni"])
def test_query_stream_rows_as_windows_equal_the_elementwise_gather(kind):
    """XLNet's query-stream position term (targets at sampled positions): the TPU form (`relative_row_windows`,
    one window per target) equals the XLA:CPU element-wise gather, values and gradient, including the clipped
    indices past the sequence (`uni`); for a program lowered for TPU `relative_rows` is that form."""
    rng = np.random.default_rng(11)
    b, n, m, qlen, mlen = 3, 2, 4, 6, 5
    klen = qlen + mlen
    r = len(ra.relative_position_sequence(qlen, klen, kind))
    offset = ra.shift_offset(qlen, kind)
    raw = jnp.asarray(rng.normal(size=(b, n, m, r)), jnp.float32)
    pos = jnp.asarray(np.stack([rng.choice(qlen, m, replace=False) for _ in range(b)]), jnp.int32)
    pos = pos.at[0, 0].set(0).at[1, 0].set(qlen - 1)  # the widest and the narrowest offsets
    ct = jnp.asarray(rng.normal(size=(b, n, m, klen)), jnp.float32)
    assert operands.cpu_layouts()
    forms = {
        "cpu": functools.partial(operands.relative_rows, offset=offset, klen=klen),
        "windows": functools.partial(operands.relative_row_windows, offset=offset, klen=klen),
    }
    out = {k: jax.vjp(lambda x: f(x, pos), raw) for k, f in forms.items()}
    (y_cpu, vjp_cpu), (y_win, vjp_win) = out["cpu"], out["windows"]
    # by hand: row offset - z + j, clipped into the sequence
    idx = np.clip(offset - np.asarray(pos)[:, None, :, None] + np.arange(klen), 0, r - 1)
    np.testing.assert_array_equal(np.asarray(y_cpu), np.take_along_axis(np.asarray(raw), idx, -1))
    np.testing.assert_array_equal(np.asarray(y_win), np.asarray(y_cpu))
    np.testing.assert_allclose(np.asarray(vjp_win(ct)[0]), np.asarray(vjp_cpu(ct)[0]), rtol=1e-6, atol=1e-6)
    with _lowered_for("tpu"):
        y_tpu = forms["cpu"](raw, pos)
        tpu_jaxpr = str(jax.make_jaxpr(forms["cpu"])(raw, pos))
    np.testing.assert_array_equal(np.asarray(y_tpu), np.asarray(y_cpu))
    assert tpu_jaxpr == str(jax.make_jaxpr(forms["windows"])(raw, pos))


def test_relative_shift_has_no_gather():
    hlo = jax.jit(lambda x: ra.relative_shift(x, klen=6, offset=4)).lower(jnp.zeros((2, 4, 10))).as_text()
    assert "gather" not in hlo


def test_attention_matches_naive_softmax():
    rng = np.random.default_rng(3)
    b, qlen, klen, n, dh = 2, 3, 5, 2, 4
    q, k, v = (rng.normal(size=(b, L, n, dh)).astype(np.float32) for L in (qlen, klen, klen))
    u = rng.normal(size=(n, dh)).astype(np.float32)
    pos = rng.normal(size=(b, n, qlen, klen)).astype(np.float32)
    seg_embed = rng.normal(size=(2, n, dh)).astype(np.float32)
    s_bias = rng.normal(size=(n, dh)).astype(np.float32)
    seg_mat = rng.integers(0, 2, size=(b, qlen, klen))
    mask = rng.random((b, 1, qlen, klen)) < 0.3
    mask[..., 0] = False
    seg = ra.segment_scores(jnp.asarray(q), seg_embed, s_bias, seg_mat)
    got = np.asarray(
        ra.relative_attention(q, k, v, r_w_bias=u, position_term=pos, segment_term=seg, mask=jnp.asarray(mask))
    )
    # naive
    want = np.zeros_like(got)
    for bb, nn, i in itertools.product(range(b), range(n), range(qlen)):
        s = np.array(
            [
                (q[bb, i, nn] + u[nn]) @ k[bb, j, nn]
                + pos[bb, nn, i, j]
                + (q[bb, i, nn] + s_bias[nn]) @ seg_embed[int(seg_mat[bb, i, j]), nn]
                for j in range(klen)
            ]
        )
        s = s / np.sqrt(dh)
        s[mask[bb, 0, i]] = -np.inf
        p = np.exp(s - s.max())
        p /= p.sum()
        want[bb, i, nn] = p @ v[bb, :, nn]
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_position_scores_at_rows_are_windows_of_the_raw_scores():
    """Queries at per-row positions: out[b, :, i, j] = raw[b, :, i, start[b, i] + j], values and gradients equal
    to an elementwise gather of the same entries."""
    rng = np.random.default_rng(4)
    b, q, n, d, klen = 2, 3, 2, 4, 6
    qh = jnp.asarray(rng.normal(size=(b, q, n, d)), jnp.float32)
    keys = jnp.asarray(rng.normal(size=(2 * klen, n, d)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
    start = jnp.asarray([[1, 6, 3], [4, 2, 5]], jnp.int32)

    def reference(qh, keys):
        raw = jnp.einsum("bind,jnd->bnij", qh + v, keys)
        idx = start[:, None, :, None] + jnp.arange(klen)
        return jnp.take_along_axis(raw, jnp.broadcast_to(idx, raw.shape[:-1] + (klen,)), axis=-1)

    ours = lambda qh, keys: ra.position_scores_at(qh, keys, v, start=start, klen=klen)
    w = jnp.asarray(rng.normal(size=(b, n, q, klen)), jnp.float32)

    @jax.jit  # values and gradients of both in one program (not op by op)
    def values_and_grads(qh, keys):
        grad = lambda f: jax.grad(lambda *a: jnp.sum(f(*a) * w), argnums=(0, 1))(qh, keys)  # noqa: E731
        return ours(qh, keys), reference(qh, keys), grad(ours), grad(reference)

    y_ours, y_ref, g_ours, g_ref = values_and_grads(qh, keys)
    np.testing.assert_allclose(np.asarray(y_ours), np.asarray(y_ref), rtol=1e-6, atol=1e-6)
    for a, r in zip(g_ours, g_ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(r), rtol=1e-5, atol=1e-5)


def test_rotated_factorized_position_scores_equal_the_original():
    """Funnel's factorized position term in its TPU form (the rotation of (q+v)·W_r^T by the query angles, contracted
    over d_model) equals the original (contracted over 2·d_model): values and gradients, for strided and per-row
    query positions and query factors with independent dropout masks on every column (not only the sinusoid
    encodings' repeated halves); XLA:CPU programs keep the original form, programs lowered for TPU get the rotated
    one (no 2·d_model-wide operand)."""
    rng = np.random.default_rng(7)
    b, qlen, klen, n, d, d_model = 2, 5, 9, 2, 3, 8
    q_head = jnp.asarray(rng.normal(size=(b, qlen, n, d)), jnp.float32)
    w_r = jnp.asarray(rng.normal(size=(d_model, n, d)), jnp.float32)
    bias = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
    k_pos = jnp.arange(klen) - 1.0
    for q_pos in (2.0 * jnp.arange(qlen) - 3, jnp.asarray(rng.integers(0, klen, size=(b, qlen)), jnp.float32)):
        (phi, pi), k_enc = ra.factorized_position_encodings(q_pos, k_pos, d_model)
        keep = rng.random(size=(2,) + phi.shape) > 0.3
        q_enc = (phi * keep[0] / 0.7, pi * keep[1] / 0.7)
        rows = [jnp.broadcast_to(x, (b, qlen, d_model)) for x in q_enc]

        @jax.jit  # both forms, the reference and the gradients in one program (not op by op)
        def forms_and_grads(q_head, w_r, bias, q_enc, k_enc, rows):
            def loss(form, q_head, w_r, bias):
                return jnp.sum(jnp.sin(form(q_head, w_r, bias, q_enc, k_enc)))

            forms = (ra.factorized_position_scores, ra.rotated_factorized_position_scores)
            want = jnp.einsum("bind,Dnd,biD,jD->bnij", q_head + bias, w_r, rows[0], k_enc[0]) + jnp.einsum(
                "bind,Dnd,biD,jD->bnij", q_head + bias, w_r, rows[1], k_enc[1]
            )
            values = [form(q_head, w_r, bias, q_enc, k_enc) for form in forms]
            grads = [jax.grad(functools.partial(loss, form), argnums=(0, 1, 2))(q_head, w_r, bias) for form in forms]
            return want, values, grads

        want, values, grads = forms_and_grads(q_head, w_r, bias, q_enc, k_enc, rows)
        for value in values:
            np.testing.assert_allclose(np.asarray(value), np.asarray(want), rtol=1e-5, atol=1e-4)
        for a, c in zip(*grads):
            np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-5, atol=1e-4)

    def widths(jaxpr):  # minor dimension of every dot_general's operands
        return {v.aval.shape[-1] for e in jaxpr.eqns if e.primitive.name == "dot_general" for v in e.invars}

    trace = lambda: jax.make_jaxpr(ra.factorized_position_scores)(q_head, w_r, bias, q_enc, k_enc).jaxpr
    assert not operands.rotated_factorized_position() and 2 * d_model in widths(trace())
    with _lowered_for("tpu"):
        assert operands.rotated_factorized_position() and 2 * d_model not in widths(trace())
