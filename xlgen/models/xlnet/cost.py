"""Analytic model FLOPs of an XLNet training step (the accounting is stated in `xlgen.models.cost`): R = k + q relative
positions, the position keys projected once per batch and direction, the query stream, the last content stream not
counted."""

from __future__ import annotations

from xlgen.models.cost import attention_layer, train


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
    content, mem_kv = attention_layer(seq_len, k, mem, rows, d, h, di, segment=True)
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
    return train(batch * (layers + head), batch * L * mem_kv + pos_keys)


def train_flops(config) -> float:
    """Model FLOPs (forward + backward, no remat) of one global training batch of a training config."""
    data = config.data
    return xlnet_train_flops(
        config.model,
        int(data.batch_size),
        int(data.seq_len),
        int(data.num_predict),
        int(config.model.get("mem_len") or 0),
        bool(data.get("bi_data", False)),
    )
