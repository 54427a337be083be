"""Operand layouts of the relative-attention products and the shift's derivative: the compiler tuning of the
relative-attention core, in one place, so that `relative_attention.py` states only the papers' terms. The forms
below compute the same values as the plain ones (bitwise on XLA:CPU) and differ only in the layouts the compiler
gives the products and their transposes; they are XLA:CPU choices (their effect in docs/performance.md) and apply
only to programs lowered for it:

* `linear_skew`: the shift's derivative is the shift itself; on XLA:CPU its tangent is built with a row width
  whose transpose (the backward pass) is vectorised, elsewhere with the primal's (smallest) width. Selected per
  lowering platform with `jax.lax.platform_dependent`. Lowered for TPU, the shift is instead the row-rotation
  kernel of `xlgen.models.tpu_shift` (XLA:TPU relayouts the pad/flatten/slice form through copy loops at ~20x the
  bytes).
* Operand layouts for the attention products (`content_keys` / `content_key_operand`, `position_keys` /
  `position_key_operand`, `ValueOperand`): keys as `[b, n, d, k]` behind an optimization barrier, so the key
  gradients are formed as `(q+u)^T dS` with `[d, k]` outputs; the shared position keys broadcast over the batch as
  a product, so the batch sum of their gradient is a matrix-vector product. `content_keys` and `position_keys`
  form them for a program lowered for XLA:CPU (`cpu_layouts`, by `xlgen.platforms.lowering_platform`: the mesh's
  devices, so a TPU plan compiled on a CPU host gets none) and return the keys as they are elsewhere, where XLA
  chooses the layouts itself: on TPU the barriers cost a copy of the keys each and the product form of the batch
  broadcast writes `[b, n, d, r]` keys the plain product does not need (docs/pod_scale.md, "Platform tuning").

* `relative_rows`: XLNet's query-stream position term (targets at sampled positions) as an element-wise gather
  on XLA:CPU, as one contiguous window per target elsewhere (XLA:TPU turns the element-wise gather's gradient
  into a sorted scatter, ~5x the HBM traffic).
* `fused_attention`: on TPU the whole core (scores, softmax, dropout, probabilities by values) is one Pallas
  kernel per direction (`xlgen.models.tpu_attention`), the shift a rotation of rows inside it.
* `fused_logsumexp_rows`: the adaptive softmax's log-normaliser, lowered for TPU, as the Pallas kernels of
  `xlgen.models.tpu_logsumexp` (the logits kept in VMEM); None elsewhere, where `adaptive_softmax.logsumexp_rows`
  forms it with XLA. With it, `dense_tail_clusters`: each tail cluster over all of a device's tokens at once, not
  in chunks of its own tokens.
* `rotated_factorized_position`: Funnel's factorized position term as the rotation of (q + v)·W_r^T by the query's
  angles, contracted over d_model rather than the original's 2·d_model (`rotated_factorized_position_scores`), for
  programs lowered for any platform but XLA:CPU, which keeps the original form (the form of its figures in
  docs/performance.md).

The relative-attention core (`relative_attention.py`), XLNet's query stream and Transformer-XL's cached evaluation
call these by name.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from xlgen import platforms
from xlgen.models import tpu_logsumexp, tpu_shift

_EMULATED_TPU = contextvars.ContextVar("xlgen_emulated_tpu", default=False)


@contextlib.contextmanager
def emulate_tpu():
    """Trace the forms chosen for TPU lowering on any backend, the Pallas kernels run through JAX (`interpret`):
    for comparing them with the other platforms' forms on the CPU."""
    token = _EMULATED_TPU.set(True)
    try:
        yield
    finally:
        _EMULATED_TPU.reset(token)


def lowering_platform() -> str:
    """`xlgen.platforms.lowering_platform()`, or `tpu` inside `emulate_tpu()`."""
    return "tpu" if _EMULATED_TPU.get() else platforms.lowering_platform()


def kernels_interpreted() -> bool:
    """Whether Pallas kernels run through JAX (`interpret=True`): inside `emulate_tpu()`."""
    return _EMULATED_TPU.get()


_UNFUSED = contextvars.ContextVar("xlgen_unfused_attention", default=False)


def fused_attention() -> bool:
    """Whether the relative-attention core is the fused kernel of `xlgen.models.tpu_attention` (scores, softmax and
    dropout in VMEM): in programs lowered for TPU, where each `[b, n, q, k]` pass of the XLA form is memory-bound
    (docs/pod_scale.md), unless traced inside `unfused_attention()`."""
    return lowering_platform() == "tpu" and not _UNFUSED.get()


@contextlib.contextmanager
def unfused_attention():
    """Trace the attention core as XLA ops on every platform (the terms of `relative_attention.py`, the shift
    kernel on TPU): for comparing the fused kernel with them, or counting the model's own FLOPs without the
    kernel's recomputation in its backward pass."""
    token = _UNFUSED.set(True)
    try:
        yield
    finally:
        _UNFUSED.reset(token)


def tangent_row_width(width: int, stride: int) -> int:
    """Row width for the tangent skew on XLA:CPU, whose transpose (the backward pass: pad the `[q, klen]`
    cotangent into rows of w - stride, flatten, pad, reshape into rows of w) is emitted as vectorised code only when
    w - stride is a power of two; otherwise every element pays integer divisions. On `[4,4,512,512]` f32 (Funnel at
    seq 512) the transpose takes 17.8 ms with w = 1024 and 5.8 ms with w = 1025; on `[8,8,256,640]` (XLNet,
    memory 128) 13.1 ms with w = 640 and 6.9 ms with w = 1025. Used up to twice the smallest width."""
    pow2 = (1 << (width - stride - 1).bit_length()) + stride
    return pow2 if pow2 <= 2 * width else width


def linear_skew(skew: Callable, min_width: Callable[[int, int, int, int], int]):
    """`shift(x, klen, offset, stride) = skew(x, klen, offset, stride, min_width(r, klen, offset, stride))` with its
    derivative the same map on the tangent (the shift is linear; at every entry a caller keeps -- entries a caller
    must mask may hold other rows' values), the tangent built on XLA:CPU with `tangent_row_width`; other platforms
    (and AOT compiles for them on a CPU host) keep the smallest width."""

    @functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
    def shift(x: jax.Array, klen: int, offset: int, stride: int) -> jax.Array:
        return skew(x, klen, offset, stride, min_width(x.shape[-1], klen, offset, stride))

    @shift.defjvp
    def shift_jvp(klen, offset, stride, primals, tangents):
        (x,), (t,) = primals, tangents
        width = min_width(x.shape[-1], klen, offset, stride)
        tangent = jax.lax.platform_dependent(
            t,
            cpu=functools.partial(
                skew, klen=klen, offset=offset, stride=stride, width=tangent_row_width(width, stride)
            ),
            default=functools.partial(skew, klen=klen, offset=offset, stride=stride, width=width),
        )
        return shift(x, klen, offset, stride), tangent

    def shift_for_platform(x: jax.Array, klen: int, offset: int, stride: int) -> jax.Array:
        if lowering_platform() == "tpu" and tpu_shift.applies(x.shape, klen):
            return tpu_shift.relative_shift(x, klen, offset, stride, interpret=_EMULATED_TPU.get())
        return shift(x, klen, offset, stride)

    return shift_for_platform


def heads_major_position_scores(qv: jax.Array, k_head_r, *, klen: int, offset: int, stride: int) -> Optional[jax.Array]:
    """The shifted position scores `[b,n,q,klen]` of keys shared by the batch (`[r,n,d]`) for TPU lowering, or None
    elsewhere (the caller then shifts `position_contraction` itself). XLA:TPU emits the product batched over the
    heads, `[n,b,q,r]`; shifted in that order, only the shifted result is transposed, where the `[b,n,q,r]` order
    costs copies of the raw scores in the forward pass and of the cotangent in the backward pass (Transformer-XL
    enwik8-large, 2 layers per core on v3: 14.2 ms roofline and 4.89 GB, against 14.9 ms and 5.24 GB in that
    order)."""
    if lowering_platform() != "tpu" or isinstance(k_head_r, (PositionKeyOperand, DirectedKeys)) or k_head_r.ndim != 3:
        return None
    if not tpu_shift.applies((qv.shape[0], qv.shape[1], k_head_r.shape[0]), klen):
        return None
    raw = jnp.einsum("bind,jnd->nbij", qv, k_head_r.astype(qv.dtype))
    shifted = tpu_shift.relative_shift(
        raw, klen, offset, stride, interpret=_EMULATED_TPU.get(), lead_axes=tpu_shift.HEADS_MAJOR
    )
    return jnp.transpose(shifted, (1, 0, 2, 3))


def fused_logsumexp_rows(h: jax.Array, table: jax.Array, bias: jax.Array) -> Optional[jax.Array]:
    """The adaptive softmax's log-normaliser `[N]` of h `[N, d]` over table `[V, d]` and bias `[V]` for TPU lowering
    (`tpu_logsumexp`: logits formed and reduced in VMEM, never written to HBM), or None elsewhere and where the rows
    do not fit the kernel's VMEM (checked with the rows as given: per device inside `shard_map`, the global count
    outside); the caller then forms it with XLA (`adaptive_softmax.logsumexp_rows`)."""
    if lowering_platform() != "tpu" or h.ndim != 2 or not tpu_logsumexp.applies(*h.shape, h.dtype):
        return None
    return tpu_logsumexp.logsumexp_rows(h, table, bias, interpret=_EMULATED_TPU.get())


def fused_nll_rows(h: jax.Array, table: jax.Array, bias: jax.Array, target: jax.Array) -> Optional[jax.Array]:
    """-log softmax(h · table^T + bias)[target] `[N]` for TPU lowering (`tpu_logsumexp.nll_rows`: the target logit
    taken in the log-normaliser's kernels, whose backward subtracts its one-hot from the softmax in VMEM), or None
    where `fused_logsumexp_rows` is None; the caller then gathers the target rows with XLA."""
    if lowering_platform() != "tpu" or h.ndim != 2 or not tpu_logsumexp.applies(*h.shape, h.dtype):
        return None
    return tpu_logsumexp.nll_rows(h, table, bias, target, interpret=_EMULATED_TPU.get())


def dense_tail_clusters(rows: int, widths, dtype) -> bool:
    """Whether the adaptive softmax runs every tail cluster once over all of a device's `rows` tokens
    (`AdaptiveLogSoftmax._tail_log_probs_dense`) instead of over chunks of each cluster's own tokens: for TPU
    lowering, where the log-normaliser kernel (`fused_logsumexp_rows`) takes the rows at every tail width. With the
    logits in VMEM a cluster costs its FLOPs and its table's bytes once, where the chunk scan adds every chunk's
    gradient of every tail table (full `[V_k, d_k]` float32, zeros for the clusters a chunk does not take) into its
    accumulators and scatters every chunk's target rows into a full table: Transformer-XL WikiText-103 large's
    adaptive softmax loss and gradient per v3 core (768 rows) take 6.3 ms roofline and 2.1 GB, against the chunk
    form's 18.0 ms and 7.7 GB, at 3.3 ms of matmul FLOPs at peak (the chunk form's costliest branches: 3.7 ms)."""
    return lowering_platform() == "tpu" and all(tpu_logsumexp.applies(rows, w, dtype) for w in widths)


def cpu_layouts() -> bool:
    """Whether the program being traced gets the XLA:CPU operand layouts: it is lowered for the CPU."""
    return lowering_platform() == "cpu"


class ContentKeyOperand(NamedTuple):
    """Key heads laid out for the content product: `keys [b, n, d, k]`, behind an optimization barrier
    (`content_key_operand`); formed once per layer when several products use the keys (XLNet's two streams)."""

    keys: jax.Array


def content_key_operand(k_head: jax.Array) -> ContentKeyOperand:
    """Key heads `[b,k,n,d]` -> `[b,n,d,k]` operand. Layout only: the key gradient is then formed as
    `(q+u)^T dS` (`[d, k]` outputs) rather than `dS^T (q+u)` (`[k, d]`), which XLA:CPU ran at about half the
    speed at seq 512 (5.3 vs 9.7 ms standalone, cf. `position_key_operand`); the barrier keeps XLA from folding
    the transpose back into the product."""
    return ContentKeyOperand(jax.lax.optimization_barrier(jnp.transpose(k_head, (0, 2, 3, 1))))


def content_keys(k_head: jax.Array):
    """Key heads `[b,k,n,d]` for the content product of a training step: the `content_key_operand` on XLA:CPU, the
    keys as they are elsewhere."""
    return content_key_operand(k_head) if cpu_layouts() else k_head


class ValueOperand(NamedTuple):
    """Value heads laid out `values [b, n, d, k]` for the probabilities-by-values product: the layout XLA:CPU
    itself gives raw `[b, k, n, d]` values before that product, kept by cached evaluation's memory (Transformer-XL
    `TransfoXLPretrained`), so only a segment's own rows are transposed."""

    values: jax.Array


class PositionKeyOperand(NamedTuple):
    """Position keys laid out for the position product: `keys [b, n, d, r]`, behind an optimization barrier
    (`position_key_operand`). Pass it wherever position keys go to form it once for several products (XLNet's
    two streams)."""

    keys: jax.Array


def position_key_operand(k_head_r: jax.Array, batch: int, direction: Optional[jax.Array] = None) -> PositionKeyOperand:
    """Position keys `[r,n,d]` (shared by the batch), `[b,r,n,d]` (per example), or `[2,r,n,d]` with a one-hot
    `direction [b,2]` (XLNet bi_data: row b uses keys `direction[b] @ k_head_r`) -> `[b,n,d,r]` operand.

    Layout only (same math, same FLOPs, bitwise-equal results on XLA:CPU):
    * the product is batched over (b, n), the shared keys broadcast over the batch, so no `[b,n,q,r]` tensor goes
      through a layout transpose (a shared-key einsum spent 22% of a Funnel seq-512 step in such transposes);
    * the keys enter the product as `[b,n,d,r]`: their gradient is then formed as `(q+v)^T · dS` (`[d, r]`
      outputs) rather than `dS^T · (q+v)` (`[r, d]`), which XLA:CPU ran 2.8x slower for `[512,1024]`
      cotangents (29.6 vs 10.7 ms for Funnel's 16 heads x batch). One layer's attention core at seq 512, forward
      and backward: 69 ms, against 78 ms with `[r, d]` key gradients;
    * the broadcast over the batch (and XLNet's direction select) is a product, so its transpose -- the key
      gradient's sum over the batch -- is a matrix-vector product: as a `reduce` over the short leading axis,
      YNNPACK took 6 ms for `[4,1024,4,64]` (0.15 ms as a product);
    * the barrier's transpose is a barrier on the key cotangent, so XLA does not fold that batch sum back into the
      product as a contracting dimension (which transposes the `[b,n,q,r]` cotangent again)."""
    if direction is not None:
        keys = jnp.einsum("bs,sndr->bndr", direction.astype(k_head_r.dtype), jnp.transpose(k_head_r, (0, 2, 3, 1)))
    elif k_head_r.ndim == 3:
        keys = jnp.einsum("b,ndr->bndr", jnp.ones((batch,), k_head_r.dtype), jnp.transpose(k_head_r, (1, 2, 0)))
    else:
        keys = jnp.transpose(k_head_r, (0, 2, 3, 1))
    return PositionKeyOperand(jax.lax.optimization_barrier(keys))


class DirectedKeys(NamedTuple):
    """XLNet's position keys of both directions `keys [2, r, n, d]` with each row's direction `index [b]` (int32:
    0 forward, 1 backward): the fused attention kernel reads row b's keys as keys[index[b]] and never forms the
    per-row `[b, r, n, d]` keys (`rows()` forms them for the XLA form)."""

    keys: jax.Array
    index: jax.Array

    def rows(self) -> jax.Array:
        """The per-row keys `[b, r, n, d]`: `direction[b] @ keys` over the merged heads `[2, r, n·d]`."""
        s, r, n, d = self.keys.shape
        direction = jax.nn.one_hot(self.index, s, dtype=self.keys.dtype)
        return jnp.einsum("bs,srx->brx", direction, self.keys.reshape(s, r, n * d)).reshape(-1, r, n, d)


def position_keys(k_head_r: jax.Array, batch: int, direction: Optional[jax.Array] = None):
    """Position keys for the position product: `position_key_operand` on XLA:CPU; elsewhere the keys as they are
    (`[r,n,d]` shared by the batch, `[b,r,n,d]` per example), XLNet's `[2,r,n,d]` with a one-hot `direction [b,2]`
    as the per-example `[b,r,n,d]` keys `direction[b] @ k_head_r` (as the original implementations form them), or
    where the fused attention kernel runs as `DirectedKeys` (read per row in the kernel)."""
    if cpu_layouts():
        return position_key_operand(k_head_r, batch, direction)
    if isinstance(k_head_r, DirectedKeys):
        return k_head_r.rows()
    if direction is not None and fused_attention():
        return DirectedKeys(k_head_r, direction[:, 1].astype(jnp.int32))
    if direction is not None:
        return DirectedKeys(k_head_r, direction[:, 1].astype(jnp.int32)).rows()
    return k_head_r


def relative_rows(raw: jax.Array, positions: jax.Array, *, offset: int, klen: int) -> jax.Array:
    """The position term of queries at arbitrary positions: out[b, :, t, j] = raw[b, :, t, offset - z + j] (the
    index clipped to [0, r)), z = positions[b, t], raw `[b, n, m, r]` against the relative-position sequence
    (XLNet's query stream: its m targets sit at sampled positions). Rows whose index leaves [0, r) are masked
    by the caller, as for `relative_shift`.

    On XLA:CPU an element-wise gather (`take_along_axis`); elsewhere `relative_row_windows`, the same values as
    one contiguous window per (b, t)."""
    if cpu_layouts():
        idx = offset - positions[:, :, None] + jnp.arange(klen)[None, None, :]  # [b, m, k]
        idx = jnp.clip(idx, 0, raw.shape[-1] - 1)
        idx = jnp.broadcast_to(idx[:, None], raw.shape[:3] + (klen,))
        return jnp.take_along_axis(raw, idx, axis=-1)
    return relative_row_windows(raw, positions, offset=offset, klen=klen)


def relative_row_windows(raw: jax.Array, positions: jax.Array, *, offset: int, klen: int) -> jax.Array:
    """`relative_rows` as a window of `klen` per (b, t) (a slice gather of b·m contiguous `[n, klen]` windows,
    its gradient adds them back). XLA:TPU gathers the element-wise form through a sorted scatter in the backward
    pass; for XLNet-Large's query stream at 2 rows per v3 core (m = 85 targets, r = 1408, k = 896, bf16, with its
    product, forward + backward) 308 MB of HBM traffic and 0.69 ms of roofline against 62 MB and 0.14 ms here.
    The raw rows are extended by repeating their last entry where a window would run past them, so every entry
    equals the clipped element-wise gather (`dynamic_slice` would move such a window instead)."""
    r = raw.shape[-1]
    need = offset + klen  # the widest window ends at offset - 0 + klen (positions >= 0)
    if need > r:
        raw = jnp.pad(raw, [(0, 0)] * (raw.ndim - 1) + [(0, need - r)], mode="edge")
    start = jnp.clip(offset - positions, 0, None)  # [b, m]
    window = lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, klen, axis=-1)  # row [n, r], s int -> [n, klen]
    return jax.vmap(jax.vmap(window, in_axes=(1, 0), out_axes=1))(raw, start)


def rotated_factorized_position() -> bool:
    """Whether the factorized position term takes its rotated form (`relative_attention.
    rotated_factorized_position_scores`: same values, half the multiply-adds): in programs lowered for anything
    but the CPU. On TPU (v3, Funnel B10-10-10H1024 per-core shapes: batch 8, seq 512, bf16, full remat, one layer
    forward and backward) it cuts the roofline from 16.0 to 11.9 ms, the HBM traffic from 4.56 to 3.40 GB and the
    matmul FLOPs from 610 to 498 G: the original form writes and reads the `[b, q, n, 2·d_model]` concatenation of
    q_r ⊙ phi and q_r ⊙ pi (XLA:TPU fuses neither the products nor the concatenation into the contraction's
    operand) and contracts over 2·d_model (docs/pod_scale.md). The XLA:CPU program keeps the original form."""
    return not cpu_layouts()
