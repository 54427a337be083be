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
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from xlgen.models.layers import Dropout, PositionwiseFF, normal, param, stacked_layers
from xlgen.models.relative_attention import (
    STREAM,
    RelativeMultiHeadAttention,
    memory_validity_mask,
    relative_attention,
    relative_position_sequence,
    segment_scores,
    shift_offset,
    sinusoid_embedding,
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
    remat: bool = False
    dtype: str = "float32"

    def __post_init__(self):
        if self.attn_type not in ("bi", "uni"):
            raise ValueError(f"XLNetConfig.attn_type={self.attn_type!r}: expected 'bi' or 'uni'")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"XLNetConfig.dtype={self.dtype!r}: expected 'float32' or 'bfloat16'")
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
    """New memory for one layer: the last `mem_len` of [mem; h[:, :reuse_len]], stop-gradient. `[b, <=mem_len, d]`."""
    cur = h[:, :reuse_len] if reuse_len else h
    cat = cur if mem is None or mem.shape[1] == 0 else jnp.concatenate([mem.astype(cur.dtype), cur], axis=1)
    return jax.lax.stop_gradient(cat[:, -mem_len:])


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
        if ctx["is_forward"] is not None:  # per-row direction: [2,r,n,d] -> [b,r,n,d]
            k_head_r = jnp.where(ctx["is_forward"][:, None, None, None], k_head_r[0], k_head_r[1])
        offset = shift_offset(qlen, ctx["attn_type"])
        mask_h = None if ctx["mask_h"] is None else ctx["mask_h"][:, None]
        h_out = None
        if content:  # (the same call order as before: attention h, attention g, FFN g, FFN h; dropout keys follow it)
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
        g_out = None
        if g is not None:
            g_out = query_stream_attention(
                attn, g, k_head, v_head, k_head_r, klen=klen, offset=offset, ctx=ctx, shared_biases=shared_biases
            )
            g_out = constrain(self.ff(constrain(g_out, STREAM)), STREAM)
        if not content:
            return h, g_out
        return constrain(self.ff(constrain(h_out, STREAM)), STREAM), g_out


def query_stream_attention(
    attn: RelativeMultiHeadAttention, g, k_head, v_head, k_head_r, *, klen: int, offset: int, ctx: dict, shared_biases
) -> jax.Array:
    """Query-stream attention of g `[b,m,d]` (target t sits at position z_t = ctx["target_pos"][b,t]) against the
    content stream's k/v/position heads; computed for the m targets only. Rows of `target_mapping` that are all
    zero (padding targets) get a zero attention vector, as in the original's einsum formulation."""
    b = attn.biases(shared_biases)
    q_head = attn.q(g)  # [b,m,n,d]
    qv = q_head + b["r_r_bias"].astype(q_head.dtype)
    if k_head_r.ndim == 3:
        raw = jnp.einsum("bmnd,rnd->bnmr", qv, k_head_r)
    else:
        raw = jnp.einsum("bmnd,brnd->bnmr", qv, k_head_r)
    # target at position z attends key j through relative-position row offset - z + j (cf. relative_shift).
    idx = offset - ctx["target_pos"][:, :, None] + jnp.arange(klen)[None, None, :]  # [b,m,k]
    idx = jnp.clip(idx, 0, raw.shape[-1] - 1)  # out-of-range rows only occur where the causal mask applies
    idx = jnp.broadcast_to(idx[:, None], raw.shape[:3] + (klen,))
    position_term = jnp.take_along_axis(raw, idx, axis=-1)
    segment_term = None
    if ctx["seg_rows"] is not None:
        segment_term = segment_scores(q_head, attn.seg_embed[...], b["r_s_bias"], ctx["seg_rows"])
    mask = None if ctx["mask_rows"] is None else ctx["mask_rows"][:, None]
    attn_vec = relative_attention(
        q_head,
        k_head,
        v_head,
        r_w_bias=b["r_w_bias"],
        position_term=position_term,
        segment_term=segment_term,
        mask=mask,
        dropatt=attn.dropatt,
    )
    attn_vec = attn_vec * ctx["target_weight"][:, :, None, None].astype(attn_vec.dtype)
    return attn.layer_norm(g + attn.drop(attn.o(attn_vec)))


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
            def layer_fn(layer, h, g, mem):
                new_mem = cache_mems(h, mem, mem_len, reuse_len) if keep_mems else None
                h, g = layer(h, g, mem, pos_emb, ctx, shared, content=content)
                return h, g, new_mem

            return nnx.remat(layer_fn) if cfg.remat else layer_fn

        layer_fn = make_layer_fn(True)

        if cfg.scan_layers:

            def body(carry, layer, mem):
                h, g = carry
                h, g, new_mem = layer_fn(layer, h, g, mem)
                return (h, g), new_mem

            def scan_layers(h, g, layers, mems):
                if mems is None:
                    scan = nnx.scan(lambda c, l: body(c, l, None), in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
                    return scan((h, g), layers)
                scan = nnx.scan(body, in_axes=(nnx.Carry, 0, 0), out_axes=(nnx.Carry, 0))
                return scan((h, g), layers, mems)

            if g is None or cfg.n_layer < 2:
                (h, g), new_mems = scan_layers(h, g, self.layers, mems)
            else:
                # Only the query stream leaves the model: the last layer's content stream is dead. XLA removes dead
                # code, but not from one iteration of a loop, so scan the first n-1 layers and run the last one
                # without its content attention and FFN (about 3% of an XLNet-Large step).
                graphdef, state = nnx.split(self.layers)
                first = nnx.merge(graphdef, jax.tree.map(lambda x: x[:-1], state))
                last = nnx.merge(graphdef, jax.tree.map(lambda x: x[-1], state))
                (h, g), new_mems = scan_layers(h, g, first, None if mems is None else mems[:-1])
                h, g, last_mem = make_layer_fn(False)(last, h, g, None if mems is None else mems[-1])
                if keep_mems:
                    new_mems = jnp.concatenate([new_mems, last_mem[None]], axis=0)
        else:
            new_mems = []
            for i, layer in enumerate(self.layers):
                h, g, new_mem = layer_fn(layer, h, g, None if mems is None else mems[i])
                new_mems.append(new_mem)
            new_mems = jnp.stack(new_mems) if keep_mems else None

        output = self.drop(g if g is not None else h)
        return output, new_mems


class XLNetLMHeadModel(nnx.Module):
    """XLNet + LM head tied to the word embedding, with a bias: logits = output · E^T + b.

    `__call__(..., target_ids=None)` returns (logits `[b, m or l, V]` float32, new_mems) or, given
    `target_ids [b, m or l]`, (per-target nll `[b, m or l]` float32, new_mems).
    """

    def __init__(self, config: XLNetConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.transformer = XLNetModel(config, rngs=rngs)
        self.lm_bias = param(rngs, nnx.initializers.zeros_init(), (config.vocab_size,), ("vocab",))

    def logits(self, output: jax.Array) -> jax.Array:
        emb = self.transformer.word_embedding[...].astype(output.dtype)
        return jnp.einsum("bld,vd->blv", output, emb).astype(jnp.float32) + self.lm_bias[...]

    def __call__(self, input_ids=None, token_type_ids=None, *, target_ids=None, **kwargs):
        output, new_mems = self.transformer(input_ids, token_type_ids, **kwargs)
        logits = self.logits(output)
        if target_ids is None:
            return logits, new_mems
        return token_nll(logits, target_ids), new_mems


def token_nll(logits: jax.Array, target_ids: jax.Array) -> jax.Array:
    """-log softmax(logits)[target]: logits `[..., V]`, target_ids `[...]` -> `[...]` float32."""
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    tgt = jnp.take_along_axis(logits, jnp.asarray(target_ids)[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return lse - tgt


# ----------------------------------------------------------------------------------------------------------------
# Loading Hugging Face checkpoints
# ----------------------------------------------------------------------------------------------------------------


def materialize(abstract, param_value, seed: int = 0):
    """A concrete module from an abstract one (`nnx.eval_shape(lambda: Cls(cfg, rngs=...))`): every Param gets
    `param_value(dotted_path, shape)` (a NumPy array), RNG streams get fresh keys from `seed`. Building this way
    skips the random initialisers entirely (loading a checkpoint costs no init compute)."""
    graphdef, state = nnx.split(abstract)
    base = jax.random.key(seed)
    for i, (path, var) in enumerate(state.flat_state()):
        name = ".".join(str(p) for p in path)
        sds = var.get_value()
        if isinstance(var, nnx.Param):
            value = np.asarray(param_value(name, tuple(sds.shape)), dtype=np.float32)
            if value.shape != tuple(sds.shape):
                raise ValueError(f"{name}: checkpoint shape {value.shape} != model shape {tuple(sds.shape)}")
            var.set_value(jnp.asarray(value, sds.dtype))
        elif isinstance(var, nnx.RngKey):
            key = jax.random.fold_in(base, i)
            var.set_value(jax.random.split(key, sds.shape) if sds.shape else key)
        else:
            var.set_value(jnp.zeros(sds.shape, sds.dtype))
    return nnx.merge(graphdef, state)


def _hf_layer(w: Dict[str, np.ndarray], i: int) -> Dict[str, np.ndarray]:
    """HF layer i weights in xlgen layout (attention `[d,n,dh]`, output `[n,dh,d]`, Linear weights transposed)."""
    p = f"layer.{i}."
    a = {f"rel_attn.{n}.kernel": w[p + f"rel_attn.{n}"] for n in ("q", "k", "v", "r")}
    a["rel_attn.o.kernel"] = np.transpose(w[p + "rel_attn.o"], (1, 2, 0))
    for n in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed"):
        a[f"rel_attn.{n}"] = w[p + f"rel_attn.{n}"]
    for src, dst in (("rel_attn.layer_norm", "rel_attn.layer_norm"), ("ff.layer_norm", "ff.layer_norm")):
        a[dst + ".scale"], a[dst + ".bias"] = w[p + src + ".weight"], w[p + src + ".bias"]
    for n in ("layer_1", "layer_2"):
        a[f"ff.{n}.kernel"], a[f"ff.{n}.bias"] = w[p + f"ff.{n}.weight"].T, w[p + f"ff.{n}.bias"]
    return a


def _hf_linear(w, src: str, dst: str, out: dict, in_shape=None):
    """HF nn.Linear `src` (weight [out, in]) -> xlgen Dense `dst` (kernel [in..., out], bias)."""
    kernel = w[src + ".weight"].T
    out[dst + ".kernel"] = kernel if in_shape is None else kernel.reshape(tuple(in_shape) + kernel.shape[1:])
    if src + ".bias" in w:
        out[dst + ".bias"] = w[src + ".bias"]


def hf_to_xlgen(head: str, config: XLNetConfig, weights: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """HF XLNet state dict -> {xlgen dotted parameter path: array} for module class `head`."""
    if head == "XLNetModel" and not any(k.startswith("transformer.") for k in weights):
        core, prefix = dict(weights), ""
    else:
        core = {k[len("transformer.") :]: v for k, v in weights.items() if k.startswith("transformer.")}
        prefix = "" if head == "XLNetModel" else "transformer."
        if not core:
            raise ValueError(f"{head}: no 'transformer.*' weights in the checkpoint")
    out = {prefix + "word_embedding": core["word_embedding.weight"], prefix + "mask_emb": core["mask_emb"].reshape(-1)}
    layers = [_hf_layer(core, i) for i in range(config.n_layer)]
    for name in layers[0]:
        if config.scan_layers:
            out[f"{prefix}layers.{name}"] = np.stack([a[name] for a in layers])
        else:
            out.update({f"{prefix}layers.{i}.{name}": a[name] for i, a in enumerate(layers)})
    w, d = weights, config.d_model
    if head == "XLNetLMHeadModel":
        out["lm_bias"] = w["lm_loss.bias"]
        if "lm_loss.weight" in w and not np.array_equal(w["lm_loss.weight"], core["word_embedding.weight"]):
            raise ValueError("lm_loss.weight differs from the word embedding; xlgen's XLNet LM head is tied")
    elif head in ("XLNetForSequenceClassification", "XLNetForMultipleChoice"):
        if "sequence_summary.summary.weight" in w:
            _hf_linear(w, "sequence_summary.summary", "sequence_summary.summary", out)
        _hf_linear(w, "logits_proj", "logits_proj", out)
    elif head == "XLNetForQuestionAnswering":
        _hf_linear(w, "start_logits.dense", "start_logits.dense", out)
        _hf_linear(w, "end_logits.dense_0", "end_logits.dense_0", out, in_shape=(2, d))
        out["end_logits.layer_norm.scale"] = w["end_logits.LayerNorm.weight"]
        out["end_logits.layer_norm.bias"] = w["end_logits.LayerNorm.bias"]
        _hf_linear(w, "end_logits.dense_1", "end_logits.dense_1", out)
        _hf_linear(w, "answer_class.dense_0", "answer_class.dense_0", out, in_shape=(2, d))
        _hf_linear(w, "answer_class.dense_1", "answer_class.dense_1", out)
    return out


HF_HEADS = (
    "XLNetModel",
    "XLNetLMHeadModel",
    "XLNetForSequenceClassification",
    "XLNetForQuestionAnswering",
    "XLNetForMultipleChoice",
)


def module_class(name: str):
    """xlgen module class for a HF architecture name."""
    if name in ("XLNetModel", "XLNetLMHeadModel"):
        return globals()[name]
    from xlgen.models.xlnet import heads as xlnet_heads

    return getattr(xlnet_heads, name)


def load_hf(head: str, config: XLNetConfig, weights: Dict[str, np.ndarray]):
    """Build xlgen module `head` holding the HF `weights` (no random init)."""
    values = hf_to_xlgen(head, config, weights)
    abstract = nnx.eval_shape(lambda: module_class(head)(config, rngs=nnx.Rngs(0)))

    def lookup(name, shape):
        if name not in values:
            raise KeyError(f"{head}: the checkpoint has no weight for xlgen parameter {name!r}")
        return values.pop(name)

    model = materialize(abstract, lookup)
    if values:
        raise ValueError(f"{head}: checkpoint weights not used by the model: {sorted(values)}")
    return model


class HFOutput(dict):
    """Dict with attribute access, carrying HF output names (`.logits`, `.mems`, ...)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class XLNetFromHF:
    """A loaded HF XLNet checkpoint, callable with HF keyword arguments (NumPy or torch tensors in, NumPy out).

    Matches HF 4.34.1 in eval mode: `use_mems` defaults to `use_mems_eval`; `mems` are HF-layout per-layer
    `[mlen, b, d]` (a tuple, as returned in `.mems`) or an xlgen `[n_layer, b, mlen, d]` array; with `mem_len`
    None/0 the whole history is kept, as HF does. QA inference returns HF's quirky "log probs" (softmax
    probabilities) with end candidates flattened as [b, end_n_top * start_n_top]. `.model` is the xlgen NNX module.
    """

    def __init__(self, model, head: str, hf_config: Dict[str, Any]):
        self.model, self.head, self.hf_config = model, head, hf_config
        self.config: XLNetConfig = model.config
        self.model.eval()
        graphdef, state = nnx.split(model)
        self._state = state

        def run(state, arrays, static):
            module = nnx.merge(graphdef, state)
            return module(**arrays, **dict(static))

        self._run = jax.jit(run, static_argnums=2)

    def __call__(
        self,
        input_ids=None,
        *,
        attention_mask=None,
        mems=None,
        perm_mask=None,
        target_mapping=None,
        token_type_ids=None,
        input_mask=None,
        use_mems=None,
        labels=None,
        start_positions=None,
        end_positions=None,
        is_impossible=None,
        cls_index=None,
        p_mask=None,
        is_forward=None,
        **unsupported,
    ):
        unsupported = {k: v for k, v in unsupported.items() if v is not None and k not in ("return_dict",)}
        if unsupported:
            raise TypeError(
                f"{self.head}: unsupported arguments {sorted(unsupported)} (head_mask, inputs_embeds "
                "and output_* are not implemented)"
            )
        if input_ids is None:
            raise ValueError(f"{self.head}: input_ids is required")
        cfg = self.config
        arrays = {
            k: np.asarray(v)
            for k, v in dict(
                input_ids=input_ids,
                token_type_ids=token_type_ids,
                attention_mask=attention_mask,
                input_mask=input_mask,
                perm_mask=perm_mask,
                target_mapping=target_mapping,
                is_forward=is_forward,
            ).items()
            if v is not None
        }
        for k in ("perm_mask", "target_mapping", "attention_mask", "input_mask"):
            if k in arrays:
                arrays[k] = arrays[k].astype(np.float32)
        training_qa = (
            self.head == "XLNetForQuestionAnswering" and start_positions is not None and end_positions is not None
        )
        if self.head == "XLNetForQuestionAnswering":
            if p_mask is not None:
                arrays["p_mask"] = np.asarray(p_mask, np.float32)
            if cls_index is not None:
                arrays["cls_index"] = np.asarray(cls_index).reshape(-1)
            if training_qa:
                arrays["start_positions"] = np.asarray(start_positions).reshape(-1)
        elif p_mask is not None or cls_index is not None or start_positions is not None:
            raise TypeError(f"{self.head}: p_mask / cls_index / start_positions are QuestionAnswering arguments")

        if mems is not None:
            if isinstance(mems, (list, tuple)):
                mems = np.stack([np.asarray(m) for m in mems]).transpose(0, 2, 1, 3)
            arrays["mems"] = np.asarray(mems, np.float32)
        mlen = 0 if mems is None else arrays["mems"].shape[2]
        use_mems = self.hf_config.get("use_mems_eval", True) if use_mems is None else use_mems
        qlen = arrays["input_ids"].shape[-1]
        if not use_mems:
            mem_len = 0
        elif cfg.mem_len:
            mem_len = cfg.mem_len
        else:  # HF keeps the whole history when mem_len is None/0
            mem_len = mlen + min(cfg.reuse_len or qlen, qlen)
        static = (("mem_len", int(mem_len)),)
        out, new_mems = self._run(self._state, arrays, static)
        result = HFOutput()
        if new_mems is not None:
            result["mems"] = tuple(np.asarray(m).transpose(1, 0, 2) for m in new_mems)
        else:
            result["mems"] = None
        self._fill(result, out, labels, start_positions, end_positions, is_impossible, cls_index, training_qa)
        return result

    def _fill(self, result, out, labels, start_positions, end_positions, is_impossible, cls_index, training_qa):
        head = self.head
        if head == "XLNetModel":
            result["last_hidden_state"] = np.asarray(out, np.float32)
        elif head == "XLNetForQuestionAnswering":
            if training_qa:
                from xlgen.models.xlnet.heads import squad_loss

                o = {k: v for k, v in out.items()}
                start_positions = np.asarray(start_positions).reshape(-1)
                end_positions = np.asarray(end_positions).reshape(-1)
                loss = np.asarray(squad_loss(o, start_positions, end_positions)).mean()
                if cls_index is not None and is_impossible is not None:
                    z = np.asarray(is_impossible, np.float32).reshape(-1)
                    x = np.asarray(o["cls_logits"], np.float64)
                    bce = np.maximum(x, 0) - x * z + np.log1p(np.exp(-np.abs(x)))
                    loss = loss + 0.5 * bce.mean()
                result["loss"] = np.float32(loss)
            else:
                b, s, e = out["end_top_index"].shape
                result["start_top_log_probs"] = np.exp(np.asarray(out["start_top_log_probs"]))
                result["start_top_index"] = np.asarray(out["start_top_index"]).astype(np.int64)
                result["end_top_log_probs"] = (
                    np.exp(np.asarray(out["end_top_log_probs"])).transpose(0, 2, 1).reshape(b, e * s)
                )
                result["end_top_index"] = (
                    np.asarray(out["end_top_index"]).transpose(0, 2, 1).reshape(b, e * s).astype(np.int64)
                )
                result["cls_logits"] = np.asarray(out["cls_logits"])
        else:
            logits = np.asarray(out, np.float32)
            result["logits"] = logits
            if labels is not None:
                result["loss"] = np.float32(_hf_loss(head, self.hf_config, logits, np.asarray(labels)))
        return result


def _hf_loss(head, hf_config, logits, labels):
    """The losses HF computes from `labels` (mean over the batch)."""

    def ce(lg, y):
        lg = lg.reshape(-1, lg.shape[-1]).astype(np.float64)
        y = y.reshape(-1)
        lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
        keep = y != -100
        return (lse - lg[np.arange(len(y)), np.where(keep, y, 0)])[keep].mean()

    if head == "XLNetForSequenceClassification":
        problem = hf_config.get("problem_type")
        n = logits.shape[-1]
        if problem is None:
            problem = (
                "regression"
                if n == 1
                else (
                    "single_label_classification"
                    if np.issubdtype(labels.dtype, np.integer)
                    else "multi_label_classification"
                )
            )
        if problem == "regression":
            return np.mean((logits.reshape(labels.shape if n == 1 else logits.shape) - labels) ** 2)
        if problem == "multi_label_classification":
            x, z = logits.astype(np.float64), labels.astype(np.float64)
            return np.mean(np.maximum(x, 0) - x * z + np.log1p(np.exp(-np.abs(x))))
    return ce(logits, labels)


def from_hf(hf_config: Dict[str, Any], weights: Dict[str, np.ndarray], kwargs: Dict[str, Any]) -> XLNetFromHF:
    """`xlgen.from_pretrained` loader for HF XLNet directories; the head comes from `architectures`.

    kwargs: XLNetConfig overrides (e.g. `scan_layers=True`, `dtype="bfloat16"`), and `head=` to force a class.
    """
    kwargs = dict(kwargs)
    archs = hf_config.get("architectures") or ["XLNetModel"]
    head = kwargs.pop("head", None) or archs[0]
    if head not in HF_HEADS:
        raise ValueError(
            f"config.json architectures={archs}: unsupported XLNet class {head!r}; supported: {sorted(HF_HEADS)}"
        )
    kwargs.setdefault("answer_class_start", "gold")  # HF's QA training path, for parity with HF outputs
    config = XLNetConfig.from_hf(hf_config, **kwargs)
    return XLNetFromHF(load_hf(head, config, weights), head, hf_config)
