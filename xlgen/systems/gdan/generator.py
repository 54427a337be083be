"""GDAN's generative model G: P(q | p, a), a GRU sequence-to-sequence model with attention and a copy mechanism
(thesis §3.2.4, eq. 3.7).

Encoder (shapes: B rows, Tp paragraph words, Tq question steps, E embedding, H hidden, V vocabulary):
    x_i = [emb(p_i); 1{i in a}]                          [B, Tp, E+1]   the answer's zero/one feature
    H   = [GRU_fwd(x); GRU_bwd(x)]                       [B, Tp, 2H]    padding positions masked
    s_0 = tanh(W_0 mean_i H_i)                           [B, H]
Decoder, step t (y_0 = <bos>, c_0 = 0):
    s_t = GRU([emb(y_{t-1}); c_{t-1}], s_{t-1})          [B, H]
    alpha_t = softmax_i(H_i W_a s_t)                     [B, Tp]        attention over the paragraph
    c_t = sum_i alpha_t,i H_i                            [B, 2H]
    p_vocab = softmax(W_v tanh(W_o [s_t; c_t]))          [B, V]         the specials other than <unk>/<eos> masked
    p_copy(w) = sum_{i: p_i = w} alpha_t,i                [B, V]         copying a paragraph word
    g_t = sigma(w_g^T s_t)                               [B]
    p_overall = g_t p_vocab + (1 - g_t) p_copy           [B, V]         (3.7)
log P_G(q | p, a) = sum_t log p_overall(q_t) over the steps up to and including the first <eos>.

`log_prob` scores given questions (teacher forcing: MLE, and REINFORCE's log-likelihood of a sample); `sample`
draws questions with the same step function (`greedy=True`: the argmax), so a sample's log-probability is its
teacher-forced one. Parameters carry logical axis names (vocab, embed, mlp).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Tuple

import jax
import jax.numpy as jnp
from flax import nnx

from xlgen.models.layers import Dense, normal, param
from xlgen.systems.gdan import text as T

TINY = 1e-10


@dataclasses.dataclass(frozen=True)
class GeneratorConfig:
    vocab_size: int
    embed_dim: int = 64
    hidden: int = 64
    question_len: int = 16


def _dense(d_in, d_out, in_axis, out_axis, rngs, use_bias=True, out_shape=None):
    out_shape = out_shape or (d_out,)
    out_axes = (None,) * (len(out_shape) - 1) + (out_axis,)
    return Dense((d_in,), out_shape, (in_axis,), out_axes, use_bias=use_bias, init_std=1 / math.sqrt(d_in), rngs=rngs)


class GRU(nnx.Module):
    """z = sigma(W_z x + U_z h + b_z), r = sigma(W_r x + U_r h + b_r), h~ = tanh(W_h x + U_h (r * h) + b_h),
    h' = (1 - z) h + z h~. x [B, D], h [B, H] -> [B, H]."""

    def __init__(self, d_in: int, d_h: int, *, rngs: nnx.Rngs):
        self.wx = _dense(d_in, d_h, "embed", "mlp", rngs, out_shape=(3, d_h))
        self.wh = _dense(d_h, d_h, "mlp", "mlp", rngs, use_bias=False, out_shape=(3, d_h))

    def __call__(self, x: jax.Array, h: jax.Array) -> jax.Array:
        gx = self.wx(x)  # [B, 3, H]
        u = self.wh.kernel[...]  # [H, 3, H]
        zr = jax.nn.sigmoid(gx[:, :2] + jnp.einsum("bh,hgk->bgk", h, u[:, :2]))
        z, r = zr[:, 0], zr[:, 1]
        cand = jnp.tanh(gx[:, 2] + (r * h) @ u[:, 2])
        return (1 - z) * h + z * cand


def _run(cell: GRU, x: jax.Array, mask: jax.Array, reverse: bool) -> jax.Array:
    """States [B, T, H] of `cell` over x [B, T, D]; a masked position keeps the previous state (padding at the end:
    the backward pass starts from zeros at the last real word)."""
    b = x.shape[0]
    h0 = jnp.zeros((b, cell.wh.kernel[...].shape[0]), x.dtype)

    def step(h, inp):
        xt, mt = inp
        h = jnp.where(mt[:, None], cell(xt, h), h)
        return h, h

    _, hs = jax.lax.scan(step, h0, (jnp.swapaxes(x, 0, 1), jnp.swapaxes(mask, 0, 1)), reverse=reverse)
    return jnp.swapaxes(hs, 0, 1)


class Generator(nnx.Module):
    """P_G(q | p, a) (module docstring)."""

    def __init__(self, cfg: GeneratorConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        v, e, h = cfg.vocab_size, cfg.embed_dim, cfg.hidden
        self.embed = param(rngs, normal(0.1), (v, e), ("vocab", "embed"))
        self.enc_fwd = GRU(e + 1, h, rngs=rngs)
        self.enc_bwd = GRU(e + 1, h, rngs=rngs)
        self.init = _dense(2 * h, h, "mlp", "mlp", rngs)
        self.dec = GRU(e + 2 * h, h, rngs=rngs)
        self.attn = _dense(2 * h, h, "mlp", "mlp", rngs, use_bias=False)
        self.out = _dense(3 * h, h, "mlp", "mlp", rngs)
        self.vocab_proj = _dense(h, v, "mlp", "vocab", rngs)
        self.gate = _dense(h, 1, "mlp", None, rngs)

    def encode(self, p, plen, start, end):
        """p [B, Tp], plen / start / end [B] -> ((H [B, Tp, 2H], mask [B, Tp], H W_a [B, Tp, H]), s_0 [B, H])."""
        pos = jnp.arange(p.shape[1])[None]
        mask = pos < plen[:, None]
        feat = ((pos >= start[:, None]) & (pos <= end[:, None])).astype(jnp.float32)
        x = jnp.concatenate([self.embed[...][p], feat[..., None]], -1)
        hs = jnp.concatenate([_run(self.enc_fwd, x, mask, False), _run(self.enc_bwd, x, mask, True)], -1)
        mean = (hs * mask[..., None]).sum(1) / jnp.maximum(mask.sum(1), 1)[:, None]
        return (hs, mask, self.attn(hs)), jnp.tanh(self.init(mean))

    def step(self, enc, p, carry, y_prev):
        """One decoder step: (carry (s, c), y_{t-1} [B]) -> (new carry, log p_overall [B, V])."""
        hs, mask, keys = enc
        s, c = carry
        s = self.dec(jnp.concatenate([self.embed[...][y_prev], c], -1), s)
        scores = jnp.einsum("bth,bh->bt", keys, s)
        alpha = jax.nn.softmax(jnp.where(mask, scores, -1e30), -1)
        c = jnp.einsum("bt,btd->bd", alpha, hs)
        logits = self.vocab_proj(jnp.tanh(self.out(jnp.concatenate([s, c], -1))))
        p_vocab = jax.nn.softmax(jnp.where(_allowed(logits.shape[-1]), logits, -1e30), -1)
        rows = jnp.arange(p.shape[0])[:, None]
        p_copy = jnp.zeros_like(p_vocab).at[rows, p].add(alpha * mask)
        g = jax.nn.sigmoid(self.gate(s))  # [B, 1]
        return (s, c), jnp.log(g * p_vocab + (1 - g) * p_copy + TINY)

    def log_prob(self, p, plen, start, end, q) -> Tuple[jax.Array, jax.Array]:
        """(log P_G(q | p, a) [B], token mask [B, Tq]) of questions q [B, Tq] (words, <eos>, padding)."""
        enc, s0 = self.encode(p, plen, start, end)
        hs = enc[0]
        y_prev = jnp.concatenate([jnp.full((q.shape[0], 1), T.BOS, q.dtype), q[:, :-1]], 1)
        c0 = jnp.zeros((q.shape[0], hs.shape[-1]), hs.dtype)

        def body(carry, y):
            carry, logp = self.step(enc, p, carry, y)
            return carry, logp

        _, logps = jax.lax.scan(body, (s0, c0), jnp.swapaxes(y_prev, 0, 1))
        tok = jnp.take_along_axis(jnp.swapaxes(logps, 0, 1), q[..., None], -1)[..., 0]  # [B, Tq]
        m = question_mask(q)
        return (tok * m).sum(-1), m

    def sample(self, p, plen, start, end, key, greedy: bool = False) -> Tuple[jax.Array, jax.Array]:
        """(questions [B, Tq]: words, then <eos>, then padding; log P_G of each [B])."""
        enc, s0 = self.encode(p, plen, start, end)
        hs = enc[0]
        b = p.shape[0]
        c0 = jnp.zeros((b, hs.shape[-1]), hs.dtype)
        keys = jax.random.split(key, self.cfg.question_len)

        def body(state, k):
            carry, y_prev, done = state
            carry, logp = self.step(enc, p, carry, y_prev)
            y = jnp.argmax(logp, -1) if greedy else jax.random.categorical(k, logp)
            y = jnp.where(done, T.PAD, y).astype(jnp.int32)
            lp = jnp.where(done, 0.0, jnp.take_along_axis(logp, y[:, None], -1)[:, 0])
            return (carry, y, done | (y == T.EOS)), (y, lp)

        init = ((s0, c0), jnp.full((b,), T.BOS, jnp.int32), jnp.zeros((b,), bool))
        _, (ys, lps) = jax.lax.scan(body, init, keys)
        return jnp.swapaxes(ys, 0, 1), lps.sum(0)


def _allowed(v: int) -> jax.Array:
    """[V] bool: the words and <unk> / <eos>; never a separator, <cls>, <bos>, padding or a domain tag."""
    return jnp.ones((v,), bool).at[jnp.array([T.PAD, T.SEP, T.CLS, T.BOS, T.D_TRUE, T.D_GEN])].set(False)


def question_mask(q: jax.Array) -> jax.Array:
    """1 at the steps up to and including the first <eos> (all steps without one), padding excluded [B, Tq]."""
    eos = (q == T.EOS).astype(jnp.int32)
    before = (jnp.cumsum(eos, -1) - eos) == 0
    return (before & (q != T.PAD)).astype(jnp.float32)


def reader_question(q: jax.Array) -> Tuple[jax.Array, jax.Array]:
    """A generated question as the reader's input: (words before the first <eos>, padded [B, Tq]; their count)."""
    eos = (q == T.EOS).astype(jnp.int32)
    keep = ((jnp.cumsum(eos, -1)) == 0) & (q != T.PAD)
    return jnp.where(keep, q, T.PAD), keep.sum(-1).astype(jnp.int32)
