"""Counting primitives of the analytic model FLOPs (`xlgen.flops` states the accounting), shared by the family
cost modules (`xlgen.models.<family>.cost`)."""

from __future__ import annotations

import math
from typing import Sequence, Tuple

_EULER_GAMMA = 0.5772156649


def _harmonic(n: int) -> float:
    return 0.0 if n <= 0 else math.log(n) + _EULER_GAMMA + 1.0 / (2 * n)


def zipf_share(start: int, end: int, vocab: int) -> float:
    """Share of running-text tokens whose id lies in [start, end) under Zipf's law (frequency ∝ 1/rank, ids sorted by
    frequency, as word-level LM vocabularies are): (H(end) - H(start)) / H(vocab)."""
    return (_harmonic(end) - _harmonic(start)) / _harmonic(vocab)


def attention_layer(
    q: int, k: int, mem: int, rows: int, d: int, h: int, d_inner: int, *, segment: bool
) -> Tuple[float, float]:
    """Forward FLOPs of one attention + FFN layer for one example: (with input gradients, memory k/v projections).
    The memory is stop-gradient: its projections get a weight gradient only."""
    proj = 2 * q * d * h * 4  # q, k, v over the segment; o
    scores = 2 * q * h * (k + rows + (2 if segment else 0))
    values = 2 * q * k * h
    ffn = 4 * q * d * d_inner
    return float(proj + scores + values + ffn), float(2 * mem * d * 2 * h)


def train(grad_in: float, weight_grad_only: float) -> float:
    """Forward + backward: 3x for matmuls whose inputs need gradients, 2x for weight-gradient-only ones."""
    return 3.0 * grad_in + 2.0 * weight_grad_only


def adaptive_softmax_fwd(
    tokens: int, d_proj: int, vocab: int, cutoffs: Sequence[int], div_val: int, d_embed: int
) -> Tuple[float, float]:
    """Forward FLOPs of (adaptive input, adaptive softmax) for `tokens` tokens. Plain softmax: no cutoffs."""
    bounds = list(zip([0] + list(cutoffs), list(cutoffs) + [vocab]))
    dims = [d_embed // div_val**i for i in range(len(bounds))] if div_val > 1 else [d_embed] * len(bounds)
    has_proj = [True] * len(bounds) if div_val > 1 else [d_embed != d_proj] * len(bounds)
    n_tails = len(bounds) - 1
    shares = [zipf_share(s, e, vocab) for s, e in bounds] if n_tails else [1.0]
    emb = sum(shares[i] * 2 * dims[i] * d_proj * has_proj[i] for i in range(len(bounds)))
    head = 2 * dims[0] * d_proj * has_proj[0] + 2 * dims[0] * (bounds[0][1] + n_tails)
    tails = sum(
        shares[i] * 2 * (dims[i] * d_proj * has_proj[i] + dims[i] * (e - s)) for i, (s, e) in enumerate(bounds) if i > 0
    )
    return float(tokens * emb), float(tokens * (head + tails))
