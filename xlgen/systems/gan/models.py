"""The adversarial systems' networks (flax.nnx; batch-norm statistics are `nnx.BatchStat` state).

CEGAN, seed 000 §B.8.1 (FC = fully connected, BN = batch norm, DC = transposed convolution, LRec = leaky ReLU):

    2-D   Generator      FC(4,128)-BN-ReLU-FC(128,128)-BN-ReLU-FC(128,2)                 FCGenerator
          Discriminator  FC(2,128)-ReLU-FC(128,128)-ReLU-FC(128,1)                       MLP (energy c(x) or logit)
          Inference net  FC(2,128)-ReLU-FC(128,128)-ReLU-FC(128,4*2)                     MLP, (µ, log σ) of eq. B.26
    28x28 Generator      FC(10,512*7*7)-BN-ReLU-DC(512,256;4c2s)-BN-ReLU-DC(256,128;4c2s)-BN-ReLU
                         -DC(128,1;3c1s)-Sigmoid                                          DCGenerator
          Discriminator  CV(1,64;3c1s)-BN-LRec-CV(64,128;4c2s)-BN-LRec-CV(128,256;4c2s)-BN-LRec-FC(256*7*7,1)
                         (the inference net: the same with FC(256*7*7, 10*2))              DCDiscriminator
    `width` scales every channel count (1.0 = the paper's).

Bad GAN (seed 003 §3.1, the MNIST networks of the paper's code): the discriminator is an MLP with Gaussian instance
noise before every layer, K class logits (the fake class has the fixed logit w_{K+1} = 0) and the last hidden layer
as the feature f(x) of feature matching; the generator FC(z,500)-BN-Softplus-FC(500,500)-BN-Softplus-FC(500,D)-
Sigmoid with z ~ U(0, 1)^100; `PixelDensity` is the low-density term's density model (a deviation from the paper's
PixelCNN++: a MADE-style masked autoregressive MLP with Gaussian conditionals, small enough to train here).

Every module maps `x [B, ...] -> outputs`; randomness (instance noise) comes in as an explicit `key`, never from
module state, so a train step is a pure function of (state, batch, step key).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def _flat(x):
    return x.reshape(x.shape[0], -1)


class MLP(nnx.Module):
    """x [B, ...] -> (out [B, d_out], feature [B, d_hidden_last]): FC-act-...-FC(d_out), optional instance noise
    (std `input_noise` on x, `hidden_noise` on each hidden layer's input, when a `key` is given)."""

    def __init__(
        self,
        d_in: int,
        hidden: Sequence[int],
        d_out: int,
        *,
        rngs: nnx.Rngs,
        act=jax.nn.relu,
        batch_norm: bool = False,
        input_noise: float = 0.0,
        hidden_noise: float = 0.0,
    ):
        dims = [d_in, *hidden]
        self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(dims[:-1], dims[1:])])
        self.norms = nnx.List([nnx.BatchNorm(b, rngs=rngs) for b in hidden]) if batch_norm else None
        self.out = nnx.Linear(dims[-1], d_out, rngs=rngs)
        self.act = act
        self.input_noise, self.hidden_noise = float(input_noise), float(hidden_noise)

    def __call__(self, x, key: Optional[jax.Array] = None) -> Tuple[jax.Array, jax.Array]:
        h = _flat(x)
        keys = list(jax.random.split(key, len(self.layers) + 1)) if key is not None else None
        for i, layer in enumerate(self.layers):
            std = self.input_noise if i == 0 else self.hidden_noise
            if keys is not None and std > 0:
                h = h + std * jax.random.normal(keys[i], h.shape, h.dtype)
            h = layer(h)
            if self.norms is not None:
                h = self.norms[i](h)
            h = self.act(h)
        feat = h
        if keys is not None and self.hidden_noise > 0:
            h = h + self.hidden_noise * jax.random.normal(keys[-1], h.shape, h.dtype)
        return self.out(h), feat


class FCGenerator(nnx.Module):
    """z [B, d_z] -> x [B, *shape]: FC-BN-act blocks, then FC and the output map (`out`: None | "sigmoid")."""

    def __init__(
        self,
        d_z: int,
        hidden: Sequence[int],
        shape: Sequence[int],
        *,
        rngs: nnx.Rngs,
        act=jax.nn.relu,
        out: Optional[str] = None,
    ):
        dims = [d_z, *hidden]
        self.layers = nnx.List([nnx.Linear(a, b, use_bias=False, rngs=rngs) for a, b in zip(dims[:-1], dims[1:])])
        self.norms = nnx.List([nnx.BatchNorm(b, rngs=rngs) for b in hidden])
        self.shape = tuple(int(s) for s in shape)
        self.out = nnx.Linear(dims[-1], math.prod(self.shape), rngs=rngs)
        self.act, self.out_fn = act, out

    def __call__(self, z):
        h = z
        for layer, norm in zip(self.layers, self.norms):
            h = self.act(norm(layer(h)))
        x = self.out(h)
        if self.out_fn == "sigmoid":
            x = jax.nn.sigmoid(x)
        return x.reshape((z.shape[0],) + self.shape)


def _ch(c: int, width: float) -> int:
    return max(1, int(round(c * width)))


class DCGenerator(nnx.Module):
    """z [B, d_z] -> images [B, 28, 28, 1] in (0, 1) (§B.8.1's DCGAN generator; `width` scales channels)."""

    def __init__(self, d_z: int = 10, *, rngs: nnx.Rngs, width: float = 1.0):
        c1, c2, c3 = _ch(512, width), _ch(256, width), _ch(128, width)
        self.c1 = c1
        self.fc = nnx.Linear(d_z, c1 * 7 * 7, rngs=rngs)
        self.bn0 = nnx.BatchNorm(c1 * 7 * 7, rngs=rngs)
        self.dc1 = nnx.ConvTranspose(c1, c2, (4, 4), strides=(2, 2), padding="SAME", rngs=rngs)
        self.bn1 = nnx.BatchNorm(c2, rngs=rngs)
        self.dc2 = nnx.ConvTranspose(c2, c3, (4, 4), strides=(2, 2), padding="SAME", rngs=rngs)
        self.bn2 = nnx.BatchNorm(c3, rngs=rngs)
        self.dc3 = nnx.ConvTranspose(c3, 1, (3, 3), strides=(1, 1), padding="SAME", rngs=rngs)

    def __call__(self, z):
        h = jax.nn.relu(self.bn0(self.fc(z))).reshape(z.shape[0], 7, 7, self.c1)
        h = jax.nn.relu(self.bn1(self.dc1(h)))  # 14x14
        h = jax.nn.relu(self.bn2(self.dc2(h)))  # 28x28
        return jax.nn.sigmoid(self.dc3(h))


class DCDiscriminator(nnx.Module):
    """images [B, 28, 28, 1] -> (out [B, d_out], feature [B, 256*7*7]) (§B.8.1's DCGAN discriminator without the
    final sigmoid; `d_out` 1 for the energy, 2·d_z for the inference net)."""

    def __init__(self, d_out: int = 1, *, rngs: nnx.Rngs, width: float = 1.0):
        c1, c2, c3 = _ch(64, width), _ch(128, width), _ch(256, width)
        self.cv1 = nnx.Conv(1, c1, (3, 3), strides=(1, 1), padding="SAME", rngs=rngs)
        self.bn1 = nnx.BatchNorm(c1, rngs=rngs)
        self.cv2 = nnx.Conv(c1, c2, (4, 4), strides=(2, 2), padding="SAME", rngs=rngs)
        self.bn2 = nnx.BatchNorm(c2, rngs=rngs)
        self.cv3 = nnx.Conv(c2, c3, (4, 4), strides=(2, 2), padding="SAME", rngs=rngs)
        self.bn3 = nnx.BatchNorm(c3, rngs=rngs)
        self.fc = nnx.Linear(c3 * 7 * 7, d_out, rngs=rngs)

    def __call__(self, x, key: Optional[jax.Array] = None):
        lrec = lambda h: jax.nn.leaky_relu(h, 0.2)  # noqa: E731  (DCGAN's slope)
        h = lrec(self.bn1(self.cv1(x)))
        h = lrec(self.bn2(self.cv2(h)))
        h = lrec(self.bn3(self.cv3(h)))
        feat = _flat(h)
        return self.fc(feat), feat


class MaskedLinear(nnx.Module):
    """y = x (W ⊙ M) + b with a fixed 0/1 mask M [d_in, d_out] (MADE), M = deg_out >= deg_in (`strict`: >),
    built from the static degree vectors (a compile-time constant, not state)."""

    def __init__(self, deg_in: Sequence[int], deg_out: Sequence[int], *, strict: bool, rngs: nnx.Rngs):
        self.linear = nnx.Linear(len(deg_in), len(deg_out), rngs=rngs)
        self.deg_in, self.deg_out, self.strict = tuple(int(d) for d in deg_in), tuple(int(d) for d in deg_out), strict

    def mask(self) -> np.ndarray:
        a, b = np.asarray(self.deg_in)[:, None], np.asarray(self.deg_out)[None, :]
        return ((b > a) if self.strict else (b >= a)).astype(np.float32)

    def __call__(self, x):
        return x @ (self.linear.kernel[...] * self.mask()) + self.linear.bias[...]


class PixelDensity(nnx.Module):
    """A small autoregressive density over D pixels in [0, 1] (MADE, Germain et al. 2015, with Gaussian
    conditionals): log p(x) = Σ_i log N(x_i; µ_i(x_<i), σ_i(x_<i)²), σ_i ≥ `min_std`. Pixels are ordered raster-wise;
    the hidden units' degrees cover 1..D-1 (cyclically; spread evenly when there are fewer units than D-1).
    x [B, ...] -> log p(x) [B] (in nats, of the flattened image)."""

    def __init__(self, d: int, hidden: int = 256, *, rngs: nnx.Rngs, min_std: float = 0.05):
        deg_in = tuple(range(1, d + 1))
        if hidden >= d - 1:  # every degree 1..D-1 at least once (cyclic)
            deg_h = tuple(int(i % max(d - 1, 1)) + 1 for i in range(hidden))
        else:  # fewer units than pixels: spread over 1..D-1 (cyclic would leave pixels > `hidden` unseen)
            deg_h = tuple(int(v) for v in np.rint(np.linspace(1, d - 1, hidden)))
        self.l1 = MaskedLinear(deg_in, deg_h, strict=False, rngs=rngs)
        self.l2 = MaskedLinear(deg_h, deg_h, strict=False, rngs=rngs)
        self.mu = MaskedLinear(deg_h, deg_in, strict=True, rngs=rngs)
        self.log_std = MaskedLinear(deg_h, deg_in, strict=True, rngs=rngs)
        self.min_std = float(min_std)

    def __call__(self, x):
        x = _flat(x)
        h = jax.nn.relu(self.l2(jax.nn.relu(self.l1(x))))
        mu = self.mu(h)
        std = self.min_std + jax.nn.softplus(self.log_std(h))
        lp = -0.5 * ((x - mu) / std) ** 2 - jnp.log(std) - 0.5 * jnp.log(2 * jnp.pi)
        return lp.sum(-1)


class Encoder(nnx.Module):
    """The VI entropy term's encoder q(z|x) = N(µ(x), σ(x)²), 0 < σ < θ (bad GAN §3.1.5; CEGAN eq. B.26 without
    the bound): x [B, ...] -> (µ [B, d_z], log σ [B, d_z])."""

    def __init__(
        self,
        d_in: int,
        hidden: Sequence[int],
        d_z: int,
        *,
        rngs: nnx.Rngs,
        max_std: float = 0.0,
        body: Optional[nnx.Module] = None,
    ):
        self.body = body if body is not None else MLP(d_in, hidden, 2 * d_z, rngs=rngs)
        self.d_z, self.max_std = int(d_z), float(max_std)

    def __call__(self, x):
        out, _ = self.body(x)
        mu, s = out[:, : self.d_z], out[:, self.d_z :]
        if self.max_std > 0:
            return mu, jnp.log(self.max_std * jax.nn.sigmoid(s) + 1e-6)
        return mu, s
