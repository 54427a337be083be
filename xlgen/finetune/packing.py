"""Packed finetuning batches (`finetune.packing=true`): several examples per row, each attending only to itself.

Short inputs (GLUE pairs) fill a fraction of `max_seq_length`; packing places several examples in one row so a step
pays for fewer padding positions. Each example keeps what it had alone in a row:

  * attention: `pack_ids` `[b, L]` (example k of the row = k >= 1, the unused tail 0): a position attends only to
    positions with its id (and real tokens, `attention_mask`). XLNet and Funnel attend through *relative* positions,
    so an example's scores equal the unpacked ones (its tokens keep their mutual distances); segment ids and
    `<cls>` stay per example (`token_type_ids` copied, one `<cls>` per example).
  * heads: `cls_index` `[b, E]` (each example's `<cls>`: XLNet's last piece, Funnel's first), `example_mask`
    `[b, E]` (1 = a real example) and `labels` `[b, E]`: logits `[b, E, num_labels]`, the loss a mean over the real
    examples. Token classification keeps per-piece `labels` / `label_mask` `[b, L]`.

Funnel pools the sequence (stride 2 per block, `<cls>` kept apart). Packing is exact under this rule: every example
starts at a multiple of S = 2^(num_blocks - 1) (the total pooling stride) and owns a slot of
`ceil((n + S - 1) / S) * S` positions for its n pieces (at least S - 1 padding positions after it), capped at
`max_seq_length` (an example that long gets a row to itself, laid out exactly as unpacked). Then every pooling
window lies inside one example, except the window that pairs the previous slot's last (padding) position with the
next example's `<cls>`, which the model resolves to that `<cls>` alone (`funnel.model.pool_packed`) — each
example's `<cls>` is kept apart as position 0 is. The decoder's upsampling repeats each pooled state over the
same S positions as unpacked; the padding after each example absorbs the following `<cls>`'s repeats. XLNet needs
no alignment (S = 1, no padding inside a row but its tail).

Rows are filled in order (next fit) from the epoch's permutation, at most `finetune.pack_size` examples per row;
the batch at `step` is rows [step·B, (step+1)·B) of the concatenated epochs: a pure function of (seed, step).
Evaluation keeps one example per row (its logits equal the packed ones, tests/test_packing.py).
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np

Features = Dict[str, np.ndarray]


def pack_stride(config) -> int:
    """S: examples start at multiples of it (Funnel: its total pooling stride; XLNet: 1)."""
    m = config.model
    if m.get("family") == "funnel":
        n_blocks = len(tuple(m.block_sizes))
        return 2 ** (n_blocks - 1)
    return 1


def slot_length(n: int, stride: int, max_len: int) -> int:
    """Positions an example of n pieces occupies in a packed row (see the module docstring)."""
    if stride == 1:
        return n
    return min(-(-(n + stride - 1) // stride) * stride, max_len)


def next_fit(order: np.ndarray, slots: np.ndarray, max_len: int, max_examples: int) -> List[List[int]]:
    """Rows of example indices: `order` cut greedily, a row closed when the next slot would overflow it."""
    rows, cur, used = [], [], 0
    for i in order.tolist():
        s = int(slots[i])
        if cur and (used + s > max_len or len(cur) == max_examples):
            rows.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += s
    if cur:
        rows.append(cur)
    return rows


class Packer:
    """Builds packed rows from one-example-per-row features (`text_features` / `token_features` layout)."""

    def __init__(self, features: Features, *, cls_last: bool, stride: int, max_examples: int, pad_id: int, kind: str):
        self.f = features
        self.L = features["input_ids"].shape[1]
        self.cls_last, self.stride, self.E, self.pad_id, self.kind = cls_last, stride, max_examples, pad_id, kind
        self.lengths = features["attention_mask"].sum(-1).astype(np.int64)
        self.slots = np.array([slot_length(int(n), stride, self.L) for n in self.lengths], np.int64)

    def rows(self, order: np.ndarray) -> List[List[int]]:
        return next_fit(order, self.slots, self.L, self.E)

    def build(self, rows: List[List[int]]) -> Features:
        """Arrays of the packed rows (shapes in the module docstring)."""
        R, L, E = len(rows), self.L, self.E
        f = self.f
        out = {
            "input_ids": np.full((R, L), self.pad_id, np.int32),
            "token_type_ids": np.zeros((R, L), np.int32),
            "attention_mask": np.zeros((R, L), np.int32),
            "pack_ids": np.zeros((R, L), np.int32),
        }
        token_level = self.kind == "token_classification"
        if token_level:
            out["labels"] = np.zeros((R, L), f["labels"].dtype)
            out["label_mask"] = np.zeros((R, L), np.float32)
        else:
            out["cls_index"] = np.zeros((R, E), np.int32)
            out["example_mask"] = np.zeros((R, E), np.float32)
            out["labels"] = np.zeros((R, E), f["labels"].dtype)
        for r, members in enumerate(rows):
            o = 0
            for k, i in enumerate(members):
                n, s = int(self.lengths[i]), int(self.slots[i])
                src = slice(L - n, L) if self.cls_last else slice(0, n)  # XLNet: left padding; Funnel: right
                dst = slice(o, o + n)
                for key in ("input_ids", "token_type_ids", "attention_mask"):
                    out[key][r, dst] = f[key][i, src]
                out["pack_ids"][r, o : o + s] = k + 1
                if token_level:
                    out["labels"][r, dst] = f["labels"][i, src]
                    out["label_mask"][r, dst] = f["label_mask"][i, src]
                else:
                    out["cls_index"][r, k] = o + n - 1 if self.cls_last else o
                    out["example_mask"][r, k] = 1.0
                    out["labels"][r, k] = f["labels"][i]
                o += s
        return out


class PackedFeaturePipeline:
    """`batch(step)`: this process's packed rows of global step `step` (pure function of (seed, step)); epoch e is
    the permutation `default_rng([seed, e])` of the examples (as `FeaturePipeline`) packed by `next_fit`."""

    def __init__(self, packer: Packer, *, global_batch_size: int, seed: int = 0, process_index=0, process_count=1):
        if global_batch_size % process_count:
            raise ValueError(f"global_batch_size={global_batch_size} is not divisible by process_count={process_count}")
        self.packer = packer
        self.num_examples = len(packer.lengths)
        if self.num_examples == 0:
            raise ValueError("no training features (empty split?)")
        self.global_batch_size = global_batch_size
        self.local_batch_size = global_batch_size // process_count
        self.seed, self.process_index = seed, process_index
        self._epochs: List[List[List[int]]] = []  # packed rows of epochs 0, 1, ...
        self._starts = [0]  # global row index where each epoch begins

    def epoch_rows(self, e: int) -> List[List[int]]:
        while len(self._epochs) <= e:
            k = len(self._epochs)
            order = np.random.default_rng([self.seed, k]).permutation(self.num_examples)
            self._epochs.append(self.packer.rows(order))
            self._starts.append(self._starts[-1] + len(self._epochs[-1]))
        return self._epochs[e]

    def rows_at(self, g: int) -> List[int]:
        """Example indices of global packed row g."""
        e = 0
        while True:
            rows = self.epoch_rows(e)
            if g < self._starts[e + 1]:
                return rows[g - self._starts[e]]
            e += 1

    def batch(self, step: int) -> Features:
        start = step * self.global_batch_size + self.process_index * self.local_batch_size
        return self.packer.build([self.rows_at(g) for g in range(start, start + self.local_batch_size)])

    def examples_per_row(self) -> float:
        """Mean examples per packed row over the first epoch."""
        return self.num_examples / len(self.epoch_rows(0))
