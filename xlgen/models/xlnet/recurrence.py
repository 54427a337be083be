"""Segment-recurrent encoding of long inputs for the finetuning heads (Transformer-XL recurrence, Dai thesis §2.3.1,
applied to finetuning as XLNet's pretraining applies it to its segments).

A document of N*L pieces in the family's layout (XLNet: left padding, `<cls>` last) is cut into N consecutive
segments of L = `data.max_seq_length` pieces, `[B, N, L]`; leading segments that hold only padding are the bucket's
unused slots. Segment s is encoded with the memory of the previous ones,

    h^s, m^{s+1} = XLNet(x^s, mems = m^s, mem_valid = v^s),     m^{s+1} = SG(last mem_len of [m^s; layer inputs of s])
    v^{s+1} = min(v^s + |real pieces of s|, mem_len)          (v^0 = 0: the zero buffer is fully masked)

so the memory holds exactly the trailing `mem_len` real pieces before segment s (left padding keeps them
contiguous at the end of the buffer, `relative_attention.memory_validity_mask`) and an empty slot changes nothing.
The gradient stops at segment boundaries (SG, `model.cache_mems`), as in pretraining. The head reads the last
segment's states h^N (its `<cls>` last), or with `pool="mean"` the mean of the final states over every real piece
of every segment (`[B, 1, d]`, a pooled summary of the whole document). One compiled program for every document
length: the segments run in a `lax.scan`.
"""

from __future__ import annotations

from typing import Optional, Tuple

import jax
import jax.numpy as jnp
from flax import nnx

from xlgen.models.relative_attention import advance_memory_validity

POOLS = ("last", "mean")


def encode_segments(
    transformer,
    input_ids: jax.Array,
    token_type_ids: Optional[jax.Array],
    attention_mask: jax.Array,
    *,
    mem_len: int,
    pool: str = "last",
) -> Tuple[jax.Array, jax.Array]:
    """input_ids / token_type_ids / attention_mask `[B, N, L]` (attention_mask 1 = real piece) -> (h `[B, L, d]` of
    the last segment, or `[B, 1, d]` pooled with `pool="mean"`; the final memory `[n_layer, B, mem_len, d]`)."""
    if pool not in POOLS:
        raise ValueError(f"finetune.segment_pool={pool!r}: expected one of {POOLS}")
    cfg = transformer.config
    B, N, L = input_ids.shape
    M = int(mem_len) if mem_len else L
    graphdef, params, rest = nnx.split(transformer, nnx.Param, ...)
    seg_major = lambda x: None if x is None else jnp.swapaxes(jnp.asarray(x), 0, 1)  # [N, B, L]
    types = seg_major(token_type_ids)

    def body(carry, xs):
        rest, mems, valid, h_last, pooled, count = carry
        ids, mask = xs[0], xs[1]
        model = nnx.merge(graphdef, params, rest)
        h, new_mems = model(
            ids, None if types is None else xs[2], attention_mask=mask, mems=mems, mem_len=M, mem_valid=valid
        )
        _, _, rest = nnx.split(model, nnx.Param, ...)  # the dropout streams advanced
        w = mask.astype(jnp.float32)
        pooled = pooled + jnp.einsum("bld,bl->bd", h.astype(jnp.float32), w)
        count = count + w.sum(-1)
        valid = advance_memory_validity(valid, mask.sum(-1).astype(jnp.int32), M)
        return (rest, new_mems.astype(mems.dtype), valid, h, pooled, count), None

    d = cfg.d_model
    carry = (
        rest,
        jnp.zeros((cfg.n_layer, B, M, d), cfg.compute_dtype),
        jnp.zeros((B,), jnp.int32),
        jnp.zeros((B, L, d), cfg.compute_dtype),
        jnp.zeros((B, d), jnp.float32),
        jnp.zeros((B,), jnp.float32),
    )
    xs = (seg_major(input_ids), seg_major(attention_mask)) + (() if types is None else (types,))
    # the advanced dropout streams are not written back: nothing after the scan draws from the encoder's streams,
    # and the module's own RNG variables may belong to an outer trace (the predictor's)
    (_, mems, _, h_last, pooled, count), _ = jax.lax.scan(body, carry, xs)
    if pool == "mean":
        return (pooled / jnp.maximum(count, 1.0)[:, None])[:, None].astype(h_last.dtype), mems
    return h_last, mems
