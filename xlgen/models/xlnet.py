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
import math
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from xlgen.models.layers import LayerNorm, PositionwiseFF, param, normal  # noqa: F401 (LayerNorm re-exported)
from xlgen.models.relative_attention import (RelativeMultiHeadAttention, position_scores, relative_attention,
                                             relative_position_sequence, segment_scores, shift_offset,
                                             sinusoid_embedding)

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
    # implementation
    scan_layers: bool = False
    remat: bool = False
    dtype: str = "float32"

    def __post_init__(self):
        if self.attn_type not in ("bi", "uni"):
            raise ValueError(f"XLNetConfig.attn_type={self.attn_type!r}: expected 'bi' or 'uni'")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"XLNetConfig.dtype={self.dtype!r}: expected 'float32' or 'bfloat16'")

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


def attention_masks(qlen: int, mlen: int, *, attn_type: str, same_length: bool = False, input_mask=None,
                    perm_mask=None):
    """Query-stream mask M_g `[b or 1, qlen, mlen+qlen]` (True = may NOT attend) and content mask M_h = M_g & i!=j.

    input_mask `[b, qlen]` (1 = padding), perm_mask `[b, qlen, qlen]` (1 = i may not attend to j). Memory
    columns are never masked by data; the causal mask ("uni") is the Transformer-XL one (optionally
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
    if mask is None:
        return None, None
    not_self = ~(jnp.arange(qlen)[:, None] + mlen == jnp.arange(klen)[None, :])
    return mask, mask & not_self[None]


def segment_matrix(token_type_ids: jax.Array, mlen: int) -> jax.Array:
    """Different-segment flags `[b, qlen, mlen+qlen]`; memory positions count as segment 0."""
    cat = jnp.pad(token_type_ids, [(0, 0), (mlen, 0)]) if mlen > 0 else token_type_ids
    return token_type_ids[:, :, None] != cat[:, None, :]


def position_encodings(qlen: int, klen: int, d_model: int, *, attn_type: str, clamp_len: int, bi: bool,
                       dtype=jnp.float32) -> jax.Array:
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
            cfg.d_model, cfg.n_head, cfg.d_head, dropout=cfg.dropout, dropatt=cfg.dropatt, own_biases=cfg.untie_r,
            segments=True, layer_norm_eps=cfg.layer_norm_eps, init_std=cfg.initializer_range, rngs=rngs)
        self.ff = PositionwiseFF(cfg.d_model, cfg.d_inner, act=cfg.ff_activation, dropout=cfg.dropout,
                                 layer_norm_eps=cfg.layer_norm_eps, init_std=cfg.initializer_range, rngs=rngs)

    def __call__(self, h, g, mem, pos_emb, ctx: dict, shared_biases):
        """h `[b,l,d]`, g `[b,m,d]` or None, mem `[b,mlen,d]` or None, pos_emb `[r,d]` or `[2,r,d]`."""
        attn = self.rel_attn
        cat = h if mem is None else jnp.concatenate([mem.astype(h.dtype), h], axis=1)
        klen, qlen = cat.shape[1], h.shape[1]
        k_head, v_head = attn.k(cat), attn.v(cat)
        k_head_r = attn.r(pos_emb.astype(h.dtype))
        if ctx["is_forward"] is not None:  # per-row direction: [2,r,n,d] -> [b,r,n,d]
            k_head_r = jnp.where(ctx["is_forward"][:, None, None, None], k_head_r[0], k_head_r[1])
        offset = shift_offset(qlen, ctx["attn_type"])
        mask_h = None if ctx["mask_h"] is None else ctx["mask_h"][:, None]
        h_out = attn.attend(h, k_head, v_head, k_head_r, klen=klen, offset=offset, mask=mask_h,
                            seg_mat=ctx["seg_mat"], shared_biases=shared_biases)
        g_out = None
        if g is not None:
            g_out = query_stream_attention(attn, g, k_head, v_head, k_head_r, klen=klen, offset=offset, ctx=ctx,
                                           shared_biases=shared_biases)
            g_out = self.ff(g_out)
        return self.ff(h_out), g_out


def query_stream_attention(attn: RelativeMultiHeadAttention, g, k_head, v_head, k_head_r, *, klen: int, offset: int,
                           ctx: dict, shared_biases) -> jax.Array:
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
    attn_vec = relative_attention(q_head, k_head, v_head, r_w_bias=b["r_w_bias"], position_term=position_term,
                                  segment_term=segment_term, mask=mask, dropatt=attn.dropatt)
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
        if cfg.scan_layers:
            @nnx.split_rngs(splits=cfg.n_layer)
            @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
            def make(r):
                return XLNetLayer(cfg, rngs=r)

            self.layers = make(rngs)
        else:
            self.layers = nnx.List([XLNetLayer(cfg, rngs=rngs) for _ in range(cfg.n_layer)])
        self.drop = nnx.Dropout(cfg.dropout, rngs=rngs)

    def shared_biases(self):
        if self.config.untie_r:
            return None
        return {"r_w_bias": self.r_w_bias[...], "r_r_bias": self.r_r_bias[...], "r_s_bias": self.r_s_bias[...]}

    def init_mems(self, batch_size: int, mem_len: Optional[int] = None) -> jax.Array:
        """Zero memory `[n_layer, b, mem_len, d]` (the original starts pretraining from zeros)."""
        mem_len = self.config.mem_len if mem_len is None else mem_len
        return jnp.zeros((self.config.n_layer, batch_size, mem_len or 0, self.config.d_model),
                         self.config.compute_dtype)

    def __call__(self, input_ids, token_type_ids=None, *, input_mask=None, attention_mask=None, mems=None,
                 perm_mask=None, target_mapping=None, is_forward=None, mem_len=None, reuse_len=None):
        """input_ids `[b,l]` int; token_type_ids `[b,l]` (any number of segment ids; None = no segment term);
        input_mask `[b,l]` (1 = pad, original) XOR attention_mask `[b,l]` (1 = real, HF); mems
        `[n_layer,b,mlen,d]`; perm_mask `[b,l,l]` (1 = i may not attend j); target_mapping `[b,m,l]` one-hot
        rows (zero rows = padding); is_forward `[b]` bool (bi_data direction; default: all forward, or the
        half-batch layout when config.bi_data). mem_len/reuse_len override the config.

        Returns (output, new_mems): output = final query stream `[b,m,d]` if target_mapping is given else the
        content stream `[b,l,d]`; new_mems `[n_layer,b,mem_len,d]` or None (mem_len 0/None).
        """
        cfg = self.config
        dtype = cfg.compute_dtype
        input_ids = jnp.asarray(input_ids)
        bsz, qlen = input_ids.shape
        mlen = 0 if mems is None else mems.shape[2]
        klen = mlen + qlen
        mem_len = cfg.mem_len if mem_len is None else mem_len
        reuse_len = cfg.reuse_len if reuse_len is None else reuse_len

        if input_mask is not None and attention_mask is not None:
            raise ValueError("XLNetModel: pass input_mask (1 = padding) or attention_mask (1 = real token), not both")
        if attention_mask is not None:
            input_mask = 1 - jnp.asarray(attention_mask)
        mask_g, mask_h = attention_masks(qlen, mlen, attn_type=cfg.attn_type, same_length=cfg.same_length,
                                         input_mask=input_mask, perm_mask=perm_mask)
        seg_mat = None
        if token_type_ids is not None:
            seg_mat = segment_matrix(jnp.asarray(token_type_ids), mlen)

        if is_forward is None and cfg.bi_data:
            is_forward = half_batch_is_forward(bsz)
        bi = is_forward is not None
        pos_emb = position_encodings(qlen, klen, cfg.d_model, attn_type=cfg.attn_type, clamp_len=cfg.clamp_len,
                                     bi=bi, dtype=dtype)
        pos_emb = self.drop(pos_emb)

        ctx = {"attn_type": cfg.attn_type, "is_forward": None if not bi else jnp.asarray(is_forward, bool),
               "mask_h": mask_h, "seg_mat": seg_mat, "seg_rows": None, "mask_rows": None}
        h = self.drop(jnp.take(self.word_embedding[...], input_ids, axis=0).astype(dtype))
        g = None
        if target_mapping is not None:
            tm = jnp.asarray(target_mapping)
            pos = jnp.argmax(tm, axis=-1).astype(jnp.int32)  # [b,m]
            ctx.update(target_pos=pos, target_weight=tm.sum(-1), mask_rows=_rows(mask_g, pos),
                       seg_rows=_rows(seg_mat, pos))
            g = self.drop(jnp.broadcast_to(self.mask_emb[...].astype(dtype), (bsz, tm.shape[1], cfg.d_model)))

        shared = self.shared_biases()
        keep_mems = bool(mem_len) and mem_len > 0

        def layer_fn(layer, h, g, mem):
            new_mem = cache_mems(h, mem, mem_len, reuse_len) if keep_mems else None
            h, g = layer(h, g, mem, pos_emb, ctx, shared)
            return h, g, new_mem

        if cfg.remat:
            layer_fn = nnx.remat(layer_fn)

        if cfg.scan_layers:
            def body(carry, layer, mem):
                h, g = carry
                h, g, new_mem = layer_fn(layer, h, g, mem)
                return (h, g), new_mem

            if mems is None:
                scan = nnx.scan(lambda c, l: body(c, l, None), in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
                (h, g), new_mems = scan((h, g), self.layers)
            else:
                scan = nnx.scan(body, in_axes=(nnx.Carry, 0, 0), out_axes=(nnx.Carry, 0))
                (h, g), new_mems = scan((h, g), self.layers, mems)
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
        return (jnp.einsum("bld,vd->blv", output, emb).astype(jnp.float32) + self.lm_bias[...])

    def __call__(self, input_ids, token_type_ids=None, *, target_ids=None, **kwargs):
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


def _assign(p: nnx.Param, value, name: str):
    value = np.asarray(value, dtype=np.float32)
    if tuple(p.shape) != value.shape:
        raise ValueError(f"{name}: checkpoint shape {value.shape} does not match model shape {tuple(p.shape)}")
    p[...] = jnp.asarray(value)


def _layer_arrays(w: Dict[str, np.ndarray], i: int) -> Dict[str, np.ndarray]:
    """HF layer i weights in xlgen layout (attention `[d,n,dh]`, output `[n,dh,d]`, Linear weights transposed)."""
    p = f"layer.{i}."
    a = {f"rel_attn.{n}.kernel": w[p + f"rel_attn.{n}"] for n in ("q", "k", "v", "r")}
    a["rel_attn.o.kernel"] = np.transpose(w[p + "rel_attn.o"], (1, 2, 0))
    for n in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed"):
        a[f"rel_attn.{n}"] = w[p + f"rel_attn.{n}"]
    a["rel_attn.layer_norm.scale"] = w[p + "rel_attn.layer_norm.weight"]
    a["rel_attn.layer_norm.bias"] = w[p + "rel_attn.layer_norm.bias"]
    for n in ("layer_1", "layer_2"):
        a[f"ff.{n}.kernel"] = w[p + f"ff.{n}.weight"].T
        a[f"ff.{n}.bias"] = w[p + f"ff.{n}.bias"]
    a["ff.layer_norm.scale"] = w[p + "ff.layer_norm.weight"]
    a["ff.layer_norm.bias"] = w[p + "ff.layer_norm.bias"]
    return a


def _get(module, dotted: str):
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def load_hf_transformer(model: XLNetModel, w: Dict[str, np.ndarray]) -> None:
    """Copy HF `XLNetModel` weights (keys without the "transformer." prefix) into `model` in place."""
    cfg = model.config
    if not cfg.untie_r:
        raise ValueError("HF XLNet checkpoints hold per-layer biases; build the model with untie_r=True")
    _assign(model.word_embedding, w["word_embedding.weight"], "word_embedding.weight")
    _assign(model.mask_emb, w["mask_emb"].reshape(-1), "mask_emb")
    per_layer = [_layer_arrays(w, i) for i in range(cfg.n_layer)]
    if cfg.scan_layers:
        for name in per_layer[0]:
            _assign(_get(model.layers, name), np.stack([a[name] for a in per_layer]), f"layer.*.{name}")
    else:
        for i, arrays in enumerate(per_layer):
            for name, value in arrays.items():
                _assign(_get(model.layers[i], name), value, f"layer.{i}.{name}")
