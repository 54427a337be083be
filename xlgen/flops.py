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
(sinusoids) counted with one gradient only, and the MLM softmax at the `objective_options.max_predictions` selected
positions when set (`funnel_train_flops`; with 0, the default, the implementation computes logits at every position
and that is counted).

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

import importlib
import math
from typing import Dict, Sequence, Tuple

_EULER_GAMMA = 0.5772156649


def _harmonic(n: int) -> float:
    return 0.0 if n <= 0 else math.log(n) + _EULER_GAMMA + 1.0 / (2 * n)


def zipf_share(start: int, end: int, vocab: int) -> float:
    """Share of running-text tokens whose id lies in [start, end) under Zipf's law (frequency ∝ 1/rank, ids sorted by
    frequency, as word-level LM vocabularies are): (H(end) - H(start)) / H(vocab)."""
    return (_harmonic(end) - _harmonic(start)) / _harmonic(vocab)


def _layer(q: int, k: int, mem: int, rows: int, d: int, h: int, d_inner: int, *, segment: bool) -> Tuple[float, float]:
    """Forward FLOPs of one attention + FFN layer for one example: (with input gradients, memory k/v projections).
    The memory is stop-gradient: its projections get a weight gradient only."""
    proj = 2 * q * d * h * 4  # q, k, v over the segment; o
    scores = 2 * q * h * (k + rows + (2 if segment else 0))
    values = 2 * q * k * h
    ffn = 4 * q * d * d_inner
    return float(proj + scores + values + ffn), float(2 * mem * d * 2 * h)


def _train(grad_in: float, weight_grad_only: float) -> float:
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


def txl_train_flops(m, batch: int, tgt_len: int, mem_len: int) -> float:
    d, n, dh, di, L = int(m.d_model), int(m.n_head), int(m.d_head), int(m.d_inner), int(m.n_layer)
    V = int(m.get("vocab_size", m.get("n_token", 0)))
    mem = max(mem_len, 0)
    k = tgt_len + mem
    main, mem_kv = _layer(tgt_len, k, mem, k, d, n * dh, di, segment=False)
    emb, head = adaptive_softmax_fwd(
        tgt_len, d, V, tuple(m.get("cutoffs", ()) or ()), int(m.get("div_val", 1)), int(m.get("d_embed") or d)
    )
    pos_keys = L * 2 * k * d * n * dh  # once per batch
    return _train(batch * (L * main + emb + head), batch * L * mem_kv + pos_keys)


def xlnet_train_flops(m, batch: int, seq_len: int, num_predict: int, mem_len: int, bi_data: bool) -> float:
    d, n, dh, di, L, V = (
        int(m.d_model),
        int(m.n_head),
        int(m.d_head),
        int(m.d_inner),
        int(m.n_layer),
        int(m.vocab_size),
    )
    h = n * dh
    mem = max(mem_len, 0)
    k = seq_len + mem
    rows = k + seq_len  # bidirectional distances klen ... -qlen+1
    content, mem_kv = _layer(seq_len, k, mem, rows, d, h, di, segment=True)
    if num_predict > 0:
        # query stream: own q and o projections, content + values against the k keys, position against all rows,
        # segment against the 2 embeddings, and the ffn; the last content stream only supplies keys and values
        query = 2 * num_predict * d * h * 2 + 2 * num_predict * h * (2 * k + rows + 2) + 4 * num_predict * d * di
        kv_segment = 2 * seq_len * d * h * 2
        layers = L * (content + query) - (content - kv_segment)
        head = 2 * num_predict * d * V
    else:
        layers, head = L * content, 2 * seq_len * d * V
    directions = 2 if bi_data else 1
    pos_keys = directions * L * 2 * rows * d * h  # once per batch and direction
    return _train(batch * (layers + head), batch * L * mem_kv + pos_keys)


def train_flops_per_step(config, param_shapes: Dict[str, Tuple[int, ...]] | None = None) -> float:
    """Model FLOPs (forward + backward, no remat) of one global training batch (0.0 if the family has no model)."""
    fam = config.model.family
    data = config.data
    if fam == "transformer_xl":
        return txl_train_flops(config.model, int(data.batch_size), int(data.tgt_len), int(config.model.mem_len))
    if fam == "xlnet":
        return xlnet_train_flops(
            config.model,
            int(data.batch_size),
            int(data.seq_len),
            int(data.num_predict),
            int(config.model.get("mem_len") or 0),
            bool(data.get("bi_data", False)),
        )
    if fam == "funnel":
        return funnel_train_flops(config)
    return 0.0


def _funnel_position_work(cfg, seq_len: int) -> float:
    """Forward FLOPs of one sequence's position work whose other factor is a constant, as counted by
    `funnel_cost.flops_per_sequence`: relative_shift: the position keys W_r·R (2·R·d·H per layer application);
    factorized: the products with the sinusoid factors (2·q·k·n·2d)."""
    from xlgen.models.funnel.cost import pooled_lengths

    def work(q, k, r):
        if cfg.attention_type == "relative_shift":
            return 2.0 * r * cfg.d_model * cfg.n_head * cfg.d_head
        return 2.0 * q * k * cfg.n_head * 2 * cfg.d_model

    lengths, total, prev = pooled_lengths(seq_len, cfg), 0.0, seq_len
    for m, (n_layers, reps) in enumerate(zip(cfg.block_sizes, cfg.block_repeats)):
        t, applications = lengths[m], n_layers * reps
        if t != prev:  # the pooling layer: queries at t, keys at prev
            total += work(t, prev, 2 * t + prev) if cfg.pool_q_only else work(t, t, 2 * t)
            applications -= 1
        total += applications * work(t, t, 2 * t)
        prev = t
    return total + cfg.num_decoder_layers * work(seq_len, seq_len, 2 * seq_len)


def funnel_train_flops(config) -> float:
    """`funnel_cost.train_flops_per_step` (3 x its per-sequence forward x batch) with the position work counted as
    the math needs it: relative_shift's position keys W_r·R do not depend on the example (projected once per batch,
    weight gradient only: 2x); factorized's products with the constant sinusoid factors need the gradient w.r.t. the
    query side only (2x)."""
    try:
        cost = importlib.import_module("xlgen.models.funnel.cost")
    except ImportError:
        return 0.0
    total = float(cost.train_flops_per_step(config))
    cfg = cost.config_from_model_section(config.model)
    nets = [cfg]
    if str(config.get("objective") or "funnel_mlm") == "funnel_electra":
        from xlgen.models.funnel.heads import generator_config

        width = float((config.get("objective_options") or {}).get("generator_width", 0.25))
        nets.append(generator_config(cfg, width))
    batch, seq_len = int(config.data.batch_size), int(config.data.seq_len)
    for net in nets:
        work = _funnel_position_work(net, seq_len)
        total -= (3.0 * batch - 2.0) * work if net.attention_type == "relative_shift" else batch * work
    # funnel_cost puts the MLM softmax (and its d_model -> d_embed transform) at every position; with
    # objective_options.max_predictions = k the heads run on the k selected positions only
    k = int((config.get("objective_options") or {}).get("max_predictions", 0) or 0)
    if 0 < k < seq_len:
        mlm = nets[-1]  # the MLM model, or ELECTRA's generator
        transform = mlm.d_model * mlm.embed_dim if (mlm.mlm_transform or mlm.embed_dim != mlm.d_model) else 0
        total -= 3.0 * batch * (seq_len - k) * 2.0 * (mlm.embed_dim * mlm.vocab_size + transform)
    return total


def mfu(flops_per_step: float, seconds_per_step: float, num_devices: int, peak_flops_per_device: float) -> float:
    if peak_flops_per_device <= 0 or seconds_per_step <= 0:
        return 0.0
    return flops_per_step / seconds_per_step / (num_devices * peak_flops_per_device)
