"""Pluggable language-model output layers (the softmax-bottleneck family) and output-embedding regularisers.

`config.model.output_layer` picks one of `OUTPUT_LAYERS`; its settings live under `config.model.output`
(`OutputConfig`). Notation (Parthiban 2020, seed 001): h `[N, d_model]` context vectors, E `[V, d_e]` the output
embedding (tied to the input table by default), P `[d_e, d_model]` the tied projection when d_e != d_model
(h_e = h Pᵀ), b `[V]` the output bias, l_z = h_eᵀ e_z + b_z the logits.

    softmax     P(z|c) = softmax(l)_z                                                        (001 eq. 2.x, Q = HEᵀ)
    sigsoftmax  P(z|c) ∝ exp(l_z) σ(l_z)                                                     (Kanai et al.; 001 §3.2)
    gss         P(z|c) = softmax(P̃L(l; c, k))_z,  P̃L(x;c,k) = k(x-c) + c - (k-1) softplus(x-c)   (001 eq. 4.14-4.16)
    plif        P(z|c) = softmax(f(l))_z, f increasing piecewise linear on [-T, T], K pieces,
                slopes softplus(v_i), continuous, extended linearly outside [-T, T]          (001 §3.3, LMS-PLIF)
    mos         P(z|c) = Σ_k π_{c,k} softmax(h_{c,k}ᵀE + b)_z,  h_{c,k} = tanh(W_k h) ∈ R^{d_e}, π_c = softmax(W_π h)
                (no prior bias: 000 A.2.4; tanh in the embedding space: 001 §3.1.2; variational dropout on h_{c,k}
                shared over time: 000 A.7)                                                   (Yang et al.; 001 §3.1)
    moc         P(z|c) = softmax((Σ_k π_{c,k} h_{c,k})ᵀE + b)_z   (same parameters as MoS; low rank control)
    doc         P(z|c) = Σ_r π_{c,r} softmax(g_{c,r}ᵀE + b)_z,  g_{c,r} = tanh(W_{r,i} o_{c,i}) from layer i's
                output o_i (o_0 the embedding), v_i components per layer, π_c = softmax(U o_top)
                                                                     (Takase et al. 2018; 001 §3.1.6 eq. 3.14-3.16)
    mixtape     P(z|c) ∝ exp(Σ_k π_{c,z,k} h_{c,k}ᵀe_z + b_z), per-token priors from a sigmoid tree over gates
                a_{c,z,k} = v_zᵀ tanh(U_k h) + u_kᵀh + b_{z,k}, v_z ∈ R^{d2}                 (Yang et al. 2019; 001 §3.4)
    adaptive    the projected adaptive softmax (`xlgen.models.adaptive_softmax`, the Transformer-XL default)

Regularisers (training only, `OutputConfig`):
    adv_eps     AdvSoft (001 §3.3.3): max_θ min_{‖δ‖≤ε} log P(z | c; e_z + δ) has δ* = -ε h_e/‖h_e‖, i.e. the target
                logit becomes l_z - ε‖h_e‖ (in the numerator AND the normaliser). Any increasing logit transform
                (sigsoftmax, gss, plif) keeps the same minimiser; for moc h_e is the mixed context.
    cosreg      MLE-CosReg (001 eq. 3.17): γ/V² Σ_{i≠j} ê_iᵀê_j = γ (‖Σ_i ê_i‖² - V)/V², computed in O(V d).
    spectrum control (Wang et al. 2020, seed 002 §3): E = U diag(σ) Vᵀ (`SpectralEmbedding`, tied input and output)
                with λ1‖UᵀU-I‖²_F + λ2‖VᵀV-I‖²_F + λ3‖UᵀU-I‖²_2 + λ4‖VᵀV-I‖²_2 and a spectrum prior
                λ Σ_k (σ_k - c1 exp(-c2 k^γ))² ("exp") or λ Σ_k (σ_k - c1 k^(-γ))² ("poly", the paper's sign).

Numerics: logits are computed with float32 accumulation from the compute dtype (bf16 ok); transforms, mixtures and
log-sum-exps are float32. `nll` never builds `[N, V]` when V > `block_size`: the log-normaliser of every component
runs in equal vocabulary blocks with an online logsumexp under `jax.checkpoint` (as the adaptive softmax does).
Sharding: every per-vocabulary parameter carries the logical axis "vocab" (and "embed"), so the rules preset decides
(`fsdp_tp` shards the vocabulary over `tensor` and the log-sum-exp becomes a cross-shard reduction).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from xlgen.models.adaptive_softmax import vocab_blocks
from xlgen.models.layers import Dense, Dropout, normal, param, zeros
from xlgen.models.output_config import OUTPUT_LAYER_NAMES, OutputConfig, config_defaults  # noqa: F401
from xlgen.sharding import constrain

_NEG = -1e30


# ----------------------------------------------------------------------------------------------------------------
# Element-wise logit transforms
# ----------------------------------------------------------------------------------------------------------------


def sigsoftmax_logit(x: jax.Array) -> jax.Array:
    """log(exp(x) σ(x)) = x + log σ(x): softmax of this is SigSoftmax (Kanai et al. 2018; 001 eq. 3.5)."""
    return x + jax.nn.log_sigmoid(x)


def smooth_pl(x: jax.Array, c: float, k: float) -> jax.Array:
    """P̃L(x; c, k) = k(x - c) + c - (k - 1) softplus(x - c) (001 eq. 4.15): ≈ x above c, ≈ kx + c(1-k) below."""
    return k * (x - c) + c - (k - 1.0) * jax.nn.softplus(x - c)


def plif(x: jax.Array, slopes: jax.Array, t: float) -> jax.Array:
    """Increasing piecewise-linear f on [-t, t] with len(slopes) equal pieces, f(-t) = -t, continuous, extended
    linearly with the edge slopes outside (001 §3.3: knots k_i = -T + 2Ti/K, b_i from continuity)."""
    n = slopes.shape[0]
    w = 2.0 * t / n
    start = jnp.concatenate([jnp.zeros((1,), slopes.dtype), jnp.cumsum(slopes * w)[:-1]])  # f(k_i) + t
    idx = jnp.clip(jnp.floor((x + t) / w), 0, n - 1).astype(jnp.int32)
    return -t + start[idx] + slopes[idx] * (x + t - idx.astype(x.dtype) * w)


def sigmoid_tree_log_priors(a: jax.Array, n_leaves: int) -> jax.Array:
    """log π of a binary sigmoid tree: gates a `[..., K-1, R]` (heap order, node 1 = root) -> `[..., K, R]`.

    Leaf k follows the bits of k from the root: bit 0 takes σ(a_node), bit 1 takes 1 - σ(a_node) = σ(-a_node).
    K = 4 gives 001's π1 = γ1γ2, π2 = γ1(1-γ2), π3 = (1-γ1)γ3, π4 = (1-γ1)(1-γ3) (Mixtape, eq. 3.13)."""
    depth = int(round(math.log2(n_leaves)))
    if 2**depth != n_leaves:
        raise ValueError(f"mixtape needs n_experts a power of two (sigmoid tree), got {n_leaves}")
    leaves = []
    for leaf in range(n_leaves):
        node, acc = 1, 0.0
        for d in range(depth):
            bit = (leaf >> (depth - 1 - d)) & 1
            g = a[..., node - 1, :]
            acc = acc + jax.nn.log_sigmoid(-g if bit else g)
            node = 2 * node + bit
        leaves.append(acc if depth else jnp.zeros(a.shape[:-2] + a.shape[-1:], jnp.float32))
    return jnp.stack(leaves, axis=-2)


# ----------------------------------------------------------------------------------------------------------------
# Blocked log-sum-exp over the vocabulary
# ----------------------------------------------------------------------------------------------------------------


def vocab_logsumexp(score_fn: Callable, rows: Dict[str, jax.Array], vocab: int, block: int) -> jax.Array:
    """logsumexp over the last axis of `score_fn(rows) [..., R]`, rows = {name: `[V, ...]`}, float32.

    V <= block: one call. Otherwise the rows are padded into `vocab_blocks` equal blocks and an online logsumexp
    runs in a checkpointed scan, so at most `[..., block]` scores are live in either pass."""
    if vocab <= block:
        return jax.nn.logsumexp(_vocab_sharded(score_fn(rows)), axis=-1)
    n_blocks, size = vocab_blocks(vocab, block)
    pad = n_blocks * size - vocab
    blocked = {
        k: jnp.pad(v, [(0, pad)] + [(0, 0)] * (v.ndim - 1)).reshape((n_blocks, size) + v.shape[1:])
        for k, v in rows.items()
    }
    valid = (jnp.arange(n_blocks * size) < vocab).reshape(n_blocks, size)
    lead = jax.eval_shape(score_fn, {k: v[0] for k, v in blocked.items()}).shape[:-1]

    @jax.checkpoint
    def step(carry, xs):
        m, s = carry
        rows_i, valid_i = xs
        scores = jnp.where(valid_i, _vocab_sharded(score_fn(rows_i)), _NEG)
        m_new = jnp.maximum(m, scores.max(-1))
        s = s * jnp.exp(m - m_new) + jnp.exp(scores - m_new[..., None]).sum(-1)
        return (m_new, s), None

    init = (jnp.full(lead, _NEG, jnp.float32), jnp.zeros(lead, jnp.float32))
    (m, s), _ = jax.lax.scan(step, init, (blocked, valid))
    return m + jnp.log(s)


def _vocab_sharded(scores: jax.Array) -> jax.Array:
    """Scores `[N, E, R]` constrained to (batch, -, vocabulary) by logical names (a no-op outside a mesh)."""
    return constrain(scores, ("activation_batch", None, "activation_vocab"))


def _logits(hs: jax.Array, table: jax.Array, bias: jax.Array) -> jax.Array:
    """hs `[N, E, d]`, table `[R, d]`, bias `[R]` -> `[N, E, R]` float32."""
    out = jnp.einsum("ned,rd->ner", hs, table.astype(hs.dtype), preferred_element_type=jnp.float32)
    return out + bias.astype(jnp.float32)


# ----------------------------------------------------------------------------------------------------------------
# Output layers
# ----------------------------------------------------------------------------------------------------------------


class OutputLayer(nnx.Module):
    """Base: a softmax (or mixture of E softmaxes) over V rows tied to `embedding` (see the module doc).

    Subclasses implement `_prepare(h, table, bias, proj, lead, layers)` -> (state {name: `[N, ...]`}, rows
    {name: `[V, ...]`}, score_fn(state, rows, margin) -> `[N, E, R]` float32 scores, log_mix `[N, E]` or None for
    E = 1). `margin` `[N]` or None is subtracted from the raw logit before the layer's transform (AdvSoft). `lead`
    is the leading shape of h before flattening (`[batch, time]` for variational dropout); `layers`
    `[n_layer + 1, ..., d_model]` the per-layer states for layers with `needs_layers` (DOC), else None.
    """

    name = "base"
    supports_adv = True
    needs_layers = False

    def __init__(
        self,
        vocab_size: int,
        d_embed: int,
        d_proj: int,
        output: OutputConfig,
        *,
        tie_weights: bool = True,
        init_std: float = 0.02,
        proj_init_std: float = 0.01,
        block_size: int = 32768,
        n_layer: int = 1,
        rngs: nnx.Rngs,
    ):
        self.vocab_size, self.d_embed, self.d_proj, self.n_layer = vocab_size, d_embed, d_proj, n_layer
        self.output, self.tie_weights, self.block_size = output, tie_weights, block_size
        self.deterministic = False  # model.eval() sets True: AdvSoft and dropout only in training
        self.bias = param(rngs, zeros, (vocab_size,), ("vocab",))
        if tie_weights:
            self.table, self.proj = None, None
        else:
            self.table = param(rngs, normal(init_std), (vocab_size, d_embed), ("vocab", "embed"))
            self.proj = (
                param(rngs, normal(proj_init_std), (d_embed, d_proj), (None, "embed")) if d_embed != d_proj else None
            )
        if output.adv_eps > 0 and not self.supports_adv:
            raise ValueError(
                f"config.model.output.adv_eps: AdvSoft's closed form needs a logit linear in e_z; output_layer="
                f"{self.name!r} is a mixture (use softmax, sigsoftmax, gss, plif or moc)"
            )

    # -- weights ---------------------------------------------------------------------------------------------------
    def weights(self, embedding) -> Tuple[jax.Array, jax.Array, Optional[jax.Array]]:
        """(table `[V, d_e]`, bias `[V]`, projection `[d_e, d_model]` or None)."""
        if self.tie_weights:
            if embedding is None:
                raise ValueError(f"tied output layer {self.name!r} needs the embedding it is tied to")
            table, proj = embedding.cluster_weights(0)
        else:
            table, proj = self.table[...], (None if self.proj is None else self.proj[...])
        return table, self.bias[...], proj

    @staticmethod
    def project(h: jax.Array, proj: Optional[jax.Array]) -> jax.Array:
        """h `[..., d_model]` -> h Pᵀ `[..., d_e]` (identity without a projection)."""
        return h if proj is None else h @ proj.astype(h.dtype).T

    def _prepare(self, h, table, bias, proj, lead, layers):
        raise NotImplementedError

    def _flat_layers(self, layers, lead):
        """Per-layer states `[n_layer + 1, *lead, d]` -> `[n_layer + 1, N, d]` (None stays None)."""
        if layers is None:
            if self.needs_layers:
                raise ValueError(f"output layer {self.name!r} needs the per-layer states (layers=...)")
            return None
        if layers.shape[1:-1] != tuple(lead):
            raise ValueError(f"layers shape {layers.shape} does not match the states' leading shape {lead}")
        return layers.reshape(layers.shape[0], -1, layers.shape[-1])

    # -- outputs ---------------------------------------------------------------------------------------------------
    def log_probs(self, h: jax.Array, embedding=None, layers: Optional[jax.Array] = None) -> jax.Array:
        """log P `[..., V]` float32 for h `[..., d_model]` (and, for DOC, `layers` `[n_layer + 1, ..., d_model]`)."""
        lead = h.shape[:-1]
        table, bias, proj = self.weights(embedding)
        flat = self._flat_layers(layers, lead)
        state, rows, score_fn, log_mix = self._prepare(h.reshape(-1, h.shape[-1]), table, bias, proj, lead, flat)
        lp = jax.nn.log_softmax(_vocab_sharded(score_fn(state, rows, None)), axis=-1)  # [N, E, V]
        lp = lp[:, 0] if log_mix is None else jax.nn.logsumexp(lp + log_mix[..., None], axis=1)
        return lp.reshape(lead + (self.vocab_size,))

    def nll(self, h: jax.Array, labels: jax.Array, embedding=None, layers: Optional[jax.Array] = None) -> jax.Array:
        """-log P(labels) `[...]` float32 (labels < 0: 0) without building `[N, V]` when V > block_size.

        Per component e: target score t_e (gathered rows) minus the blocked log-normaliser; mixtures combine
        log Σ_e π_e exp(t_e - lse_e). AdvSoft (training): t' = score with the margin ε‖h_e‖ and
        lse' = lse + log(1 + exp(t - lse)(exp(t' - t) - 1)) (the target's own term in the normaliser changes)."""
        lead = labels.shape
        flat = self._flat_layers(layers, h.shape[:-1])
        h_lead = h.shape[:-1]
        h = h.reshape(-1, h.shape[-1])
        labels = labels.reshape(-1)
        table, bias, proj = self.weights(embedding)
        state, rows, score_fn, log_mix = self._prepare(h, table, bias, proj, h_lead, flat)
        idx = jnp.clip(labels, 0, self.vocab_size - 1)
        target_rows = {k: jnp.take(v, idx, axis=0) for k, v in rows.items()}

        def target(margin):
            def one(s, r, m):
                add = lambda x: x[None]  # noqa: E731
                m = None if m is None else m[None]
                return score_fn(jax.tree.map(add, s), jax.tree.map(add, r), m)[0, :, 0]

            if margin is None:
                return jax.vmap(lambda s, r: one(s, r, None))(state, target_rows)
            return jax.vmap(one)(state, target_rows, margin)

        t = target(None)  # [N, E]
        lse = vocab_logsumexp(lambda r: score_fn(state, r, None), rows, self.vocab_size, self.block_size)
        eps = self.output.adv_eps
        if eps > 0 and not self.deterministic:
            margin = eps * self.adv_norm(state)  # [N]
            t_adv = target(margin)
            frac = jnp.exp(t - lse) * jnp.expm1(t_adv - t)
            lse = lse + jnp.log(jnp.maximum(1.0 + frac, 1e-30))
            t = t_adv
        lp = t - lse
        lp = lp[:, 0] if log_mix is None else jax.nn.logsumexp(lp + log_mix, axis=1)
        return jnp.where(labels >= 0, -lp, 0.0).reshape(lead)

    def adv_norm(self, state) -> jax.Array:
        """‖h_e‖ `[N]` of the (single) context vector, float32 (AdvSoft's margin is ε times this)."""
        he = state["h"][:, 0].astype(jnp.float32)
        return jnp.sqrt(jnp.sum(he * he, axis=-1))

    # -- regularisers ----------------------------------------------------------------------------------------------
    def regularization(self, embedding=None) -> Tuple[jax.Array, Dict[str, jax.Array]]:
        """(penalty, {name: value}) of the parameter-only regularisers: CosReg and spectrum control."""
        o = self.output
        total = jnp.zeros((), jnp.float32)
        terms: Dict[str, jax.Array] = {}
        if o.cosreg > 0:
            table, _, _ = self.weights(embedding)
            terms["cosreg"] = cosreg_penalty(table)
            total = total + o.cosreg * terms["cosreg"]
        if o.spectrum_control:
            if not isinstance(embedding, SpectralEmbedding):
                raise ValueError("spectrum_control needs the model's SpectralEmbedding")
            pen, sc_terms = embedding.penalty(o)
            terms.update(sc_terms)
            total = total + pen
        return total, terms


class _SingleSoftmax(OutputLayer):
    """softmax(f(h_eᵀE + b)) with an element-wise increasing transform f (identity here)."""

    name = "softmax"

    def transform(self, x: jax.Array) -> jax.Array:
        return x

    def contexts(self, h: jax.Array, proj, lead) -> jax.Array:
        """The context vectors `[N, 1, d_e]`."""
        del lead
        return self.project(h, proj)[:, None, :]

    def _prepare(self, h, table, bias, proj, lead, layers):
        del layers
        transform = self.transform_fn()

        def score_fn(state, rows, margin):
            x = _logits(state["h"], rows["table"], rows["bias"])
            if margin is not None:
                x = x - margin[:, None, None]
            return transform(x)

        return {"h": self.contexts(h, proj, lead)}, {"table": table, "bias": bias}, score_fn, None

    def transform_fn(self) -> Callable:
        return self.transform


class Softmax(_SingleSoftmax):
    """P = softmax(h_eᵀE + b): rank(log P) over contexts <= d_e + 2 (d_e + 1 without the bias; 001 §2.5)."""

    name = "softmax"


class SigSoftmax(_SingleSoftmax):
    """P ∝ exp(l) σ(l) (001 eq. 3.5): the normaliser of g(l) = exp(l + log σ(l)); no new parameters."""

    name = "sigsoftmax"

    def transform(self, x):
        return sigsoftmax_logit(x)


class GSS(_SingleSoftmax):
    """Generalised SigSoftmax GSS(l; c, k) = softmax(P̃L(l; c, k)) (001 eq. 4.16); c, k fixed hyperparameters."""

    name = "gss"

    def transform(self, x):
        return smooth_pl(x, self.output.c, self.output.k)


def plif_slope_init(kind: str) -> Callable:
    """Initialiser of PLIF's slope parameters v (slopes softplus(v)). "random" (001 §5.7.1: "all these 10^5
    parameters are initialized with random positive values"; the distribution is not given): v ~ U(0, 1), i.e.
    slopes in (0.69, 1.31); "identity": softplus(v) = 1, f(x) = x at init."""
    if kind == "random":
        return lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, 0.0, 1.0)
    if kind == "identity":
        return lambda key, shape, dtype: jnp.full(shape, math.log(math.e - 1.0), dtype)
    raise ValueError(f"config.model.output.plif_init={kind!r}: expected 'random' or 'identity'")


class PLIF(_SingleSoftmax):
    """LMS-PLIF: softmax(f(l)), f learned increasing piecewise linear (`plif`); slopes softplus(v), v random
    positive at init (001 §5.7.1; `plif_init="identity"` starts at f(x) = x). LMS-PLIF† (frozen slopes) is an
    optimizer setting: `optimizer.param_groups=({"pattern": r"slope_logits", "frozen": True},)`."""

    name = "plif"

    def __init__(self, *args, rngs: nnx.Rngs, **kw):
        super().__init__(*args, rngs=rngs, **kw)
        n = self.output.plif_intervals
        self.slope_logits = param(rngs, plif_slope_init(self.output.plif_init), (n,), (None,))

    def transform_fn(self):
        slopes = jax.nn.softplus(self.slope_logits[...].astype(jnp.float32))
        t = float(self.output.plif_range)
        return lambda x: plif(x, slopes, t)


def latent_init_std(d_in: int) -> float:
    """Init std of the MoS / Mixtape context projections: PyTorch's default `nn.Linear` scale 1/sqrt(3 d_in), as in
    the original MoS code. With the model's init_std (0.02) tanh(W h) starts ~6x smaller than h at d = 64, the logits
    start near-uniform and the mixture lags the softmax for hundreds of steps."""
    return 1.0 / math.sqrt(3.0 * d_in)


def expert_dropout(x: jax.Array, drop: Dropout, lead) -> jax.Array:
    """Dropout on context vectors x `[N, K, d]` of N = prod(lead) positions; `drop` with broadcast_dims (1,) (the
    variational kind) draws one mask per sequence (lead[0]) and (k, feature), shared over the time axes lead[1:]."""
    if drop.rate == 0.0 or not drop.broadcast_dims:
        return drop(x)
    b = lead[0] if len(lead) else 1
    return drop(x.reshape((b, -1) + x.shape[1:])).reshape(x.shape)


def make_expert_dropout(output: OutputConfig, rngs: nnx.Rngs) -> Dropout:
    """The "MoS dropout" on h_{c,k}: variational (one mask per sequence, 000 A.7) or per element."""
    dims = (1,) if output.expert_dropout_kind == "variational" else ()
    return Dropout(output.expert_dropout, broadcast_dims=dims, rngs=rngs)


class _Experts(nnx.Module):
    """h_{c,k} = tanh(W_k h) `[N, K, d_out]` (with the latent bias of the original code, and expert dropout) and
    log π_c = log softmax(W_π h) `[N, K]` (no bias unless `prior_bias`; 000 A.2.4)."""

    def __init__(self, d_in: int, d_out: int, output: OutputConfig, rngs: nnx.Rngs):
        std = latent_init_std(d_in)  # the original MoS initialisation, see latent_init_std
        k = output.n_experts
        self.n_experts = k
        self.latent = Dense((d_in,), (k, d_out), ("embed",), (None, "embed"), init_std=std, rngs=rngs)
        self.prior = Dense((d_in,), (k,), ("embed",), (None,), use_bias=output.prior_bias, init_std=std, rngs=rngs)
        self.drop = make_expert_dropout(output, rngs)

    def __call__(self, h: jax.Array, lead=None):
        """h `[N, d_in]` -> (h_k `[N, K, d_out]`, log π `[N, K]` float32); `lead` = h's shape before flattening."""
        hk = expert_dropout(jnp.tanh(self.latent(h)), self.drop, h.shape[:1] if lead is None else lead)
        log_prior = jax.nn.log_softmax(self.prior(h).astype(jnp.float32), axis=-1)
        return hk, log_prior


def _expert_width(output: OutputConfig, d_embed: int, d_proj: int) -> int:
    """Width of h_{c,k}: d_e ("embed", 001 §3.1.2) or d_model ("model", projected afterwards)."""
    return d_embed if output.expert_space == "embed" else d_proj


class MoS(OutputLayer):
    """Mixture of Softmaxes: P = Σ_k π_k softmax(h_kᵀE + b) (001 eq. 3.1); log-space mixture in float32."""

    name = "mos"
    supports_adv = False

    def __init__(self, vocab_size, d_embed, d_proj, output, *, init_std=0.02, rngs, **kw):
        super().__init__(vocab_size, d_embed, d_proj, output, init_std=init_std, rngs=rngs, **kw)
        self.experts = _Experts(d_proj, _expert_width(self.output, d_embed, d_proj), self.output, rngs)

    def expert_contexts(self, hk: jax.Array, proj) -> jax.Array:
        """h_{c,k} in the embedding space: as computed ("embed") or P·h_{c,k} ("model")."""
        return hk if self.output.expert_space == "embed" else self.project(hk, proj)

    def _prepare(self, h, table, bias, proj, lead, layers):
        del layers
        hk, log_prior = self.experts(h, lead)
        state = {"h": self.expert_contexts(hk, proj)}

        def score_fn(state, rows, margin):
            del margin
            return _logits(state["h"], rows["table"], rows["bias"])

        return state, {"table": table, "bias": bias}, score_fn, log_prior


class MoC(_SingleSoftmax):
    """Mixture of Contexts: softmax((Σ_k π_k h_k)ᵀE + b) (001 eq. 3.2): MoS's parameters, still rank <= d_e + 2."""

    name = "moc"

    def __init__(self, vocab_size, d_embed, d_proj, output, *, init_std=0.02, rngs, **kw):
        super().__init__(vocab_size, d_embed, d_proj, output, init_std=init_std, rngs=rngs, **kw)
        self.experts = _Experts(d_proj, _expert_width(self.output, d_embed, d_proj), self.output, rngs)

    def contexts(self, h, proj, lead):
        hk, log_prior = self.experts(h, lead)
        mixed = jnp.einsum("nk,nkd->nd", jnp.exp(log_prior).astype(hk.dtype), hk)
        mixed = mixed if self.output.expert_space == "embed" else self.project(mixed, proj)
        return mixed[:, None, :]


class DOC(MoS):
    """Direct Output Connection (Takase et al. 2018; 001 §3.1.6): a mixture of R = Σ_i v_i softmaxes whose
    contexts come from several layers, P = Σ_r π_r softmax(g_rᵀE + b) (eq. 3.14), g_{c,r} = tanh(W_{r,i} o_{c,i})
    (eq. 3.15, with the tanh of Takase et al. and MoS; `doc_tanh=False` drops it as eq. 3.15 is printed),
    π_c = softmax(U o_{c,top}) (eq. 3.16, no bias). `doc_counts` = (v_top, v_top-1, ...): o_top is the model's
    final state h (after its dropout), o_{top-j} the output of the block j below, o_0 the embedding output.
    With `doc_counts=(K,)` DOC is MoS with K experts (the same parameters, `experts` = the top layer's)."""

    name = "doc"
    needs_layers = True

    def __init__(self, vocab_size, d_embed, d_proj, output, *, init_std=0.02, rngs, n_layer: int = 1, **kw):
        output = OutputConfig.from_any(output)
        counts = output.doc_counts
        if len(counts) > n_layer + 1:
            raise ValueError(
                f"config.model.output.doc_counts={counts}: {len(counts)} entries, but the model has {n_layer} "
                f"blocks + the embedding = {n_layer + 1} states"
            )
        top = dataclasses.replace(output, n_experts=sum(counts))  # the prior is over all R components
        super().__init__(vocab_size, d_embed, d_proj, top, init_std=init_std, rngs=rngs, n_layer=n_layer, **kw)
        width = _expert_width(self.output, d_embed, d_proj)
        std = latent_init_std(d_proj)
        # experts.latent holds the top layer's v_top projections; one Dense per lower state with v_i > 0
        self.experts.latent = Dense((d_proj,), (counts[0], width), ("embed",), (None, "embed"), init_std=std, rngs=rngs)
        self.lower = nnx.List(
            [
                Dense((d_proj,), (v, width), ("embed",), (None, "embed"), init_std=std, rngs=rngs) if v else None
                for v in counts[1:]
            ]
        )

    def _prepare(self, h, table, bias, proj, lead, layers):
        """h `[N, d]` the top state, layers `[n_layer + 1, N, d]` (layers[-1-j] = output of the j-th block from the
        top, layers[0] the embedding output)."""
        act = jnp.tanh if self.output.doc_tanh else (lambda x: x)
        log_prior = jax.nn.log_softmax(self.experts.prior(h).astype(jnp.float32), axis=-1)
        parts = [act(self.experts.latent(h))] if self.output.doc_counts[0] else []
        for j, dense in enumerate(self.lower, start=1):
            if dense is not None:
                parts.append(act(dense(layers[layers.shape[0] - 1 - j].astype(h.dtype))))
        g = expert_dropout(jnp.concatenate(parts, axis=1), self.experts.drop, lead)  # [N, R, width]
        state = {"h": self.expert_contexts(g, proj)}

        def score_fn(state, rows, margin):
            del margin
            return _logits(state["h"], rows["table"], rows["bias"])

        return state, {"table": table, "bias": bias}, score_fn, log_prior


class Mixtape(OutputLayer):
    """Mixtape: P ∝ exp(Σ_k π_{c,z,k} h_{c,k}ᵀe_z + b_z) (001 eq. 3.12-3.13), h_{c,k} = tanh(W_k h), per-token
    priors π_{c,z,·} = sigmoid tree over gates a_{c,z,k} = v_zᵀ tanh(U_k h) + u_kᵀh + b_{z,k} (k < K)."""

    name = "mixtape"
    supports_adv = False

    def __init__(self, vocab_size, d_embed, d_proj, output, *, init_std=0.02, rngs, **kw):
        super().__init__(vocab_size, d_embed, d_proj, output, init_std=init_std, rngs=rngs, **kw)
        k, d2 = output.n_experts, output.d2
        sigmoid_tree_log_priors(jnp.zeros((max(k - 1, 1), 1)), k)  # validates K
        std = latent_init_std(d_proj)
        self.latent = Dense((d_proj,), (k, d_proj), ("embed",), (None, "embed"), init_std=std, rngs=rngs)
        self.drop = Dropout(output.expert_dropout, rngs=rngs)
        g = max(k - 1, 1)
        self.gate_hidden = Dense((d_proj,), (g, d2), ("embed",), (None, None), init_std=std, rngs=rngs)
        self.gate_linear = Dense((d_proj,), (g,), ("embed",), (None,), use_bias=False, init_std=std, rngs=rngs)
        self.gate_vocab = param(rngs, normal(init_std), (vocab_size, d2), ("vocab", None))
        self.gate_bias = param(rngs, zeros, (vocab_size, g), ("vocab", None))

    def _prepare(self, h, table, bias, proj, lead, layers):
        del lead, layers
        k = self.output.n_experts
        hk = self.project(self.drop(jnp.tanh(self.latent(h))), proj)  # [N, K, d_e]
        state = {
            "h": hk,
            "g": jnp.tanh(self.gate_hidden(h)),  # [N, K-1, d2]
            "u": self.gate_linear(h).astype(jnp.float32),  # [N, K-1]
        }
        rows = {"table": table, "bias": bias, "v": self.gate_vocab[...], "b": self.gate_bias[...]}

        def score_fn(state, rows, margin):
            del margin
            lk = jnp.einsum(
                "nkd,rd->nkr", state["h"], rows["table"].astype(state["h"].dtype), preferred_element_type=jnp.float32
            )
            if k == 1:
                mixed = lk[:, 0]
            else:
                a = jnp.einsum(
                    "ngd,rd->ngr", state["g"], rows["v"].astype(state["g"].dtype), preferred_element_type=jnp.float32
                )
                a = a + state["u"][..., None] + rows["b"].astype(jnp.float32).T[None]
                mixed = jnp.sum(jnp.exp(sigmoid_tree_log_priors(a, k)) * lk, axis=1)
            return (mixed + rows["bias"].astype(jnp.float32))[:, None, :]

        return state, rows, score_fn, None


OUTPUT_LAYERS: Dict[str, type] = {
    "softmax": Softmax,
    "sigsoftmax": SigSoftmax,
    "gss": GSS,
    "plif": PLIF,
    "mos": MoS,
    "moc": MoC,
    "doc": DOC,
    "mixtape": Mixtape,
}


def make_output_layer(name: str, vocab_size: int, d_embed: int, d_proj: int, output, **kw) -> OutputLayer:
    """Build the registered output layer `name` (not `adaptive`, which lives in `adaptive_softmax`)."""
    if name not in OUTPUT_LAYERS:
        raise ValueError(f"config.model.output_layer={name!r}: unknown; expected one of {list(OUTPUT_LAYER_NAMES)}")
    return OUTPUT_LAYERS[name](vocab_size, d_embed, d_proj, OutputConfig.from_any(output), **kw)


# ----------------------------------------------------------------------------------------------------------------
# Regularisers and the spectrum-control parameterisation
# ----------------------------------------------------------------------------------------------------------------


def cosreg_penalty(table: jax.Array) -> jax.Array:
    """(1/V²) Σ_{i≠j} ê_iᵀê_j = (‖Σ_i ê_i‖² - V) / V² for table `[V, d]` (ê = e/‖e‖): O(V d), float32."""
    e = table.astype(jnp.float32)
    e_hat = e * jax.lax.rsqrt(jnp.maximum(jnp.sum(e * e, axis=-1, keepdims=True), 1e-24))
    s = jnp.sum(e_hat, axis=0)
    v = table.shape[0]
    return (jnp.sum(s * s) - jnp.sum(e_hat * e_hat)) / (v * v)


def spectrum_prior(k: jax.Array, kind: str, c1: float, c2: float, gamma: float) -> jax.Array:
    """Target singular values at 1-based index k: exp c1·exp(-c2 k^γ), poly c1·k^(-γ) (seed 002 §3.2)."""
    k = k.astype(jnp.float32)
    if kind == "exp":
        return c1 * jnp.exp(-c2 * k**gamma)
    if kind == "poly":
        return c1 * k ** (-gamma)
    raise ValueError(f"spectrum prior {kind!r}: expected 'exp' or 'poly'")


def singular_values(sigma: jax.Array, order: str = "sorted") -> jax.Array:
    """The σ_k the spectrum prior compares with its descending target. "sorted": the singular values of
    U diag(σ) Vᵀ for orthonormal U, V, i.e. |σ| in descending order (a negative σ_k is a sign flip of u_k, so σ_k
    of seed 002 — "the k-th largest singular value", positive — is the k-th largest |σ|); "index": σ as stored
    (signs and positions kept, so the prior may pull an unordered or negative σ_k)."""
    if order == "sorted":
        return -jnp.sort(-jnp.abs(sigma))
    if order == "index":
        return sigma
    raise ValueError(f"config.model.output.sc_prior_order={order!r}: expected 'sorted' or 'index'")


def spectral_from_table(table) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """W `[V, d]` -> (U `[V, r]`, σ `[r]` descending, V `[d, r]`) with W = U diag(σ) Vᵀ, r = min(V, d) (thin SVD)."""
    w = np.asarray(table, np.float64)
    u, s, vt = np.linalg.svd(w, full_matrices=False)
    return u.astype(np.float32), s.astype(np.float32), vt.T.astype(np.float32)


def table_from_spectral(u, sigma, v) -> jax.Array:
    """U diag(σ) Vᵀ `[V, d]` (float32)."""
    u, sigma, v = (jnp.asarray(x, jnp.float32) for x in (u, sigma, v))
    return (u * sigma) @ v.T


def collapse_spectral_params(params: Dict[str, Any], prefix: str = "embedding/") -> Dict[str, Any]:
    """A {path: array} parameter dict with `<prefix>u/sigma/v` replaced by `<prefix>tables/0` = U diag(σ) Vᵀ
    (for export / finetuning / loading into a model without spectrum control). Other entries are kept."""
    out = {k: v for k, v in params.items() if k not in (prefix + "u", prefix + "sigma", prefix + "v")}
    out[prefix + "tables/0"] = np.asarray(
        table_from_spectral(params[prefix + "u"], params[prefix + "sigma"], params[prefix + "v"])
    )
    return out


def expand_spectral_params(params: Dict[str, Any], prefix: str = "embedding/") -> Dict[str, Any]:
    """Inverse of `collapse_spectral_params`: `<prefix>tables/0` -> its thin SVD (exact up to round-off)."""
    out = {k: v for k, v in params.items() if k != prefix + "tables/0"}
    u, s, v = spectral_from_table(params[prefix + "tables/0"])
    out.update({prefix + "u": u, prefix + "sigma": s, prefix + "v": v})
    return out


class SpectralEmbedding(nnx.Module):
    """Tied word embedding E = U diag(σ) Vᵀ (seed 002 eq. 3): U `[V, r]` ("vocab", None), σ `[r]`, V `[d_e, r]`.

    Input: sqrt(d_proj) · (U[x] ⊙ σ) Vᵀ (Pᵀ when d_e != d_proj), as `AdaptiveEmbedding` with div_val 1.
    Output: `cluster_weights(0)` gives the full table (and projection) to a non-adaptive output layer;
    `output_table(0)` / `output_proj(0)` give them to the adaptive softmax with div_val 1, whose clusters are row
    slices of the one table E (the head's shortlist rows and each tail's rows): the spectrum of E is then the
    spectrum of the whole output embedding, and the cluster logits W_c and per-cluster output projections are
    untouched (div_val > 1 is refused: clusters of different widths form no single matrix E to factorise; see
    docs/output_layers.md). Initialised as the thin SVD of a normal(init_std) table, i.e. the same distribution
    as the unfactorised embedding.
    """

    def __init__(
        self,
        vocab_size: int,
        d_embed: int,
        d_proj: int,
        *,
        init_std: float = 0.02,
        proj_init_std: float = 0.01,
        rngs: nnx.Rngs,
    ):
        self.vocab_size, self.d_embed, self.d_proj = vocab_size, d_embed, d_proj
        r = min(vocab_size, d_embed)
        w = normal(init_std)(rngs.params(), (vocab_size, d_embed), jnp.float32)
        u, s, vt = jnp.linalg.svd(w, full_matrices=False)
        meta = dict(eager_sharding=False)
        self.u = nnx.Param(u, out_sharding=("vocab", None), **meta)
        self.sigma = nnx.Param(s, out_sharding=(None,), **meta)
        self.v = nnx.Param(vt.T[:, :r], out_sharding=("embed", None), **meta)
        self.proj = (
            param(rngs, normal(proj_init_std), (d_embed, d_proj), (None, "embed")) if d_embed != d_proj else None
        )

    def table(self) -> jax.Array:
        """E = U diag(σ) Vᵀ `[V, d_e]`."""
        return (self.u[...] * self.sigma[...]) @ self.v[...].T

    def cluster_weights(self, k: int = 0):
        if k != 0:
            raise ValueError("SpectralEmbedding has a single cluster (no adaptive cutoffs)")
        return self.table(), (None if self.proj is None else self.proj[...])

    def output_table(self, t: int) -> jax.Array:
        """Table t of a tied adaptive softmax (div_val 1: only t = 0, the whole E)."""
        if t != 0:
            raise ValueError("SpectralEmbedding has one table (adaptive softmax with div_val=1 only)")
        return self.table()

    def output_proj(self, t: int) -> Optional[jax.Array]:
        if t != 0:
            raise ValueError("SpectralEmbedding has one table (adaptive softmax with div_val=1 only)")
        return None if self.proj is None else self.proj[...]

    def __call__(self, ids: jax.Array, dtype=jnp.float32) -> jax.Array:
        rows = jnp.take(self.u[...], ids, axis=0, mode="clip") * self.sigma[...]
        emb = (rows @ self.v[...].T).astype(dtype)
        if self.proj is not None:
            emb = emb @ self.proj[...].astype(dtype)
        return emb * jnp.asarray(math.sqrt(self.d_proj), dtype)

    def penalty(self, o: OutputConfig) -> Tuple[jax.Array, Dict[str, jax.Array]]:
        """λ1‖UᵀU-I‖²_F + λ2‖VᵀV-I‖²_F + λ3‖UᵀU-I‖²_2 + λ4‖VᵀV-I‖²_2 + the spectrum prior (seed 002 §3)."""
        u, s, v = self.u[...].astype(jnp.float32), self.sigma[...].astype(jnp.float32), self.v[...].astype(jnp.float32)
        eye = jnp.eye(s.shape[0], dtype=jnp.float32)
        du, dv = u.T @ u - eye, v.T @ v - eye
        terms = {"sc_u_fro": jnp.sum(du * du), "sc_v_fro": jnp.sum(dv * dv)}
        total = o.sc_lambda_u_fro * terms["sc_u_fro"] + o.sc_lambda_v_fro * terms["sc_v_fro"]
        if o.sc_lambda_u_spec > 0 or o.sc_lambda_v_spec > 0:
            terms["sc_u_spec"] = jnp.max(jnp.abs(jnp.linalg.eigvalsh(du))) ** 2
            terms["sc_v_spec"] = jnp.max(jnp.abs(jnp.linalg.eigvalsh(dv))) ** 2
            total = total + o.sc_lambda_u_spec * terms["sc_u_spec"] + o.sc_lambda_v_spec * terms["sc_v_spec"]
        if o.sc_prior != "none":
            target = spectrum_prior(jnp.arange(1, s.shape[0] + 1), o.sc_prior, o.sc_c1, o.sc_c2, o.sc_gamma)
            terms["sc_prior"] = jnp.sum((singular_values(s, o.sc_prior_order) - target) ** 2)
            total = total + o.sc_lambda_prior * terms["sc_prior"]
        return total, terms
