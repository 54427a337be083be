"""The relative shift for TPU: each row rotated in VMEM by a Pallas kernel, one HBM read and one write.

On XLA:TPU the gather-free shift of `relative_attention.relative_shift` (pad, flatten `[q, w]`, slice, re-split
into rows of w - stride) merges the two tiled minor dimensions of the scores: XLA lowers it to a flat relayout
through 16-trip copy loops, ~20x the bytes of reading the scores once and writing the result (docs/pod_scale.md).
Here every row is rotated where it lies instead (`roll_rows`): for a block of `tq` rows `[tq, W]` in VMEM,

    y[i, j] = x[i, (j - a_i) mod W],   a_i = (start + step * i) mod W      (row i rotated right by a_i)

as one rotation of the block by a_{i0} (the block's first row) and a barrel shift of the rest, (step·(i - i0))
mod W < W, by its bits: log2(W) rotations by a power of two, each kept in the rows whose bit is set. v3 has no
strided rotation (v5+ only) nor a dynamic rotation of bfloat16 vregs, so the block is rotated in float32.

The shift out[i, j] = x[i, offset - stride*i + j] is `roll_rows` with a_i = -(offset - stride*i) over a width W
>= max(r, klen) rounded up to the 128 lanes (the scores padded with zeros): entries whose source offset -
stride*i + j lies in [0, r) are exact; the others (which the callers mask, cf. `relative_shift`) hold zeros or
values of the same row. Its derivative is the transposed map, `roll_rows` of the zero-padded cotangent by
+(offset - stride*i), then cut to r columns (a `custom_vjp`: the kernel itself is not differentiable).

Runs per device (`xlgen.sharding.per_shard`: batch and heads as the scores are split; rows and columns whole), so
the partitioner never gathers a custom call's operand. `interpret=True` runs the same kernel through JAX on any
backend (the tests compare it with the XLA shift on the CPU).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from xlgen import sharding

LANES = 128  # vreg lanes: the minor block dimension is a multiple of it
BLOCK_BYTES = 2 * 2**20  # float32 bytes of one block [tq, W] (several live copies fit v3's 16 MiB of VMEM)
ROW_MULTIPLE = 16  # rows per block: bfloat16 vregs pack 16 sublanes
SCORE_AXES = ("activation_batch", "activation_heads")  # the scores' leading axes, `[b, n, q, r]`
HEADS_MAJOR = ("activation_heads", "activation_batch")  # `[n, b, q, r]`, as XLA:TPU's batched product emits it


def block_rows(q: int, width: int) -> int:
    """Rows per kernel block for `[q, width]` rows: the largest multiple of 16 dividing q with a float32 block of at
    most BLOCK_BYTES, or q itself (a block of the whole dimension) when q is small; 0 when neither fits."""
    limit = BLOCK_BYTES // (4 * width)
    if q <= limit and (q % ROW_MULTIPLE or q <= 256):
        return q
    best = 0
    for tq in range(ROW_MULTIPLE, min(q, limit) + 1, ROW_MULTIPLE):
        if q % tq == 0:
            best = tq
    return best


def padded_width(r: int, klen: int) -> int:
    """The rotation width W: at least the r source and the klen result columns, a multiple of the lanes."""
    return -(-max(r, klen) // LANES) * LANES


def applies(shape, klen: int) -> bool:
    """Whether `[..., q, r]` scores fit the kernel's blocks."""
    return len(shape) >= 2 and block_rows(shape[-2], padded_width(shape[-1], klen)) > 0


def _roll_rows_kernel(x_ref, o_ref, *, width: int, start: int, step: int, rows: int):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    y = x_ref[...].astype(jnp.float32)
    if y.shape[-1] < width:  # zero columns up to the rotation width, in VMEM
        y = jnp.concatenate([y, jnp.zeros((rows, width - y.shape[-1]), y.dtype)], axis=1)
    first = pl.program_id(1) * rows
    y = pltpu.roll(y, (start + step * first) % width, 1)
    rest = (jax.lax.broadcasted_iota(jnp.int32, (rows, 1), 0) * step) % width  # each row's remaining rotation
    bit = 1
    while bit < width:
        y = jnp.where((rest & bit) != 0, pltpu.roll(y, bit, 1), y)
        bit *= 2
    o_ref[...] = y[:, : o_ref.shape[-1]].astype(o_ref.dtype)


def roll_rows(x: jax.Array, *, width: int, start: int, step: int, out_width: int, interpret: bool = False) -> jax.Array:
    """y[..., i, j] = xw[..., i, (j - a_i) mod W] for j < out_width, a_i = (start + step*i) mod W, xw = x with zero
    columns up to W = `width` (a multiple of 128); x `[..., q, c]` (c <= W) -> `[..., q, out_width]`, one Pallas
    kernel on the device's block. The zero columns are added in VMEM when c is a multiple of 128."""
    from jax.experimental import pallas as pl

    *lead, q, cols = x.shape
    if cols < width and cols % LANES:
        x, cols = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - cols)]), width
    rows = block_rows(q, width)
    kernel = functools.partial(_roll_rows_kernel, width=width, start=start % width, step=step % width, rows=rows)
    x3 = x.reshape(-1, q, cols)
    out = pl.pallas_call(
        kernel,
        grid=(x3.shape[0], q // rows),
        in_specs=[pl.BlockSpec((None, rows, cols), lambda m, l: (m, l, 0))],
        out_specs=pl.BlockSpec((None, rows, out_width), lambda m, l: (m, l, 0)),
        out_shape=jax.ShapeDtypeStruct(
            (x3.shape[0], q, out_width), x.dtype, manual_axis_type=jax.typeof(x3).manual_axis_type
        ),
        interpret=interpret,
    )(x3)
    return out.reshape(*lead, q, out_width)


def _per_device(fn, ndim: int, lead_axes):
    """`fn` on each device's block of `[b, n, q, r]` scores (or `[n, b, q, r]`, `lead_axes` naming the two leading
    axes), split over batch and heads as the scores are."""
    if ndim != 4:
        return fn
    names = tuple(lead_axes) + (None, None)
    return sharding.per_shard(fn, (names,), names)


def relative_shift(
    x: jax.Array, klen: int, offset: int, stride: int, interpret: bool = False, lead_axes=SCORE_AXES
) -> jax.Array:
    """out[..., i, j] = x[..., i, offset - stride*i + j] (where that index is in [0, r)), x `[..., q, r]` ->
    `[..., q, klen]`: `relative_attention.relative_shift` by the row-rotation kernel. `lead_axes`: the logical
    names of a 4-d x's two leading axes (batch and heads, in either order)."""
    return _shift(x, x.shape[-1], klen, offset, stride, interpret, tuple(lead_axes))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5, 6))
def _shift(x, r, klen, offset, stride, interpret, lead_axes):
    width = padded_width(r, klen)

    def shift(block):
        return roll_rows(block, width=width, start=-offset, step=stride, out_width=klen, interpret=interpret)

    return _per_device(shift, x.ndim, lead_axes)(x)


def _shift_fwd(x, r, klen, offset, stride, interpret, lead_axes):
    return _shift(x, r, klen, offset, stride, interpret, lead_axes), None


def _shift_bwd(r, klen, offset, stride, interpret, lead_axes, _, cotangent):
    width = padded_width(r, klen)

    def transpose(block):
        return roll_rows(block, width=width, start=offset, step=-stride, out_width=r, interpret=interpret)

    return (_per_device(transpose, cotangent.ndim, lead_axes)(cotangent),)


_shift.defvjp(_shift_fwd, _shift_bwd)
