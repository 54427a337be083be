"""Analytic model FLOPs of a Transformer-XL training step (the accounting is stated in `xlgen.models.cost`): R = k
relative positions, the position keys projected once per batch, the (adaptive) softmax LM head and adaptive input."""

from __future__ import annotations

from xlgen.models.cost import adaptive_softmax_fwd, attention_layer, train


def txl_train_flops(m, batch: int, tgt_len: int, mem_len: int) -> float:
    d, n, dh, di, L = int(m.d_model), int(m.n_head), int(m.d_head), int(m.d_inner), int(m.n_layer)
    V = int(m.get("vocab_size", m.get("n_token", 0)))
    mem = max(mem_len, 0)
    k = tgt_len + mem
    main, mem_kv = attention_layer(tgt_len, k, mem, k, d, n * dh, di, segment=False)
    emb, head = adaptive_softmax_fwd(
        tgt_len, d, V, tuple(m.get("cutoffs", ()) or ()), int(m.get("div_val", 1)), int(m.get("d_embed") or d)
    )
    pos_keys = L * 2 * k * d * n * dh  # once per batch
    return train(batch * (L * main + emb + head), batch * L * mem_kv + pos_keys)


def train_flops(config) -> float:
    """Model FLOPs (forward + backward, no remat) of one global training batch of a training config."""
    data = config.data
    return txl_train_flops(config.model, int(data.batch_size), int(data.tgt_len), int(config.model.mem_len))
