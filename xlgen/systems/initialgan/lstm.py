"""LSTM cells of InitialGAN (seed 004 §III-C): the fully normalised LSTM (eq. 3) and the LayerNorm LSTM it extends
(Ba et al.; the Fig. 7 ablation), stacked and run over time.

Fully normalised LSTM (eq. 3), gates in the order f, i, o, ĉ, each `[B, H]`:

    (f_t, i_t, o_t, ĉ_t) = LN(W_h h_{t-1}) + LN(W_x x_t) + b             LN over the 4H gate pre-activations
    c_t = LN(σ(f_t)) ∘ c_{t-1} + σ(i_t) ∘ tanh(ĉ_t)
    h_t = LN(σ(o_t)) ∘ tanh(c_t)

LayerNorm LSTM (Ba et al. 2016 as in TensorFlow Addons' LayerNormLSTMCell, which the paper's Table III counts:
two 4H gate LNs and one H cell LN):

    gates as above;  c_t = LN(σ(f_t) ∘ c_{t-1} + σ(i_t) ∘ tanh(ĉ_t));  h_t = σ(o_t) ∘ tanh(c_t)

With input and hidden width 512 the two have 2,109,440 and 2,108,416 parameters (Table III). `plain` is the
unnormalised LSTM (eqs. 19-21) for comparison. Logical axes: inputs `embed`, hidden and gates `mlp`. LN ε = 1e-3,
the default of the paper's framework (TF2 Keras): LN's gradient near a zero input is ~1/sqrt(ε), and the critic's
Lipschitz penalty is taken at interpolates where the aligner's μ_x can be small.
"""

from __future__ import annotations

from typing import List, Tuple

import jax
import jax.numpy as jnp
from flax import nnx

from xlgen.models import layers

CELLS = ("fn", "ln", "plain")


class LSTMCell(nnx.Module):
    """One LSTM cell of kind `cell` (`fn` fully normalised, `ln` LayerNorm, `plain`)."""

    def __init__(self, in_dim: int, hidden: int, *, cell: str = "fn", eps: float = 1e-3, rngs: nnx.Rngs):
        if cell not in CELLS:
            raise ValueError(f"unknown LSTM cell {cell!r}; expected one of {CELLS}")
        self.cell, self.hidden = cell, hidden
        init = nnx.initializers.glorot_uniform()
        self.w_x = layers.Dense(
            (in_dim,), (4 * hidden,), ("embed",), ("mlp",), use_bias=False, kernel_init=init, rngs=rngs
        )
        self.w_h = layers.Dense(
            (hidden,),
            (4 * hidden,),
            ("mlp",),
            ("mlp",),
            use_bias=False,
            kernel_init=nnx.initializers.orthogonal(),
            rngs=rngs,
        )
        self.b = layers.param(rngs, layers.zeros, (4 * hidden,), ("mlp",))
        if cell != "plain":
            self.ln_x = layers.LayerNorm(4 * hidden, eps=eps, axis="mlp", rngs=rngs)
            self.ln_h = layers.LayerNorm(4 * hidden, eps=eps, axis="mlp", rngs=rngs)
        if cell == "fn":
            self.ln_f = layers.LayerNorm(hidden, eps=eps, axis="mlp", rngs=rngs)
            self.ln_o = layers.LayerNorm(hidden, eps=eps, axis="mlp", rngs=rngs)
        if cell == "ln":
            self.ln_c = layers.LayerNorm(hidden, eps=eps, axis="mlp", rngs=rngs)

    def __call__(self, carry: Tuple[jax.Array, jax.Array], x: jax.Array) -> Tuple[jax.Array, jax.Array]:
        """(h_{t-1}, c_{t-1}) `[B, H]` each, x_t `[B, in]` -> (h_t, c_t)."""
        h, c = carry
        gh, gx = self.w_h(h), self.w_x(x)
        if self.cell != "plain":
            gh, gx = self.ln_h(gh), self.ln_x(gx)
        f, i, o, g = jnp.split(gh + gx + self.b[...], 4, axis=-1)
        if self.cell == "fn":
            c = self.ln_f(jax.nn.sigmoid(f)) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = self.ln_o(jax.nn.sigmoid(o)) * jnp.tanh(c)
        elif self.cell == "ln":
            c = self.ln_c(jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g))
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
        else:
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return h, c


class LSTMStack(nnx.Module):
    """`num_layers` cells, layer l's h_t the input of layer l+1; `step` advances one time step, `__call__` runs a
    whole sequence with `jax.lax.scan` (the module split into graph and state, so no NNX state moves in the scan)."""

    def __init__(self, in_dim: int, hidden: int, num_layers: int, *, cell: str = "fn", rngs: nnx.Rngs):
        self.hidden = hidden
        self.cells = nnx.List(
            [LSTMCell(in_dim if l == 0 else hidden, hidden, cell=cell, rngs=rngs) for l in range(num_layers)]
        )

    def initial_state(self, batch: int) -> List[Tuple[jax.Array, jax.Array]]:
        z = jnp.zeros((batch, self.hidden), jnp.float32)
        return [(z, z) for _ in self.cells]

    def step(self, state, x: jax.Array):
        """state (per layer (h, c)), x_t `[B, in]` -> (new state, top h_t `[B, H]`)."""
        new = []
        for cell, carry in zip(self.cells, state):
            h, c = cell(carry, x)
            new.append((h, c))
            x = h
        return new, x

    def __call__(self, xs: jax.Array) -> jax.Array:
        """xs `[B, T, in]` -> top-layer hidden states `[B, T, H]` (h_0 = c_0 = 0)."""
        graphdef, params = nnx.split(self)

        def body(state, x):
            return nnx.merge(graphdef, params).step(state, x)

        _, hs = jax.lax.scan(body, self.initial_state(xs.shape[0]), jnp.swapaxes(xs, 0, 1))
        return jnp.swapaxes(hs, 0, 1)
