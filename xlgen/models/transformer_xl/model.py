"""Transformer-XL language model (Dai et al. 2019; Dai thesis Ch. 3) on the shared relative-attention core.

For layer n = 1..N and segment τ (thesis Eq. 3.5; batch-major `[b, len, d]`):

    h̃^{n-1} = [SG(m^{n-1}) ∘ h^{n-1}]                     memory of the layer's INPUT, concatenated on length
    q, k, v = h^{n-1} W_q, h̃^{n-1} W_k, h̃^{n-1} W_v        (k, v of memory and segment projected apart)
    A_ij    = (q_i + u)·k_j + shift((q_i + v)·W_r R)_ij   R: sinusoids of distance mlen+i-j (clamped), no abs pos
    o^n     = LN(h^{n-1} + drop(W_o MaskedSoftmax(A/sqrt(d_head)) v))
    h^n     = LN(o^n + drop(W_2 drop(ReLU(W_1 o^n + b_1)) + b_2))
    m^{n-1} <- SG([m^{n-1} ∘ h^{n-1}][-mem_len:])

with h^0 = drop(AdaptiveEmbedding(x)) (scaled by sqrt(d_model)), dropout on R, dropout on h^N, and the adaptive
log-softmax on top (tied to the input embedding). `same_length` and the memory update follow the original
PyTorch code and Hugging Face `TransfoXLModel` exactly (query i then sees the `mem_len` keys i+1..i+mem_len when
the memory is full).

`TransformerXLLM.__call__(input_ids, mems=None, *, labels=None, mem_len=None)` returns
`(log_probs [b,l,V] or nll [b,l], new_mems [n_layer, b, mem_len, d_model])`. `mems=None` means *no* memory
(the original PyTorch behaviour); `init_mems` gives zero memory (what the TF code and HF use, and what the trainer
keeps with a fixed shape). `from_hf` loads Hugging Face `TransfoXLLMHeadModel` / `TransfoXLModel` directories.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from xlgen.models.adaptive_softmax import (
    AdaptiveEmbedding,
    AdaptiveLogSoftmax,
    cluster_bounds,
    pad_rows,
    stored_rows,
    table_rows,
)
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
from xlgen.models.output_layers import OUTPUT_LAYER_NAMES, OutputConfig, SpectralEmbedding, make_output_layer
from xlgen.models.params import materialize, stack_layers
from xlgen.models.relative_attention import (
    STREAM,
    ContentKeyOperand,
    RelativeMultiHeadAttention,
    ValueOperand,
    memory_validity_mask,
    relative_position_sequence,
    shift_offset,
    sinusoid_embedding,
)
from xlgen.sharding import constrain

# ----------------------------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TransformerXLConfig:
    """Architecture (HF `TransfoXLConfig` names and defaults) plus xlgen execution options.

    `cutoffs=()` gives a plain softmax; `d_embed=None` means d_model; `clamp_len <= 0` means no clamping;
    `tie_projs=None` derives it from `proj_share_all_but_first` (HF: [False] + [psabf] * n_clusters).
    Execution: `scan_layers` (stack layer params on a leading "layers" axis and scan), `remat` (recompute each
    layer in the backward pass), `dtype` (compute dtype; params stay float32; softmax / log-probs in float32),
    `softmax_block_size` (most vocabulary rows the label-NLL's logsumexp takes at once: a larger cluster runs in
    equal blocks with recompute; 32768 keeps WT103's 20,003-row head whole — `[tokens/device, 20003]` float32 is
    ~60 MB per v3 core at the paper batch — and blocks the 160K / 68K-row tails), `softmax_chunk_size` (tokens
    per tail-cluster chunk of the label NLL).
    Output layer: `output_layer` = "adaptive" (the adaptive softmax above; a plain softmax when `cutoffs=()`) or one
    of `xlgen.models.output_layers` (softmax, mos, moc, sigsoftmax, gss, plif, mixtape; need `cutoffs=()`), with its
    settings and regularisers (AdvSoft, CosReg, spectrum control) in `output` (`OutputConfig` or a dict).
    """

    vocab_size: int = 267735
    cutoffs: Sequence[int] = (20000, 40000, 200000)
    d_model: int = 1024
    d_embed: Optional[int] = 1024
    n_head: int = 16
    d_head: int = 64
    d_inner: int = 4096
    div_val: int = 4
    n_layer: int = 18
    mem_len: int = 1600
    clamp_len: int = 1000
    same_length: bool = True
    untie_r: bool = True
    proj_share_all_but_first: bool = True
    tie_projs: Optional[Sequence[bool]] = None
    tie_word_embeddings: bool = True
    dropout: float = 0.1
    dropatt: float = 0.0
    init_std: float = 0.02
    proj_init_std: float = 0.01
    layer_norm_epsilon: float = 1e-5
    # execution options (not architecture)
    scan_layers: bool = False
    remat: Union[bool, str] = "none"  # a name of layers.REMAT_POLICIES (True / False = full / none)
    dtype: str = "float32"
    param_dtype: str = "float32"
    scores_dtype: str = "float32"
    softmax_dtype: str = "float32"
    logits_dtype: str = "float32"  # float32 only: the adaptive / blocked softmax layers accumulate in float32
    softmax_block_size: int = 32768
    softmax_chunk_size: int = 256
    table_rows_multiple: int = 1  # adaptive tables' stored rows padded to this (div_val > 1; see adaptive_softmax)
    output_layer: str = "adaptive"
    output: Any = None  # OutputConfig (a dict is converted)

    def __post_init__(self):
        object.__setattr__(self, "cutoffs", tuple(int(c) for c in self.cutoffs))
        if self.tie_projs is not None:
            object.__setattr__(self, "tie_projs", tuple(bool(t) for t in self.tie_projs))
        cluster_bounds(self.vocab_size, self.cutoffs)  # validates
        if len(self.resolved_tie_projs) != len(self.cutoffs) + 1:
            raise ValueError(f"tie_projs={self.tie_projs} needs {len(self.cutoffs) + 1} entries (head + tails)")
        if self.n_layer < 1 or self.n_head < 1 or self.d_head < 1:
            raise ValueError("n_layer, n_head and d_head must be positive")
        object.__setattr__(self, "remat", remat_policy(self.remat))
        check_precision(self)
        if self.logits_dtype != "float32":
            raise ValueError(
                f"TransformerXLConfig.logits_dtype={self.logits_dtype!r}: Transformer-XL's output layers compute "
                "their logits and log-normalisers in float32 (blocked, never a [tokens, V] tensor); use float32"
            )
        out = OutputConfig.from_any(self.output)
        object.__setattr__(self, "output", out)
        if self.output_layer not in OUTPUT_LAYER_NAMES:
            raise ValueError(f"output_layer={self.output_layer!r}: expected one of {list(OUTPUT_LAYER_NAMES)}")
        if self.output_layer == "adaptive":
            if out.adv_eps > 0 or out.cosreg > 0:
                raise ValueError(
                    "output.adv_eps / cosreg need output_layer=softmax (or another non-adaptive layer), not 'adaptive'"
                )
        elif self.cutoffs:
            raise ValueError(f"output_layer={self.output_layer!r} needs cutoffs=() (one vocabulary table)")
        if self.table_rows_multiple != 1 and (self.output_layer != "adaptive" or self.div_val == 1):
            raise ValueError(
                f"table_rows_multiple={self.table_rows_multiple} pads the adaptive softmax's per-cluster tables: it "
                "needs output_layer='adaptive' and div_val > 1"
            )
        if self.table_rows_multiple < 1:
            raise ValueError(f"table_rows_multiple={self.table_rows_multiple} must be >= 1")
        if out.spectrum_control and (not self.tie_word_embeddings or self.div_val != 1):
            raise ValueError(
                "output.spectrum_control needs tie_word_embeddings=True and div_val=1 (with div_val > 1 the adaptive "
                "clusters have tables of different widths: no single output embedding E = U diag(σ) Vᵀ)"
            )

    @property
    def embed_dim(self) -> int:
        return self.d_model if self.d_embed is None else self.d_embed

    @property
    def resolved_tie_projs(self) -> tuple:
        if self.tie_projs is not None:
            return self.tie_projs
        return (False,) + (bool(self.proj_share_all_but_first),) * len(self.cutoffs)

    def to_dict(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d["cutoffs"] = list(self.cutoffs)
        d["tie_projs"] = None if self.tie_projs is None else list(self.tie_projs)
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "TransformerXLConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown TransformerXLConfig keys {unknown}; valid keys: {sorted(names)}")
        return cls(**d)

    @classmethod
    def from_hf(cls, hf: Dict[str, Any], **overrides) -> "TransformerXLConfig":
        """From a HF `config.json` dict (TransfoXLConfig). Unsupported variants raise naming the key."""
        for key, ok, why in (
            ("pre_lnorm", lambda v: not v, "pre-LN blocks are not supported (post-LN only)"),
            ("attn_type", lambda v: v == 0, "only attn_type=0 (relative attention) exists"),
            ("sample_softmax", lambda v: v is None or v <= 0, "sampled softmax not supported"),
        ):
            if key in hf and not ok(hf[key]):
                raise ValueError(f"config.json: {key}={hf[key]!r}: {why}")
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: hf[k] for k in names if k in hf}
        if "vocab_size" not in hf and "n_token" in hf:
            kw["vocab_size"] = hf["n_token"]
        if "tie_projs" in hf and hf["tie_projs"] is not None:
            kw["tie_projs"] = tuple(hf["tie_projs"])[: len(kw.get("cutoffs", cls.cutoffs)) + 1]
        for k in (
            "scan_layers",
            "remat",
            "dtype",
            "param_dtype",
            "scores_dtype",
            "softmax_dtype",
            "logits_dtype",
            "softmax_block_size",
            "softmax_chunk_size",
            "table_rows_multiple",
            "output_layer",
            "output",
        ):
            kw.pop(k, None)
        bad = sorted(set(overrides) - names)
        if bad:
            raise ValueError(f"unknown TransformerXLConfig overrides {bad}; valid keys: {sorted(names)}")
        kw.update(overrides)
        return cls(**kw)


# ----------------------------------------------------------------------------------------------------------------
# Pieces
# ----------------------------------------------------------------------------------------------------------------


def attention_mask(qlen: int, mlen: int, *, same_length: bool = False, mem_len: int = 0) -> np.ndarray:
    """Causal mask with memory `[qlen, mlen + qlen]`, True where query i may NOT attend key j (a jax array when a
    size is symbolic).

    Key j (over [memory; segment]) is blocked iff j > mlen + i. With `same_length`, also iff j <= i - s where
    s = qlen - (klen - mem_len) if klen > mem_len else qlen (original PyTorch / HF convention).
    """
    klen = mlen + qlen
    xp = np if isinstance(qlen, int) and isinstance(mlen, int) else jnp  # jnp: symbolic sizes (`jax.export`)
    i = xp.arange(qlen)[:, None]
    j = xp.arange(klen)[None, :]
    blocked = j > i + mlen
    if same_length:
        mask_len = klen - mem_len
        shift = qlen - mask_len if mask_len > 0 else qlen
        blocked = blocked | (j <= i - shift)
    return blocked


def update_mems(mems: jax.Array, hids: jax.Array, mem_len: int) -> jax.Array:
    """SG([mems ∘ hids][-mem_len:]) along the length axis 2 of `[n_layer, b, len, d]`."""
    cat = jnp.concatenate([mems, hids.astype(mems.dtype)], axis=2)
    start = max(0, cat.shape[2] - mem_len)
    return jax.lax.stop_gradient(cat[:, :, start:])


class TransformerXLBlock(nnx.Module):
    """Relative attention over [memory; h] + ReLU FFN, both post-LN."""

    def __init__(self, config: TransformerXLConfig, *, rngs: nnx.Rngs):
        c = config
        self.attn = RelativeMultiHeadAttention(
            c.d_model,
            c.n_head,
            c.d_head,
            dropout=c.dropout,
            dropatt=c.dropatt,
            own_biases=c.untie_r,
            layer_norm_eps=c.layer_norm_epsilon,
            init_std=c.init_std,
            scores_dtype=c.scores_dtype,
            softmax_dtype=c.softmax_dtype,
            rngs=rngs,
        )
        self.ff = PositionwiseFF(
            c.d_model,
            c.d_inner,
            act="relu",
            dropout=c.dropout,
            layer_norm_eps=c.layer_norm_epsilon,
            init_std=c.init_std,
            rngs=rngs,
        )

    def __call__(
        self,
        h: jax.Array,
        mem: jax.Array,
        pos_emb: jax.Array,
        mask: jax.Array,
        shared_biases: Optional[dict],
        cache: Optional[dict] = None,
    ):
        """h `[b,l,d]`, mem `[b,m,d]`, pos_emb `[m+l,d]`, mask `[1|b,1,l,m+l]` -> `[b,l,d]`.

        `cache` (evaluation): {"position_keys": W_r R `[m+l,n,d]`, a `PositionKeyOperand`, or None; "kv_mem":
        (keys, values) `[b,n,d,m']` (m' >= m) whose last m rows are the memory's heads, or None}; then returns
        `(out, (keys, values) [b,n,d,m+l])`. Memory rows are never updated, so the next segment's memory heads are
        the last rows of these. Heads are kept in the `[b,n,d,k]` layout of the content and value products
        (`ContentKeyOperand`, `ValueOperand`): a segment then transposes only its own rows, and appending them is
        one fusion (`_append_heads`)."""
        attn = self.attn
        h, mem = constrain(h, STREAM), constrain(mem, STREAM)  # rows over the batch axes, d_model whole
        if cache is None:
            k_head, v_head = attn.kv_heads(h, mem)  # memory projected apart: no input gradient for its rows
            k_head_r = attn.position_heads(pos_emb)
        else:
            mlen = mem.shape[1]
            heads_last = lambda x: jnp.transpose(x.astype(h.dtype), (0, 2, 3, 1))  # [b,l,n,d] -> [b,n,d,l]
            if cache["kv_mem"] is not None:
                k_mem, v_mem = (x[..., x.shape[-1] - mlen :].astype(h.dtype) for x in cache["kv_mem"])
            else:
                k_mem, v_mem = map(heads_last, attn.kv_heads(mem))
            k_h, v_h = map(heads_last, attn.kv_heads(h))
            k_head = ContentKeyOperand(_append_heads(k_mem, k_h))
            v_head = ValueOperand(_append_heads(v_mem, v_h))
            k_head_r = cache["position_keys"]
            k_head_r = attn.position_heads(pos_emb) if k_head_r is None else k_head_r
        out = attn.attend(
            h,
            k_head,
            v_head,
            k_head_r,
            klen=mem.shape[1] + h.shape[1],
            offset=shift_offset(h.shape[1], "txl"),
            mask=mask,
            shared_biases=shared_biases,
        )
        out = constrain(self.ff(constrain(out, STREAM)), STREAM)
        return out if cache is None else (out, (k_head.keys, v_head.values))


def _layer_entry(layer_cache: dict, n: int) -> dict:
    """Layer n's part of a cached pass's {"position_keys", "kv_mem"}: stacked arrays (or operands) indexed on their
    leading layer axis; keys/values given as per-layer sequences (what an unscanned stack returns) picked."""
    pk, kv = layer_cache["position_keys"], layer_cache["kv_mem"]
    return {
        "position_keys": None if pk is None else pk[n] if isinstance(pk, list) else jax.tree.map(lambda x: x[n], pk),
        "kv_mem": None if kv is None else (kv[0][n], kv[1][n]),
    }


def _append_heads(prev: jax.Array, new: jax.Array) -> jax.Array:
    """`[..., m]` ++ `[..., l]` along the last axis as one select of two pads: a single loop fusion on XLA:CPU,
    which fuses the slice producing `prev`, where `concatenate` is a separate copy after that slice."""
    m, l = prev.shape[-1], new.shape[-1]
    lead = [(0, 0)] * (prev.ndim - 1)
    first = jnp.arange(m + l) < m
    return jnp.where(first, jnp.pad(prev, lead + [(0, l)]), jnp.pad(new, lead + [(m, 0)]))


def _apply_block(block, h, mem, pos_emb, mask, shared, cache=None):
    return block(h, mem, pos_emb, mask, shared, cache)


# ----------------------------------------------------------------------------------------------------------------
# The language model
# ----------------------------------------------------------------------------------------------------------------


class TransformerXLLM(nnx.Module):
    """Transformer-XL LM: adaptive input -> N relative-attention blocks with memory -> adaptive log-softmax."""

    def __init__(self, config: TransformerXLConfig, *, rngs: nnx.Rngs):
        c = self.config = config
        if c.output.spectrum_control:  # E = U diag(σ) Vᵀ, tied (output_layers.SpectralEmbedding)
            self.embedding = SpectralEmbedding(
                c.vocab_size, c.embed_dim, c.d_model, init_std=c.init_std, proj_init_std=c.proj_init_std, rngs=rngs
            )
        else:
            self.embedding = AdaptiveEmbedding(
                c.vocab_size,
                c.embed_dim,
                c.d_model,
                c.cutoffs,
                c.div_val,
                init_std=c.init_std,
                proj_init_std=c.proj_init_std,
                rows_multiple=c.table_rows_multiple,
                rngs=rngs,
            )
        if c.output_layer != "adaptive":  # output_layers registry (softmax, mos, gss, ...)
            self.softmax = make_output_layer(
                c.output_layer,
                c.vocab_size,
                c.embed_dim,
                c.d_model,
                c.output,
                tie_weights=c.tie_word_embeddings,
                init_std=c.init_std,
                proj_init_std=c.proj_init_std,
                block_size=c.softmax_block_size,
                n_layer=c.n_layer,
                rngs=rngs,
            )
        else:
            self.softmax = AdaptiveLogSoftmax(
                c.vocab_size,
                c.embed_dim,
                c.d_model,
                c.cutoffs,
                c.div_val,
                tie_weights=c.tie_word_embeddings,
                tie_projs=c.resolved_tie_projs,
                init_std=c.init_std,
                proj_init_std=c.proj_init_std,
                block_size=c.softmax_block_size,
                chunk_size=c.softmax_chunk_size,
                rows_multiple=c.table_rows_multiple,
                rngs=rngs,
            )
        if not c.untie_r:  # one u, v shared by all layers
            self.r_w_bias = param(rngs, normal(c.init_std), (c.n_head, c.d_head), ("heads", "kv"))
            self.r_r_bias = param(rngs, normal(c.init_std), (c.n_head, c.d_head), ("heads", "kv"))
        self.layers = stacked_layers(lambda r: TransformerXLBlock(c, rngs=r), c.n_layer, rngs, scan=c.scan_layers)
        self.drop = Dropout(c.dropout, rngs=rngs)

    def regularization(self):
        """(penalty, {term: value}) of the output-embedding regularisers (CosReg, spectrum control); 0 without."""
        if self.config.output_layer == "adaptive":
            if self.config.output.spectrum_control:  # E = U diag(σ) Vᵀ under the adaptive softmax (div_val 1)
                return self.embedding.penalty(self.config.output)
            return jnp.zeros((), jnp.float32), {}
        return self.softmax.regularization(self.embedding)

    def init_mems(self, batch_size: int, mem_len: Optional[int] = None) -> jax.Array:
        """Zero memory `[n_layer, batch, mem_len, d_model]` in the compute dtype."""
        c = self.config
        m = c.mem_len if mem_len is None else mem_len
        return jnp.zeros((c.n_layer, batch_size, m, c.d_model), jnp.dtype(c.dtype))

    def hidden_states(
        self,
        input_ids: jax.Array,
        mems: Optional[jax.Array] = None,
        *,
        mem_len: Optional[int] = None,
        mem_valid: Optional[jax.Array] = None,
        cache: Optional[dict] = None,
        with_layers: bool = False,
    ):
        """Last-layer states `[b,l,d_model]` (after the final dropout) and the new memory (see module doc).

        `with_layers`: one more (last) result, every layer's state `[n_layer + 1, b, l, d_model]` from the same pass
        (index 0 the embedding output, n the output of block n, the last one before the final dropout), for output
        layers that read several layers (DOC).

        `cache` (cached evaluation, see `TransfoXLPretrained`): {"position_keys": `[n_layer, m+l, n, d]` from
        `position_keys(l, m+l)`, per-layer `PositionKeyOperand`s (a list; stacked in one for scanned layers), or
        None; "kv_mem": (keys, values) `[n_layer, b, n, d, m']` (or per-layer lists of `[b, n, d, m']`) whose last
        m rows are the memory's heads, or None (then projected from `mems`)}; the result then has a third element,
        the keys/values of this pass's m + l rows in that layout (per-layer lists for an unscanned stack), whose
        last rows are the heads of the returned memory. Same results as without (the memory's heads are those
        computed when its rows were the segment), minus the memory and position projections.

        `mem_valid` int `[b]` (or scalar): the memory is a fixed-length buffer whose last `mem_valid[b]` rows are
        real and the rest (zeros) are masked (`relative_attention.memory_validity_mask`); with a buffer of
        `mem_len` rows the returned memory keeps that shape, its count being
        `advance_memory_validity(mem_valid, l, mem_len)`. Equals the growing (concatenated) memory exactly."""
        c = self.config
        dtype = jnp.dtype(c.dtype)
        mem_len = c.mem_len if mem_len is None else mem_len
        b, qlen = input_ids.shape
        if mems is None:
            mems = jnp.zeros((c.n_layer, b, 0, c.d_model), dtype)
        if mems.shape[0] != c.n_layer or mems.shape[1] != b or mems.shape[3] != c.d_model:
            raise ValueError(f"mems shape {mems.shape} != [n_layer={c.n_layer}, batch={b}, mem, d={c.d_model}]")
        mems = jax.lax.stop_gradient(mems.astype(dtype))
        mlen = mems.shape[2]
        klen = mlen + qlen
        mask = jnp.asarray(attention_mask(qlen, mlen, same_length=c.same_length, mem_len=mem_len))[None, None]
        if mem_valid is not None:
            mask = mask | memory_validity_mask(mem_valid, mlen, qlen)  # [b,1,l,m+l]
        pos_seq = relative_position_sequence(qlen, klen, "txl", c.clamp_len if c.clamp_len > 0 else None)
        pos_emb = self.drop(sinusoid_embedding(pos_seq, c.d_model, dtype))
        h = self.drop(self.embedding(input_ids, dtype))
        shared = None if c.untie_r else {"r_w_bias": self.r_w_bias[...], "r_r_bias": self.r_r_bias[...]}
        apply = rematerialize(_apply_block, c.remat)
        layer_cache = None if cache is None else {"position_keys": None, "kv_mem": None, **cache}
        if c.scan_layers:
            # the memory enters the loop whole and layer i reads its own rows: scanned over, it would be saved again
            # as a stacked residual (the input of the memory's key and value projections, for their weight
            # gradients), which XLA:TPU copies whole in every iteration
            @nnx.scan(in_axes=(nnx.Carry, 0, 0, None, None, None, 0), out_axes=(nnx.Carry, 0))
            def body(h, block, i, pos_emb, mask, shared, lc):
                mem = jax.lax.dynamic_index_in_dim(mems, i, keepdims=False)
                if lc is None:
                    return apply(block, h, mem, pos_emb, mask, shared), h
                out, kv = apply(block, h, mem, pos_emb, mask, shared, lc)
                return out, (h, kv)

            h, hids = body(h, self.layers, jnp.arange(mems.shape[0]), pos_emb, mask, shared, layer_cache)
            if cache is not None:
                hids, kvs = hids
        else:
            hids, kvs = [], []
            for n, block in enumerate(self.layers):
                hids.append(h)
                if cache is None:
                    h = apply(block, h, mems[n], pos_emb, mask, shared)
                else:
                    h, kv = apply(block, h, mems[n], pos_emb, mask, shared, _layer_entry(layer_cache, n))
                    kvs.append(kv)
            hids = jnp.stack(hids)
            kvs = tuple(list(x) for x in zip(*kvs)) if kvs else None  # per layer: stacking would copy them all
        new_mems = update_mems(mems, hids, mem_len) if mem_len > 0 else mems[:, :, :0]
        out = (self.drop(h), new_mems) if cache is None else (self.drop(h), new_mems, jax.lax.stop_gradient(kvs))
        if with_layers:
            out = out + (jnp.concatenate([hids, h[None].astype(hids.dtype)]),)
        return out

    def position_keys(self, qlen: int, klen: int) -> jax.Array:
        """Every layer's position keys W_r R for `qlen` queries against `klen` keys `[n_layer, klen, n, d]`
        (evaluation: no dropout on the encodings); a function of the parameters only, so cached evaluation forms
        them once per memory length instead of once per segment."""
        c = self.config
        dtype = jnp.dtype(c.dtype)
        pos_seq = relative_position_sequence(qlen, klen, "txl", c.clamp_len if c.clamp_len > 0 else None)
        pos_emb = sinusoid_embedding(pos_seq, c.d_model, dtype)
        if c.scan_layers:

            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
            def body(carry, block):
                return carry, block.attn.position_heads(pos_emb)

            return body(None, self.layers)[1]
        return jnp.stack([block.attn.position_heads(pos_emb) for block in self.layers])

    def __call__(
        self,
        input_ids: jax.Array,
        mems: Optional[jax.Array] = None,
        *,
        labels: Optional[jax.Array] = None,
        mem_len: Optional[int] = None,
        mem_valid: Optional[jax.Array] = None,
        cache: Optional[dict] = None,
    ):
        """input_ids `[b,l]` int, mems `[n_layer,b,m,d_model]` or None (no memory), labels `[b,l]` next tokens
        (negative = ignored) -> `(log_probs [b,l,V] | nll [b,l], new_mems [n_layer,b,min(m+l,mem_len),d])`, with
        the memory rows' keys/values third when `cache` is given (see `hidden_states`).
        Log-probs / nll are float32; with labels the `[b,l,V]` tensor is never built."""
        layers = getattr(self.softmax, "needs_layers", False)  # DOC: every layer's state, from this one pass
        h, new_mems, *kv = self.hidden_states(
            input_ids, mems, mem_len=mem_len, mem_valid=mem_valid, cache=cache, with_layers=layers
        )
        extra = {"layers": kv.pop()} if layers else {}
        if labels is None:
            return (self.softmax.log_probs(h, self.embedding, **extra), new_mems, *kv)
        return (self.softmax.nll(h, labels, self.embedding, **extra), new_mems, *kv)


def count_params(model_or_state) -> int:
    """Number of scalars in the nnx.Param leaves (works on abstract models from `nnx.eval_shape`)."""
    state = nnx.state(model_or_state, nnx.Param)
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(state)))


def from_params(
    config: TransformerXLConfig, params: Dict[str, np.ndarray], *, strict: bool = True, seed: int = 0
) -> TransformerXLLM:
    """A `TransformerXLLM` holding `params` ({unscanned "/"-joined path: array}, e.g. "layers/3/attn/q/kernel"),
    built without random init (`xlgen.models.params.materialize`); layers are stacked for `scan_layers` configs.
    Parameters absent from `params` are zero only with `strict=False` (the unused softmax of a headless
    TransfoXLModel); RNG streams are seeded with `seed`."""
    params = vocab_rows(config, params, stored=True)
    if config.scan_layers:
        params = stack_layers(params, config.n_layer, sep="/")
    abstract = nnx.eval_shape(lambda: TransformerXLLM(config, rngs=nnx.Rngs(seed)))
    return materialize(abstract, params, sep="/", strict=strict, seed=seed)


def vocab_rows(config: TransformerXLConfig, params: Dict[str, np.ndarray], *, stored: bool) -> Dict[str, np.ndarray]:
    """`params` with the adaptive tables and output biases at their stored rows (`stored=True`: zero rows appended,
    what a loader of real-sized weights does) or at their real rows (`stored=False`: sliced, what an exporter
    does). Identity when `config.table_rows_multiple` is 1."""
    if config.table_rows_multiple == 1:
        return params
    sizes = table_rows(config.vocab_size, config.cutoffs, config.div_val)
    out = dict(params)
    for k, real in enumerate(sizes):
        rows = stored_rows(real, config.table_rows_multiple) if stored else real
        for name in (f"embedding/tables/{k}", f"softmax/tables/{k}", f"softmax/biases/{k}"):
            if name in out:
                a = out[name]
                out[name] = pad_rows(np.asarray(a), rows) if stored else a[:rows]
    return out
