"""The aligner of InitialGAN (seed 004 §III-A, §III-D, Appendix C): a Transformer encoder that maps each word of a
sentence to a Gaussian N(μ_x, σ_x²) in representation space, and the transformation layer F_LT back to words.

    e      = E_A(x) + PE                                    [B, T, d]   fixed sinusoidal positions
    h      = L post-LN blocks (multi-head self-attention, FFN, dropout)(e)
    μ_x    = W_μ h,  log σ_x² = W_σ h                       [B, T, d_r]
    ẑ      = μ_x + σ_x ∘ ε̂,  ε̂ ~ N(0, I)                    (Alg. 1 lines 5-7)
    p(x|ẑ) = softmax(F_LT(ẑ)),  F_LT(r) = W_LT r + b_LT      [B, T, V]   (eq. 2; frozen while G trains)

Loss (eq. 4), per position and summed over the d_r dimensions:

    L_A = -log p(x_i | ẑ_i) + KL(N(μ, σ²) || N(0, I)) + λ_a log σ²_{x_i}

with the input corrupted BERT-style (15% of the positions chosen; of those 80% [MASK], 10% a random word, 10% kept).
The reconstruction term covers every position (not only the chosen ones): the real representations the
discriminator sees are μ_x of uncorrupted sentences at every position, and the generator's words are F_LT of them,
so F_LT must decode every position (a reading of §III-D, which names BERT's selection but not the loss positions).
"""

from __future__ import annotations

import math
from typing import Dict, Tuple

import jax
import jax.numpy as jnp
from flax import nnx

from xlgen.models import layers


def sinusoid_positions(length: int, dim: int) -> jax.Array:
    """Fixed positional encoding `[length, dim]` (Vaswani et al.)."""
    pos = jnp.arange(length, dtype=jnp.float32)[:, None]
    inv = jnp.exp(-math.log(10000.0) * jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    ang = pos * inv
    return jnp.concatenate([jnp.sin(ang), jnp.cos(ang)], axis=-1)[:, :dim]


class EncoderBlock(nnx.Module):
    """Post-LN Transformer block: x = LN(x + Drop(MHA(x))); x = LN(x + Drop(FFN(x)))."""

    def __init__(self, d: int, n_head: int, d_inner: int, dropout: float, *, rngs: nnx.Rngs):
        dh = d // n_head
        self.n_head = n_head
        self.qkv = layers.Dense((d,), (3, n_head, dh), ("embed",), (None, "heads", "kv"), rngs=rngs)
        self.o = layers.Dense((n_head, dh), (d,), ("heads", "kv"), ("embed",), rngs=rngs)
        self.ff1 = layers.Dense((d,), (d_inner,), ("embed",), ("mlp",), rngs=rngs)
        self.ff2 = layers.Dense((d_inner,), (d,), ("mlp",), ("embed",), rngs=rngs)
        self.ln1 = layers.LayerNorm(d, eps=1e-5, rngs=rngs)
        self.ln2 = layers.LayerNorm(d, eps=1e-5, rngs=rngs)
        self.drop = layers.Dropout(dropout, rngs=None)

    def __call__(self, x: jax.Array, *, train: bool, key: jax.Array) -> jax.Array:
        k1, k2, k3 = jax.random.split(key, 3)
        q, k, v = jnp.moveaxis(self.qkv(x), 2, 0)  # [B, T, n, dh] each
        att = jnp.einsum("bqnd,bknd->bnqk", q, k) / math.sqrt(q.shape[-1])
        att = self.drop(jax.nn.softmax(att, axis=-1), deterministic=not train, rngs=k1)
        a = self.o(jnp.einsum("bnqk,bknd->bqnd", att, v))
        x = self.ln1(x + self.drop(a, deterministic=not train, rngs=k2))
        f = self.ff2(jax.nn.relu(self.ff1(x)))
        return self.ln2(x + self.drop(f, deterministic=not train, rngs=k3))


class Aligner(nnx.Module):
    """Words -> (μ_x, log σ_x²) `[B, T, d_r]`; `to_words` is F_LT."""

    def __init__(
        self, vocab: int, d: int, d_rep: int, n_layer: int, n_head: int, d_inner: int, dropout: float, *, rngs
    ):
        self.d = d
        self.embed = layers.param(rngs, layers.normal(d**-0.5), (vocab, d), ("vocab", "embed"))
        self.blocks = nnx.List([EncoderBlock(d, n_head, d_inner, dropout, rngs=rngs) for _ in range(n_layer)])
        self.drop = layers.Dropout(dropout, rngs=None)
        self.mu = layers.Dense((d,), (d_rep,), ("embed",), ("embed",), rngs=rngs)
        self.logvar = layers.Dense((d,), (d_rep,), ("embed",), ("embed",), rngs=rngs)
        self.to_words = layers.Dense((d_rep,), (vocab,), ("embed",), ("vocab",), rngs=rngs)  # F_LT

    def __call__(self, tokens: jax.Array, *, train: bool = False, key=None) -> Tuple[jax.Array, jax.Array]:
        """tokens `[B, T]` int -> (μ_x, log σ_x²), each `[B, T, d_r]`."""
        key = jax.random.key(0) if key is None else key
        keys = jax.random.split(key, len(self.blocks) + 1)
        x = self.embed[...][tokens] * math.sqrt(self.d) + sinusoid_positions(tokens.shape[1], self.d)
        x = self.drop(x, deterministic=not train, rngs=keys[0])
        for block, k in zip(self.blocks, keys[1:]):
            x = block(x, train=train, key=k)
        return self.mu(x), self.logvar(x)


def bert_corrupt(tokens: jax.Array, key: jax.Array, *, vocab: int, mask_id: int, first_word: int, rate: float = 0.15):
    """BERT's input corruption: each position chosen with probability `rate`; a chosen one becomes `mask_id` (80%),
    a random word id in [first_word, vocab) (10%) or stays (10%)."""
    k1, k2, k3 = jax.random.split(key, 3)
    chosen = jax.random.bernoulli(k1, rate, tokens.shape)
    u = jax.random.uniform(k2, tokens.shape)
    rand = jax.random.randint(k3, tokens.shape, first_word, vocab)
    out = jnp.where(chosen & (u < 0.8), mask_id, tokens)
    return jnp.where(chosen & (u >= 0.8) & (u < 0.9), rand, out)


def aligner_loss(
    aligner: Aligner, tokens: jax.Array, key: jax.Array, *, lambda_a: float, mask_id: int, first_word: int
) -> Tuple[jax.Array, Dict[str, jax.Array]]:
    """Eq. 4 averaged over positions; metrics: its three terms and the accuracy of F_LT(μ_x) (the words the
    generator's real counterparts decode to)."""
    k_corrupt, k_drop, k_eps = jax.random.split(key, 3)
    vocab = aligner.embed.shape[0]
    inputs = bert_corrupt(tokens, k_corrupt, vocab=vocab, mask_id=mask_id, first_word=first_word)
    mu, logvar = aligner(inputs, train=True, key=k_drop)
    z = mu + jnp.exp(0.5 * logvar) * jax.random.normal(k_eps, mu.shape)
    logp = jax.nn.log_softmax(aligner.to_words(z), axis=-1)
    nll = -jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]
    kl = 0.5 * jnp.sum(jnp.square(mu) + jnp.exp(logvar) - 1.0 - logvar, axis=-1)
    pen = jnp.sum(logvar, axis=-1)
    loss = jnp.mean(nll + kl + lambda_a * pen)
    acc = jnp.mean(jnp.argmax(aligner.to_words(mu), -1) == tokens)
    return loss, {
        "aligner_nll": jnp.mean(nll),
        "aligner_kl": jnp.mean(kl),
        "aligner_logvar": jnp.mean(pen),
        "aligner_acc": acc,
    }
