"""Funnel-Transformer (Dai thesis Ch. 5; Dai et al. 2020): a pooled encoder, a decoder, MLM head and HF loading.

    embeddings  h = Dropout(LN(E[x]))                                   (no absolute positions)
    block 1     L_1 post-LN relative-attention layers at length T
    block m>1   h' = Pool(h) (stride 2, <cls> kept apart);  first layer  h <- LN(h' + Attn(Q=h', KV=h))  (Eq. 5.4,
                "pool-query-only"), remaining layers standard, at length T/2^(m-1)
    decoder     g = Upsample(h^M) + h^1 (repeat each state 2^(M-1) times, Eq. 5.5), then `num_decoder_layers`
                full-length layers

Attention is the shared relative-attention core (`xlgen.models.relative_attention`): content + position + segment
terms, scaled by 1/sqrt(d_head). Positions are strided: block m has query/key positions spaced 2^(m-1) apart, and the
pooling layer's queries are spaced twice as far as its keys. The position term is computed in either of the two forms
of the original code, selected by `attention_type`, which agree numerically:

    "relative_shift"  project sinusoids of the distance sequence, then the gather-free strided `relative_shift`
    "factorized"      sin/cos of absolute positions and the trig identity (`factorized_position_scores`), no shift

With `separate_cls`, position and segment terms are zeroed on every score involving <cls> (the `func_mask`).
Segment term: s_ij = seg_embed[1] if i, j are in the same segment (or either has token type 2 = <cls>) else
seg_embed[0] (the HF/original layout [different, same]).

Everything here reproduces `transformers` 4.34.1 `modeling_funnel.py` exactly (see tests/test_funnel.py), including
its choice of the block-1 residual when block 1 has repeated (shared) layers: the original code adds the LAST output
of block 1; HF adds the output after `block_sizes[0]` layer applications. `FunnelConfig.hf_block1_residual` selects
HF's (set by `from_hf`); the default follows the paper/original.

Heads, the ELECTRA objective and losses live in `xlgen.models.funnel.heads`, Hugging Face loading in
`xlgen.models.funnel.hf`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from xlgen.models import operands, tpu_attention
from xlgen.models.layers import (
    Dense,
    Dropout,
    LayerNorm,
    PositionwiseFF,
    activation,
    check_precision,
    normal,
    param,
    remat_policy,
    rematerialize,
    zeros,
)
from xlgen.models.relative_attention import (
    RelativeMultiHeadAttention,
    factorized_position_encodings,
    factorized_position_scores,
    fused_relative_attention,
    position_scores,
    position_scores_at,
    relative_attention,
    segment_scores,
    sinusoid_embedding,
)
from xlgen.sharding import UNCONSTRAINED, constrain

CLS_TOKEN_TYPE = 2  # token type id marking <cls> (treated as "same segment" as everything)


# ----------------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------------


def parse_block_layout(layout: Union[str, Sequence[int]]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """ "6-3x2-3x2" (or "6_3x2_3x2") -> block_sizes (6, 3, 3), block_repeats (1, 2, 2).

    "3x2" = 3 parameter sets, each applied twice in a row (layer0, layer0, layer1, layer1, ...), as in the original
    code and HF. A sequence of ints means no sharing.
    """
    if not isinstance(layout, str):
        sizes = tuple(int(s) for s in layout)
        return sizes, (1,) * len(sizes)
    sizes, repeats = [], []
    for part in re.split(r"[-_]", layout.strip()):
        m = re.fullmatch(r"(\d+)(?:x(\d+))?", part.strip())
        if not m or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
            raise ValueError(f"invalid block layout {layout!r}: expected e.g. '6-6-6' or '6-3x2-3x2'")
        sizes.append(int(m.group(1)))
        repeats.append(int(m.group(2) or 1))
    return tuple(sizes), tuple(repeats)


@dataclasses.dataclass(frozen=True)
class FunnelConfig:
    """Funnel-Transformer hyper-parameters (original-code names; `from_hf` maps the HF config).

    `block_sizes` accepts the sharing notation ("6-3x2-3x2"; `block_repeats` is then ignored, so
    `dataclasses.replace(cfg, block_sizes="4-4-4")` just works) or a sequence of ints (then `block_repeats` applies,
    default all 1). `d_embed` (None = d_model) != d_model adds an input projection and an MLM projection back
    to d_embed (the ELECTRA generator). `dtype` is the compute dtype ("float32" or "bfloat16"); parameters,
    LayerNorm statistics, softmax and logits stay float32.
    """

    vocab_size: int = 30522
    block_sizes: Union[str, Tuple[int, ...]] = (4, 4, 4)
    block_repeats: Optional[Tuple[int, ...]] = None
    num_decoder_layers: int = 2
    d_model: int = 768
    n_head: int = 12
    d_head: int = 64
    d_inner: int = 3072
    d_embed: Optional[int] = None
    hidden_act: str = "gelu_new"
    dropout: float = 0.1
    dropatt: float = 0.1
    dropact: float = 0.0
    layer_norm_eps: float = 1e-9
    init_std: float = 0.02
    pooling_type: str = "mean"
    attention_type: str = "relative_shift"
    separate_cls: bool = True
    truncate_seq: bool = True
    pool_q_only: bool = True
    mlm_transform: bool = False  # original `lm_proj` (dense + act + LN) before the tied softmax; HF has none
    hf_block1_residual: bool = False
    remat: Union[bool, str] = "none"  # a name of layers.REMAT_POLICIES (True / False = full / none)
    dtype: str = "float32"
    param_dtype: str = "float32"
    scores_dtype: str = "float32"
    softmax_dtype: str = "float32"
    logits_dtype: str = "float32"

    def __post_init__(self):
        sizes, repeats = parse_block_layout(self.block_sizes)
        if not isinstance(self.block_sizes, str) and self.block_repeats is not None:  # a string's sharing wins
            repeats = tuple(int(r) for r in self.block_repeats)
            if len(repeats) != len(sizes):
                raise ValueError(f"FunnelConfig: block_repeats {repeats} does not match block_sizes {sizes}")
        object.__setattr__(self, "block_sizes", sizes)
        object.__setattr__(self, "block_repeats", repeats)
        if self.pooling_type not in ("mean", "max", "min"):
            raise ValueError(f"FunnelConfig.pooling_type={self.pooling_type!r}; expected mean, max or min")
        if self.attention_type not in ("relative_shift", "factorized"):
            raise ValueError(
                f"FunnelConfig.attention_type={self.attention_type!r}; expected 'relative_shift' or 'factorized'"
            )
        object.__setattr__(self, "remat", remat_policy(self.remat))
        check_precision(self)
        if self.d_model % 2:
            raise ValueError("FunnelConfig.d_model must be even (sin/cos position encodings)")

    @property
    def num_blocks(self) -> int:
        return len(self.block_sizes)

    @property
    def embed_dim(self) -> int:
        return self.d_embed or self.d_model

    @property
    def pooling_stride(self) -> int:
        """Positions one position of the last block stands for (each block after the first halves the length):
        packed finetuning rows (`xlgen.finetune.packing`) start every example at a multiple of it."""
        return 2 ** (self.num_blocks - 1)

    @property
    def compute_dtype(self):
        return jnp.bfloat16 if self.dtype == "bfloat16" else jnp.float32

    @property
    def layout(self) -> str:
        """Paper notation, e.g. "B6-3x2-3x2"."""
        return "B" + "-".join(f"{s}x{r}" if r > 1 else f"{s}" for s, r in zip(self.block_sizes, self.block_repeats))

    @classmethod
    def from_hf(cls, hf: dict, **overrides) -> "FunnelConfig":
        """From a HF `config.json` dict (transformers FunnelConfig field names)."""
        known = dict(
            vocab_size=hf.get("vocab_size", 30522),
            block_sizes=tuple(hf.get("block_sizes", (4, 4, 4))),
            block_repeats=tuple(hf.get("block_repeats") or (1,) * len(hf.get("block_sizes", (4, 4, 4)))),
            num_decoder_layers=hf.get("num_decoder_layers", 2),
            d_model=hf.get("d_model", 768),
            n_head=hf.get("n_head", 12),
            d_head=hf.get("d_head", 64),
            d_inner=hf.get("d_inner", 3072),
            hidden_act=hf.get("hidden_act", "gelu_new"),
            dropout=hf.get("hidden_dropout", 0.1),
            dropatt=hf.get("attention_dropout", 0.1),
            dropact=hf.get("activation_dropout", 0.0),
            layer_norm_eps=hf.get("layer_norm_eps", 1e-9),
            init_std=hf.get("initializer_std") or 0.02,
            pooling_type=hf.get("pooling_type", "mean"),
            attention_type=hf.get("attention_type", "relative_shift"),
            separate_cls=hf.get("separate_cls", True),
            truncate_seq=hf.get("truncate_seq", True),
            pool_q_only=hf.get("pool_q_only", True),
            hf_block1_residual=True,
        )
        known.update(overrides)
        return cls(**known)


# ----------------------------------------------------------------------------------------------------------------
# Sequence structure: pooling, strided positions, upsampling (all lengths static)
# ----------------------------------------------------------------------------------------------------------------


def stride_select(x, axis: int, cfg: FunnelConfig):
    """Keep the positions a pooled sequence keeps (<cls> plus the first of each pair), by slicing (HF stride_pool).

    Works for NumPy and JAX arrays; length T -> ceil(T/2) (separate_cls+truncate_seq), ceil((T+1)/2) (separate_cls)
    or ceil(T/2).
    """
    mod = np if isinstance(x, np.ndarray) else jnp
    axis %= x.ndim
    if axis == 1 and not isinstance(x.shape[1], int):  # a symbolic length: the first of each pooling window
        return _pairs(x, cfg)[:, :, 0]
    lead = (slice(None),) * axis
    if cfg.separate_cls:
        x = mod.concatenate([x[lead + (slice(None, 1),)], x], axis=axis)
        return x[lead + (slice(None, -1, 2) if cfg.truncate_seq else slice(None, None, 2),)]
    return x[lead + (slice(None, None, 2),)]


def pool_sequence(x: jax.Array, mode: str, cfg: FunnelConfig) -> jax.Array:
    """Stride-2 window-2 pooling along axis 1 of `[b, T, ...]` (Eq. 5.3), <cls> kept apart (HF pool_tensor).

    With separate_cls the sequence is [cls, cls, x_1, ..., x_{T-2}] (truncate_seq drops the last token), so <cls>
    pools with itself and x_{2k-1}, x_{2k} form pair k. An odd tail is pooled alone (ceil mode).
    """
    x = _pairs(x, cfg)
    if mode == "mean":
        return x.mean(axis=2).astype(x.dtype)
    if mode == "max":
        return x.max(axis=2)
    if mode == "min":
        return x.min(axis=2)
    raise ValueError(f"unknown pooling mode {mode!r}")


def _pairs(x: jax.Array, cfg: FunnelConfig) -> jax.Array:
    """`[b, T, ...]` -> the pooling windows `[b, ceil(T'/2), 2, ...]` of `pool_sequence` (T' after the <cls> shift)."""
    if cfg.separate_cls:
        suffix = x[:, :-1] if cfg.truncate_seq else x
        x = jnp.concatenate([x[:, :1], suffix], axis=1)
    t = x.shape[1]
    if not isinstance(t, int):  # a symbolic length (`jax.export`): the odd tail's copy kept when t is odd
        x = jnp.concatenate([x, x[:, -1:]], axis=1)[:, : 2 * (1 + (t - 1) // 2)]
    elif t % 2:
        x = jnp.concatenate([x, x[:, -1:]], axis=1)  # a window of one element: mean/max/min of itself
    return x.reshape(x.shape[0], x.shape[1] // 2, 2, *x.shape[2:])


def pool_packed(x: jax.Array, mode: str, cfg: FunnelConfig, starts: jax.Array) -> jax.Array:
    """`pool_sequence` of a packed row (several examples, each starting at a multiple of 2^(num_blocks-1);
    `starts` `[b, T]` bool marks each example's first position, its <cls>). With separate_cls every example's <cls>
    is kept apart as position 0 is in one example: the window whose second element is a <cls> (it pairs the
    previous example's last, padding, position with the next example's <cls>) yields that <cls> alone. Without
    separate_cls the windows never straddle two examples and the plain pooling applies."""
    pooled = pool_sequence(x, mode, cfg)
    if not cfg.separate_cls:
        return pooled
    pair, second = _pairs(x, cfg), _pairs(starts, cfg)[:, :, 1]
    return jnp.where(second.reshape(second.shape + (1,) * (x.ndim - 2)), pair[:, :, 1], pooled)


def pool_second(x: jax.Array, cfg: FunnelConfig) -> jax.Array:
    """The second element of every pooling window `[b, T'', ...]` (a packed row's example ids and <cls> flags: a
    window lies inside one example, or ends with the next example's <cls>)."""
    return _pairs(x, cfg)[:, :, 1]


def packed_starts(pack_ids: jax.Array) -> jax.Array:
    """`[b, T]` bool: True where a packed example begins (position 0, and wherever the example id changes)."""
    first = jnp.ones_like(pack_ids[:, :1], bool)
    return jnp.concatenate([first, pack_ids[:, 1:] != pack_ids[:, :-1]], axis=1)


def pool_positions(pos: np.ndarray, block_index: int, cfg: FunnelConfig) -> np.ndarray:
    """Absolute positions of the pooled sequence entering block `block_index` (original `rel_shift_pos_enc`):
    pooled states sit at the position of the first of their pair; <cls> is placed at 1 - 2^block_index so that
    the positions stay evenly spaced (its position terms are masked anyway)."""
    if not isinstance(pos.shape[0], int):  # a symbolic length: evenly spaced, as long as `_pairs` makes it
        t = pos.shape[0] + (1 if cfg.separate_cls and not cfg.truncate_seq else 0)
        n = 1 + (t - 1) // 2
        if cfg.separate_cls:
            body = pos[1] + 2 * (pos[2] - pos[1]) * jnp.arange(n - 1, dtype=pos.dtype)
            return jnp.concatenate([jnp.array([1 - 2**block_index], pos.dtype), body])
        return pos[0] + 2 * (pos[1] - pos[0]) * jnp.arange(n, dtype=pos.dtype)
    if cfg.separate_cls:
        body = pos[1:-1] if cfg.truncate_seq else pos[1:]
        return np.concatenate([np.array([1 - 2**block_index], pos.dtype), body[::2]])
    return pos[::2]


def relative_distances(q_pos: np.ndarray, k_pos: np.ndarray, k_stride: int, shift: int) -> np.ndarray:
    """Distance sequence for the strided `relative_shift` (HF `relative_pos`): from q_pos[0] - k_pos[0] +
    shift·len(q)·k_stride down to q_pos[0] - k_pos[-1] in steps of k_stride. Entry offset - shift·i + j (offset =
    shift·len(q)) then holds q_pos[i] - k_pos[j]."""
    if not isinstance(q_pos, np.ndarray) or not isinstance(k_pos, np.ndarray):
        # symbolic lengths (jax arrays of `jax.export` sizes): k_pos is evenly spaced by k_stride (<cls> included,
        # `pool_positions`), so the sequence has len(k) + shift·len(q) entries
        lq, lk = q_pos.shape[0], k_pos.shape[0]
        return (q_pos[0] - k_pos[0]) + k_stride * (shift * lq) - k_stride * jnp.arange(lk + shift * lq)
    max_dist = q_pos[0] - k_pos[0] + shift * len(q_pos) * k_stride
    min_dist = q_pos[0] - k_pos[-1]
    return np.arange(max_dist, min_dist - 1, -k_stride)


def upsample(x: jax.Array, stride: int, target_len: int, cfg: FunnelConfig) -> jax.Array:
    """Eq. 5.5: repeat each non-<cls> state `stride` times and re-attach <cls> -> `[b, target_len, d]`."""
    if stride == 1:
        return x
    if cfg.separate_cls:
        cls, x = x[:, :1], x[:, 1:]
    out = jnp.repeat(x, stride, axis=1)
    if cfg.separate_cls:
        if cfg.truncate_seq:
            out = jnp.pad(out, ((0, 0), (0, stride - 1), (0, 0)))
        return jnp.concatenate([cls, out[:, : target_len - 1]], axis=1)
    return out[:, :target_len]


def pooled_lengths(seq_len: int, cfg: FunnelConfig) -> Tuple[int, ...]:
    """Sequence length inside each encoder block, e.g. (512, 256, 128) for separate_cls + truncate_seq."""
    lengths, t = [], seq_len
    for b in range(cfg.num_blocks):
        if b > 0 and t > (2 if cfg.separate_cls else 1):
            t = len(pool_positions(np.arange(t), b, cfg))
        lengths.append(t)
    return tuple(lengths)


class AttentionInputs(NamedTuple):
    """What one attention call needs besides q/k/v: static positions (NumPy) and per-batch masks (JAX)."""

    q_pos: np.ndarray  # [q] absolute query positions
    k_pos: np.ndarray  # [k] absolute key positions
    k_stride: int  # spacing of key positions
    shift: int  # q spacing / k spacing (2 in a pooling layer, else 1)
    q_type: jax.Array  # [b, q] token types at the query positions
    k_type: jax.Array  # [b, k]
    key_real: jax.Array  # [b, k] 1 = real token (attention_mask at key positions)
    # [b, q] int: per-row query positions (selected rows of a full-length layer: keys at 0..k-1, k_stride = shift
    # = 1; q_pos unused), or None: the queries are at q_pos
    q_rows: Optional[jax.Array] = None
    # packed rows (several examples per row, `xlgen.finetune.packing`): example id of every query / key position
    # ([b, q], [b, k] int; attention stays inside an example) and their <cls> flags ([b, q], [b, k] bool: the
    # func_mask of each example's own <cls>); None: one example per row
    q_pack: Optional[jax.Array] = None
    k_pack: Optional[jax.Array] = None
    q_cls: Optional[jax.Array] = None
    k_cls: Optional[jax.Array] = None

    def segment_same(self) -> jax.Array:
        """[b, q, k] True where the segment term uses seg_embed[1] (same segment, or <cls> involved)."""
        same = self.q_type[:, :, None] == self.k_type[:, None, :]
        cls = (self.q_type == CLS_TOKEN_TYPE)[:, :, None] | (self.k_type == CLS_TOKEN_TYPE)[:, None, :]
        return same | cls


# ----------------------------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------------------------


def _unsharded_embed(kernel: jax.Array) -> jax.Array:
    """`kernel` `[embed, ...]` with its `embed` dimension gathered when a mesh is set (other dimensions left to the
    partitioner). The factorized position term contracts q against W_r into a d_model-wide `[b, q, n, D]` tensor:
    left alone, the partitioner keeps D sharded like W_r's fsdp-sharded `embed` and moves the (much larger)
    activations instead -- all-gathers of the global batch, all-to-alls and partial-sum all-reduces every layer.
    Gathering the 2 MB weight, as FSDP does for every other projection, keeps the activations batch-sharded."""
    return constrain(kernel, (None,) + (UNCONSTRAINED,) * (kernel.ndim - 1))


_STREAM = ("activation_batch", "activation_length", "activation_embed")


def _batch_sharded(x: jax.Array) -> jax.Array:
    """The residual stream `[b, t, d]` constrained by logical names (rows over the batch axes, d whole under every
    preset; `xlgen.sharding.constrain`). Without it the partitioner may carry the stream sharded like the
    fsdp-sharded `embed` of the weights: every projection then all-reduces partial sums of the global batch and
    every LayerNorm reduces across devices."""
    return constrain(x, _STREAM)


class FunnelAttention(RelativeMultiHeadAttention):
    """The shared relative-attention layer with Funnel's settings: q without bias, k/v/o with bias, per-layer u, v,
    b_s biases and segment embeddings; strided positions in either form; <cls> excluded from position/segment terms.
    """

    def __init__(self, cfg: FunnelConfig, *, rngs: nnx.Rngs):
        super().__init__(
            cfg.d_model,
            cfg.n_head,
            cfg.d_head,
            dropout=cfg.dropout,
            dropatt=cfg.dropatt,
            qkv_bias=(False, True, True),
            o_bias=True,
            own_biases=True,
            segments=True,
            layer_norm_eps=cfg.layer_norm_eps,
            init_std=cfg.init_std,
            scores_dtype=cfg.scores_dtype,
            softmax_dtype=cfg.softmax_dtype,
            rngs=rngs,
        )
        self.attention_type = cfg.attention_type
        self.separate_cls = cfg.separate_cls
        self.d_model = cfg.d_model
        self.pos_drop = Dropout(cfg.dropout, rngs=rngs)

    def __call__(self, query: jax.Array, kv: jax.Array, ai: AttentionInputs) -> jax.Array:
        """query `[b, q, d]`, kv `[b, k, d]` -> LN(query + Attn) `[b, q, d]`."""
        dtype = query.dtype
        b = self.biases(None)
        q_head, (k_head, v_head) = self.query_heads(query), self.kv_heads(kv)
        qlen, klen = query.shape[1], kv.shape[1]
        rows = ai.q_rows
        if rows is not None and (ai.k_stride != 1 or ai.shift != 1 or klen != len(ai.k_pos)):
            raise ValueError("FunnelAttention: query rows (q_rows) need a full-length layer (stride 1, no pooling)")
        if rows is None and ai.q_pack is None and operands.fused_attention():
            attn_vec = self.fused_core(q_head, k_head, v_head, ai, b, dtype)
            if attn_vec is not None:
                return self.output(query, attn_vec)
        if self.attention_type == "factorized":
            (phi, pi), k_enc = factorized_position_encodings(
                jnp.asarray(ai.q_pos) if rows is None else rows, jnp.asarray(ai.k_pos), self.d_model, dtype
            )
            pos = factorized_position_scores(
                q_head,
                _unsharded_embed(self.r.kernel[...]),
                b["r_r_bias"],
                (self.pos_drop(phi), self.pos_drop(pi)),
                k_enc,
            )
        elif rows is None:
            dist = relative_distances(ai.q_pos, ai.k_pos, ai.k_stride, ai.shift)
            enc = self.pos_drop(sinusoid_embedding(jnp.asarray(dist), self.d_model, dtype))
            pos = position_scores(
                q_head, self.position_heads(enc), b["r_r_bias"], klen=klen, offset=ai.shift * qlen, stride=ai.shift
            )
        else:  # the full-length layer's distances klen, ..., -(klen-1); query at p reads from klen - p
            dist = relative_distances(ai.k_pos, ai.k_pos, 1, 1)
            enc = self.pos_drop(sinusoid_embedding(jnp.asarray(dist), self.d_model, dtype))
            pos = position_scores_at(q_head, self.position_heads(enc), b["r_r_bias"], start=klen - rows, klen=klen)
        seg = segment_scores(q_head, self.seg_embed[...], b["r_s_bias"], ai.segment_same())
        if self.separate_cls:  # func_mask: no position / segment bias on scores involving <cls>
            if ai.q_cls is not None:  # packed: each example's own <cls>
                keep = ~(ai.q_cls[:, :, None] | ai.k_cls[:, None, :])[:, None]
            elif rows is None:
                xp = np if isinstance(qlen, int) and isinstance(klen, int) else jnp  # jnp: symbolic sizes
                keep = (xp.arange(qlen) > 0)[:, None] & (xp.arange(klen) > 0)[None, :]
            else:
                keep = (rows > 0)[:, None, :, None] & (np.arange(klen) > 0)
            pos = jnp.where(keep, pos, 0)
            seg = jnp.where(keep, seg, 0)
        mask = (ai.key_real == 0)[:, None, None, :]
        if ai.q_pack is not None:  # packed: no attention across examples
            mask = mask | (ai.q_pack[:, :, None] != ai.k_pack[:, None, :])[:, None]
        attn_vec = relative_attention(
            q_head,
            self.content_keys(k_head),
            v_head,
            r_w_bias=b["r_w_bias"],
            position_term=pos,
            segment_term=seg,
            mask=mask,
            dropatt=self.dropatt,
            scores_dtype=self.scores_dtype,
            softmax_dtype=self.softmax_dtype,
        )
        return self.output(query, attn_vec)

    def fused_core(self, q_head, k_head, v_head, ai: AttentionInputs, b: dict, dtype) -> Optional[jax.Array]:
        """The attention core of `__call__` as one kernel for TPU lowering (`fused_relative_attention`; the same
        terms, dropout keys drawn in the same order), or None where it does not apply."""
        qlen, klen = q_head.shape[1], k_head.shape[1]
        factorized_form = self.attention_type == "factorized"
        dist = None if factorized_form else relative_distances(ai.q_pos, ai.k_pos, ai.k_stride, ai.shift)
        fits = tpu_attention.applies(qlen, klen, klen, self.d_model) if factorized_form else (
            tpu_attention.applies(qlen, klen, len(dist))
        )  # fmt: skip
        if not fits:  # (checked before drawing the encodings' dropout keys)
            return None
        common = dict(
            klen=klen,
            mask=(ai.key_real == 0)[:, None, None, :],
            seg_mat=ai.segment_same(),
            seg_embed=self.seg_embed[...],
            dropatt=self.dropatt,
            exclude_first=self.separate_cls,
        )
        if factorized_form:
            q_enc, k_enc = factorized_position_encodings(
                jnp.asarray(ai.q_pos), jnp.asarray(ai.k_pos), self.d_model, dtype
            )
            q_enc = (self.pos_drop(q_enc[0]), self.pos_drop(q_enc[1]))
            factorized = (q_enc, k_enc, _unsharded_embed(self.r.kernel[...]))
            return fused_relative_attention(q_head, k_head, v_head, None, b, factorized=factorized, **common)
        enc = self.pos_drop(sinusoid_embedding(jnp.asarray(dist), self.d_model, dtype))
        return fused_relative_attention(
            q_head, k_head, v_head, self.position_heads(enc), b, offset=ai.shift * qlen, stride=ai.shift, **common
        )


class FunnelLayer(nnx.Module):
    """Post-LN layer (Eqs. 5.1-5.2): h <- LN(q + Attn(q, kv)); h <- LN(h + FFN(h))."""

    def __init__(self, cfg: FunnelConfig, *, rngs: nnx.Rngs):
        self.attention = FunnelAttention(cfg, rngs=rngs)
        self.ffn = PositionwiseFF(
            cfg.d_model,
            cfg.d_inner,
            act=cfg.hidden_act,
            dropout=cfg.dropout,
            dropact=cfg.dropact,
            layer_norm_eps=cfg.layer_norm_eps,
            init_std=cfg.init_std,
            rngs=rngs,
        )
        self.remat = cfg.remat

    def __call__(self, query: jax.Array, kv: jax.Array, ai: AttentionInputs) -> jax.Array:
        if self.remat == "none":
            return self._forward(query, kv, ai)
        return rematerialize(lambda layer, q, k: layer._forward(q, k, ai), self.remat)(self, query, kv)

    def _forward(self, query, kv, ai):
        query, kv = _batch_sharded(query), _batch_sharded(kv)
        return _batch_sharded(self.ffn(_batch_sharded(self.attention(query, kv, ai))))


class FunnelEmbeddings(nnx.Module):
    """h = Dropout(LN(E[x])): word embeddings `[vocab, d_embed]` only (positions are relative)."""

    def __init__(self, cfg: FunnelConfig, *, rngs: nnx.Rngs):
        self.word_embeddings = param(rngs, normal(cfg.init_std), (cfg.vocab_size, cfg.embed_dim), ("vocab", "embed"))
        self.layer_norm = LayerNorm(cfg.embed_dim, eps=cfg.layer_norm_eps, rngs=rngs)
        self.drop = Dropout(cfg.dropout, rngs=rngs)
        self.dtype = cfg.compute_dtype

    def __call__(self, input_ids: jax.Array) -> jax.Array:
        h = jnp.take(self.word_embeddings[...], input_ids, axis=0)
        return self.drop(self.layer_norm(h)).astype(self.dtype)


def _full_length_inputs(seq_len: int, token_type_ids, attention_mask, pack_ids=None) -> AttentionInputs:
    pos = np.arange(seq_len) if isinstance(seq_len, int) else jnp.arange(seq_len)  # jnp: a symbolic length
    ai = AttentionInputs(pos, pos, 1, 1, token_type_ids, token_type_ids, attention_mask)
    if pack_ids is None:
        return ai
    starts = packed_starts(pack_ids)
    return ai._replace(q_pack=pack_ids, k_pack=pack_ids, q_cls=starts, k_cls=starts)


class FunnelEncoder(nnx.Module):
    """Blocks of layers with pooling between them. `blocks[m][l]` is the l-th parameter set of block m, applied
    `block_repeats[m]` times in a row."""

    def __init__(self, cfg: FunnelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        if cfg.d_embed is not None and cfg.d_embed != cfg.d_model:
            self.input_projection = Dense(
                (cfg.d_embed,), (cfg.d_model,), ("embed",), ("embed",), init_std=cfg.init_std, rngs=rngs
            )
        else:
            self.input_projection = None
        self.blocks = nnx.List([nnx.List([FunnelLayer(cfg, rngs=rngs) for _ in range(n)]) for n in cfg.block_sizes])

    def __call__(
        self, h: jax.Array, token_type_ids: jax.Array, attention_mask: jax.Array, pack_ids=None
    ) -> Tuple[jax.Array, jax.Array]:
        """h `[b, T, d]` -> (last hidden `[b, T_M, d]`, block-1 output `[b, T, d]` for the decoder residual).
        pack_ids `[b, T]` int: packed rows (`xlgen.finetune.packing`), examples aligned to 2^(num_blocks-1)."""
        cfg = self.cfg
        if self.input_projection is not None:
            h = self.input_projection(h)
        ai = _full_length_inputs(h.shape[1], token_type_ids, attention_mask, pack_ids)
        block1 = None
        applied = 0
        for m, block in enumerate(self.blocks):
            pooling = m > 0 and h.shape[1] > (2 if cfg.separate_cls else 1)
            for l, layer in enumerate(block):
                for r in range(cfg.block_repeats[m]):
                    if pooling and l == 0 and r == 0:
                        h, ai = self._pooling_layer(layer, h, ai, m)
                    else:
                        h = layer(h, h, ai)
                    applied += 1
                    if m == 0 and cfg.hf_block1_residual and applied == cfg.block_sizes[0]:
                        block1 = h
            if m == 0 and block1 is None:
                block1 = h
        return h, block1

    def _pooling_layer(self, layer: FunnelLayer, h: jax.Array, ai: AttentionInputs, m: int):
        """First layer of block m > 0: pool, attend (pool-query-only or fully pooled), return pooled inputs."""
        cfg = self.cfg
        q_pos = pool_positions(ai.q_pos, m, cfg)
        stride = 2**m
        if ai.q_cls is None:
            pooled = pool_sequence(h, cfg.pooling_type, cfg)
            q_type = stride_select(ai.q_type, 1, cfg)
            key_real = pool_sequence(ai.key_real, "min", cfg)
            packed = {}
        else:  # packed rows: every example pools as if alone (`pool_packed`)
            pooled = pool_packed(h, cfg.pooling_type, cfg, ai.q_cls)
            q_type = jnp.where(
                pool_second(ai.q_cls, cfg), pool_second(ai.q_type, cfg), stride_select(ai.q_type, 1, cfg)
            )
            key_real = pool_packed(ai.key_real, "min", cfg, ai.q_cls)
            pack, cls = pool_second(ai.q_pack, cfg), pool_second(ai.q_cls, cfg)
            packed = dict(q_pack=pack, k_pack=pack, q_cls=cls, k_cls=cls)
        if cfg.pool_q_only:
            ai_q = AttentionInputs(q_pos, ai.k_pos, stride // 2, 2, q_type, ai.k_type, ai.key_real)
            if packed:
                ai_q = ai_q._replace(q_pack=packed["q_pack"], k_pack=ai.k_pack, q_cls=packed["q_cls"], k_cls=ai.k_cls)
            out = layer(pooled, h, ai_q)
        else:
            out = layer(pooled, pooled, AttentionInputs(q_pos, q_pos, stride, 1, q_type, q_type, key_real, **packed))
        return out, AttentionInputs(q_pos, q_pos, stride, 1, q_type, q_type, key_real, **packed)


class FunnelDecoder(nnx.Module):
    """g = Upsample(h^M) + h^1, then `num_decoder_layers` full-length layers."""

    def __init__(self, cfg: FunnelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.layers = nnx.List([FunnelLayer(cfg, rngs=rngs) for _ in range(cfg.num_decoder_layers)])

    def __call__(
        self, final_hidden, block1_hidden, token_type_ids, attention_mask, rows=None, pack_ids=None
    ) -> jax.Array:
        """-> `[b, T, d]`, or with `rows` (int `[b, k]` positions) the output at those positions only, `[b, k, d]`:
        the last layer then runs its queries, FFN and LayerNorms on those k rows (keys/values at all T), which
        is all an MLM loss over k predicted positions needs."""
        seq_len = block1_hidden.shape[1]
        h = upsample(final_hidden, 2 ** (self.cfg.num_blocks - 1), seq_len, self.cfg) + block1_hidden
        ai = _full_length_inputs(seq_len, token_type_ids, attention_mask, pack_ids)
        last = len(self.layers) - 1
        for n, layer in enumerate(self.layers):
            if rows is not None and n == last:
                q_type = take_rows(token_type_ids, rows)
                return layer(take_rows(h, rows), h, ai._replace(q_type=q_type, q_rows=rows))
            h = layer(h, h, ai)
        return h if rows is None else take_rows(h, rows)


def take_rows(h: jax.Array, rows: jax.Array) -> jax.Array:
    """h `[b, T, ...]`, rows int `[b, k]` -> `[b, k, ...]`."""
    return jnp.take_along_axis(h, rows.reshape(rows.shape + (1,) * (h.ndim - 2)), axis=1)


# ----------------------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------------------


@struct.dataclass
class FunnelOutput:
    """HF-style output: whichever fields the model produces are set."""

    last_hidden_state: Optional[jax.Array] = None
    logits: Optional[jax.Array] = None
    start_logits: Optional[jax.Array] = None
    end_logits: Optional[jax.Array] = None
    cls_logits: Optional[jax.Array] = None
    encoder_last_hidden_state: Optional[jax.Array] = None


def _default_inputs(input_ids, token_type_ids, attention_mask):
    input_ids = jnp.asarray(input_ids)
    token_type_ids = jnp.zeros_like(input_ids) if token_type_ids is None else jnp.asarray(token_type_ids)
    attention_mask = jnp.ones_like(input_ids) if attention_mask is None else jnp.asarray(attention_mask)
    return input_ids, token_type_ids, attention_mask


class FunnelBaseModel(nnx.Module):
    """Embeddings + encoder (no decoder): `last_hidden_state` `[b, T_M, d]` at the pooled length. Used for
    sequence-level finetuning (the decoder is dropped, thesis T:L1841)."""

    def __init__(self, cfg: FunnelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.embeddings = FunnelEmbeddings(cfg, rngs=rngs)
        self.encoder = FunnelEncoder(cfg, rngs=rngs)

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None, pack_ids=None) -> FunnelOutput:
        input_ids, token_type_ids, attention_mask = _default_inputs(input_ids, token_type_ids, attention_mask)
        h, _ = self.encoder(self.embeddings(input_ids), token_type_ids, attention_mask, pack_ids)
        return FunnelOutput(last_hidden_state=h)


class FunnelModel(nnx.Module):
    """Embeddings + encoder + decoder: `last_hidden_state` `[b, T, d]` at full length (token-level tasks);
    `encoder_last_hidden_state` `[b, T_M, d]`."""

    def __init__(self, cfg: FunnelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.embeddings = FunnelEmbeddings(cfg, rngs=rngs)
        self.encoder = FunnelEncoder(cfg, rngs=rngs)
        self.decoder = FunnelDecoder(cfg, rngs=rngs)

    def encode_decode(
        self, embedded: jax.Array, token_type_ids, attention_mask, rows=None, pack_ids=None
    ) -> Tuple[jax.Array, jax.Array]:
        """From embeddings `[b, T, d_embed]`: (decoder output `[b, T, d]` (`[b, k, d]` at `rows`, see
        `FunnelDecoder`), encoder output `[b, T_M, d]`)."""
        enc, block1 = self.encoder(embedded, token_type_ids, attention_mask, pack_ids)
        return self.decoder(enc, block1, token_type_ids, attention_mask, rows, pack_ids), enc

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None, rows=None, pack_ids=None) -> FunnelOutput:
        """`rows` (int `[b, k]`): `last_hidden_state` `[b, k, d]` at those positions only (see `FunnelDecoder`).
        `pack_ids` `[b, T]`: packed rows (`xlgen.finetune.packing`)."""
        input_ids, token_type_ids, attention_mask = _default_inputs(input_ids, token_type_ids, attention_mask)
        dec, enc = self.encode_decode(self.embeddings(input_ids), token_type_ids, attention_mask, rows, pack_ids)
        return FunnelOutput(last_hidden_state=dec, encoder_last_hidden_state=enc)


class MLMHead(nnx.Module):
    """logits = T(h) · E^T + b with the input embedding E tied; T = identity (HF) or, with `mlm_transform` or
    d_embed != d_model, LN(act(W h + c)) -> d_embed (original `lm_proj`). Logits in `logits_dtype` (float32)."""

    def __init__(self, cfg: FunnelConfig, *, rngs: nnx.Rngs):
        if cfg.mlm_transform or cfg.embed_dim != cfg.d_model:
            self.transform = Dense(
                (cfg.d_model,), (cfg.embed_dim,), ("embed",), ("embed",), init_std=cfg.init_std, rngs=rngs
            )
            self.transform_norm = LayerNorm(cfg.embed_dim, eps=cfg.layer_norm_eps, rngs=rngs)
        else:
            self.transform = None
        self.act = cfg.hidden_act
        self.bias = param(rngs, zeros, (cfg.vocab_size,), ("vocab",))
        self.logits_dtype = cfg.logits_dtype

    def __call__(self, h: jax.Array, embedding: jax.Array) -> jax.Array:
        if self.transform is not None:
            h = self.transform_norm(activation(self.act)(self.transform(h)))
        dt = jnp.dtype(self.logits_dtype)
        logits = jnp.einsum("...d,vd->...v", h, embedding.astype(h.dtype))
        return logits.astype(dt) + self.bias[...].astype(dt)


class FunnelForMaskedLM(nnx.Module):
    """FunnelModel + tied MLM head: `logits` `[b, T, vocab]` (float32)."""

    def __init__(self, cfg: FunnelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.funnel = FunnelModel(cfg, rngs=rngs)
        self.lm_head = MLMHead(cfg, rngs=rngs)

    def hidden(self, input_ids, token_type_ids=None, attention_mask=None, rows=None) -> jax.Array:
        """Decoder output `[b, T, d]`, or `[b, k, d]` at positions `rows` `[b, k]` (computed there only)."""
        return self.funnel(input_ids, token_type_ids, attention_mask, rows).last_hidden_state

    def logits_from_hidden(self, h: jax.Array) -> jax.Array:
        return self.lm_head(h, self.funnel.embeddings.word_embeddings[...])

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None) -> FunnelOutput:
        out = self.funnel(input_ids, token_type_ids, attention_mask)
        return out.replace(logits=self.logits_from_hidden(out.last_hidden_state))
