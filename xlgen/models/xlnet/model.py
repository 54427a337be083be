"""XLNet (Yang et al. 2019; Dai thesis Ch. 4): two-stream relative attention, permutation LM, memory, bi_data.

Built on the shared core `xlgen.models.relative_attention`. Layout is batch-major: tokens `[b, l]`, hidden
`[b, l, d]`, memory `[n_layer, b, mlen, d]`, query stream `[b, m, d]` (m = num_predict targets).

Per layer (Dai thesis Eq. 4.6-4.8, XLNet §2.3/§2.5), with cat = [memory; h]:

    h_i <- LN(h_i + Attn(q = h_i,   kv = cat, mask = M_h[i]))   then FFN     (content stream, may see itself)
    g_t <- LN(g_t + Attn(q = g_t,   kv = cat, mask = M_g[z_t]))  then FFN     (query stream, same weights)

where g starts from the trained vector `mask_emb`, is kept only at the target positions z_t given by
`target_mapping` (partial prediction), and the masks are (1 = may NOT attend, as `perm_mask`):

    M_g[i, j] = perm_mask[i, j] OR pad[j] OR causal(i, j) (attn_type="uni")       memory columns always visible
    M_h[i, j] = M_g[i, j] AND i != j

Scores are (q+u)·k + shift((q+v)·W_r R) + (q+b_s)·s_ij (relative positions, relative segments); memory counts
as segment 0. `bi_data`: rows whose `is_forward` flag is False use negated distances; the original's "first half
forward, second half backward" batch layout is `half_batch_is_forward(batch_size)`.

Memory (Transformer-XL recurrence): each layer caches its *input*, only the first `reuse_len` positions of the
current segment, keeps the last `mem_len` positions, stop-gradient.

Modules return `(output, new_mems)`; `new_mems` is `[n_layer, b, mem_len, d]` (stop-gradient) or None when
`mem_len` is 0/None.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from xlgen.models import operands, tpu_attention
from xlgen.models.layers import (
    Dropout,
    PositionwiseFF,
    check_precision,
    normal,
    param,
    remat_policy,
    rematerialize,
    stacked_layers,
)
from xlgen.models.operands import position_keys, relative_rows
from xlgen.models.relative_attention import (
    STREAM,
    RelativeMultiHeadAttention,
    kernel_attention,
    memory_validity_mask,
    position_contraction,
    relative_attention,
    relative_position_sequence,
    segment_scores,
    shift_offset,
    sinusoid_embedding,
    whole_heads,
)
from xlgen.sharding import constrain

# ----------------------------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class XLNetConfig:
    """XLNet hyper-parameters; names follow HF `XLNetConfig` / the original `xlnet.py` flags.

    `dropatt` is the attention-probability dropout (HF uses `dropout` for it; `from_hf` sets dropatt=dropout).
    `mem_len`/`reuse_len` None or 0 mean "no memory" / "cache the whole segment". `scan_layers` stacks the
    layers and runs them with `nnx.scan` (same numbers); `remat` recomputes each layer in the backward pass;
    `dtype` is the compute dtype ("float32" or "bfloat16"; parameters, LayerNorm and softmax stay float32).
    """

    vocab_size: int = 32000
    d_model: int = 1024
    n_layer: int = 24
    n_head: int = 16
    d_head: int = 64
    d_inner: int = 4096
    ff_activation: str = "gelu"
    untie_r: bool = True
    attn_type: str = "bi"
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    dropout: float = 0.1
    dropatt: float = 0.1
    mem_len: Optional[int] = None
    reuse_len: Optional[int] = None
    bi_data: bool = False
    clamp_len: int = -1
    same_length: bool = False
    # finetuning heads (HF names)
    num_labels: int = 2
    summary_type: str = "last"
    summary_use_proj: bool = True
    summary_activation: Optional[str] = "tanh"
    summary_proj_to_labels: bool = False
    summary_last_dropout: float = 0.1
    start_n_top: int = 5
    end_n_top: int = 5
    # SQuAD answerability head input in training: "weighted" = the original get_qa_outputs (softmax(start logits)-
    # weighted state, dropout after the tanh, as at inference); "gold" = HF (the gold start's state, no dropout: for
    # unanswerable windows that is <cls> itself, which leaks the label). from_pretrained(HF dir) uses "gold".
    answer_class_start: str = "weighted"
    # implementation
    scan_layers: bool = False
    remat: Union[bool, str] = "none"  # a name of layers.REMAT_POLICIES (True / False = full / none)
    dtype: str = "float32"
    param_dtype: str = "float32"
    scores_dtype: str = "float32"
    softmax_dtype: str = "float32"
    logits_dtype: str = "float32"

    def __post_init__(self):
        if self.attn_type not in ("bi", "uni"):
            raise ValueError(f"XLNetConfig.attn_type={self.attn_type!r}: expected 'bi' or 'uni'")
        object.__setattr__(self, "remat", remat_policy(self.remat))
        check_precision(self)
        if self.answer_class_start not in ("weighted", "gold"):
            raise ValueError(
                f"XLNetConfig.answer_class_start={self.answer_class_start!r}: expected 'weighted' (original) or "
                "'gold' (Hugging Face)"
            )

    @property
    def compute_dtype(self):
        return jnp.bfloat16 if self.dtype == "bfloat16" else jnp.float32

    @classmethod
    def from_hf(cls, hf: Dict[str, Any], **overrides) -> "XLNetConfig":
        """From a HF `config.json` dict. HF keeps r_w/r_r/r_s biases per layer whatever `untie_r` says, so the
        loaded model always has per-layer biases (untie_r=True); HF applies `dropout` to attention probs too."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: hf[k] for k in names if k in hf and k not in ("untie_r", "dropatt")}
        if "n_token" in hf and "vocab_size" not in hf:
            kw["vocab_size"] = hf["n_token"]
        if "id2label" in hf and "num_labels" not in hf:
            kw["num_labels"] = len(hf["id2label"])
        kw["d_head"] = hf.get("d_head", hf["d_model"] // hf["n_head"])
        kw["untie_r"] = True
        kw["dropatt"] = hf.get("dropout", 0.1)
        if kw.get("clamp_len") is None:
            kw["clamp_len"] = -1
        kw.update(overrides)
        return cls(**kw)


def half_batch_is_forward(batch_size: int) -> np.ndarray:
    """The original `bi_data` layout as per-row flags: first half forward, second half backward `[b]` bool."""
    return np.arange(batch_size) < batch_size // 2


# ----------------------------------------------------------------------------------------------------------------
# Masks, segments, positions (pure functions)
# ----------------------------------------------------------------------------------------------------------------


def attention_masks(
    qlen: int,
    mlen: int,
    *,
    attn_type: str,
    same_length: bool = False,
    input_mask=None,
    perm_mask=None,
    mem_valid=None,
):
    """Query-stream mask M_g `[b or 1, qlen, mlen+qlen]` (True = may NOT attend) and content mask M_h = M_g & i!=j.

    input_mask `[b, qlen]` (1 = padding), perm_mask `[b, qlen, qlen]` (1 = i may not attend to j). Memory
    columns are never masked by data, except the empty rows of a fixed-length buffer (`mem_valid` `[b]`: how many
    trailing memory rows are real, `relative_attention.memory_validity_mask`); the causal mask ("uni") is the Transformer-XL one (optionally
    `same_length`). Returns (None, None) when nothing is masked (attn_type="bi" and no data masks).
    """
    klen = mlen + qlen
    mask = None
    if attn_type == "uni":
        i = jnp.arange(qlen)[:, None]
        j = jnp.arange(klen)[None, :]
        causal = j > mlen + i
        if same_length:
            causal = causal | (j < i)
        mask = causal[None]
    data = None
    if input_mask is not None:
        data = jnp.asarray(input_mask).astype(bool)[:, None, :]
    if perm_mask is not None:
        pm = jnp.asarray(perm_mask).astype(bool)
        data = pm if data is None else (data | pm)
    if data is not None:
        if mlen > 0:
            data = jnp.pad(data, [(0, 0), (0, 0), (mlen, 0)])
        mask = data if mask is None else (mask | data)
    if mem_valid is not None and mlen > 0:  # fixed-length memory buffer: its not-yet-written rows are masked
        empty = memory_validity_mask(mem_valid, mlen, qlen)[:, 0]  # [b, 1, mlen + qlen]
        empty = jnp.broadcast_to(empty, (empty.shape[0], qlen, mlen + qlen))
        mask = empty if mask is None else (mask | empty)
    if mask is None:
        return None, None
    not_self = ~(jnp.arange(qlen)[:, None] + mlen == jnp.arange(klen)[None, :])
    return mask, mask & not_self[None]


def segment_matrix(token_type_ids: jax.Array, mlen: int) -> jax.Array:
    """Different-segment flags `[b, qlen, mlen+qlen]`; memory positions count as segment 0."""
    cat = jnp.pad(token_type_ids, [(0, 0), (mlen, 0)]) if mlen > 0 else token_type_ids
    return token_type_ids[:, :, None] != cat[:, None, :]


def position_encodings(
    qlen: int, klen: int, d_model: int, *, attn_type: str, clamp_len: int, bi: bool, dtype=jnp.float32
) -> jax.Array:
    """Sinusoid encodings of the relative distances: `[r, d]`, or `[2, r, d]` (forward, backward) when `bi`."""
    pos_seq = relative_position_sequence(qlen, klen, attn_type, clamp_len)
    fwd = sinusoid_embedding(pos_seq, d_model, dtype)
    if not bi:
        return fwd
    return jnp.stack([fwd, sinusoid_embedding(-pos_seq, d_model, dtype)])


def cache_mems(h: jax.Array, mem: Optional[jax.Array], mem_len: int, reuse_len: Optional[int]) -> jax.Array:
    """New memory: the last `mem_len` of [mem; h[..., :reuse_len, :]], stop-gradient, for one layer (h `[b, l, d]`,
    mem `[b, m, d]`) or all (`[n_layer, b, l, d]`, `[n_layer, b, m, d]`). `[..., b, <=mem_len, d]`."""
    cur = h[..., :reuse_len, :] if reuse_len else h
    cat = cur if mem is None or mem.shape[-2] == 0 else jnp.concatenate([mem.astype(cur.dtype), cur], axis=-2)
    return jax.lax.stop_gradient(cat[..., -mem_len:, :])


# ----------------------------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------------------------


class XLNetLayer(nnx.Module):
    """Two-stream relative attention (shared weights) + position-wise FFN, post-LN."""

    def __init__(self, cfg: XLNetConfig, *, rngs: nnx.Rngs):
        self.rel_attn = RelativeMultiHeadAttention(
            cfg.d_model,
            cfg.n_head,
            cfg.d_head,
            dropout=cfg.dropout,
            dropatt=cfg.dropatt,
            own_biases=cfg.untie_r,
            segments=True,
            layer_norm_eps=cfg.layer_norm_eps,
            init_std=cfg.initializer_range,
            scores_dtype=cfg.scores_dtype,
            softmax_dtype=cfg.softmax_dtype,
            rngs=rngs,
        )
        self.ff = PositionwiseFF(
            cfg.d_model,
            cfg.d_inner,
            act=cfg.ff_activation,
            dropout=cfg.dropout,
            layer_norm_eps=cfg.layer_norm_eps,
            init_std=cfg.initializer_range,
            rngs=rngs,
        )

    def __call__(self, h, g, mem, pos_emb, ctx: dict, shared_biases, *, content: bool = True):
        """h `[b,l,d]`, g `[b,m,d]` or None, mem `[b,mlen,d]` or None, pos_emb `[r,d]` or `[2,r,d]`.

        `content=False` (the last layer when only the query stream is used): the content stream's keys/values are
        formed, its own attention and FFN are not, and h is returned unchanged."""
        attn = self.rel_attn
        h = constrain(h, STREAM)  # residual streams and memory rows over the batch axes, d_model whole
        g = None if g is None else constrain(g, STREAM)
        mem = None if mem is None else constrain(mem, STREAM)
        k_head, v_head = attn.kv_heads(h, mem)  # memory projected apart: no input gradient for its rows
        klen, qlen = k_head.shape[1], h.shape[1]
        k_head_r = attn.position_heads(pos_emb.astype(h.dtype))
        direction = None
        if ctx["is_forward"] is not None:  # per-row direction: keys [2,r,n,d], row b uses direction[b] @ keys
            # a [b,2] x [2, r*n*d] selection product rather than a where: its gradient is the transposed product,
            # where the where's is a select + reduce over the batch (~9% of an XLNet bi_data step on XLA:CPU)
            direction = jax.nn.one_hot(jnp.where(ctx["is_forward"], 0, 1), 2, dtype=k_head_r.dtype)
        k_head_r = position_keys(k_head_r, h.shape[0], direction)  # formed once for both streams
        k_head = attn.content_keys(k_head)  # formed once for both streams (in training)
        offset = shift_offset(qlen, ctx["attn_type"])
        mask_h = None if ctx["mask_h"] is None else ctx["mask_h"][:, None]
        pair = None
        if content and g is not None:  # both streams in one kernel call where it applies (TPU)
            pair = two_stream_attention(attn, h, g, k_head, v_head, k_head_r, klen, offset, mask_h, ctx, shared_biases)
        if pair is not None:
            h_out, g_out = pair
        else:  # call order: attention h, attention g, FFN g, FFN h (the dropout keys are drawn in this order)
            h_out, g_out = None, None
            if content:
                h_out = attn.attend(
                    h,
                    k_head,
                    v_head,
                    k_head_r,
                    klen=klen,
                    offset=offset,
                    mask=mask_h,
                    seg_mat=ctx["seg_mat"],
                    shared_biases=shared_biases,
                )
            if g is not None:
                g_out = query_stream_attention(
                    attn, g, k_head, v_head, k_head_r, klen=klen, offset=offset, ctx=ctx, shared_biases=shared_biases
                )
        if g_out is not None:
            g_out = constrain(self.ff(constrain(g_out, STREAM)), STREAM)
        if not content:
            return h, g_out
        return constrain(self.ff(constrain(h_out, STREAM)), STREAM), g_out


def two_stream_attention(
    attn: RelativeMultiHeadAttention, h, g, k_head, v_head, k_head_r, klen, offset, mask_h, ctx, shared_biases
):
    """Both streams' attention sub-layers (h `[b,l,d]`, g `[b,m,d]`) as one kernel call for TPU
    (`tpu_attention.two_streams`: one backward, the shared heads' gradients summed in VMEM), or None where the
    kernel does not apply (the caller runs `attend` and `query_stream_attention`). Dropout keys are drawn in the
    order of those two calls: the content stream's probabilities, its output, the query stream's probabilities."""
    content = attn.kernel_operands(
        attn.query_heads(h),
        k_head,
        v_head,
        k_head_r,
        klen=klen,
        offset=offset,
        mask=mask_h,
        seg_mat=ctx["seg_mat"],
        shared_biases=shared_biases,
    )
    query = query_stream_operands(attn, attn.query_heads(g), k_head, v_head, k_head_r, klen, offset, ctx, shared_biases)
    if content is None or query is None:
        return None
    query.update({name: content[name] for name in ("u", "vb", "k", "v", "r", "memory", "directions")})
    content["dropout"] = attn.dropatt.keep_seed()
    drop_key = attn.drop.draw()
    query["dropout"] = attn.dropatt.keep_seed()
    vec_h, vec_g = tpu_attention.two_streams(content, query, interpret=operands.kernels_interpreted())
    vec_g = vec_g * ctx["target_weight"][:, :, None].astype(vec_g.dtype)
    return attn.output(h, vec_h, drop_key), attn.output(g, vec_g)


def query_stream_operands(
    attn: RelativeMultiHeadAttention, q_head, k_head, v_head, k_head_r, klen, offset, ctx, shared_biases
):
    """The kernel's arguments for the query stream's heads q_head `[b,m,n,d]` (or None where it does not apply):
    target t, at position z_t = ctx["target_pos"][b,t], reads the position scores from offset - z_t."""
    return attn.kernel_operands(
        q_head,
        k_head,
        v_head,
        k_head_r,
        klen=klen,
        starts=offset - ctx["target_pos"],
        mask=None if ctx["mask_rows"] is None else ctx["mask_rows"][:, None],
        seg_mat=ctx["seg_rows"],
        shared_biases=shared_biases,
    )


def query_stream_attention(
    attn: RelativeMultiHeadAttention, g, k_head, v_head, k_head_r, *, klen: int, offset: int, ctx: dict, shared_biases
) -> jax.Array:
    """Query-stream attention of g `[b,m,d]` (target t sits at position z_t = ctx["target_pos"][b,t]) against the
    content stream's k/v/position heads; computed for the m targets only. Rows of `target_mapping` that are all
    zero (padding targets) get a zero attention vector, as in the original's einsum formulation."""
    q_head = attn.query_heads(g)  # [b,m,n,d]
    options = query_stream_operands(attn, q_head, k_head, v_head, k_head_r, klen, offset, ctx, shared_biases)
    attn_vec = kernel_attention(options, attn.dropatt)
    if attn_vec is not None:  # [b,m,n·d]
        attn_vec = attn_vec * ctx["target_weight"][:, :, None].astype(attn_vec.dtype)
        return attn.output(g, attn_vec)
    b = attn.biases(shared_biases)
    mask = None if ctx["mask_rows"] is None else ctx["mask_rows"][:, None]
    k_head, v_head = whole_heads(k_head), whole_heads(v_head)
    raw = position_contraction(q_head + b["r_r_bias"].astype(q_head.dtype), k_head_r)  # [b,n,m,r]
    # target at position z attends key j through relative-position row offset - z + j (cf. relative_shift);
    # out-of-range rows only occur where the causal mask applies
    position_term = relative_rows(raw, ctx["target_pos"], offset=offset, klen=klen)  # [b,n,m,k]
    segment_term = None
    if ctx["seg_rows"] is not None:
        segment_term = segment_scores(q_head, attn.seg_embed[...], b["r_s_bias"], ctx["seg_rows"])
    attn_vec = relative_attention(
        q_head,
        k_head,
        v_head,
        r_w_bias=b["r_w_bias"],
        position_term=position_term,
        segment_term=segment_term,
        mask=mask,
        dropatt=attn.dropatt,
        scores_dtype=attn.scores_dtype,
        softmax_dtype=attn.softmax_dtype,
    )
    attn_vec = attn_vec * ctx["target_weight"][:, :, None, None].astype(attn_vec.dtype)
    return attn.output(g, attn_vec)


def _rows(x: Optional[jax.Array], pos: jax.Array) -> Optional[jax.Array]:
    """x `[b or 1, l, k]` -> rows at positions pos `[b, m]` -> `[b, m, k]`."""
    if x is None:
        return None
    x = jnp.broadcast_to(x, (pos.shape[0],) + x.shape[1:])
    return jnp.take_along_axis(x, pos[:, :, None], axis=1)


# ----------------------------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------------------------


class XLNetModel(nnx.Module):
    """XLNet encoder: embedding, n_layer two-stream layers. See module docstring."""

    def __init__(self, config: XLNetConfig, *, rngs: nnx.Rngs):
        cfg = self.config = config
        std = cfg.initializer_range
        self.word_embedding = param(rngs, normal(std), (cfg.vocab_size, cfg.d_model), ("vocab", "embed"))
        self.mask_emb = param(rngs, normal(std), (cfg.d_model,), ("embed",))
        if not cfg.untie_r:  # biases shared by all layers
            hd, ax = (cfg.n_head, cfg.d_head), ("heads", "kv")
            self.r_w_bias = param(rngs, normal(std), hd, ax)
            self.r_r_bias = param(rngs, normal(std), hd, ax)
            self.r_s_bias = param(rngs, normal(std), hd, ax)
        self.layers = stacked_layers(lambda r: XLNetLayer(cfg, rngs=r), cfg.n_layer, rngs, scan=cfg.scan_layers)
        self.drop = Dropout(cfg.dropout, rngs=rngs)

    def shared_biases(self):
        if self.config.untie_r:
            return None
        return {"r_w_bias": self.r_w_bias[...], "r_r_bias": self.r_r_bias[...], "r_s_bias": self.r_s_bias[...]}

    def init_mems(self, batch_size: int, mem_len: Optional[int] = None) -> jax.Array:
        """Zero memory `[n_layer, b, mem_len, d]` (the original starts pretraining from zeros)."""
        mem_len = self.config.mem_len if mem_len is None else mem_len
        return jnp.zeros(
            (self.config.n_layer, batch_size, mem_len or 0, self.config.d_model), self.config.compute_dtype
        )

    def __call__(
        self,
        input_ids=None,
        token_type_ids=None,
        *,
        input_mask=None,
        attention_mask=None,
        mems=None,
        perm_mask=None,
        target_mapping=None,
        is_forward=None,
        mem_len=None,
        reuse_len=None,
        inputs_embeds=None,
        mem_valid=None,
    ):
        """input_ids `[b,l]` int (or inputs_embeds `[b,l,d]`); token_type_ids `[b,l]` (any number of segment
        ids; None = no segment term);
        input_mask `[b,l]` (1 = pad, original) XOR attention_mask `[b,l]` (1 = real, HF); mems
        `[n_layer,b,mlen,d]`; perm_mask `[b,l,l]` (1 = i may not attend j); target_mapping `[b,m,l]` one-hot
        rows (zero rows = padding); is_forward `[b]` bool (bi_data direction; default: all forward, or the
        half-batch layout when config.bi_data). mem_len/reuse_len override the config. mem_valid `[b]`: the
        memory is a fixed-length buffer whose last mem_valid rows are real (the rest masked; incremental decoding).

        Returns (output, new_mems): output = final query stream `[b,m,d]` if target_mapping is given else the
        content stream `[b,l,d]`; new_mems `[n_layer,b,mem_len,d]` or None (mem_len 0/None).
        """
        cfg = self.config
        dtype = cfg.compute_dtype
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("XLNetModel: pass exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = jnp.take(self.word_embedding[...], jnp.asarray(input_ids), axis=0)
        bsz, qlen = inputs_embeds.shape[:2]
        mlen = 0 if mems is None else mems.shape[2]
        klen = mlen + qlen
        mem_len = cfg.mem_len if mem_len is None else mem_len
        reuse_len = cfg.reuse_len if reuse_len is None else reuse_len

        if input_mask is not None and attention_mask is not None:
            raise ValueError("XLNetModel: pass input_mask (1 = padding) or attention_mask (1 = real token), not both")
        if attention_mask is not None:
            input_mask = 1 - jnp.asarray(attention_mask)
        mask_g, mask_h = attention_masks(
            qlen,
            mlen,
            attn_type=cfg.attn_type,
            same_length=cfg.same_length,
            input_mask=input_mask,
            perm_mask=perm_mask,
            mem_valid=mem_valid,
        )
        seg_mat = None
        if token_type_ids is not None:
            seg_mat = segment_matrix(jnp.asarray(token_type_ids), mlen)

        if is_forward is None and cfg.bi_data:
            is_forward = half_batch_is_forward(bsz)
        bi = is_forward is not None
        pos_emb = position_encodings(
            qlen, klen, cfg.d_model, attn_type=cfg.attn_type, clamp_len=cfg.clamp_len, bi=bi, dtype=dtype
        )
        pos_emb = self.drop(pos_emb)

        ctx = {
            "attn_type": cfg.attn_type,
            "is_forward": None if not bi else jnp.asarray(is_forward, bool),
            "mask_h": mask_h,
            "seg_mat": seg_mat,
            "seg_rows": None,
            "mask_rows": None,
        }
        h = self.drop(inputs_embeds.astype(dtype))
        g = None
        if target_mapping is not None:
            tm = jnp.asarray(target_mapping)
            pos = jnp.argmax(tm, axis=-1).astype(jnp.int32)  # [b,m]
            ctx.update(
                target_pos=pos, target_weight=tm.sum(-1), mask_rows=_rows(mask_g, pos), seg_rows=_rows(seg_mat, pos)
            )
            g = self.drop(jnp.broadcast_to(self.mask_emb[...].astype(dtype), (bsz, tm.shape[1], cfg.d_model)))

        shared = self.shared_biases()
        keep_mems = bool(mem_len) and mem_len > 0

        def make_layer_fn(content: bool):
            def layer_fn(layer, h, g, mem):  # -> (h, g, the input rows the memory keeps)
                kept = (h[:, :reuse_len] if reuse_len else h) if keep_mems else None
                h, g = layer(h, g, mem, pos_emb, ctx, shared, content=content)
                return h, g, kept

            return rematerialize(layer_fn, cfg.remat)

        layer_fn = make_layer_fn(True)

        # scanned, the new memory is formed after the loop from the layers' stacked inputs
        if cfg.scan_layers:

            def body(carry, layer, mem):
                h, g = carry
                h, g, kept = layer_fn(layer, h, g, mem)
                return (h, g), kept

            def scan_layers(h, g, layers, mems):
                if mems is None:
                    scan = nnx.scan(lambda c, l: body(c, l, None), in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
                    return scan((h, g), layers)
                # the memory enters the loop whole and layer i reads its own rows: scanned over, it would be saved
                # again as a stacked residual (the input of the memory's key and value projections, for their
                # weight gradients), which XLA:TPU copies whole in every iteration
                read = lambda c, l, i: body(c, l, jax.lax.dynamic_index_in_dim(mems, i, keepdims=False))
                scan = nnx.scan(read, in_axes=(nnx.Carry, 0, 0), out_axes=(nnx.Carry, 0))
                return scan((h, g), layers, jnp.arange(mems.shape[0]))

            if g is None or cfg.n_layer < 2:
                (h, g), kept = scan_layers(h, g, self.layers, mems)
            else:
                # Only the query stream leaves the model: the last layer's content stream is dead. XLA removes dead
                # code, but not from one iteration of a loop, so scan the first n-1 layers and run the last one
                # without its content attention and FFN (about 3% of an XLNet-Large step).
                graphdef, state = nnx.split(self.layers)
                first = nnx.merge(graphdef, jax.tree.map(lambda x: x[:-1], state))
                last = nnx.merge(graphdef, jax.tree.map(lambda x: x[-1], state))
                (h, g), kept = scan_layers(h, g, first, None if mems is None else mems[:-1])
                h, g, last_kept = make_layer_fn(False)(last, h, g, None if mems is None else mems[-1])
                if keep_mems:
                    kept = jnp.concatenate([kept, last_kept[None]], axis=0)
            new_mems = cache_mems(kept, mems, mem_len, None) if keep_mems else None
        else:
            new_mems = []
            for i, layer in enumerate(self.layers):
                mem = None if mems is None else mems[i]
                dead = g is not None and cfg.n_layer >= 2 and i == cfg.n_layer - 1  # as scanned: h not used after
                h, g, kept = (make_layer_fn(False) if dead else layer_fn)(layer, h, g, mem)
                new_mems.append(cache_mems(kept, mem, mem_len, None) if keep_mems else None)
            new_mems = jnp.stack(new_mems) if keep_mems else None

        output = self.drop(g if g is not None else h)
        return output, new_mems


class XLNetLMHeadModel(nnx.Module):
    """XLNet + LM head tied to the word embedding, with a bias: logits = output · E^T + b.

    `__call__(..., target_ids=None)` returns (logits `[b, m or l, V]` in `logits_dtype`, float32 by default, new_mems) or, given
    `target_ids [b, m or l]`, (per-target nll `[b, m or l]` float32, new_mems).
    """

    def __init__(self, config: XLNetConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.transformer = XLNetModel(config, rngs=rngs)
        self.lm_bias = param(rngs, nnx.initializers.zeros_init(), (config.vocab_size,), ("vocab",))

    def logits(self, output: jax.Array) -> jax.Array:
        """`[b, l, V]` in the config's `logits_dtype` (float32 by default)."""
        dt = jnp.dtype(self.config.logits_dtype)
        emb = self.transformer.word_embedding[...].astype(output.dtype)
        return jnp.einsum("bld,vd->blv", output, emb).astype(dt) + self.lm_bias[...].astype(dt)

    def __call__(self, input_ids=None, token_type_ids=None, *, target_ids=None, **kwargs):
        output, new_mems = self.transformer(input_ids, token_type_ids, **kwargs)
        logits = self.logits(output)
        if target_ids is None:
            return logits, new_mems
        return token_nll(logits, target_ids), new_mems


def token_nll(logits: jax.Array, target_ids: jax.Array) -> jax.Array:
    """-log softmax(logits)[target]: logits `[..., V]`, target_ids `[...]` -> `[...]` float32 (the log-softmax in
    the logits' dtype: float32, or bfloat16 under `logits_dtype=bfloat16`)."""
    lse = jax.nn.logsumexp(logits, axis=-1)
    tgt = jnp.take_along_axis(logits, jnp.asarray(target_ids)[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return (lse - tgt).astype(jnp.float32)
