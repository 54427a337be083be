"""Dropout keep masks from JAX's own PRNG implementations, for measuring them against the counter hash of
`xlgen.models.layers.keep_mask` (docs/performance.md, "Tried and not kept").

Each variant replaces `layers.keep_mask`: the dropout stream's threefry key gives the key words of the named
implementation (`jax.random.wrap_key_data`, what `jax_default_prng_impl` would give the stream itself), whose
`jax.random.bits` are compared with the same threshold. Setup hooks for `xlgen.bench.ab`:

    python -m xlgen.bench.ab --arm=hash:. --arm=rbg:.:xlgen.reproductions.dropout_prng:rbg \\
        --arm=unsafe_rbg:.:xlgen.reproductions.dropout_prng:unsafe_rbg \\
        --arm=threefry:.:xlgen.reproductions.dropout_prng:threefry -- --config=... (a train workload)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from xlgen.models import layers

_KEY_WORDS = {"threefry2x32": 2, "philox4x32": 2, "philox2x32": 1, "rbg": 4, "unsafe_rbg": 4}


def prng_keep_mask(impl: str, key: jax.Array, shape, keep_prob: float) -> jax.Array:
    """bool `shape`, True with probability `keep_prob`, from `jax.random.bits` of a key of implementation `impl`
    derived from `key`."""
    words = jax.random.bits(key, (_KEY_WORDS[impl],), jnp.uint32)
    k = jax.random.wrap_key_data(words, impl=impl)
    threshold = jnp.uint32(min(int(round(keep_prob * 2.0**32)), 2**32 - 1))
    return jax.random.bits(k, tuple(int(d) for d in shape), jnp.uint32) < threshold


def use(impl: str) -> None:
    layers.keep_mask = functools.partial(prng_keep_mask, impl)


def threefry():
    use("threefry2x32")


def philox():
    use("philox4x32")


def rbg():
    use("rbg")


def unsafe_rbg():
    use("unsafe_rbg")
