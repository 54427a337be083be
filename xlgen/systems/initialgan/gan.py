"""Generator, discriminator and the adversarial objective of InitialGAN (seed 004 §III-A, §III-B, §III-D).

Generator (eqs. 1-2) with dropout sampling (§III-B), for t = 1..T and x̂_0 = <s>:

    z_t     = Dropout(E(x̂_{t-1}) ⊕ ε_t, ρ)        ε_t ~ N(0, I) `[B, n_noise]`, the mask active in training AND sampling
    r_g^(t) = W_out G_φ(z_t | z_{<t})            G_φ a stack of (fully normalised) LSTM cells, r `[B, d_r]`
    x̂_t     = argmax F_LT(r_g^(t))                F_LT the aligner's frozen transformation layer

The randomness of a sample is (noise key, mask key): the same keys give the same sentences, other masks other
sentences. Ablation (Fig. 7, "no dropout sampling"): `dropout_sampling=False` keeps ε_t and drops the mask.

Discriminator: c_t = w_c · D_ψ(r_t | r_{<t}) + b_c per position, D(r) = mean_t c_t.

Objective (eqs. 5-6; WGAN with the Lipschitz penalty of Petzka et al.):

    L_D = -E[D(r_d)] + E[D(G(z))] + λ_d E_{r_m}[(max(0, ||∇_r D(r_m)||_2 - 1))²],  r_m = ε' r_d + (1 - ε') r_g
    L_G = -E[D(G(z))]

r_d = μ_x of the frozen aligner; ε' ~ U[0, 1] per sentence; the gradient norm is over a whole sentence `[T, d_r]`.
Batch sizes: bs_g = bs_d / (1 - ρ) (§III-B), `generator_batch`.
"""

from __future__ import annotations

from typing import Dict, Tuple

import jax
import jax.numpy as jnp
from flax import nnx

from xlgen.models import layers
from xlgen.systems.initialgan.lstm import LSTMStack


def generator_batch(disc_batch: int, rate: float, dropout_sampling: bool = True) -> int:
    """bs_g = bs_d / (1 - ρ), rounded to the nearest integer (§III-B); bs_d without dropout sampling."""
    if not dropout_sampling or rate <= 0.0:
        return int(disc_batch)
    if rate >= 1.0:
        raise ValueError(f"dropout sampling rate must be < 1, got {rate}")
    return int(round(disc_batch / (1.0 - rate)))


class Generator(nnx.Module):
    def __init__(
        self,
        vocab: int,
        d_embed: int,
        d_noise: int,
        hidden: int,
        num_layers: int,
        d_rep: int,
        *,
        cell: str = "fn",
        rate: float = 0.75,
        dropout_sampling: bool = True,
        rngs: nnx.Rngs,
    ):
        self.d_embed, self.d_noise = d_embed, d_noise
        self.rate, self.dropout_sampling = float(rate), bool(dropout_sampling)
        self.embed = layers.param(rngs, layers.normal(1.0), (vocab, d_embed), ("vocab", "embed"))
        self.lstm = LSTMStack(d_embed + d_noise, hidden, num_layers, cell=cell, rngs=rngs)
        self.out = layers.Dense(
            (hidden,), (d_rep,), ("mlp",), ("embed",), kernel_init=nnx.initializers.glorot_uniform(), rngs=rngs
        )

    def randomness(self, noise_key: jax.Array, mask_key: jax.Array, batch: int, length: int):
        """(ε `[T, B, n_noise]`, keep-mask `[T, B, d_embed + n_noise]` or None without dropout sampling)."""
        eps = jax.random.normal(noise_key, (length, batch, self.d_noise))
        if not self.dropout_sampling or self.rate == 0.0:
            return eps, None
        return eps, jax.random.bernoulli(mask_key, 1.0 - self.rate, (length, batch, self.d_embed + self.d_noise))

    def __call__(
        self, f_lt: Tuple[jax.Array, jax.Array], noise_key, mask_key, *, batch: int, length: int, bos_id: int
    ) -> Tuple[jax.Array, jax.Array]:
        """-> (r_g `[B, T, d_r]`, x̂ `[B, T]` int32). `f_lt` = (kernel `[d_r, V]`, bias `[V]`), taken as constants."""
        w_lt, b_lt = jax.lax.stop_gradient(f_lt[0]), jax.lax.stop_gradient(f_lt[1])
        eps, keep = self.randomness(noise_key, mask_key, batch, length)
        graphdef, state = nnx.split(self)
        scale = 1.0 / (1.0 - self.rate)

        def body(carry, inputs):
            lstm_state, prev = carry
            g = nnx.merge(graphdef, state)
            e_t, m_t = inputs
            z = jnp.concatenate([g.embed[...][prev], e_t], axis=-1)
            if m_t is not None:
                z = jnp.where(m_t, z * scale, 0.0)
            lstm_state, h = g.lstm.step(lstm_state, z)
            r = g.out(h)
            word = jnp.argmax(r @ w_lt + b_lt, axis=-1).astype(jnp.int32)
            return (lstm_state, word), (r, word)

        init = (self.lstm.initial_state(batch), jnp.full((batch,), bos_id, jnp.int32))
        _, (reps, words) = jax.lax.scan(body, init, (eps, keep))
        return jnp.swapaxes(reps, 0, 1), jnp.swapaxes(words, 0, 1)


class Discriminator(nnx.Module):
    def __init__(self, d_rep: int, hidden: int, num_layers: int, *, cell: str = "fn", rngs: nnx.Rngs):
        self.lstm = LSTMStack(d_rep, hidden, num_layers, cell=cell, rngs=rngs)
        self.head = layers.Dense(
            (hidden,), (1,), ("mlp",), (None,), kernel_init=nnx.initializers.glorot_uniform(), rngs=rngs
        )

    def __call__(self, reps: jax.Array) -> jax.Array:
        """r `[B, T, d_r]` -> D(r) `[B]` (the mean over positions of c_t)."""
        return jnp.mean(self.head(self.lstm(reps))[..., 0], axis=-1)


def lipschitz_penalty(disc: Discriminator, r_d: jax.Array, r_g: jax.Array, key: jax.Array) -> jax.Array:
    """R = E[(max(0, ||∇_r D(r_m)||_2 - 1))²] on r_m = ε' r_d + (1 - ε') r_g, ε' ~ U[0, 1] per sentence."""
    e = jax.random.uniform(key, (r_d.shape[0], 1, 1))
    r_m = e * r_d + (1.0 - e) * r_g
    grads = jax.grad(lambda r: jnp.sum(disc(r)))(r_m)  # D is per-sentence, so row b's gradient is ∇D(r_m[b])
    norms = jnp.sqrt(jnp.sum(jnp.square(grads), axis=(1, 2)) + 1e-12)
    return jnp.mean(jnp.square(jnp.maximum(0.0, norms - 1.0)))


def critic_loss(disc, r_d, r_g, key, *, lambda_d: float) -> Tuple[jax.Array, Dict[str, jax.Array]]:
    """L_D (eq. 5) with r_g held constant; metrics: the Wasserstein estimate E[D(r_d)] - E[D(r_g)] and R."""
    r_g = jax.lax.stop_gradient(r_g)
    d_real, d_fake = disc(r_d), disc(r_g)
    pen = lipschitz_penalty(disc, r_d, r_g, key)
    w = jnp.mean(d_real) - jnp.mean(d_fake)
    return -w + lambda_d * pen, {"wasserstein": w, "lipschitz_penalty": pen}


def generator_loss(disc, r_g) -> jax.Array:
    """L_G (eq. 6)."""
    return -jnp.mean(disc(r_g))
