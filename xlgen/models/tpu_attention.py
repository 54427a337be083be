"""The relative-attention core for TPU as one Pallas kernel: scores, softmax and dropout never leave VMEM.

Per (batch row, head) and block of `tq` queries, the kernel forms the whole `[tq, klen]` block of scores of
`relative_attention.relative_attention` (Dai thesis Eq. 3.3 / XLNet §4.3) in VMEM:

    S   = (qu · k^T  +  shift(qv · r^T)  +  segment) · scale,  masked entries -1e30
    P   = softmax(S)  (float32),   P_d = dropout(P)   (the `layers.keep_mask` hash of the element's global index)
    out = P_d · v

qu = q + u and qv = q + v (the content and position biases), k, v the key and value heads, r the position keys
against the relative-position sequence, `shift` the row rotation of `tpu_shift` (row i of qv · r^T read from
column start_i = offset - stride·i, or from per-row starts: XLNet's query stream), segment = ef[i, seg_ij] (XLNet
and Funnel's two per-row segment scores selected by a different-segment flag). Keys are never split into blocks:
klen (memory included) is at most a few thousand in the XL models, so a block of rows holds all its scores and the
softmax needs no online rescaling; the backward kernel recomputes S and P from the same inputs (no residual but
the inputs: not even the log-normaliser) and forms dqu, dqv, dk, dv, dr and the segment scores' gradient, the
position term's through the transposed rotation. Every `[b, n, q, k]` pass of the XLA form (content product,
position product and shift, sum, scale and mask, softmax and its backward, dropout, probabilities by values:
each memory-bound on v3 at d_head = 64) becomes VMEM traffic; HBM sees q, k, v, r once per (row, head) and the
masks as one int8 `[q, k]` array per row (bit 0: masked, bit 1: different segment).

Scores and softmax are float32 inside the kernel whatever `scores_dtype` says (that key sets the bytes of the
XLA form's passes, which do not exist here); products take the operands' dtype (bfloat16 on TPU) with float32
accumulation. Runs per device (`per_device`: batch and heads split as the activations are); `interpret=True`
runs the same kernels through JAX on any backend.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from xlgen import platforms, sharding
from xlgen.models import layers

LANES = 128
MASK_VALUE = -1e30  # as relative_attention.MASK_VALUE
BLOCK_BYTES = 1 << 20  # float32 bytes of one [tq, W] block of scores (the kernels hold ~6 of them in VMEM)
TRANS_B = (((1,), (1,)), ((), ()))  # a · b^T
MASKED, DIFFERENT_SEGMENT = 1, 2  # bits of the flags array


class Shift(NamedTuple):
    """Where row i of the raw position scores `[q, r]` is read: columns start_i + j, start_i = offset - stride·i
    (static), or `starts[b, i]` (int32 `[b, q]`) when given."""

    offset: int = 0
    stride: int = 1
    starts: Optional[jax.Array] = None


def padded_width(r: int, klen: int) -> int:
    return -(-max(r, klen) // LANES) * LANES


def block_rows(q: int, width: int) -> int:
    """Query rows per block: the largest multiple of 128 dividing q whose float32 `[tq, width]` block is at most
    BLOCK_BYTES, or q itself when that fits (a block of the whole dimension); 0 if neither. (Per-row inputs are
    laid out with the queries on the lanes, so a block of them is a multiple of 128 or all of them.)"""
    limit = max(BLOCK_BYTES // (4 * width), 1)
    if q <= limit:
        return q
    best = 0
    for tq in range(LANES, limit + 1, LANES):
        if q % tq == 0:
            best = tq
    return best


def applies(q: int, klen: int, r: int) -> bool:
    return block_rows(q, padded_width(r, klen)) > 0


# ----------------------------------------------------------------------------------------------------------------
# In-kernel pieces (plain jnp on VMEM values)
# ----------------------------------------------------------------------------------------------------------------


def _fmix32(h):
    """`layers._fmix32` in wrapping int32 arithmetic (the same bits as uint32)."""
    srl = jax.lax.shift_right_logical
    h = h ^ srl(h, 16)
    h = h * jnp.int32(np.uint32(0x85EBCA6B).view(np.int32))
    h = h ^ srl(h, 13)
    h = h * jnp.int32(np.uint32(0xC2B2AE35).view(np.int32))
    return h ^ srl(h, 16)


def _keep(seed0, seed1, base, shape, klen: int, threshold: int):
    """`layers.keep_mask` of `[rows, klen]` entries whose row-major global indices are base + i·klen + j."""
    i = jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    j = jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    bits = _fmix32(_fmix32((base + i * klen + j) ^ seed0) + seed1)
    flip = jnp.int32(-(2**31))  # unsigned comparison through signed ints
    return (bits ^ flip) < jnp.int32(np.uint32(threshold).view(np.int32) ^ np.int32(-(2**31)))


def _rotate_rows(x, amounts, first, width: int, largest: int):
    """y[i, j] = x[i, (j - first - a_i) mod W] (rows rotated right), a_i = `amounts[i]` `[rows, 1]` int32 in
    [0, largest]: one rotation of the block by `first` (an int, traced or not; None for 0), then a barrel shift by
    the bits of the amounts (log2(largest) rotations, each kept in the rows whose bit is set)."""
    from jax.experimental.pallas import tpu as pltpu

    if first is not None:
        x = pltpu.roll(x, first, 1)
    bit = 1
    while bit <= largest:
        x = jnp.where((amounts & bit) != 0, pltpu.roll(x, bit, 1), x)
        bit *= 2
    return x


def _pad_columns(x, width: int):
    if x.shape[-1] < width:
        x = jnp.concatenate([x, jnp.zeros((x.shape[0], width - x.shape[-1]), x.dtype)], axis=1)
    return x


class _Static(NamedTuple):
    """Shapes and options fixed per call."""

    rows: int  # tq
    width: int  # W
    klen: int
    rlen: int
    offset: int
    stride: int
    dynamic: bool  # per-row starts
    segments: bool
    masks: bool
    dropout: bool
    threshold: int
    keep_prob: float
    scale: float
    heads: int  # global head count (dropout index)
    qlen: int  # global query count (dropout index)
    operands: str  # dtype of the products' operands in VMEM


def product_dtype(dtype) -> str:
    """The products' operand dtype: the inputs' own, float32 on TPU v2/v3, whose Mosaic matmuls take no bfloat16
    operands (XLA's own bfloat16 products there run on the same MXU)."""
    kind = platforms.lowering_device_kind()
    return "float32" if any(gen in kind for gen in ("TPU v2", "TPU v3")) else jnp.dtype(dtype).name


def _row_amounts(st: _Static, q_block, starts_ref, inverse: bool = False):  # starts_ref: the `[tq, 1]` starts
    """(first, rest, largest rest): row i's right rotation first + rest_i (mod W) taking out[i, j] = raw[i, start_i
    + j] (the shift), or its inverse (`inverse`: the shift's transpose, raw[i, start_i + j] = out[i, j])."""
    i = jax.lax.broadcasted_iota(jnp.int32, (st.rows, 1), 0)
    if st.dynamic:
        starts = starts_ref % st.width  # [tq, 1] int32
        return None, (starts if inverse else (st.width - starts) % st.width), st.width - 1
    largest = st.stride * (st.rows - 1)
    first = st.stride * q_block * st.rows - st.offset  # + stride * i
    if inverse:  # -(first + stride i) = -(first + largest) + stride (rows - 1 - i)
        return (-(first + largest)) % st.width, (st.stride * (st.rows - 1 - i)) % st.width, largest
    return first % st.width, (st.stride * i) % st.width, largest


def _scores(st: _Static, q_block, qu, qv, k, r, ef, flags, amounts):
    """S `[tq, klen]` float32 (masked entries MASK_VALUE)."""
    s = jax.lax.dot_general(qu, k, TRANS_B, preferred_element_type=jnp.float32)
    raw = jax.lax.dot_general(qv, r, TRANS_B, preferred_element_type=jnp.float32)  # [tq, r]
    s = s + _rotate_rows(_pad_columns(raw, st.width), amounts[1], amounts[0], st.width, amounts[2])[:, : st.klen]
    if st.segments:
        s = s + jnp.where((flags & DIFFERENT_SEGMENT) != 0, ef[:, 1:2], ef[:, 0:1])
    s = s * st.scale
    if st.masks:
        s = jnp.where((flags & MASKED) != 0, MASK_VALUE, s)
    return s


def _softmax(s):
    p = jnp.exp(s - s.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


def _dropout_keep(st: _Static, scalars_ref, b, n, q_block):
    """This block's keep mask: global row-major index over `[batch, heads, qlen, klen]`."""
    b_glob = scalars_ref[2] + b
    n_glob = scalars_ref[3] + n
    base = ((b_glob * st.heads + n_glob) * st.qlen + q_block * st.rows) * st.klen
    return _keep(scalars_ref[0], scalars_ref[1], base, (st.rows, st.klen), st.klen, st.threshold)


def _load(refs, st: _Static):
    """(ef `[tq, 2]` float32, flags `[tq, klen]` int32, starts `[tq, 1]` int32) or None each, in argument order
    (ef and starts arrive with the queries on the lanes, `[2, tq]` and `[1, tq]`)."""
    ef = refs.pop(0)[...].astype(jnp.float32).T if st.segments else None
    flags = refs.pop(0)[...].astype(jnp.int32) if (st.segments or st.masks) else None
    starts = refs.pop(0)[...].T if st.dynamic else None
    return ef, flags, starts


def _forward_kernel(st: _Static, scalars_ref, qu_ref, qv_ref, k_ref, v_ref, r_ref, *refs):
    from jax.experimental import pallas as pl

    refs = list(refs)
    o_ref = refs.pop()
    ef, flags, starts = _load(refs, st)
    n, b, q_block = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    amounts = _row_amounts(st, q_block, starts)
    qu, qv, k, r = (ref[...].astype(st.operands) for ref in (qu_ref, qv_ref, k_ref, r_ref))
    s = _scores(st, q_block, qu, qv, k, r, ef, flags, amounts)
    p = _softmax(s)
    if st.dropout:
        p = jnp.where(_dropout_keep(st, scalars_ref, b, n, q_block), p / st.keep_prob, 0.0)
    v = v_ref[...].astype(st.operands)
    o_ref[...] = jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32).astype(o_ref.dtype)


def _backward_kernel(st: _Static, shared_r: bool, scalars_ref, qu_ref, qv_ref, k_ref, v_ref, r_ref, *refs):
    from jax.experimental import pallas as pl

    refs = list(refs)
    dk_acc, dv_acc, dr_acc = refs[-3:]  # float32 VMEM accumulators over the query blocks (and rows: shared r)
    dqu_ref, dqv_ref, dk_ref, dv_ref, dr_ref = refs[-8:-3]
    def_ref = refs[-9] if st.segments else None
    refs = refs[: -9 if st.segments else -8]
    do_ref = refs.pop()
    ef, flags, starts = _load(refs, st)
    n, b, q_block = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    last_b, last_q = pl.num_programs(1) - 1, pl.num_programs(2) - 1
    r_first = (q_block == 0) & ((b == 0) | (not shared_r))
    r_last = (q_block == last_q) & ((b == last_b) | (not shared_r))

    @pl.when(q_block == 0)
    def _():
        dk_acc[...] = jnp.zeros_like(dk_acc)
        dv_acc[...] = jnp.zeros_like(dv_acc)

    @pl.when(r_first)
    def _():
        dr_acc[...] = jnp.zeros_like(dr_acc)

    qu, qv, k, v, r, do = (ref[...].astype(st.operands) for ref in (qu_ref, qv_ref, k_ref, v_ref, r_ref, do_ref))
    amounts = _row_amounts(st, q_block, starts)
    p = _softmax(_scores(st, q_block, qu, qv, k, r, ef, flags, amounts))
    dp = jax.lax.dot_general(do, v, TRANS_B, preferred_element_type=jnp.float32)  # d(P_d)
    pd = p
    if st.dropout:
        keep = _dropout_keep(st, scalars_ref, b, n, q_block)
        pd = jnp.where(keep, p / st.keep_prob, 0.0)
        dp = jnp.where(keep, dp / st.keep_prob, 0.0)
    dv_acc[...] += jnp.dot(pd.T.astype(do.dtype), do, preferred_element_type=jnp.float32)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    if st.masks:
        ds = jnp.where((flags & MASKED) != 0, 0.0, ds)
    ds = ds * st.scale  # d(content + position + segment)
    dqu_ref[...] = jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32).astype(dqu_ref.dtype)
    dk_acc[...] += jnp.dot(ds.T.astype(qu.dtype), qu, preferred_element_type=jnp.float32)
    first, rest, largest = _row_amounts(st, q_block, starts, inverse=True)
    draw = _rotate_rows(_pad_columns(ds, st.width), rest, first, st.width, largest)[:, : st.rlen]
    dqv_ref[...] = jnp.dot(draw.astype(r.dtype), r, preferred_element_type=jnp.float32).astype(dqv_ref.dtype)
    dr_acc[...] += jnp.dot(draw.T.astype(qv.dtype), qv, preferred_element_type=jnp.float32)
    if st.segments:
        different = (flags & DIFFERENT_SEGMENT) != 0
        same_sum = jnp.where(different, 0.0, ds).sum(axis=-1, keepdims=True)
        diff_sum = jnp.where(different, ds, 0.0).sum(axis=-1, keepdims=True)
        def_ref[...] = jnp.concatenate([same_sum, diff_sum], axis=1).T.astype(def_ref.dtype)

    @pl.when(q_block == last_q)
    def _():
        dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)

    @pl.when(r_last)
    def _():
        dr_ref[...] = dr_acc[...].astype(dr_ref.dtype)


# ----------------------------------------------------------------------------------------------------------------
# pallas_call plumbing
# ----------------------------------------------------------------------------------------------------------------


def _specs(st: _Static, shapes: dict):
    """BlockSpecs of the inputs, grid (heads, batch, query blocks)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    d = shapes["qu"][-1]
    rb = shapes["r"][0]
    row = lambda n, b, i: (b, n, i, 0)
    whole = lambda n, b, i: (b, n, 0, 0)
    specs = [
        pl.BlockSpec(memory_space=pltpu.SMEM),
        pl.BlockSpec((None, None, st.rows, d), row),
        pl.BlockSpec((None, None, st.rows, d), row),
        _once((None, None, st.klen, d), whole),
        _once((None, None, st.klen, d), whole),
        _once((None, None, st.rlen, d), (lambda n, b, i: (0, n, 0, 0)) if rb == 1 else whole),
    ]
    if st.segments:
        specs.append(pl.BlockSpec((None, None, 2, st.rows), lambda n, b, i: (b, n, 0, i)))
    if st.segments or st.masks:
        mb = shapes["flags"][0]
        specs.append(pl.BlockSpec((None, st.rows, st.klen), lambda n, b, i: ((0 if mb == 1 else b), i, 0)))
    if st.dynamic:
        specs.append(pl.BlockSpec((None, 1, st.rows), lambda n, b, i: (b, 0, i)))
    return specs


def _once(block, index):
    """A block that changes once per (row, head), every q / tq steps: one VMEM buffer, not two (its next block's
    copy waits for the last step on this one, a stall per (row, head) that keeps the keys, values, position keys
    and their gradients of d_head = 128 and klen = 1536 within v3's 16 MiB of VMEM)."""
    from jax.experimental import pallas as pl

    return pl.BlockSpec(block, index, pipeline_mode=pl.Buffered(1))


def _struct(shape, dtype, like):
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.typeof(like).manual_axis_type)


def _call_forward(st: _Static, interpret: bool, scalars, qu, qv, k, v, r, extras):
    from jax.experimental import pallas as pl

    b, n, q, d = qu.shape
    shapes = {"qu": qu.shape, "r": r.shape, "flags": None if extras.get("flags") is None else extras["flags"].shape}
    args = [scalars, qu, qv, k, v, r] + [
        extras[key] for key in ("ef", "flags", "starts") if extras.get(key) is not None
    ]
    return pl.pallas_call(
        functools.partial(_forward_kernel, st),
        grid=(n, b, q // st.rows),
        in_specs=_specs(st, shapes),
        out_specs=pl.BlockSpec((None, None, st.rows, d), lambda n_, b_, i: (b_, n_, i, 0)),
        out_shape=_struct(qu.shape, qu.dtype, qu),
        cost_estimate=_cost(st, b, n, q, d, backward=False),
        interpret=interpret,
    )(*args)


def _call_backward(st: _Static, interpret: bool, scalars, qu, qv, k, v, r, extras, do):
    from jax.experimental import pallas as pl

    b, n, q, d = qu.shape
    shared_r = r.shape[0] == 1
    shapes = {"qu": qu.shape, "r": r.shape, "flags": None if extras.get("flags") is None else extras["flags"].shape}
    args = [scalars, qu, qv, k, v, r] + [
        extras[key] for key in ("ef", "flags", "starts") if extras.get(key) is not None
    ]
    row = lambda n_, b_, i: (b_, n_, i, 0)
    whole = lambda n_, b_, i: (b_, n_, 0, 0)
    out_specs, out_shape = [], []
    if st.segments:
        out_specs.append(pl.BlockSpec((None, None, 2, st.rows), lambda n_, b_, i: (b_, n_, 0, i)))
        out_shape.append(_struct((b, n, 2, q), jnp.float32, qu))
    out_specs += [
        pl.BlockSpec((None, None, st.rows, d), row),
        pl.BlockSpec((None, None, st.rows, d), row),
        _once((None, None, st.klen, d), whole),
        _once((None, None, st.klen, d), whole),
        _once((None, None, st.rlen, d), (lambda n_, b_, i: (0, n_, 0, 0)) if shared_r else whole),
    ]
    out_shape += [_struct(x.shape, x.dtype, qu) for x in (qu, qv, k, v, r)]
    from jax.experimental.pallas import tpu as pltpu

    outs = pl.pallas_call(
        functools.partial(_backward_kernel, st, shared_r),
        grid=(n, b, q // st.rows),
        in_specs=_specs(st, shapes) + [pl.BlockSpec((None, None, st.rows, d), row)],
        out_specs=out_specs,
        out_shape=out_shape,
        scratch_shapes=[pltpu.VMEM((st.klen, d), jnp.float32)] * 2 + [pltpu.VMEM((st.rlen, d), jnp.float32)],
        cost_estimate=_cost(st, b, n, q, d, backward=True),
        interpret=interpret,
    )(*args, do)
    d_ef = outs[0] if st.segments else None
    return (*outs[-5:], d_ef)


def _cost(st: _Static, b: int, n: int, q: int, d: int, backward: bool):
    """The kernel's matmul FLOPs (forward: content, position, probabilities by values; backward: the content and
    position products again, then dP, dv, dqu, dk, dqv, dr) and exponentials, for the roofline."""
    from jax.experimental import pallas as pl

    per_row = 5 * st.klen + 3 * st.rlen if backward else 2 * st.klen + st.rlen
    return pl.CostEstimate(flops=2 * b * n * q * d * per_row, transcendentals=b * n * q * st.klen, bytes_accessed=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _attention(st, interpret, scalars, qu, qv, k, v, r, extras):
    return _call_forward(st, interpret, scalars, qu, qv, k, v, r, extras)


def _attention_fwd(st, interpret, scalars, qu, qv, k, v, r, extras):
    return _call_forward(st, interpret, scalars, qu, qv, k, v, r, extras), (scalars, qu, qv, k, v, r, extras)


def _attention_bwd(st, interpret, residuals, do):
    scalars, qu, qv, k, v, r, extras = residuals
    dqu, dqv, dk, dv, dr, d_ef = _call_backward(st, interpret, scalars, qu, qv, k, v, r, extras, do)
    d_extras = jax.tree.map(_zero_cotangent, extras)
    if st.segments:
        d_extras["ef"] = d_ef.astype(extras["ef"].dtype)  # (the transposed layout: swapaxes' vjp undoes it)
    return _zero_cotangent(scalars), dqu, dqv, dk, dv, dr, d_extras


def _zero_cotangent(x):
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


_attention.defvjp(_attention_fwd, _attention_bwd)


# ----------------------------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------------------------

BATCH, HEADS = "activation_batch", "activation_heads"


def relative_attention(
    qu: jax.Array,
    qv: jax.Array,
    k: jax.Array,
    v: jax.Array,
    r: jax.Array,
    *,
    shift: Shift,
    scale: float,
    ef: Optional[jax.Array] = None,
    flags: Optional[jax.Array] = None,
    masks: bool = False,
    dropout: Optional[tuple] = None,
    interpret: bool = False,
) -> jax.Array:
    """softmax(mask((qu·k^T + shift(qv·r^T) + ef[seg]) · scale)), dropped out, · v, heads-major:

    qu, qv `[b, n, q, d]`; k, v `[b, n, klen, d]`; r `[1 or b, n, rlen, d]` (position keys shared by the batch or
    per row); `shift` where row i of qv·r^T is read (`Shift`); `ef` `[b, n, q, 2]` the segment scores (same,
    different segment) or None; `flags` int8 `[1 or b, q, klen]` (bit 0 masked, if `masks`; bit 1 different
    segment, if `ef` is given); `dropout` (seed uint32 `[2]` of `layers.keep_mask`, keep probability) or None.
    Returns `[b, n, q, d]` in qu's dtype."""
    b, n, q, d = qu.shape
    klen, rlen = k.shape[2], r.shape[2]
    width = padded_width(rlen, klen)
    seed, keep_prob = dropout if dropout is not None else (jnp.zeros((2,), jnp.uint32), 1.0)
    st = _Static(
        rows=block_rows(q, width),
        width=width,
        klen=klen,
        rlen=rlen,
        offset=int(shift.offset),
        stride=int(shift.stride),
        dynamic=shift.starts is not None,
        segments=ef is not None,
        masks=masks,
        dropout=dropout is not None,
        threshold=layers.keep_threshold(keep_prob),
        keep_prob=float(keep_prob),
        scale=float(scale),
        heads=n,
        qlen=q,
        operands=product_dtype(qu.dtype),
    )
    if st.rows == 0:
        raise ValueError(f"tpu_attention: no block of rows fits {q} queries against {width} columns")
    extras = {
        "ef": None if ef is None else jnp.swapaxes(ef, -1, -2),  # [b, n, 2, q]: queries on the lanes
        "flags": flags,
        "starts": None if shift.starts is None else shift.starts[:, None, :].astype(jnp.int32),
    }
    extras = {key: val for key, val in extras.items() if val is not None}
    seed_words = jax.lax.bitcast_convert_type(jnp.asarray(seed, jnp.uint32), jnp.int32)
    return per_device(functools.partial(_attention, st, interpret), seed_words, qu, qv, k, v, r, extras)


def per_device(fn, seed_words, qu, qv, k, v, r, extras):
    """`fn(scalars, qu, qv, k, v, r, extras)` on each device's batch rows and heads (`jax.shard_map` under the
    active rules; a plain call off a mesh). scalars = (seed0, seed1, first batch row, first head) of the device."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or all(size == 1 for size in mesh.shape.values()):
        return fn(jnp.concatenate([seed_words, jnp.zeros((2,), jnp.int32)]), qu, qv, k, v, r, extras)
    rules = sharding.active_rules()
    spec = sharding.activation_spec((BATCH, HEADS, None, None), qu.shape, rules, mesh)
    batch_axes, head_axes = (() if a is None else (a,) if isinstance(a, str) else tuple(a) for a in spec[:2])
    P = jax.sharding.PartitionSpec
    row_spec = lambda x, lead: P(*((spec[0] if x.shape[0] > 1 else None,) + lead + (None,) * (x.ndim - 1 - len(lead))))
    in_specs = (
        P(),
        spec,
        spec,
        spec,
        spec,
        row_spec(r, (spec[1],)),
        {key: (P(spec[0], spec[1], None, None) if key == "ef" else row_spec(x, ())) for key, x in extras.items()},
    )
    split = batch_axes + head_axes

    def body(seed_words, qu, qv, k, v, r, extras):
        def varying(x):
            missing = tuple(a for a in split if a not in jax.typeof(x).manual_axis_type.varying)
            return jax.lax.pcast(x, missing, to="varying") if missing else x

        first_row = lambda axes, size: varying(jax.lax.axis_index(axes) * size if axes else jnp.int32(0))
        b0, n0 = first_row(batch_axes, qu.shape[0]), first_row(head_axes, qu.shape[1])
        scalars = jnp.concatenate([varying(seed_words), jnp.stack([b0, n0]).astype(jnp.int32)])
        qu, qv, k, v, r, extras = jax.tree.map(varying, (qu, qv, k, v, r, extras))
        return fn(scalars, qu, qv, k, v, r, extras)

    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=spec)(seed_words, qu, qv, k, v, r, extras)
