"""Analytic model FLOPs of one training step (6·N·D-style: forward + backward, no rematerialisation), for MFU.

Counted: every matmul the MATH of the model needs, 2·m·n·k each; element-wise work (softmax, LayerNorm, the
relative shift, the optimizer) is not, as in the usual 6·N·D accounting. The backward pass costs 2x the forward of
a matmul whose input needs a gradient (input + weight gradient), 1x of one whose input does not (weight gradient
only: the stop-gradient memory, the sinusoid position encodings). Per layer and example, with query length q, key
length k = mem + q, R relative-position rows, H = n_head·d_head, model width d:

    q, o projections        2·q·d·H each                 k, v over the segment   2·q·d·H each
    k, v over the memory    2·mem·d·H each (1x backward) position keys           2·R·d·H, once per batch (1x bwd)
    scores                  2·q·H·(k + R (+ 2))          content, position before the (free) shift (+ segment)
    values                  2·q·k·H                      feed-forward            2·2·q·d·d_inner

Transformer-XL: R = k; the LM head is the (adaptive) softmax: the head cluster (shortlist + one logit per tail
cluster, after its projection d_model -> d_0 if any) for every token, and tail cluster i (projection + V_i logits)
for the tokens whose label lies in it, a data-dependent share estimated by Zipf's law (`zipf_share`; with
WT103's cutoffs the tails are < 1% of the step whatever the share). The adaptive input counts each token's own
cluster projection.

XLNet: R = k + q (distances both ways); the position keys are projected once per batch and direction (2 with
bi_data). The query stream (num_predict targets) reuses the content stream's keys, values and position keys. The
LAST layer's content stream (q, o, scores, values, ffn) is not counted: nothing depends on it when the loss is on
the query stream (its keys and values are, the query stream attends to them).

Funnel: `xlgen.models.funnel.cost` (per-block cost with pooling), with the position work that multiplies constants
(sinusoids) counted with one gradient only, and the MLM softmax and the last decoder layer's queries, FFN and
LayerNorms at the k predicted rows per sequence (`funnel.heads.predictions_per_row`: `objective_options.
max_predictions`, by default the mlm pipeline's own count; -1 = every position; `funnel.cost.train_flops`).

The formulas live with each family (`xlgen.models.<family>.cost`, registered as a `FlopCount` record); this module
holds the shared counting primitives and `train_flops_per_step`, which its caller gives the family's count.

Executed vs model FLOPs. The compiled step executes at least these matmuls and, on top:
  * with remat (`model.remat`), each layer's forward again in the backward pass: executed = model + recomputed
    forward, i.e. ≈ 4/3 x model for a fully rematerialised network (the forward is 1/3 of 6·N·D);
  * recomputation the implementation chooses without remat (the adaptive softmax's blocked log-normaliser runs under
    `jax.checkpoint`: its logits are recomputed in the backward pass, over a vocabulary padded to whole blocks);
  * work whose result is partly thrown away: the k/v projections of [memory; h] are one matmul, so their input
    gradient is computed for the memory rows too and dropped at the stop-gradient (TXL and XLNet, 2·mem·d·2H per
    layer and example); with scanned layers XLNet's last content stream is computed (forward and backward), since a
    scan body is the same for every layer; the adaptive input projects every token through every cluster's
    projection and the tails run in fixed-size token chunks; XLNet without bi_data still projects the position keys
    in both directions.
`xlgen plan` reports the executed matmuls counted on the traced step (`plan.jaxpr_matmul_flops`) next to this model;
MFU = model FLOPs / (devices · peak · time).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional, Sequence, Tuple

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


@dataclasses.dataclass(frozen=True)
class FlopCount:
    """The record of a system whose training FLOPs are counted, in `Family.records` (`xlgen.models.family`):
    `train_step(config)` = the analytic model FLOPs of one global training step (`xlgen.models.<family>.cost`)."""

    train_step: Callable[[Any], float]


def train_flops_per_step(config, count: Optional[FlopCount]) -> float:
    """Model FLOPs (forward + backward, no remat) of one global training batch: the system's `FlopCount`; 0.0 for a
    system that counts none (no MFU)."""
    return float(count.train_step(config)) if count is not None else 0.0
