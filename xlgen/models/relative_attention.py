"""The relative-attention core shared by Transformer-XL, XLNet and Funnel-Transformer.

Score of query i against key j (Dai thesis Eq. 3.3 / XLNet §4.3, one head, before scaling):

    A[i, j] = (q_i + u)·k_j                      content term        ("a + c")
            + shift((q_i + v)·W_r R)[i, j]        position term       ("b + d")
            + (q_i + b_s)·s_{ij}                  segment term        (XLNet, Funnel; optional)

then `A / sqrt(d_head)`, masking, softmax (float32 by default), dropout on the probabilities (`dropatt`) and the weighted
sum of values. The position term is computed against a *sequence* of relative positions R_p (one row per
distance, not per (i, j) pair) and moved into place by a gather-free shift (pad / reshape / slice).

Tensor layout is batch-major throughout: queries `[b, q, n, d]`, keys/values `[b, k, n, d]`, position keys
`[r, n, d]` (shared by the batch) or `[b, r, n, d]` (per-example, e.g. XLNet `bi_data` with a direction flag per
row), scores `[b, n, q, k]`.

Relative-position conventions (query i sits at absolute position mlen + i, key j at j, distance mlen + i - j):

    kind   position sequence R_p                 shift offset  used by
    "txl"  klen-1, klen-2, ..., 0                qlen - 1      Transformer-XL (causal)
    "uni"  klen, klen-1, ..., 0                  qlen          XLNet attn_type="uni"
    "bi"   klen, klen-1, ..., -qlen+1            qlen          XLNet attn_type="bi"

For every kind, `relative_shift(x, klen=klen, offset=offset)` maps x[i, p] to out[i, j] with p = offset - i + j,
i.e. the row holding distance mlen + i - j. Funnel's pooled queries use `stride` > 1 (p = offset - stride*i + j).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from xlgen.models import operands, tpu_attention
from xlgen.models.layers import ATTENTION_OUT, QKV_PROJ, Dense, Dropout, LayerNorm, named, normal, param
from xlgen.models.operands import (  # operand layouts for the products (same math; see operands)
    ContentKeyOperand,
    PositionKeyOperand,
    ValueOperand,
)
from xlgen.sharding import constrain

SCORES = ("activation_batch", "activation_heads", "activation_length", "activation_kv_length")  # [b, n, q, k]
STREAM = ("activation_batch", "activation_length", "activation_embed")  # residual stream / memory [b, l, d]

MASK_VALUE = -1e30  # added to masked scores (float32); equals the original implementations' convention


# ----------------------------------------------------------------------------------------------------------------
# Relative positions and sinusoid encodings
# ----------------------------------------------------------------------------------------------------------------


def sinusoid_embedding(pos_seq: jax.Array, d_model: int, dtype=jnp.float32) -> jax.Array:
    """Sinusoid encodings `[..., d_model]` = concat(sin(p·f), cos(p·f)) with f_i = 1 / 10000^(2i/d_model)."""
    inv_freq = 1.0 / (10000 ** (jnp.arange(0, d_model, 2.0, dtype=jnp.float32) / d_model))
    sinusoid = pos_seq.astype(jnp.float32)[..., None] * inv_freq
    return jnp.concatenate([jnp.sin(sinusoid), jnp.cos(sinusoid)], axis=-1).astype(dtype)


def relative_position_sequence(qlen: int, klen: int, kind: str, clamp_len: Optional[int] = None) -> jax.Array:
    """Relative distances R_p for `kind` in {"txl", "uni", "bi"} (see module docstring), clamped to
    [-clamp_len, clamp_len] when `clamp_len` is a positive int. Returns float32 `[r]`."""
    if kind == "txl":
        start, end = klen - 1, -1
    elif kind == "uni":
        start, end = klen, -1
    elif kind == "bi":
        start, end = klen, -qlen
    else:
        raise ValueError(f"unknown relative-position kind {kind!r}; expected 'txl', 'uni' or 'bi'")
    pos_seq = jnp.arange(start, end, -1, dtype=jnp.float32)
    if clamp_len is not None and clamp_len > 0:
        pos_seq = jnp.clip(pos_seq, -clamp_len, clamp_len)
    return pos_seq


def shift_offset(qlen: int, kind: str) -> int:
    """Offset p0 such that distance mlen+i-j sits at index p = p0 - i + j of `relative_position_sequence`."""
    return qlen - 1 if kind == "txl" else qlen


# ----------------------------------------------------------------------------------------------------------------
# Fixed-length memory buffers with a validity count
# ----------------------------------------------------------------------------------------------------------------


def memory_validity_mask(mem_valid, mlen: int, qlen: int) -> jax.Array:
    """Keys of a fixed-length memory buffer that hold nothing yet: `[b, 1, 1, mlen + qlen]` bool, True (blocked) for
    key j < mlen - mem_valid[b].

    The buffer `[.., b, mlen, d]` keeps its newest states at the end (as `update_mems` leaves them); `mem_valid`
    int `[b]` (or a scalar) counts the trailing rows that are real. Masking the rest makes a zero-initialised buffer
    of full length behave exactly like the growing memory of the original PyTorch implementation (empty at the
    first segment), with one compiled shape for every segment."""
    valid = jnp.asarray(mem_valid, jnp.int32).reshape(-1)
    j = jnp.arange(mlen + qlen, dtype=jnp.int32)
    return (j[None, :] < (mlen - valid)[:, None])[:, None, None, :]


def advance_memory_validity(mem_valid, qlen: int, mem_len: int) -> jax.Array:
    """The valid count after appending `qlen` states to a buffer of `mem_len` rows: min(mem_valid + qlen, mem_len)."""
    return jnp.minimum(jnp.asarray(mem_valid, jnp.int32) + qlen, mem_len)


# ----------------------------------------------------------------------------------------------------------------
# Gather-free shift
# ----------------------------------------------------------------------------------------------------------------


def relative_shift(x: jax.Array, *, klen: int, offset: int, stride: int = 1) -> jax.Array:
    """out[..., i, j] = x[..., i, offset - stride*i + j] for i < q, j < klen, without a gather.

    x: `[..., q, r]` scores against a relative-position sequence. Entries whose source index falls outside
    [0, r) come out as zeros or neighbouring-row values and must be masked by the caller (as in the originals,
    e.g. the causal upper triangle of Transformer-XL). Requires offset - stride*(q-1) >= 0.

    Implementation (`_skew`): pad the r axis on the right to a row width w, flatten (q, w) row-major, drop the
    first `offset` elements, and read rows of length w - stride: element (i, j) of the result is then flat element
    i*(w-stride) + j + offset = i*w + (offset - stride*i + j), i.e. row i, column offset - stride*i + j. The
    result's derivative is the same map applied to the tangent (`operands.linear_skew`: its row width is the
    compiler's choice per backend, since the speed of its transpose depends on w). Lowered for TPU, where the
    flatten is a relayout, the same map is a kernel rotating each row in place (`xlgen.models.tpu_shift`).
    """
    q = x.shape[-2]
    if offset - stride * (q - 1) < 0:
        raise ValueError(f"relative_shift: offset={offset} too small for {q} queries with stride {stride}")
    return _relative_shift(x, klen, offset, stride)


def _skew(x: jax.Array, klen: int, offset: int, stride: int, width: int) -> jax.Array:
    """`relative_shift` through rows of `width` >= max(r, offset + klen, stride + klen) (pad, flatten, slice)."""
    *lead, q, r = x.shape
    if width > r:
        x = jnp.pad(x, [(0, 0)] * len(lead) + [(0, 0), (0, width - r)])
    flat = x.reshape(*lead, q * width)
    need = offset + q * (width - stride)
    if need > q * width:
        flat = jnp.pad(flat, [(0, 0)] * len(lead) + [(0, need - q * width)])
    flat = jax.lax.slice_in_dim(flat, offset, need, axis=-1)
    return flat.reshape(*lead, q, width - stride)[..., :klen]


def _skew_width(r: int, klen: int, offset: int, stride: int) -> int:
    """The smallest row width `_skew` can use."""
    return max(r, offset + klen, stride + klen)


# The shift is linear: its derivative is the same map on the tangent. `operands.linear_skew` defines it once, with
# the tangent's row width chosen per backend (the primal uses the smallest).
_relative_shift = operands.linear_skew(_skew, _skew_width)


# ----------------------------------------------------------------------------------------------------------------
# Score terms and the attention itself
# ----------------------------------------------------------------------------------------------------------------


def content_scores(q_head: jax.Array, k_head, r_w_bias: jax.Array) -> jax.Array:
    """(q + u)·k: q `[b,q,n,d]`, k `[b,k,n,d]` or a `ContentKeyOperand`, u `[n,d]` -> `[b,n,q,k]`."""
    qu = q_head + r_w_bias.astype(q_head.dtype)
    if isinstance(k_head, ContentKeyOperand):
        return jnp.einsum("bind,bndj->bnij", qu, k_head.keys.astype(q_head.dtype))
    return jnp.einsum("bind,bjnd->bnij", qu, k_head)


def position_contraction(qv: jax.Array, k_head_r) -> jax.Array:
    """Raw position scores (q + v)·W_r R before the shift: qv `[b,q,n,d]`, position keys `[r,n,d]` (shared by
    the batch), `[b,r,n,d]` or a `PositionKeyOperand` -> `[b,n,q,r]` (see `operands.position_keys`)."""
    if not isinstance(k_head_r, PositionKeyOperand):
        k_head_r = operands.position_keys(k_head_r, qv.shape[0])
    if isinstance(k_head_r, PositionKeyOperand):
        return jnp.einsum("bind,bndj->bnij", qv, k_head_r.keys.astype(qv.dtype))
    spec = "bind,jnd->bnij" if k_head_r.ndim == 3 else "bind,bjnd->bnij"
    return jnp.einsum(spec, qv, k_head_r.astype(qv.dtype))


def position_scores(
    q_head: jax.Array, k_head_r: jax.Array, r_r_bias: jax.Array, *, klen: int, offset: int, stride: int = 1
) -> jax.Array:
    """shift((q + v)·W_r R): q `[b,q,n,d]`, position keys `[r,n,d]`, `[b,r,n,d]` or a `PositionKeyOperand`,
    v `[n,d]` -> `[b,n,q,klen]`."""
    qv = q_head + r_r_bias.astype(q_head.dtype)
    scores = operands.heads_major_position_scores(qv, k_head_r, klen=klen, offset=offset, stride=stride)
    if scores is not None:
        return scores
    return relative_shift(position_contraction(qv, k_head_r), klen=klen, offset=offset, stride=stride)


def position_scores_at(q_head: jax.Array, k_head_r, r_r_bias: jax.Array, *, start: jax.Array, klen: int) -> jax.Array:
    """`position_scores` for queries at arbitrary, per-row positions (e.g. only the predicted positions of an MLM):
    out[b, :, i, j] = raw[b, :, i, start[b, i] + j], raw = (q + v)·W_r R `[b,n,q,r]` and start `[b,q]` int (for
    full-length keys at positions 0..klen-1 and the distance sequence klen, ..., -(klen-1): start = klen - the
    query's position). A window of `klen` per (b, i) instead of the shift, a gather of b·q contiguous `[n, klen]`
    slices (its gradient adds them back): meant for a few query rows. An elementwise gather (`take_along_axis`,
    one index per element, its gradient a scatter of single elements) cost ~1% of a Funnel seq-512 step."""
    raw = position_contraction(q_head + r_r_bias.astype(q_head.dtype), k_head_r)
    window = lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, klen, axis=-1)  # row [n, r], s int -> [n, klen]
    return jax.vmap(jax.vmap(window, in_axes=(1, 0), out_axes=1))(raw, start)


def factorized_position_encodings(q_pos: jax.Array, k_pos: jax.Array, d_model: int, dtype=jnp.float32):
    """Per-position sin/cos factors of the gather-free ("factorized") position term (Funnel `rel_attn_type`).

    With angles a_i = ω q_pos[i], b_j = ω k_pos[j] (ω the `sinusoid_embedding` frequencies, d_model/2 of them),
    the identities sin(a-b) = sin a cos b - cos a sin b and cos(a-b) = cos a cos b + sin a sin b give

        [sin(a_i-b_j), cos(a_i-b_j)] = phi_i ⊙ psi_j + pi_i ⊙ omega_j      (elementwise, width d_model)
        phi = [sin a, sin a], pi = [cos a, cos a], psi = [cos b, sin b], omega = [-sin b, cos b],

    i.e. the sinusoid encoding of the distance q_pos[i] - k_pos[j] without building it. Returns
    `(phi, pi)` `[..., q, d_model]` (query side; q_pos `[q]` or per row `[b, q]`) and `(psi, omega)` `[k, d_model]`
    (key side).
    """
    inv_freq = 1.0 / (10000 ** (jnp.arange(0, d_model, 2.0, dtype=jnp.float32) / d_model))
    a = q_pos.astype(jnp.float32)[..., None] * inv_freq
    b = k_pos.astype(jnp.float32)[:, None] * inv_freq
    sin_a, cos_a, sin_b, cos_b = jnp.sin(a), jnp.cos(a), jnp.sin(b), jnp.cos(b)
    phi = jnp.concatenate([sin_a, sin_a], -1)
    pi = jnp.concatenate([cos_a, cos_a], -1)
    psi = jnp.concatenate([cos_b, sin_b], -1)
    omega = jnp.concatenate([-sin_b, cos_b], -1)
    return (phi.astype(dtype), pi.astype(dtype)), (psi.astype(dtype), omega.astype(dtype))


def factorized_position_scores(q_head: jax.Array, r_kernel: jax.Array, r_r_bias: jax.Array, q_enc, k_enc) -> jax.Array:
    """Position term ((q + v)·W_r^T) · sinusoid(q_pos_i - k_pos_j) without a shift or gather.

    q `[b,q,n,d]`, r_kernel `[d_model,n,d]` (the `r` projection), v `[n,d]`, `q_enc = (phi, pi)` `[q,d_model]`
    or `[b,q,d_model]`, `k_enc = (psi, omega)` `[k,d_model]` from `factorized_position_encodings` -> `[b,n,q,k]`. Equals
    `position_scores` on the sinusoid encodings of the distances (same W_r), for any (e.g. strided) positions.
    Costs b·n·q·k·2·d_model multiply-adds (vs. b·n·q·r·d_head for the shift form) but is all plain matmuls.
    Programs lowered for other platforms than XLA:CPU compute it as `rotated_factorized_position_scores` (half
    the multiply-adds, no `[b, q, n, 2·d_model]` operand; `operands.rotated_factorized_position`).
    """
    if operands.rotated_factorized_position():
        return rotated_factorized_position_scores(q_head, r_kernel, r_r_bias, q_enc, k_enc)
    phi, pi = q_enc
    psi, omega = k_enc
    qv = q_head + r_r_bias.astype(q_head.dtype)
    q_r = jnp.einsum("bind,Dnd->binD", qv, r_kernel.astype(q_head.dtype))  # (q+v) W_r^T  [b,q,n,D]
    phi, pi = phi[..., None, :].astype(q_r.dtype), pi[..., None, :].astype(q_r.dtype)
    q_r = jnp.concatenate([q_r * phi, q_r * pi], -1)
    k_r = jnp.concatenate([psi, omega], -1).astype(q_r.dtype)  # [k, 2D]
    return jnp.einsum("binD,jD->bnij", q_r, k_r)


def rotated_factorized_position_scores(
    q_head: jax.Array, r_kernel: jax.Array, r_r_bias: jax.Array, q_enc, k_enc
) -> jax.Array:
    """`factorized_position_scores` contracted over d_model instead of 2·d_model (same arguments and values).

    Split every d_model-wide vector into halves (subscripts 1, 2). The key factors of
    `factorized_position_encodings` are psi = [cos b, sin b] and omega = [-sin b, cos b] = [-psi_2, psi_1], so
    per query row, with q_r = (q + v)·W_r^T (any query factors phi, pi, e.g. with dropout applied):

        q_r·(phi ⊙ psi_j + pi ⊙ omega_j) = X·psi_j1 + Y·psi_j2,   X = q_r1 phi_1 + q_r2 pi_2,  Y = q_r2 phi_2 - q_r1 pi_1,
        [X, Y] = q_r ⊙ phi + q_s ⊙ [pi_2, -pi_1],   q_s = (q + v)·[W_r2; W_r1]^T (W_r with its halves swapped)

    (the rotation of q_r by the query's angles). `k_enc`'s omega is not read: it must be [-psi_2, psi_1] as
    `factorized_position_encodings` returns it. Costs b·n·q·k·d_model multiply-adds for the scores plus a second
    (q + v)·W projection; on TPU the swapped projection fuses with the products (docs/pod_scale.md)."""
    phi, pi = q_enc
    psi, _ = k_enc
    half = r_kernel.shape[0] // 2
    qv = q_head + r_r_bias.astype(q_head.dtype)
    w = r_kernel.astype(q_head.dtype)
    q_r = jnp.einsum("bind,Dnd->binD", qv, w)  # [b,q,n,D]
    q_s = jnp.einsum("bind,Dnd->binD", qv, jnp.concatenate([w[half:], w[:half]], 0))
    phi, pi = phi[..., None, :].astype(q_r.dtype), pi[..., None, :].astype(q_r.dtype)
    xy = q_r * phi + q_s * jnp.concatenate([pi[..., half:], -pi[..., :half]], -1)
    return jnp.einsum("binD,jD->bnij", xy, psi.astype(q_r.dtype))


def segment_scores(q_head: jax.Array, seg_embed: jax.Array, r_s_bias: jax.Array, seg_mat: jax.Array) -> jax.Array:
    """(q + b_s)·s_ij with s_ij = seg_embed[1] if i, j are in different segments else seg_embed[0].

    q `[b,q,n,d]`, seg_embed `[2,n,d]`, r_s_bias `[n,d]`, seg_mat `[b,q,k]` (bool/0-1: different segment)
    -> `[b,n,q,k]` (a select between the two per-(i) scores, no gather).
    """
    ef = jnp.einsum("bind,snd->bnis", q_head + r_s_bias.astype(q_head.dtype), seg_embed.astype(q_head.dtype))
    diff = seg_mat.astype(bool)[:, None]  # [b,1,q,k]
    return jnp.where(diff, ef[..., 1:2], ef[..., 0:1])


def relative_attention(
    q_head: jax.Array,
    k_head: jax.Array,
    v_head: jax.Array,
    *,
    r_w_bias: jax.Array,
    position_term: Optional[jax.Array] = None,
    segment_term: Optional[jax.Array] = None,
    mask: Optional[jax.Array] = None,
    dropatt: Optional[Callable] = None,
    scale: Optional[float] = None,
    return_probs: bool = False,
    scores_dtype: str = "float32",
    softmax_dtype: str = "float32",
):
    """Softmax((content + position + segment) * scale, masked) · V.

    q `[b,q,n,d]`, k/v `[b,k,n,d]` (or a `ContentKeyOperand` / `ValueOperand`); position/segment terms
    `[b,n,q,k]` (already shifted); `mask` broadcastable to `[b,n,q,k]`, True where query i may NOT attend key j
    (XLNet `perm_mask` convention). Scores (sum, scale, mask) and probabilities in `scores_dtype`, the softmax
    computed in `softmax_dtype` (both float32 unless the model's precision policy says otherwise; bfloat16 scores
    with a float32 softmax is Funnel-Transformer's TPU code, see `xlgen.models.layers.PRECISION_KEYS`). The mask
    value -1e30 is finite in bfloat16 too (its range is float32's), so masked entries leave the max subtraction
    exact and underflow to 0 in the exp. Returns attn_vec `[b,q,n,d]` (and the probabilities `[b,n,q,k]` when
    `return_probs`).
    """
    d_head = q_head.shape[-1]
    scale = 1.0 / math.sqrt(d_head) if scale is None else scale
    sdt = jnp.dtype(scores_dtype)
    scores = content_scores(q_head, k_head, r_w_bias).astype(sdt)
    if position_term is not None:
        scores = scores + position_term.astype(sdt)
    if segment_term is not None:
        scores = scores + segment_term.astype(sdt)
    scores = scores * scale
    if mask is not None:
        scores = jnp.where(mask, MASK_VALUE, scores)
    scores = constrain(scores, SCORES)
    probs = constrain(jax.nn.softmax(scores.astype(softmax_dtype), axis=-1).astype(sdt), SCORES)
    probs_d = dropatt(probs) if dropatt is not None else probs
    if isinstance(v_head, ValueOperand):
        attn_vec = jnp.einsum("bnij,bndj->bind", probs_d.astype(v_head.values.dtype), v_head.values)
    else:
        attn_vec = jnp.einsum("bnij,bjnd->bind", probs_d.astype(v_head.dtype), v_head)
    return (attn_vec, probs) if return_probs else attn_vec


class SegmentHeads(NamedTuple):
    """Key or value heads `[b, m+l, n, d]` kept as the memory's `[b, m, n, d]` and the segment's `[b, l, n, d]`
    projections, where the fused kernel runs (`RelativeMultiHeadAttention.kv_heads`): the kernel reads the two in
    place of their concatenation, a copy of both in HBM. `whole()` forms the concatenation (the XLA form)."""

    memory: jax.Array
    current: jax.Array

    @property
    def shape(self) -> tuple:
        b, m, n, d = self.memory.shape
        return (b, m + self.current.shape[1], n, d)

    def whole(self) -> jax.Array:
        return jnp.concatenate([self.memory, self.current], axis=1)


def whole_heads(x):
    """Key or value heads as one array (`SegmentHeads` concatenated; anything else as it is)."""
    return x.whole() if isinstance(x, SegmentHeads) else x


def fused_relative_attention(*args, dropatt=None, **kw) -> Optional[jax.Array]:
    """`relative_attention` of the content, position and segment terms as one kernel (`xlgen.models.tpu_attention`,
    chosen by `operands.fused_attention`), or None where it does not apply (the caller then forms the terms
    itself): the arguments of `fused_operands`, and `dropatt` the probabilities' `Dropout`."""
    return kernel_attention(fused_operands(*args, **kw), dropatt)


def kernel_attention(options: Optional[dict], dropatt=None) -> Optional[jax.Array]:
    """The kernel on `fused_operands`' arguments (None where they are None), `dropatt`'s key drawn only where it
    runs. Returns attn_vec `[b,q,n·d]`, the heads merged (`RelativeMultiHeadAttention.output` takes it so)."""
    if options is None:
        return None
    dropout = None if dropatt is None else dropatt.keep_seed()
    return tpu_attention.relative_attention(**options, dropout=dropout, interpret=operands.kernels_interpreted())


def fused_operands(
    q_head: jax.Array,
    k_head: jax.Array,
    v_head: jax.Array,
    k_head_r: jax.Array,
    biases: dict,
    *,
    klen: int,
    offset: int = 0,
    stride: int = 1,
    starts: Optional[jax.Array] = None,
    mask=None,
    seg_mat=None,
    seg_embed=None,
    factorized: Optional[tuple] = None,
    exclude_first: bool = False,
) -> Optional[dict]:
    """The arguments of `tpu_attention.relative_attention` (all but dropout) for the relative attention of q
    against k and v, or None where the kernel does not apply. q `[b,q,n,d]`, k/v `[b,k,n,d]`; the position term
    either shifted, position keys `[r,n,d]` or `[b,r,n,d]` with row i reading the position scores from
    offset - stride·i or from `starts [b,q]` (queries at arbitrary positions), XLNet's `operands.DirectedKeys`
    (keys `[2,r,n,d]` read per row), or `factorized` = (q_enc, k_enc, r_kernel) as for
    `factorized_position_scores` (then `k_head_r` is None); `mask` broadcastable to `[b,1,q,k]`, `seg_mat [b,q,k]`
    with `seg_embed [2,n,d]`; `exclude_first`: no position and segment terms in row 0 and column 0 (Funnel's
    <cls>)."""
    if not operands.fused_attention() or isinstance(k_head, ContentKeyOperand) or isinstance(v_head, ValueOperand):
        return None
    if isinstance(k_head_r, PositionKeyOperand) or (mask is not None and mask.ndim == 4 and mask.shape[1] != 1):
        return None
    b, q, n, d = q_head.shape
    directions = None
    if isinstance(k_head_r, operands.DirectedKeys):  # keys [2, r, n, d], row b reads keys[index[b]]
        k_head_r, directions = k_head_r.keys, k_head_r.index
    rlen = klen if k_head_r is None else k_head_r.shape[-3]
    if not tpu_attention.applies(q, klen, rlen, 0 if factorized is None else factorized[2].shape[0]):
        return None
    merge = lambda x: x.reshape(*x.shape[:-2], n * d)  # [..., l, n, d] -> [..., l, n·d]: cancels `split_heads`
    memory = None
    if isinstance(k_head, SegmentHeads) and isinstance(v_head, SegmentHeads):  # read apart, concatenated in VMEM
        memory = (merge(k_head.memory), merge(v_head.memory))
        k_head, v_head = k_head.current, v_head.current
    k_head, v_head = whole_heads(k_head), whole_heads(v_head)
    cast = lambda bias: bias.astype(q_head.dtype)
    u, v = cast(biases["r_w_bias"]), cast(biases["r_r_bias"])  # added in the kernel
    r, fact = None, None
    if k_head_r is not None:
        r = merge(k_head_r if k_head_r.ndim == 4 else k_head_r[None]).astype(q_head.dtype)
    if factorized is not None:
        (phi, pi), (psi, _), r_kernel = factorized  # the rotated form: see rotated_factorized_position_scores
        half = r_kernel.shape[0] // 2
        w = r_kernel.astype(q_head.dtype)  # [D, n, d]
        lead = lambda x: (x if x.ndim == 3 else x[None]).astype(q_head.dtype)
        fact = tpu_attention.Factorized(
            phi=lead(phi),
            pi=lead(jnp.concatenate([pi[..., half:], -pi[..., :half]], -1)),
            w_r=merge(w),
            w_s=merge(jnp.concatenate([w[half:], w[:half]], 0)),
            psi=psi.astype(q_head.dtype),
        )
    q_flat = merge(q_head)
    ef, flags = None, None
    rows = b if (mask is not None and mask.shape[0] > 1) or seg_mat is not None else 1
    if mask is not None:
        mask = mask[:, 0] if mask.ndim == 4 else mask
        flags = jnp.broadcast_to(mask, (mask.shape[0], q, klen)).astype(jnp.int8)
        flags = jnp.broadcast_to(flags, (rows, q, klen))
    if seg_mat is not None:  # ef[b,n,i,s] = (q + b_s)_{b,i,n} · s_{s,n}, from the merged heads through the
        # block-diagonal [n·d, n, 2] of the segment embeddings (2n outputs per token: no split of the queries)
        seg = jnp.einsum("snd,nm->ndms", seg_embed.astype(q_head.dtype), jnp.eye(n, dtype=q_head.dtype))
        qs = q_flat + merge(cast(biases["r_s_bias"]))
        ef = jnp.einsum("bix,xns->bnis", qs, seg.reshape(n * d, n, 2)).astype(jnp.float32)
        different = seg_mat.astype(jnp.int8) * jnp.int8(tpu_attention.DIFFERENT_SEGMENT)
        flags = different if flags is None else flags | different
    return dict(
        q=q_flat,
        u=u,
        vb=v,
        k=merge(k_head),
        v=merge(v_head),
        r=r,
        shift=tpu_attention.Shift(offset, stride, starts),
        directions=directions,
        memory=memory,
        factorized=fact,
        scale=1.0 / math.sqrt(d),
        ef=ef,
        flags=flags,
        masks=mask is not None,
        exclude_first=exclude_first,
    )


# ----------------------------------------------------------------------------------------------------------------
# The attention layer (projections + core + post-LN residual)
# ----------------------------------------------------------------------------------------------------------------


class RelativeMultiHeadAttention(nnx.Module):
    """Projections around `relative_attention`, with a post-LN residual:

        out = LN(query_input + drop(attn_vec · W_o))

    Parameters (logical axes): q, k, v: `[embed, heads, kv]` (+ optional bias `[heads, kv]`), r: `[embed, heads,
    kv]`, o: `[heads, kv, embed]`, and per-layer u, v biases `[heads, kv]` when `own_biases` (TXL/XLNet
    `untie_r`); segment parameters (`seg_embed [2, heads, kv]`, `r_s_bias`) when `segments`. Each model maps its
    checkpoint layout (HF/TF) onto these names.
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        d_head: int,
        *,
        dropout: float = 0.0,
        dropatt: float = 0.0,
        qkv_bias: tuple = (False, False, False),
        o_bias: bool = False,
        own_biases: bool = True,
        segments: bool = False,
        layer_norm_eps: float = 1e-12,
        init_std: float = 0.02,
        scores_dtype: str = "float32",
        softmax_dtype: str = "float32",
        rngs: nnx.Rngs,
    ):
        hd = (n_head, d_head)
        self.scores_dtype, self.softmax_dtype = scores_dtype, softmax_dtype
        ax_in, ax_out = ("embed",), ("heads", "kv")
        self.n_head, self.d_head = n_head, d_head
        self.q = Dense((d_model,), hd, ax_in, ax_out, use_bias=qkv_bias[0], init_std=init_std, rngs=rngs)
        self.k = Dense((d_model,), hd, ax_in, ax_out, use_bias=qkv_bias[1], init_std=init_std, rngs=rngs)
        self.v = Dense((d_model,), hd, ax_in, ax_out, use_bias=qkv_bias[2], init_std=init_std, rngs=rngs)
        self.r = Dense((d_model,), hd, ax_in, ax_out, use_bias=False, init_std=init_std, rngs=rngs)
        self.o = Dense(hd, (d_model,), ax_out, ("embed",), use_bias=o_bias, init_std=init_std, rngs=rngs)
        if own_biases:
            self.r_w_bias = param(rngs, normal(init_std), hd, ax_out)
            self.r_r_bias = param(rngs, normal(init_std), hd, ax_out)
        if segments:
            if own_biases:
                self.r_s_bias = param(rngs, normal(init_std), hd, ax_out)
            self.seg_embed = param(rngs, normal(init_std), (2,) + hd, (None,) + ax_out)
        self.segments = segments
        self.own_biases = own_biases
        self.layer_norm = LayerNorm(d_model, eps=layer_norm_eps, rngs=rngs)
        self.drop = Dropout(dropout, rngs=rngs)
        self.dropatt = Dropout(dropatt, rngs=rngs)

    def biases(self, shared: Optional[dict]) -> dict:
        """The u / v / b_s biases to use: this layer's own (untie_r) or the model-wide `shared` ones."""
        if self.own_biases:
            b = {"r_w_bias": self.r_w_bias[...], "r_r_bias": self.r_r_bias[...]}
            if self.segments:
                b["r_s_bias"] = self.r_s_bias[...]
            return b
        if shared is None:
            raise ValueError("layer built with own_biases=False needs the model's shared biases")
        return shared

    def position_heads(self, pos_emb: jax.Array) -> jax.Array:
        """W_r R: position keys `[r, n, d]` (or `[..., r, n, d]`) of the encodings `pos_emb [..., r, d_model]`,
        with W_r's `embed` gathered first (the encodings are whole on every device; see `Dense`). Where the fused
        kernel runs, each of the batch's devices projects its share of the positions and the keys are gathered:
        projected whole on every device, the shared keys cost XLNet-Large on 1,024 v3 cores 4.6 ms of a 62 ms step,
        where the gather moves r·n·d bfloat16 elements per layer."""
        if operands.fused_attention():
            # [..., r] as one dimension of rows, so that the gather runs along the major one (no relayout after);
            # the product's output split too, else the partitioner gathers its input instead
            rows = pos_emb.reshape(-1, pos_emb.shape[-1])
            shares = lambda x: constrain(x, ("activation_positions", None))
            keys = constrain(shares(self.r(shares(rows), gather_input_dims=True, merged=True)), (None, None))
            return self.split_heads(keys.reshape(*pos_emb.shape[:-1], keys.shape[-1]))
        return self.r(pos_emb, gather_input_dims=True)

    def split_heads(self, x: jax.Array) -> jax.Array:
        """`[..., n·d]` -> `[..., n, d]`. Where the fused kernel runs (`operands.fused_attention`) the projections
        are formed merged (`Dense(merged=True)`) and split by this reshape, which the kernel's own reshape back to
        `[..., n·d]` cancels in XLA: no heads-major transposes, no `[rows, d_head]` arrays padded to 128 lanes."""
        return x.reshape(*x.shape[:-1], self.n_head, self.d_head)

    def content_keys(self, k_head):
        """The key heads as the content product's operand: in training `operands.content_keys` (the `[b,n,d,k]`
        layout on XLA:CPU); in evaluation (no backward pass) the keys as they are. Idempotent."""
        if isinstance(k_head, ContentKeyOperand) or self.dropatt.deterministic:
            return k_head
        return operands.content_keys(k_head)

    def kv_heads(self, h: jax.Array, mem: Optional[jax.Array] = None) -> tuple:
        """Key and value heads `[b, m+l, n, d]` of `[mem; h]` for h `[b,l,d]` and a stop-gradient memory mem
        `[b,m,d]` (or None). Memory and segment are projected separately, `[k(mem); k(h)]`: one matmul over the
        concatenation would also form the memory rows' input gradient in the backward pass, only to drop it.
        Where the fused kernel runs, the two stay apart (`SegmentHeads`)."""
        merged = operands.fused_attention()  # formed merged and split (`split_heads`), memory and segment apart
        k, v = (lambda x: self.heads(self.k, x, merged)), (lambda x: self.heads(self.v, x, merged))
        split = self.split_heads if merged else (lambda x: x)
        if mem is None or mem.shape[1] == 0:
            return split(k(h)), split(v(h))
        mem = mem.astype(h.dtype)
        if merged:
            return SegmentHeads(split(k(mem)), split(k(h))), SegmentHeads(split(v(mem)), split(v(h)))
        return jnp.concatenate([k(mem), k(h)], axis=1), jnp.concatenate([v(mem), v(h)], axis=1)

    def kernel_operands(
        self, q_head, k_head, v_head, k_head_r, *, seg_mat=None, shared_biases=None, **kw
    ) -> Optional[dict]:
        """`fused_operands` (the kernel's arguments, None where it does not apply) with this layer's biases and,
        given `seg_mat`, its segment embeddings; `kw`: klen, offset, stride, starts, mask."""
        segments = self.segments and seg_mat is not None
        return fused_operands(
            q_head,
            k_head,
            v_head,
            k_head_r,
            self.biases(shared_biases),
            seg_mat=seg_mat if segments else None,
            seg_embed=self.seg_embed[...] if segments else None,
            **kw,
        )

    def attend(
        self,
        query_input: jax.Array,
        k_head: jax.Array,
        v_head: jax.Array,
        k_head_r: jax.Array,
        *,
        klen: int,
        offset: int,
        stride: int = 1,
        mask=None,
        seg_mat=None,
        shared_biases=None,
        position_term=None,
    ) -> jax.Array:
        """One attention + post-LN residual for `query_input [b,q,d]` against precomputed key/value/position
        heads (lets XLNet's query stream reuse the content stream's heads). `position_term` overrides the
        shifted position scores (Funnel's factorized form)."""
        b = self.biases(shared_biases)
        q_head = self.query_heads(query_input)
        k_head = self.content_keys(k_head)
        if position_term is None:
            kw = dict(klen=klen, offset=offset, stride=stride, mask=mask, seg_mat=seg_mat, shared_biases=shared_biases)
            attn_vec = kernel_attention(self.kernel_operands(q_head, k_head, v_head, k_head_r, **kw), self.dropatt)
            if attn_vec is not None:
                return self.output(query_input, attn_vec)
        k_head, v_head = whole_heads(k_head), whole_heads(v_head)
        if position_term is None:
            position_term = position_scores(q_head, k_head_r, b["r_r_bias"], klen=klen, offset=offset, stride=stride)
        segment_term = None
        if self.segments and seg_mat is not None:
            segment_term = segment_scores(q_head, self.seg_embed[...], b["r_s_bias"], seg_mat)
        attn_vec = relative_attention(
            q_head,
            k_head,
            v_head,
            r_w_bias=b["r_w_bias"],
            position_term=position_term,
            segment_term=segment_term,
            mask=mask,
            dropatt=self.dropatt,
            scores_dtype=self.scores_dtype,
            softmax_dtype=self.softmax_dtype,
        )
        return self.output(query_input, attn_vec)

    def output(self, query_input: jax.Array, attn_vec: jax.Array, drop_key: Optional[jax.Array] = None) -> jax.Array:
        """The sub-layer's output LN(query_input + drop(attn_vec · W_o)) `[b, q, d]` (the product named
        `attention_out` for the remat policies, `xlgen.models.layers.REMAT_POLICIES`); attn_vec `[b, q, n, d]`, or
        `[b, q, n·d]` as the fused kernel writes it; `drop_key` the dropout's key drawn earlier (`Dropout.draw`)."""
        out = self.o(attn_vec, merged=attn_vec.ndim == 3)
        return self.layer_norm(query_input + self.drop(named(out, ATTENTION_OUT), rngs=drop_key))

    def heads(self, proj: Dense, x: jax.Array, merged: bool = False) -> jax.Array:
        """`x · W` `[b, l, n, d_head]` (`[b, l, n·d_head]` if `merged`) for the query / key / value projection
        `proj`, named `qkv_proj`."""
        return named(proj(x, merged=merged), QKV_PROJ)

    def query_heads(self, x: jax.Array) -> jax.Array:
        """The query heads `[b, q, n, d]` (formed merged and split where the fused kernel runs: `split_heads`)."""
        if operands.fused_attention():
            return self.split_heads(self.heads(self.q, x, merged=True))
        return self.heads(self.q, x)

    def __call__(
        self,
        query_input: jax.Array,
        kv_input: jax.Array,
        pos_emb: jax.Array,
        *,
        offset: int,
        stride: int = 1,
        mask=None,
        seg_mat=None,
        shared_biases=None,
    ) -> jax.Array:
        """query_input `[b,q,d]`, kv_input `[b,k,d]` (e.g. concat(memory, h)), pos_emb `[r,d]` or `[b,r,d]`."""
        k_head, v_head = self.kv_heads(kv_input)
        return self.attend(
            query_input,
            k_head,
            v_head,
            self.position_heads(pos_emb),
            klen=kv_input.shape[1],
            offset=offset,
            stride=stride,
            mask=mask,
            seg_mat=seg_mat,
            shared_biases=shared_biases,
        )
