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
each memory-bound on v3 at d_head = 64) becomes VMEM traffic; HBM sees q, k, v, r once per (row, block of heads)
and the masks as one int8 `[q, k]` array per row and block of heads (bit 0: masked, bit 1: different segment).

Operands are token-major with the heads merged, `[b, l, n·d]`, as the projections write them (one 2-D product
each, `layers.Dense(merged=True)`): no transposes to and from a heads-major layout, and a block of `LANES` lanes
holds 128 / d heads at d_head < 128 (a `[rows, 64]` block would be padded to the 128 lanes in HBM). The kernel
takes the block's heads one after another, each product over the whole block with the other heads' lanes zeroed:
the MXU's contraction and output are 128 wide either way. XLNet's keys of both directions are read per row by its
direction (`directions`), and the memory's keys and values may come apart from the segment's (`memory`), joined in
VMEM.

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


def applies(q: int, klen: int, r: int, factor_width: int = 0) -> bool:
    """Whether q queries against klen keys fit the kernel's blocks: r position keys (shifted), and the factorized
    term's width D (0 without one)."""
    return block_rows(q, padded_width(r, klen) + factor_width) > 0


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


class Factorized(NamedTuple):
    """Funnel-Transformer's factorized position term, rotated form (`relative_attention.
    rotated_factorized_position_scores`), formed inside the kernel from the position queries qv:

        pos[i, j] = ((qv_i · W_r^T) ⊙ phi_i + (qv_i · W_s^T) ⊙ pi_i) · psi_j

    phi, pi `[1 or b, q, D]` (the query factors; pi as [pi_2, -pi_1]), w_r, w_s `[n, D, d]` (W_r per head, and
    with its halves swapped), psi `[klen, D]` (the key factors). phi, pi and psi are constants (sinusoids of the
    positions, dropout applied): no gradient flows to them."""

    phi: jax.Array
    pi: jax.Array
    w_r: jax.Array
    w_s: jax.Array
    psi: jax.Array


def heads_per_block(n: int, d: int) -> int:
    """Heads per block of lanes: one at d_head a multiple of 128; 128 / d where that divides n; else all n (a
    block of the whole merged dimension)."""
    if d % LANES == 0:
        return 1
    if n * d <= LANES or LANES % d or n % (LANES // d):
        return n
    return LANES // d


class _Static(NamedTuple):
    """Shapes and options fixed per call."""

    rows: int  # tq
    width: int  # W: the rotation width (0 without a shifted position term)
    klen: int
    offset: int
    stride: int
    dynamic: bool  # per-row starts
    segments: bool
    masks: bool
    exclude_first: bool  # no position / segment term in global row 0 and column 0 (Funnel's <cls>)
    dropout: bool
    threshold: int
    keep_prob: float
    scale: float
    heads: int  # global head count (dropout index)
    qlen: int  # global query count (dropout index)
    operands: str  # dtype of the products' operands in VMEM
    d_head: int
    group: int = 1  # heads per block (`heads_per_block` of the device's heads; set per device in `_call`)


def product_dtype(dtype) -> str:
    """The products' operand dtype: the inputs' own, float32 on TPU v2/v3, whose Mosaic matmuls take no bfloat16
    operands (issue jax-ml/jax#23989; Mosaic's lowered kernel then feeds the MXU float32 in its rounding mode, one
    pass at the bfloat16 rate, as XLA's default-precision products)."""
    kind = platforms.lowering_device_kind()
    return "float32" if any(gen in kind for gen in ("TPU v2", "TPU v3")) else jnp.dtype(dtype).name


def _row_amounts(st: _Static, q_block, starts, inverse: bool = False):
    """(first, rest, largest rest): row i's right rotation first + rest_i (mod W) taking out[i, j] = raw[i, start_i
    + j] (the shift), or its inverse (`inverse`: the shift's transpose, raw[i, start_i + j] = out[i, j]); starts:
    the block's `[tq, 1]` per-row starts, or None (static offset and stride)."""
    i = jax.lax.broadcasted_iota(jnp.int32, (st.rows, 1), 0)
    if st.dynamic:
        starts = starts % st.width
        return None, (starts if inverse else (st.width - starts) % st.width), st.width - 1
    largest = st.stride * (st.rows - 1)
    first = st.stride * q_block * st.rows - st.offset  # + stride * i
    if inverse:  # -(first + stride i) = -(first + largest) + stride (rows - 1 - i)
        return (-(first + largest)) % st.width, (st.stride * (st.rows - 1 - i)) % st.width, largest
    return first % st.width, (st.stride * i) % st.width, largest


class _Block(NamedTuple):
    """One grid step's inputs, loaded (products' operands in `st.operands`)."""

    qu: jax.Array
    qv: jax.Array
    k: jax.Array
    r: Optional[jax.Array]
    ef: Optional[jax.Array]  # [tq, 2] float32, one head's (read per head by `_head`)
    flags: Optional[jax.Array]  # [tq, klen] int32
    starts: Optional[jax.Array]  # [tq, 1] int32
    fact: Optional[tuple]  # (phi, pi [tq, D], w_r, w_s [D, d], psi [klen, D])


def _keys(x: dict, name: str, st: _Static):
    """The keys (`k`) or values (`v`) `[klen, hb·d]`: the memory's rows (`k_mem`, `v_mem`, when given apart) and
    the segment's, concatenated in VMEM."""
    rows = x[name][...].astype(st.operands)
    if name + "_mem" in x:
        rows = jnp.concatenate([x[name + "_mem"][...].astype(st.operands), rows], axis=0)
    return rows


def _load(x: dict, st: _Static) -> _Block:
    cast = lambda name: x[name][...].astype(st.operands) if name in x else None
    q = cast("q")
    return _Block(
        qu=q + cast("u"),  # q + u, q + v: the biases `[1, hb·d]` added in VMEM
        qv=q + cast("vb"),
        k=_keys(x, "k", st),
        r=(x["r"][x["directions"][x["row"]]] if "directions" in x else x["r"][...]).astype(st.operands)
        if "r" in x
        else None,
        ef=None,  # read per head (`_head`)
        flags=x["flags"][...].astype(jnp.int32) if "flags" in x else None,
        starts=x["starts"][...].T if "starts" in x else None,  # arrives as [1, tq]
        fact=tuple(cast(name) for name in ("phi", "pi", "w_r", "w_s", "psi")) if "psi" in x else None,
    )


def _per_head(st: _Static, body, carry):
    """carry = body(h, lanes, carry) for each head h of the block, `lanes` its lanes `[1, hb·d]` bool (None for a
    block of one head): a loop, so that one head's `[tq, klen]` temporaries are live at a time in VMEM."""
    if st.group == 1:
        return body(0, None, carry)
    head = jax.lax.broadcasted_iota(jnp.int32, (1, st.group * st.d_head), 1) // st.d_head
    return jax.lax.fori_loop(0, st.group, lambda h, c: body(h, head == h, c), carry)


def _only(lanes, x):
    """x with the lanes of the other heads zeroed."""
    return x if lanes is None else jnp.where(lanes, x, jnp.zeros_like(x))


def _head(blk: _Block, x: dict, h, lanes) -> _Block:
    """The block's inputs for head h: its queries' lanes (the products then contract over its lanes only) and its
    segment scores `[tq, 2]` (`ef` arrives as `[hb, 2, tq]`, queries on the lanes)."""
    ef = x["ef"][h].astype(jnp.float32).T if "ef" in x else None
    return blk._replace(qu=_only(lanes, blk.qu), qv=_only(lanes, blk.qv), ef=ef)


def _first_excluded(st: _Static, q_block):
    """True where the position and segment terms apply: not in global row 0 nor column 0."""
    i = jax.lax.broadcasted_iota(jnp.int32, (st.rows, st.klen), 0) + q_block * st.rows
    j = jax.lax.broadcasted_iota(jnp.int32, (st.rows, st.klen), 1)
    return (i > 0) & (j > 0)


def _scores(st: _Static, q_block, blk: _Block):
    """S `[tq, klen]` float32 (masked entries MASK_VALUE), and the factorized term's xy `[tq, D]` (or None)."""
    s = jax.lax.dot_general(blk.qu, blk.k, TRANS_B, preferred_element_type=jnp.float32)
    pos, xy = None, None
    if blk.r is not None:
        raw = jax.lax.dot_general(blk.qv, blk.r, TRANS_B, preferred_element_type=jnp.float32)  # [tq, r]
        first, rest, largest = _row_amounts(st, q_block, blk.starts)
        pos = _rotate_rows(_pad_columns(raw, st.width), rest, first, st.width, largest)[:, : st.klen]
    if blk.fact is not None:
        phi, pi, w_r, w_s, psi = blk.fact
        q_r = jax.lax.dot_general(blk.qv, w_r, TRANS_B, preferred_element_type=jnp.float32)  # [tq, D]
        q_s = jax.lax.dot_general(blk.qv, w_s, TRANS_B, preferred_element_type=jnp.float32)
        xy = q_r * phi + q_s * pi
        term = jax.lax.dot_general(xy.astype(psi.dtype), psi, TRANS_B, preferred_element_type=jnp.float32)
        pos = term if pos is None else pos + term
    if st.segments:
        seg = jnp.where((blk.flags & DIFFERENT_SEGMENT) != 0, blk.ef[:, 1:2], blk.ef[:, 0:1])
        pos = seg if pos is None else pos + seg
    if pos is not None:
        if st.exclude_first:
            pos = jnp.where(_first_excluded(st, q_block), pos, 0.0)
        s = s + pos
    s = s * st.scale
    if st.masks:
        s = jnp.where((blk.flags & MASKED) != 0, MASK_VALUE, s)
    return s, xy


def _softmax(s):
    p = jnp.exp(s - s.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


def _dropout_keep(st: _Static, scalars_ref, b, n, q_block):
    """This block's keep mask: global row-major index over `[batch, heads, qlen, klen]`."""
    b_glob = scalars_ref[2] + b
    n_glob = scalars_ref[3] + n
    base = ((b_glob * st.heads + n_glob) * st.qlen + q_block * st.rows) * st.klen
    return _keep(scalars_ref[0], scalars_ref[1], base, (st.rows, st.klen), st.klen, st.threshold)


def _forward_kernel(st: _Static, names: tuple, *refs):
    from jax.experimental import pallas as pl

    x = dict(zip(names, refs))
    group, b, q_block = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    blk = _load(dict(x, row=b), st)
    v = _keys(x, "v", st)

    def head(h, lanes, out):
        s, _ = _scores(st, q_block, _head(blk, x, h, lanes))
        p = _softmax(s)
        if st.dropout:
            keep = _dropout_keep(st, x["scalars"], b, group * st.group + h, q_block)
            p = jnp.where(keep, p / st.keep_prob, 0.0)
        return out + _only(lanes, jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32))

    out = _per_head(st, head, jnp.zeros(blk.qu.shape, jnp.float32))
    x["out"][...] = out.astype(x["out"].dtype)


# gradients accumulated over the grid in float32 VMEM: name -> whether the block is shared by the batch rows
_ACCUMULATED = ("dk", "dv", "dr", "dw_r", "dw_s", "du", "dvb")


def _backward_kernel(st: _Static, names: tuple, shared: dict, direct: tuple, *refs):
    from jax.experimental import pallas as pl

    x = dict(zip(names, refs))
    x.update({name + "_acc": x[name] for name in direct})  # float32 outputs accumulated in place
    group, b, q_block = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    last_b, last_q = pl.num_programs(1) - 1, pl.num_programs(2) - 1
    for name in _ACCUMULATED:
        if name in x:
            first = (q_block == 0) & ((b == 0) | (not shared[name]))
            pl.when(first)(functools.partial(_start, x, name))

    blk = _load(dict(x, row=b), st)
    do = x["do"][...].astype(st.operands)
    v = _keys(x, "v", st)

    def head(h, lanes, carry):
        dq, du, dvb = carry
        bh = _head(blk, x, h, lanes)
        s, xy = _scores(st, q_block, bh)
        p = _softmax(s)
        do_h = _only(lanes, do)
        dp = jax.lax.dot_general(do_h, v, TRANS_B, preferred_element_type=jnp.float32)  # d(P_d)
        pd = p
        if st.dropout:
            keep = _dropout_keep(st, x["scalars"], b, group * st.group + h, q_block)
            pd = jnp.where(keep, p / st.keep_prob, 0.0)
            dp = jnp.where(keep, dp / st.keep_prob, 0.0)
        x["dv_acc"][...] += jnp.dot(pd.T.astype(do.dtype), do_h, preferred_element_type=jnp.float32)
        ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
        if st.masks:
            ds = jnp.where((bh.flags & MASKED) != 0, 0.0, ds)
        ds = ds * st.scale  # d(content + position + segment)
        dqu = _only(lanes, jnp.dot(ds.astype(bh.k.dtype), bh.k, preferred_element_type=jnp.float32))
        x["dk_acc"][...] += jnp.dot(ds.T.astype(bh.qu.dtype), bh.qu, preferred_element_type=jnp.float32)
        ds_pos = jnp.where(_first_excluded(st, q_block), ds, 0.0) if st.exclude_first else ds
        dqv = jnp.zeros(bh.qv.shape, jnp.float32)
        if bh.r is not None:
            first, rest, largest = _row_amounts(st, q_block, bh.starts, inverse=True)
            draw = _rotate_rows(_pad_columns(ds_pos, st.width), rest, first, st.width, largest)[:, : bh.r.shape[0]]
            dqv += jnp.dot(draw.astype(bh.r.dtype), bh.r, preferred_element_type=jnp.float32)
            dr = jnp.dot(draw.T.astype(bh.qv.dtype), bh.qv, preferred_element_type=jnp.float32)
            if "directions" in x:  # both directions' keys accumulated, row b's into its own
                x["dr_acc"][x["directions"][b]] += dr
            else:
                x["dr_acc"][...] += dr
        if bh.fact is not None:
            phi, pi, w_r, w_s, psi = bh.fact
            dxy = jnp.dot(ds_pos.astype(psi.dtype), psi, preferred_element_type=jnp.float32)  # [tq, D]
            dq_r, dq_s = (dxy * phi).astype(w_r.dtype), (dxy * pi).astype(w_s.dtype)
            dqv += jnp.dot(dq_r, w_r, preferred_element_type=jnp.float32) + jnp.dot(
                dq_s, w_s, preferred_element_type=jnp.float32
            )
            x["dw_r_acc"][...] += jnp.dot(dq_r.T, bh.qv, preferred_element_type=jnp.float32)
            x["dw_s_acc"][...] += jnp.dot(dq_s.T, bh.qv, preferred_element_type=jnp.float32)
        dqv = _only(lanes, dqv)
        if st.segments:
            different = (bh.flags & DIFFERENT_SEGMENT) != 0
            same_sum = jnp.where(different, 0.0, ds_pos).sum(axis=-1, keepdims=True)
            diff_sum = jnp.where(different, ds_pos, 0.0).sum(axis=-1, keepdims=True)
            x["d_ef"][h] = jnp.concatenate([same_sum, diff_sum], axis=1).T.astype(x["d_ef"].dtype)  # [2, tq]
        return dq + dqu + dqv, du + dqu.sum(axis=0, keepdims=True), dvb + dqv.sum(axis=0, keepdims=True)

    zeros = lambda shape: jnp.zeros(shape, jnp.float32)
    dq, du, dvb = _per_head(st, head, (zeros(blk.qu.shape), zeros((1, blk.qu.shape[1])), zeros((1, blk.qu.shape[1]))))
    x["dq"][...] = dq.astype(x["dq"].dtype)
    x["du_acc"][...] += du
    x["dvb_acc"][...] += dvb

    for name in _ACCUMULATED:
        if name in x and name not in direct:
            last = (q_block == last_q) & ((b == last_b) | (not shared[name]))
            pl.when(last)(functools.partial(_write, x, name))


def _start(x: dict, name: str):
    """An accumulator's start: zeros, or the gradient it accumulates onto (`onto` of `_call`, the other stream's),
    the keys' and values' joined from the memory's rows and the segment's when these came apart."""
    acc = x[name + "_acc"]
    if name + "_onto" not in x:
        acc[...] = jnp.zeros_like(acc)
    elif name + "_mem_onto" in x:
        m = x[name + "_mem_onto"].shape[0]
        acc[:m] = x[name + "_mem_onto"][...].astype(acc.dtype)
        acc[m:] = x[name + "_onto"][...].astype(acc.dtype)
    else:
        acc[...] = x[name + "_onto"][...].astype(acc.dtype)


def _write(x: dict, name: str):
    """An accumulated gradient to its output; the keys' and values' split into the memory's rows and the segment's
    when these came apart."""
    acc = x[name + "_acc"]
    if name + "_mem" in x:
        m = x[name + "_mem"].shape[0]
        x[name + "_mem"][...] = acc[:m].astype(x[name + "_mem"].dtype)
        x[name][...] = acc[m:].astype(x[name].dtype)
    else:
        x[name][...] = acc[...].astype(x[name].dtype)


# ----------------------------------------------------------------------------------------------------------------
# pallas_call plumbing
# ----------------------------------------------------------------------------------------------------------------


def _once(block, index):
    """A block that changes at most once per (row, block of heads), every q / tq steps: one VMEM buffer, not two (its
    next block's copy waits for the last step on this one, a stall per (row, block) that keeps the keys, values,
    position keys and their gradients of d_head = 128 and klen = 1536 within v3's 16 MiB of VMEM)."""
    from jax.experimental import pallas as pl

    return pl.BlockSpec(block, index, pipeline_mode=pl.Buffered(1))


def _specs(st: _Static, inputs: dict) -> dict:
    """BlockSpecs of the inputs present, grid (head blocks, batch, query blocks); a block of lanes holds st.group
    heads of the merged `n·d` dimension."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    bw = st.group * st.d_head
    lead = lambda name: (lambda g, b: b) if inputs[name].shape[0] > 1 else (lambda g, b: 0)
    specs = {
        "scalars": pl.BlockSpec(memory_space=pltpu.SMEM),
        "q": pl.BlockSpec((None, st.rows, bw), lambda g, b, i: (b, i, g)),
        "u": _once((1, bw), lambda g, b, i: (0, g)),
        "vb": _once((1, bw), lambda g, b, i: (0, g)),
    }
    for name in ("k", "v", "k_mem", "v_mem"):
        if name in inputs:
            specs[name] = _once((None, inputs[name].shape[1], bw), lambda g, b, i: (b, 0, g))
    if "directions" in inputs:  # the keys of both directions, per block of heads; each row's direction in SMEM
        specs["directions"] = pl.BlockSpec(memory_space=pltpu.SMEM)
        specs["r"] = _once((2, inputs["r"].shape[1], bw), lambda g, b, i: (0, 0, g))
    elif "r" in inputs:
        rb, rlen = lead("r"), inputs["r"].shape[1]
        specs["r"] = _once((None, rlen, bw), lambda g, b, i: (rb(g, b), 0, g))
    if "ef" in inputs:
        specs["ef"] = pl.BlockSpec((None, st.group, 2, st.rows), lambda g, b, i: (b, g, 0, i))
    if "flags" in inputs:
        fb = lead("flags")
        specs["flags"] = pl.BlockSpec((None, st.rows, st.klen), lambda g, b, i: (fb(g, b), i, 0))
    if "starts" in inputs:
        specs["starts"] = pl.BlockSpec((None, 1, st.rows), lambda g, b, i: (b, 0, i))
    if "psi" in inputs:
        width = inputs["psi"].shape[-1]
        pb = lead("phi")
        for name in ("phi", "pi"):
            specs[name] = pl.BlockSpec((None, st.rows, width), lambda g, b, i: (pb(g, b), i, 0))
        for name in ("w_r", "w_s"):
            specs[name] = _once((width, bw), lambda g, b, i: (0, g))
        specs["psi"] = _once((st.klen, width), lambda g, b, i: (0, 0))
    return specs


def _struct(shape, dtype, like):
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.typeof(like).manual_axis_type)


def _flops(st: _Static, inputs: dict, backward: bool) -> int:
    """The kernel's matmul FLOPs: forward content, position and segment products and probabilities by values;
    backward the score products again, then dP, dv, dqu, dk and the position term's gradients. Per head over its
    d lanes (a block of several heads runs each product 128 lanes wide, as the MXU would at d < 128 anyway)."""
    b, q, nd = inputs["q"].shape
    n, d, k = nd // st.d_head, st.d_head, st.klen
    per_row = (10 if backward else 4) * d * k
    if "r" in inputs:
        per_row += (6 if backward else 2) * d * inputs["r"].shape[1]
    if "psi" in inputs:
        width = inputs["psi"].shape[-1]
        per_row += (12 * d * width + 4 * width * k) if backward else (4 * d * width + 2 * width * k)
    return b * n * q * per_row


def _block_bytes(block, dtype) -> int:
    """HBM bytes of one block: the two minor dimensions padded to the (32 / itemsize, 128) tiles."""
    dims = [1 if d is None else d for d in block]
    size = jnp.dtype(dtype).itemsize
    dims[-1] = -(-dims[-1] // LANES) * LANES
    if len(dims) > 1:
        dims[-2] = -(-dims[-2] // (32 // size)) * (32 // size)
    return int(np.prod(dims)) * size


def _bytes_moved(grid, specs, arrays) -> int:
    """The HBM bytes a kernel's pipeline moves: per array, a block copy whenever its block index changes from one
    grid step to the next (row-major over the grid), e.g. the masks fetched again for every head, where the
    roofline's operand and result sizes count each array once."""
    import itertools

    total = 0
    for spec, x in zip(specs, arrays):
        if spec.block_shape is None:  # the SMEM scalars
            continue
        last, copies = None, 0
        for step in itertools.product(*(range(g) for g in grid)):
            index = spec.index_map(*step)
            copies += index != last
            last = index
        total += copies * _block_bytes(spec.block_shape, x.dtype)
    return total


def _call(st: _Static, interpret: bool, inputs: dict, do=None, onto: Optional[dict] = None):
    """The forward kernel (`do` None): out `[b, q, n·d]`; else the backward kernel: a dict of gradients, those of
    the accumulated inputs (keys, values, position keys, biases) added onto `onto`'s when given (the other
    stream's gradients of the same inputs, their buffers reused for the sums)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    qu = inputs["q"]
    b, q, nd = qu.shape
    st = st._replace(group=heads_per_block(nd // st.d_head, st.d_head))  # of this device's heads
    specs = _specs(st, inputs)
    names = tuple(inputs)
    row = specs["q"]
    grid = (nd // (st.group * st.d_head), b, q // st.rows)
    in_specs, in_arrays = [specs[k] for k in names], list(inputs.values())
    if do is None:
        outs = {"out": (row, qu)}
        kernel = functools.partial(_forward_kernel, st, names + ("out",))
        accumulated = []
    else:
        in_specs, in_arrays = in_specs + [row], in_arrays + [do]
        outs = {"dq": (row, qu)}  # name -> (spec, like)
        for name in ("u", "vb", "k", "v", "r", "w_r", "w_s", "k_mem", "v_mem"):
            if name in inputs:
                outs["d" + name] = (specs[name], inputs[name])
        if "ef" in inputs:
            outs["d_ef"] = (specs["ef"], inputs["ef"])
        shared = {
            "du": True,
            "dvb": True,
            "dk": False,
            "dv": False,
            "dr": "r" in inputs and (inputs["r"].shape[0] == 1 or "directions" in inputs),
            "dw_r": True,
            "dw_s": True,
        }
        # the keys of both directions' gradient: a float32 output accumulated in place (no scratch: with the keys,
        # the `[2, rlen, 128]` blocks of XLNet-Base's content stream would not fit v3's VMEM)
        direct = ("dr",) if "directions" in inputs else ()
        for name in direct:
            outs[name] = (outs[name][0], jax.ShapeDtypeStruct(outs[name][1].shape, jnp.float32))
        accumulated = [name for name in _ACCUMULATED if name in outs and name not in direct]
        onto = {} if onto is None else {name: onto[name] for name in outs if name in onto}
        for name, x in onto.items():  # read where the sum is written (aliased), at the accumulator's start
            in_specs, in_arrays = in_specs + [outs[name][0]], in_arrays + [x]
        refs = names + ("do",) + tuple(name + "_onto" for name in onto)
        refs += tuple(outs) + tuple(name + "_acc" for name in accumulated)
        kernel = functools.partial(_backward_kernel, st, refs, shared, direct)
    out_specs, out_like = [spec for spec, _ in outs.values()], [like for _, like in outs.values()]
    cost = pl.CostEstimate(
        flops=_flops(st, inputs, do is not None),
        transcendentals=b * (nd // st.d_head) * q * st.klen,
        bytes_accessed=_bytes_moved(grid, in_specs + out_specs, in_arrays + out_like),
    )
    block = lambda spec: tuple(size for size in spec.block_shape if size is not None)
    acc_shape = lambda name: (st.klen, block(outs[name][0])[1]) if name in ("dk", "dv") else block(outs[name][0])
    aliases = {}
    if do is not None:
        first_onto, names_out = len(in_arrays) - len(onto), list(outs)
        aliases = {first_onto + i: names_out.index(name) for i, name in enumerate(onto)}
    results = pl.pallas_call(
        kernel,
        grid=grid,
        input_output_aliases=aliases,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=[_struct(like.shape, like.dtype, qu) for like in out_like],
        scratch_shapes=[pltpu.VMEM(acc_shape(name), jnp.float32) for name in accumulated],
        cost_estimate=cost,
        interpret=interpret,
    )(*in_arrays)
    return results[0] if do is None else dict(zip(outs, results))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _attention(st, interpret, inputs):
    return _call(st, interpret, inputs)


def _attention_fwd(st, interpret, inputs):
    return _call(st, interpret, inputs), inputs


def _cotangents(inputs: dict, grads: dict) -> dict:
    cotangents = {}
    for name, x in inputs.items():
        key = "d_ef" if name == "ef" else "d" + name
        if key in grads:
            cotangents[name] = grads[key].astype(x.dtype)
        elif jnp.issubdtype(x.dtype, jnp.floating):
            cotangents[name] = jnp.zeros_like(x)  # constants: phi, pi, psi
        else:
            cotangents[name] = np.zeros(x.shape, jax.dtypes.float0)
    return cotangents


def _attention_bwd(st, interpret, inputs, do):
    return (_cotangents(inputs, _call(st, interpret, inputs, do)),)


_attention.defvjp(_attention_fwd, _attention_bwd)

# the inputs both of XLNet's streams read (`two_streams`); the query stream's own inputs carry this prefix
SHARED = ("u", "vb", "k", "v", "k_mem", "v_mem", "r", "directions")
QUERY = "g:"


def _streams(inputs: dict) -> tuple:
    """The flat inputs of `_two_streams` as the content stream's and the query stream's."""
    content = {name: x for name, x in inputs.items() if not name.startswith(QUERY)}
    query = {name: x for name, x in inputs.items() if name in SHARED}
    query.update({name[len(QUERY) :]: x for name, x in inputs.items() if name.startswith(QUERY)})
    return content, query


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _two_streams(st_content, st_query, interpret, inputs):
    content, query = _streams(inputs)
    return _call(st_content, interpret, content), _call(st_query, interpret, query)


def _two_streams_fwd(st_content, st_query, interpret, inputs):
    content, query = _streams(inputs)
    return (_call(st_content, interpret, content), _call(st_query, interpret, query)), inputs


def _two_streams_bwd(st_content, st_query, interpret, inputs, douts):
    """The query stream's backward kernel, then the content stream's accumulating onto its gradients of the shared
    inputs: their sums are formed in VMEM, where two calls would leave XLA to add them in HBM. (In this order the
    extra reads fall to the content stream's kernel, compute-bound with a query per key: XLNet-Base's query stream
    has 85 targets against 896 keys and would turn memory-bound.)"""
    content, query = _streams(inputs)
    grads = _call(st_query, interpret, query, douts[1])
    onto = {"d" + name: grads["d" + name] for name in SHARED if "d" + name in grads}
    cotangents = {QUERY + name: x for name, x in _cotangents(query, grads).items() if name not in SHARED}
    cotangents.update(_cotangents(content, _call(st_content, interpret, content, douts[0], onto)))
    return (cotangents,)


_two_streams.defvjp(_two_streams_fwd, _two_streams_bwd)


# ----------------------------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------------------------

BATCH, HEADS = "activation_batch", "activation_heads"


def _prepare(
    q: jax.Array,
    u: jax.Array,
    vb: jax.Array,
    k: jax.Array,
    v: jax.Array,
    r: Optional[jax.Array] = None,
    *,
    shift: Shift = Shift(),
    directions: Optional[jax.Array] = None,
    memory: Optional[tuple] = None,
    factorized: Optional[Factorized] = None,
    scale: float,
    ef: Optional[jax.Array] = None,
    flags: Optional[jax.Array] = None,
    masks: bool = False,
    exclude_first: bool = False,
    dropout: Optional[tuple] = None,
) -> tuple:
    """(static options, inputs, seed words) of one call of `relative_attention`."""
    n, d = u.shape
    b, qlen, _ = q.shape
    klen = k.shape[1] + (0 if memory is None else memory[0].shape[1])
    width = 0 if r is None else padded_width(r.shape[1], klen)
    seed, keep_prob = dropout if dropout is not None else (jnp.zeros((2,), jnp.uint32), 1.0)
    st = _Static(
        rows=block_rows(qlen, max(width, klen) + (0 if factorized is None else factorized.psi.shape[-1])),
        width=width,
        klen=klen,
        offset=int(shift.offset),
        stride=int(shift.stride),
        dynamic=shift.starts is not None,
        segments=ef is not None,
        masks=masks,
        exclude_first=exclude_first,
        dropout=dropout is not None,
        threshold=layers.keep_threshold(keep_prob),
        keep_prob=float(keep_prob),
        scale=float(scale),
        heads=n,
        qlen=qlen,
        operands=product_dtype(q.dtype),
        d_head=d,
    )
    if st.rows == 0:
        raise ValueError(f"tpu_attention: no block of rows fits {qlen} queries against {width} columns")
    bias = lambda x: x.astype(q.dtype).reshape(1, n * d)
    inputs = {"q": q, "u": bias(u), "vb": bias(vb), "k": k, "v": v, "r": r}
    if memory is not None:
        inputs["k_mem"], inputs["v_mem"] = memory
    if ef is not None:
        inputs["ef"] = jnp.swapaxes(ef, -1, -2)  # [b, n, 2, q]: queries on the lanes
    inputs["flags"] = flags
    if shift.starts is not None:
        inputs["starts"] = shift.starts[:, None, :].astype(jnp.int32)
    if directions is not None:
        inputs["directions"] = directions.astype(jnp.int32)
    if factorized is not None:  # W_r, W_s and psi, whole per head or call, enter in the products' dtype: no VMEM
        inputs.update(factorized._asdict())  # copy converting them (tiny arrays, read once per head or call)
        for name in ("w_r", "w_s", "psi"):
            inputs[name] = inputs[name].astype(st.operands)
    inputs = {name: x for name, x in inputs.items() if x is not None}
    return st, inputs, jax.lax.bitcast_convert_type(jnp.asarray(seed, jnp.uint32), jnp.int32)


def relative_attention(q, u, vb, k, v, r=None, *, interpret: bool = False, **options) -> jax.Array:
    """softmax(mask((qu·k^T + position + ef[seg]) · scale)), dropped out, · v, per head, qu = q + u, qv = q + vb,
    every operand token-major with the heads merged:

    q `[b, q, n·d]` and the content and position biases u, vb `[n, d]` (added in VMEM); k, v `[b, klen, n·d]`;
    the position term shift(qv·r^T), r `[1 or b, rlen, n·d]` (position keys shared by the batch or per row;
    `shift` says where row i of qv·r^T is read; with `directions` int32 `[b]`, r `[2, rlen, n·d]` holds the keys
    of both directions and row b reads r[directions[b]]: XLNet's bidirectional rows), and/or the `factorized` term;
    `memory` (k_mem, v_mem) `[b, m, n·d]`: the memory's keys and values given apart, the first m of the klen
    (factorized: its w_r, w_s `[D, n·d]`); `ef` `[b, n, q, 2]` the segment scores (same, different segment) or
    None; `flags` int8 `[1 or b, q, klen]` (bit 0 masked, if `masks`; bit 1 different segment, if `ef` is given);
    `exclude_first`: no position and segment terms in row 0 and column 0 (Funnel's <cls>); `dropout` (seed uint32
    `[2]` of `layers.keep_mask`, keep probability) or None. Returns `[b, q, n·d]` in q's dtype."""
    st, inputs, seed_words = _prepare(q, u, vb, k, v, r, **options)
    call = functools.partial(_attention, st, interpret)
    return per_device(call, {"scalars": seed_words}, inputs, heads=u.shape[0], check_vma=not interpret)


def two_streams(content: dict, query: dict, *, interpret: bool = False) -> tuple:
    """XLNet's two streams (Yang et al. 2019, §2.3) against the same keys, values, position keys and biases:
    (`relative_attention(**content)`, `relative_attention(**query)`), each a dict of its arguments, those named in
    `SHARED` (and `memory`) the same arrays in both. One backward: the content stream's kernel adds its gradients
    of the shared inputs onto the query stream's in VMEM, where two calls leave XLA to add them in HBM (reading
    both, writing the sum: 2.1 ms of a 72 ms XLNet-Base step on v3)."""
    for name in ("u", "vb", "k", "v", "r", "memory", "directions"):
        if content.get(name) is not query.get(name):
            raise ValueError(f"tpu_attention.two_streams: the streams' {name!r} differ")
    st_c, inputs, seed_c = _prepare(**content)
    st_q, own, seed_q = _prepare(**query)
    inputs.update({QUERY + name: x for name, x in own.items() if name not in SHARED})
    call = functools.partial(_two_streams, st_c, st_q, interpret)
    seeds = {"scalars": seed_c, QUERY + "scalars": seed_q}
    return per_device(call, seeds, inputs, heads=content["u"].shape[0], check_vma=not interpret)


# logical names of each input's axes, for the per-device split (batch-like leading axes of size 1 stay whole)
_AXES = {
    "q": (BATCH, None, HEADS),
    "u": (None, HEADS),
    "vb": (None, HEADS),
    "k": (BATCH, None, HEADS),
    "v": (BATCH, None, HEADS),
    "k_mem": (BATCH, None, HEADS),
    "v_mem": (BATCH, None, HEADS),
    "r": (BATCH, None, HEADS),
    "ef": (BATCH, HEADS, None, None),
    "flags": (BATCH, None, None),
    "starts": (BATCH, None, None),
    "directions": (BATCH,),
    "phi": (BATCH, None, None),
    "pi": (BATCH, None, None),
    "w_r": (None, HEADS),
    "w_s": (None, HEADS),
    "psi": (None, None),
}


def per_device(fn, seeds: dict, inputs: dict, heads: int, check_vma: bool = True):
    """`fn({**scalars, **inputs})` on each device's batch rows and heads (`jax.shard_map` under the active rules,
    whole heads of the merged `n·d` dimensions; a plain call off a mesh). `seeds` names each call's seed words;
    its scalars are (seed0, seed1, first batch row, first head) of the device. Input names may carry a prefix
    (`QUERY`): their axes are those of the name after it.

    `check_vma=False` for interpreted kernels: Pallas traces a kernel's body with no varying manual axes and its
    interpreter evaluates that body on the device's (varying) blocks, where a constant meeting a block fails the
    check (e.g. the zeros padding a row). Unchecked, `shard_map`'s transpose itself sums the gradient of an input
    shared over split axes (position keys shared by the batch), as the checked `pcast` to varying does."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or all(size == 1 for size in mesh.shape.values()):
        origin = jnp.zeros((2,), jnp.int32)
        return fn({**{name: jnp.concatenate([seed, origin]) for name, seed in seeds.items()}, **inputs})
    rules = sharding.active_rules()
    b, q, nd = inputs["q"].shape
    spec = sharding.activation_spec((BATCH, HEADS, None, None), (b, heads, q, nd // heads), rules, mesh)
    batch_axes, head_axes = (() if a is None else (a,) if isinstance(a, str) else tuple(a) for a in spec[:2])
    P = jax.sharding.PartitionSpec
    entry = {BATCH: spec[0], HEADS: spec[1], None: None}
    axes = dict(_AXES, r=(None, None, HEADS)) if "directions" in inputs else _AXES  # r: [2 directions, rlen, n·d]
    in_specs = {
        name: P(*(None if (axis == BATCH and x.shape[0] == 1) else entry[axis] for axis in axes[name.split(":")[-1]]))
        for name, x in inputs.items()
    }
    split = batch_axes + head_axes

    def body(seeds, inputs):
        def varying(x):
            missing = tuple(a for a in split if a not in jax.typeof(x).manual_axis_type.varying)
            return jax.lax.pcast(x, missing, to="varying") if missing else x

        first_row = lambda axes, size: varying(jax.lax.axis_index(axes) * size if axes else jnp.int32(0))
        local_heads = inputs["q"].shape[2] * heads // nd
        b0, n0 = first_row(batch_axes, inputs["q"].shape[0]), first_row(head_axes, local_heads)
        origin = jnp.stack([b0, n0]).astype(jnp.int32)
        scalars = {name: jnp.concatenate([varying(seed), origin]) for name, seed in seeds.items()}
        return fn({**scalars, **jax.tree.map(varying, inputs)})

    specs = dict(in_specs=(P(), in_specs), out_specs=P(spec[0], None, spec[1]), check_vma=check_vma)
    return jax.shard_map(body, mesh=mesh, **specs)(seeds, inputs)
