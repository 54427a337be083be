"""Analytic training FLOPs per step (forward + backward = 3 x forward), for MFU.

Counted: every matmul (2 * m * n * k), i.e. the dense projections, the feed-forward, the softmax / LM head, and
the attention score and value products including the relative-position term:

  per layer, per example, query length q, key length k = mem + q, heads n, head width dh, model width d:
    projections   2 * q * d * (3 n dh)  (q, k, v over the segment)  + 2 * k_mem * d * 2 n dh (k, v over memory)
                  + 2 * R * d * n dh  (position keys, R = k (+ q for bidirectional))  + 2 * q * n dh * d (output)
    scores        2 * q * n dh * (k + R (+ 2))        content, position before the shift (+ segment select)
    values        2 * q * k * n dh
    ffn           2 * 2 * q * d * d_inner
  LM head         2 * q * d * V (tied or not; adaptive softmax counted as its clusters)

The memory k/v projections (stop-gradient input) and the position-key projection (computed once per batch and
direction) get a weight gradient only. Element-wise work (softmax, LayerNorm, relative shift) is ignored, as in the usual 6ND-style accounting.
Funnel uses `xlgen.models.funnel_cost` (the Funnel engineer's per-block cost with pooling) when available.
"""

from __future__ import annotations

import importlib
from typing import Dict, Tuple


def _attn_layer_fwd(q: int, k: int, d: int, n: int, dh: int, d_inner: int, *, segment: bool,
                    pos_rows: int) -> Tuple[float, float]:
    """Per example: (flops with input gradients, memory k/v projection flops). The memory is stop-gradient, so its
    projections have no input gradient (backward = 1x forward instead of 2x). The position term multiplies the
    queries with all `pos_rows` relative-position keys before the (free) shift; the segment term with the two
    segment embeddings before the (free) select."""
    mem = k - q
    proj = 2 * q * d * 3 * n * dh + 2 * q * n * dh * d
    scores = 2 * q * n * dh * (k + pos_rows + (2 if segment else 0))
    values = 2 * q * k * n * dh
    ffn = 4 * q * d * d_inner
    return float(proj + scores + values + ffn), float(2 * mem * d * 2 * n * dh)


def _train(per_example: float, mem_proj: float, batch: int, pos_proj: float) -> float:
    """Training FLOPs: 3x forward for everything with input gradients, 2x for the stop-gradient memory projections
    (weight gradient only), and the position-key projection once per batch (sinusoids do not depend on the
    example) with a weight gradient only."""
    return 3.0 * batch * per_example + 2.0 * batch * mem_proj + 2.0 * pos_proj


def txl_train_flops(m, batch: int, tgt_len: int, mem_len: int) -> float:
    d, n, dh, di, L, V = (int(m.d_model), int(m.n_head), int(m.d_head), int(m.d_inner), int(m.n_layer),
                          int(m.get("vocab_size", m.get("n_token", 0))))
    k = tgt_len + max(mem_len, 0)
    main, mem = _attn_layer_fwd(tgt_len, k, d, n, dh, di, segment=False, pos_rows=k)
    head = 2 * tgt_len * d * V
    return _train(L * main + head, L * mem, batch, L * 2 * k * d * n * dh)


def xlnet_train_flops(m, batch: int, seq_len: int, num_predict: int, mem_len: int, bi_data: bool) -> float:
    d, n, dh, di, L, V = (int(m.d_model), int(m.n_head), int(m.d_head), int(m.d_inner), int(m.n_layer),
                          int(m.vocab_size))
    k = seq_len + max(mem_len, 0)
    rows = k + seq_len  # bidirectional distances klen ... -qlen+1
    main, mem = _attn_layer_fwd(seq_len, k, d, n, dh, di, segment=True, pos_rows=rows)
    # query stream: num_predict queries reuse the content keys/values/position keys; own q and output projections,
    # content + values against k keys, position against all rows, segment against 2 embeddings, and the ffn
    query = (2 * num_predict * d * n * dh * 2 + 2 * num_predict * n * dh * (2 * k + rows + 2)
             + 4 * num_predict * d * di)
    head = 2 * num_predict * d * V
    directions = 2 if bi_data else 1
    return _train(L * (main + query) + head, L * mem, batch, directions * L * 2 * (k + seq_len) * d * n * dh)


def train_flops_per_step(config, param_shapes: Dict[str, Tuple[int, ...]] | None = None) -> float:
    """3 x forward FLOPs of one global training batch (0.0 if the family has no cost model)."""
    fam = config.model.family
    data = config.data
    if fam == "transformer_xl":
        return txl_train_flops(config.model, int(data.batch_size), int(data.tgt_len), int(config.model.mem_len))
    if fam == "xlnet":
        return xlnet_train_flops(config.model, int(data.batch_size), int(data.seq_len), int(data.num_predict),
                                 int(config.model.get("mem_len") or 0), bool(data.get("bi_data", False)))
    if fam == "funnel":
        try:
            cost = importlib.import_module("xlgen.models.funnel_cost")
        except ImportError:
            return 0.0
        fn = getattr(cost, "train_flops_per_step", None)
        if fn is not None:
            return float(fn(config))
        fwd_fn = getattr(cost, "forward_flops", None)
        if fwd_fn is None:
            return 0.0
        fwd = float(fwd_fn(config))
    else:
        return 0.0
    return 3.0 * fwd


def mfu(flops_per_step: float, seconds_per_step: float, num_devices: int, peak_flops_per_device: float) -> float:
    if peak_flops_per_device <= 0 or seconds_per_step <= 0:
        return 0.0
    return flops_per_step / seconds_per_step / (num_devices * peak_flops_per_device)
