"""Planetoid (thesis §3.3, Fig. 3.10): a classifier trained jointly with a model of graph contexts.

Layers h^k(x) = ReLU(W_k h^{k-1}(x) + b_k); one layer per dotted arrow of Fig. 3.10, as in the thesis' experiments.

    -T (eq. 3.13)  p(y | x, e) = softmax_y([h^k(x), h^l(e)] w_y), e = a free embedding per node (transductive)
    -I (eq. 3.14)  e = h^{l1}(x),  p(y | x) = softmax_y([h^k(x), h^{l2}(e)] w_y)       (inductive: e from x)
    -G             p(y | e) = softmax_y(h^l(e) w_y), no features (Fig. 3.10a without the x branch)

    L_s = -(1/N1) sum_i log p(y_i | x_i, e_i)                                     (supervised loss)
    L_u = -E_(i,c,gamma) log sigma(gamma w_c^T e_i)                               (eq. 3.12, negative sampling)

w_c is a free context vector per node. Shapes: ids [B] int, x [B, F] float, y [B] int, gamma [B] in {+1, -1}.
Logical axis names (xlgen's sharding rules): "vocab" for the node rows of e and w_c (rows of a table, as a vocabulary),
"embed" for the embedding width, "mlp" for the hidden widths; feature and class axes are left unnamed (replicated).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from xlgen.models import layers

VARIANTS = ("T", "I", "G")


@dataclasses.dataclass(frozen=True)
class PlanetoidConfig:
    """`config.model` (minus `family`); the graph gives the node, feature and class counts."""

    variant: str = "T"
    embedding_dim: int = 50
    feature_hidden: int = 64  # width of h^k(x)
    embedding_hidden: int = 64  # width of h^l(e)
    # gradient multiplier of the per-node tables e and w_c: a batch mean gives each table row 1/N of a per-example
    # step (word2vec's SGD is per pair), so with SGD the tables take `node_lr_multiplier` times the learning rate
    node_lr_multiplier: float = 100.0

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"config.model.variant={self.variant!r}: expected one of {list(VARIANTS)}")


def _dense(n_in, n_out, axes, rngs):
    return layers.Dense((n_in,), (n_out,), axes[:1], axes[1:], kernel_init=nnx.initializers.glorot_uniform(), rngs=rngs)


def scale_gradient(x, k: float):
    """x in the forward pass, k times its gradient in the backward pass (x - stop_gradient(x) is exactly 0)."""
    return x + (k - 1.0) * (x - jax.lax.stop_gradient(x))


class Planetoid(nnx.Module):
    def __init__(self, cfg: PlanetoidConfig, num_nodes: int, num_features: int, num_classes: int, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, init = cfg.embedding_dim, layers.normal(1.0 / cfg.embedding_dim)
        if cfg.variant == "I":
            self.embed_x = _dense(num_features, d, (None, "embed"), rngs)  # h^{l1}
        else:
            self.embedding = layers.param(rngs, init, (num_nodes, d), ("vocab", "embed"))  # e
        self.context = layers.param(rngs, init, (num_nodes, d), ("vocab", "embed"))  # w_c
        width = cfg.embedding_hidden
        self.embedding_layer = _dense(d, cfg.embedding_hidden, ("embed", "mlp"), rngs)  # h^l / h^{l2}
        if cfg.variant != "G":
            self.feature_layer = _dense(num_features, cfg.feature_hidden, (None, "mlp"), rngs)  # h^k
            width += cfg.feature_hidden
        self.out = _dense(width, num_classes, ("mlp", None), rngs)  # w_y

    def _table(self, table):
        return scale_gradient(table[...], self.cfg.node_lr_multiplier)

    def embed(self, ids, x):
        """e_i [B, d]: the free embedding (-T, -G) or h^{l1}(x_i) (-I)."""
        if self.cfg.variant == "I":
            return jax.nn.relu(self.embed_x(x))
        return self._table(self.embedding)[ids]

    def __call__(self, ids, x):
        """Class logits [B, C] (eq. 3.13 / 3.14 before the softmax)."""
        h = [jax.nn.relu(self.embedding_layer(self.embed(ids, x)))]
        if self.cfg.variant != "G":
            h.insert(0, jax.nn.relu(self.feature_layer(x)))
        return self.out(jnp.concatenate(h, -1))

    def context_score(self, ids, x, context_ids):
        """w_c^T e_i [B]."""
        return jnp.sum(self.embed(ids, x) * self._table(self.context)[context_ids], -1)


def supervised_nll(model: Planetoid, ids, x, y):
    """-log p(y_i | x_i, e_i) [B] (eq. 3.13 / 3.14), and whether the argmax is y_i [B]."""
    logits = model(ids, x)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1)[:, 0]
    return nll, jnp.argmax(logits, -1) == y


def supervised_loss(model: Planetoid, ids, x, y):
    """L_s = -(1/N1) sum_i log p(y_i | x_i, e_i), and the batch accuracy."""
    nll, correct = supervised_nll(model, ids, x, y)
    return nll.mean(), correct.mean()


def context_nll(model: Planetoid, ids, x, context_ids, gamma):
    """-log sigma(gamma w_c^T e_i) [B] (the terms of eq. 3.12)."""
    return -jax.nn.log_sigmoid(gamma * model.context_score(ids, x, context_ids))


def context_loss(model: Planetoid, ids, x, context_ids, gamma):
    """L_u = -(1/N2) sum log sigma(gamma w_c^T e_i) (eq. 3.12)."""
    return context_nll(model, ids, x, context_ids, gamma).mean()
