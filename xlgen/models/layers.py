"""Small building blocks shared by the three model families.

Every parameter carries logical axis names (stored as NNX `out_sharding` metadata, with eager sharding off so
modules can be built with or without a mesh). The trainer maps logical names to mesh axes with the rules in
`xlgen.sharding`. Logical names used by models:

    vocab   vocabulary rows of embeddings / softmax
    embed   model width d_model (also adaptive-embedding widths)
    heads   attention heads n_head
    kv      per-head width d_head
    mlp     feed-forward width d_inner
    layers  stacked-layer axis (scan over layers)
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from xlgen.sharding import UNCONSTRAINED, constrain

LogicalAxes = Sequence[Optional[str]]

# ------------------------------------------------------------------------------------------ rematerialisation

# Activations a layer names with `jax.ad_checkpoint.checkpoint_name` (every family: the shared attention layer and
# the FFN), i.e. the outputs of the layer's weight products, which the named policies below save:
#   qkv_proj        the query / key / value heads x W_q, x W_k, x W_v `[b, l, n, d_head]`
#   attention_out   attn_vec W_o `[b, q, d]`: the attention's output projection (before dropout, residual, LN)
#   mlp_hidden      x W_1 + b_1 `[b, l, d_inner]`: the FFN's hidden layer before its activation
#   mlp_out         act(.) W_2 + b_2 `[b, l, d]`: the FFN's output projection (before dropout, residual, LN)
QKV_PROJ, ATTENTION_OUT, MLP_HIDDEN, MLP_OUT = "qkv_proj", "attention_out", "mlp_hidden", "mlp_out"

# `model.remat` by name -> what the backward pass keeps of each layer's forward (the rest is recomputed):
#   none            no rematerialisation: everything the backward pass needs is kept (today's remat=False)
#   full            nothing but the layer's inputs (today's remat=True): the whole layer runs again
#   dots            every matmul output (projections, FFN, attention scores and context): no product runs again
#   dots_no_batch   matmul outputs without batch dimensions in the contraction: the weight products (projections,
#                   FFN) are kept, the attention's score / context products run again
#   attention_out   the attention's weight products (qkv_proj, attention_out): its score / context products and
#                   the whole FFN run again
#   mlp             the FFN's products (mlp_hidden, mlp_out): the attention runs again
#   offload_dots    as dots_no_batch, but the kept products are moved to host memory and back (TPU: pinned host)
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch", "attention_out", "mlp", "offload_dots")
_REMAT_ALIASES = {True: "full", False: "none", "true": "full", "false": "none", "True": "full", "False": "none"}


def remat_policy(value) -> str:
    """The policy name of a `model.remat` value: one of REMAT_POLICIES, or True / False (and their spellings, from
    older configs and `config.json` files) for full / none. Anything else raises naming the choices."""
    name = _REMAT_ALIASES.get(value, value) if isinstance(value, (bool, str)) else value
    if name not in REMAT_POLICIES:
        raise ValueError(f"model.remat={value!r}: expected one of {list(REMAT_POLICIES)} (or True / False)")
    return name


def checkpoint_policy(name: str):
    """The `jax.checkpoint_policies` entry of a policy name (None = save nothing; 'none' has no policy)."""
    p = jax.checkpoint_policies
    return {
        "full": None,
        "dots": p.checkpoint_dots,
        "dots_no_batch": p.dots_with_no_batch_dims_saveable,
        "attention_out": p.save_only_these_names(QKV_PROJ, ATTENTION_OUT),
        "mlp": p.save_only_these_names(MLP_HIDDEN, MLP_OUT),
        "offload_dots": p.offload_dot_with_no_batch_dims("device", "pinned_host"),
    }[remat_policy(name)]


def rematerialize(fn: Callable, remat) -> Callable:
    """`fn` (a function of NNX modules and arrays, e.g. one layer's forward) under `nnx.remat` with the policy
    `remat` names (`remat_policy`); `fn` itself for 'none'. Gradients equal the unrematerialised ones."""
    name = remat_policy(remat)
    if name == "none":
        return fn
    return nnx.remat(fn, policy=checkpoint_policy(name))


# ------------------------------------------------------------------------------------------ precision

# The precision policy of a model config (every family; defaults = float32 everywhere but `dtype`'s choice):
#   param_dtype     storage dtype of the parameters (the train state; `xlgen.train.program` casts at init)
#   dtype           compute dtype of the layers (matmul operands, activations, memory)
#   scores_dtype    dtype of the attention scores `[b, n, q, k]` in memory: the sum of their terms, the scaling, the
#                   masking and the probabilities the softmax returns (what the score tensors cost in HBM)
#   softmax_dtype   dtype the attention softmax computes in (max, exp, sum, division), on the scores cast to it; its
#                   probabilities are cast back to `scores_dtype`. The two differ in the originals' TPU code:
#                   Funnel-Transformer keeps bfloat16 scores with a float32 softmax (its `safe_softmax`), XLNet's
#                   `use_bfloat16` path both bfloat16, Transformer-XL's both float32 (configs/pretrain/*)
#   logits_dtype    dtype of the LM / MLM output logits and their log-softmax (XLNet, Funnel; Transformer-XL's
#                   adaptive and blocked softmax layers accumulate in float32 and accept float32 only)
# plus `optimizer.state_dtype` (Adam moments; `xlgen.train.program`).
FLOAT_DTYPES = ("float32", "bfloat16")
PRECISION_KEYS = ("param_dtype", "dtype", "scores_dtype", "softmax_dtype", "logits_dtype")


def check_precision(config, keys: Sequence[str] = PRECISION_KEYS) -> None:
    """Every precision field of a model config dataclass names one of FLOAT_DTYPES; else ValueError naming it."""
    for key in keys:
        value = getattr(config, key)
        if value not in FLOAT_DTYPES:
            raise ValueError(f"{type(config).__name__}.{key}={value!r}: expected one of {list(FLOAT_DTYPES)}")


def named(x: jax.Array, name: str) -> jax.Array:
    """`x` tagged as the activation `name` for the remat policies (an identity otherwise)."""
    return checkpoint_name(x, name)


def _fmix32(h: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser (a bijection with full avalanche)."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def hashed_bits(seed: jax.Array, shape: Sequence[int]) -> jax.Array:
    """uint32 `shape` random bits: fmix32(fmix32(i ^ s0) + s1) of each element's row-major index i, for a
    uint32[2] seed. Counter-based like threefry (a pure function of seed and position, the same under any
    sharding), but two multiply-xorshift rounds: on XLA:CPU threefry-based `jax.random.bernoulli` costs ~100 ns per
    element and dominated dropout-heavy train steps; this is ~1000x cheaper and fuses into its consumer."""
    shape = tuple(int(d) for d in shape)
    idx = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):
        idx = idx + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride & 0xFFFFFFFF)
        stride *= shape[axis]
    return _fmix32(_fmix32(idx ^ seed[0]) + seed[1])


def keep_mask(key: jax.Array, shape: Sequence[int], keep_prob: float) -> jax.Array:
    """bool `shape`, True with probability `keep_prob` (up to 2^-32): `hashed_bits` seeded by two words drawn from
    `key` (the dropout stream's threefry key), compared with a threshold.

    Why not `jax.random` with another `jax_default_prng_impl`: on XLA:CPU (jax 0.10.2) the same keep mask and
    select over `[4,4,512,512]` costs ~0.8 ns per element this way, ~6 with philox4x32 and ~20 with threefry2x32,
    rbg or unsafe_rbg, which at a dropout mask per attention layer is a large share of a train step
    (docs/performance.md, "Alternatives not taken"). The hash is as reproducible: a pure function of (key, position),
    the same under any sharding, so resume is exact."""
    return hashed_bits(keep_seed_words(key), shape) < jnp.uint32(keep_threshold(keep_prob))


def keep_seed_words(key: jax.Array) -> jax.Array:
    """The two uint32 words seeding `keep_mask`'s hash, drawn from `key`."""
    return jax.random.bits(key, (2,), jnp.uint32)


def keep_threshold(keep_prob: float) -> int:
    """Bits below this (as uint32) are kept: round(keep_prob · 2^32), at most 2^32 - 1."""
    return min(int(round(keep_prob * 2.0**32)), 2**32 - 1)


class Dropout(nnx.Dropout):
    """`nnx.Dropout` (same RNG stream, same `rate` / `deterministic` / `broadcast_dims` semantics) whose keep mask
    is `keep_mask`: masks a pure function of (key, position), so resume and sharding equality hold as before."""

    def __call__(self, inputs, *, deterministic: Optional[bool] = None, rngs=None) -> jax.Array:
        det = self.deterministic if deterministic is None else deterministic
        if self.rate == 0.0 or det:
            return inputs
        if self.rate == 1.0:
            return jnp.zeros_like(inputs)
        key = self._key(rngs)
        keep_prob = 1.0 - self.rate
        shape = list(inputs.shape)
        for dim in self.broadcast_dims:
            shape[dim] = 1
        mask = jnp.broadcast_to(keep_mask(key, shape, keep_prob), inputs.shape)
        return jax.lax.select(mask, inputs / jnp.asarray(keep_prob, inputs.dtype), jnp.zeros_like(inputs))

    def _key(self, rngs=None) -> jax.Array:
        stream = self.rngs if rngs is None else rngs
        if isinstance(stream, jax.Array):
            return stream
        return stream.dropout() if isinstance(stream, nnx.Rngs) else stream()

    def draw(self, *, deterministic: Optional[bool] = None, rngs=None) -> Optional[jax.Array]:
        """The key `__call__` would draw now, consumed (None where it would draw none): `__call__(x, rngs=key)`
        later applies the same mask, for callers that must keep the stream's order while computing out of it."""
        det = self.deterministic if deterministic is None else deterministic
        if self.rate in (0.0, 1.0) or det:
            return None
        return self._key(rngs)

    def keep_seed(self, *, deterministic: Optional[bool] = None, rngs=None):
        """(seed uint32 `[2]`, keep probability) of the keep mask `__call__` would draw now (`keep_mask`: the
        bits `hashed_bits(seed, shape)`), consuming the same key; None when it would return its input unchanged.
        For kernels that apply this dropout themselves (`xlgen.models.tpu_attention`)."""
        det = self.deterministic if deterministic is None else deterministic
        if self.rate == 0.0 or det:
            return None
        if self.rate == 1.0 or self.broadcast_dims:
            raise ValueError(f"Dropout.keep_seed: rate {self.rate}, broadcast_dims {self.broadcast_dims} unsupported")
        return keep_seed_words(self._key(rngs)), 1.0 - self.rate


def param(rngs: nnx.Rngs, init: Callable, shape: Sequence[int], axes: LogicalAxes, dtype=jnp.float32) -> nnx.Param:
    """A parameter `init(key, shape, dtype)` annotated with logical axis names (len(axes) == len(shape))."""
    if len(axes) != len(shape):
        raise ValueError(f"logical axes {tuple(axes)} do not match shape {tuple(shape)}")
    return nnx.Param(init(rngs.params(), tuple(shape), dtype), out_sharding=tuple(axes), eager_sharding=False)


def normal(std: float) -> Callable:
    return nnx.initializers.normal(stddev=std)


zeros = nnx.initializers.zeros_init()
ones = nnx.initializers.ones_init()


class LayerNorm(nnx.Module):
    """LayerNorm over the last axis (logical name `axis`, default `embed`), computed in float32. Post-LN everywhere in
    the XL family."""

    def __init__(self, dim: int, *, eps: float = 1e-12, axis: str = "embed", rngs: nnx.Rngs):
        self.eps = eps
        self.scale = param(rngs, ones, (dim,), (axis,))
        self.bias = param(rngs, zeros, (dim,), (axis,))

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        mean = xf.mean(-1, keepdims=True)
        var = jnp.square(xf - mean).mean(-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(var + self.eps)
        return (y * self.scale[...] + self.bias[...]).astype(x.dtype)


class Dense(nnx.Module):
    """y = x @ kernel (+ bias); kernel shape `in_shape + out_shape` with logical names `in_axes + out_axes`.

    E.g. a head projection d_model -> (n_head, d_head): `Dense((d,), (n, dh), ("embed",), ("heads", "kv"))`.
    `xlgen.models.lora.attach` may give it a low-rank adapter (`lora_a`, `lora_b`, `lora_scale`):
    y = x @ kernel + lora_scale * (x @ lora_a) @ lora_b (+ bias).
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        out_shape: Sequence[int],
        in_axes: LogicalAxes,
        out_axes: LogicalAxes,
        *,
        use_bias: bool = True,
        init_std: float = 0.02,
        kernel_init: Optional[Callable] = None,
        rngs: nnx.Rngs,
    ):
        self.n_in, self.n_out = len(in_shape), len(out_shape)
        self.kernel = param(
            rngs, kernel_init or normal(init_std), tuple(in_shape) + tuple(out_shape), tuple(in_axes) + tuple(out_axes)
        )
        self.bias = param(rngs, zeros, tuple(out_shape), tuple(out_axes)) if use_bias else None

    def __call__(self, x: jax.Array, *, gather_input_dims: bool = False, merged: bool = False) -> jax.Array:
        """`gather_input_dims`: the kernel's input dimensions are gathered (replicated) before the product, the
        others left to the partitioner. For an input every device holds whole (position encodings `[r, d]`), a
        product against an fsdp-sharded `embed` would otherwise be formed as partial sums and all-reduced, a
        transfer the size of the output, instead of gathering the (smaller) weight as FSDP does elsewhere.

        `merged`: the product with the kernel's input dimensions merged into one and its output dimensions into
        one, x `[..., prod(in_shape)]` -> `[..., prod(out_shape)]` (a head projection as one 2-D product whose
        result is token-major with the heads merged, `[..., n·d]`: the fused attention kernel's operand layout)."""
        k = self.kernel[...]
        if gather_input_dims:
            k = constrain(k, (None,) * self.n_in + (UNCONSTRAINED,) * (k.ndim - self.n_in))
        k = k.astype(x.dtype)
        n_in, lora_a = self.n_in, getattr(self, "lora_a", None)  # a low-rank adapter, `xlgen.models.lora.attach`
        lora_b, bias = getattr(self, "lora_b", None), self.bias
        if merged:
            inputs = k.shape[: self.n_in]
            k, n_in = k.reshape(int(np.prod(inputs)), -1), 1
            if lora_a is not None:
                lora_a, lora_b = lora_a[...].reshape(k.shape[0], -1), lora_b[...].reshape(lora_b[...].shape[0], -1)
            bias = None if bias is None else bias[...].reshape(-1)
        x_axes = tuple(range(x.ndim - n_in, x.ndim))
        y = jnp.tensordot(x, k, axes=(x_axes, tuple(range(n_in))))
        if lora_a is not None:  # y += lora_scale * (x A) B: the adapter never forms a kernel-sized matrix
            xa = jnp.tensordot(x, lora_a[...].astype(x.dtype), axes=(x_axes, tuple(range(n_in))))
            y = y + self.lora_scale * jnp.tensordot(xa, lora_b[...].astype(x.dtype), axes=1)
        if bias is not None:
            y = y + bias[...].astype(y.dtype)
        return y


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
    """ReLU / exact GELU / tanh-approximated GELU ("gelu_new", Funnel's HF default)."""
    if name == "relu":
        return jax.nn.relu
    if name == "gelu":
        return lambda x: jax.nn.gelu(x, approximate=False)
    if name in ("gelu_new", "gelu_tanh"):
        return lambda x: jax.nn.gelu(x, approximate=True)
    raise ValueError(f"unknown activation {name!r}; expected relu, gelu or gelu_new")


class PositionwiseFF(nnx.Module):
    """Post-LN feed-forward block: LN(x + drop(W2 drop_act(act(W1 x + b1)) + b2)).

    `dropact` is Funnel's dropout after the activation; TXL/XLNet apply `dropout` there (pass dropact=dropout).
    """

    def __init__(
        self,
        d_model: int,
        d_inner: int,
        *,
        act: str = "relu",
        dropout: float = 0.0,
        dropact: Optional[float] = None,
        layer_norm_eps: float = 1e-12,
        init_std: float = 0.02,
        rngs: nnx.Rngs,
    ):
        self.layer_1 = Dense((d_model,), (d_inner,), ("embed",), ("mlp",), init_std=init_std, rngs=rngs)
        self.layer_2 = Dense((d_inner,), (d_model,), ("mlp",), ("embed",), init_std=init_std, rngs=rngs)
        self.layer_norm = LayerNorm(d_model, eps=layer_norm_eps, rngs=rngs)
        self.act_name = act
        self.drop_inner = Dropout(dropout if dropact is None else dropact, rngs=rngs)
        self.drop_out = Dropout(dropout, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = activation(self.act_name)(named(self.layer_1(x), MLP_HIDDEN))
        if h.ndim == 3:  # the hidden [b, l, d_inner]: rows over the batch axes, d_inner over `tensor` (fsdp_tp)
            h = constrain(h, ("activation_batch", "activation_length", "activation_mlp"))
        h = self.drop_inner(h)
        return self.layer_norm(x + self.drop_out(named(self.layer_2(h), MLP_OUT)))


def stacked_layers(
    make_layer: Callable[[nnx.Rngs], nnx.Module], n_layer: int, rngs: nnx.Rngs, *, scan: bool
) -> nnx.Module:
    """`n_layer` layers: a list, or (scan=True) one module whose parameters are stacked on a leading `layers`
    logical axis, for `nnx.scan`/`jax.lax.scan` over layers (fast compiles for deep models)."""
    if not scan:
        return nnx.List([make_layer(rngs) for _ in range(n_layer)])

    @nnx.split_rngs(splits=n_layer)
    @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def make(r):
        return make_layer(r)

    return make(rngs)
