"""Transformer-XL LM streams: the global batch is `global_batch_size` contiguous streams (rows).

Per pass, the (rotated) corpus is cut into B rows of L = N // B tokens (`batchify`); at step t of a pass, row r
holds stream tokens [r*L + t*tgt_len, r*L + (t+1)*tgt_len) and the next tokens as labels, so segment t of every
row continues segment t-1 (mems stay meaningful). A pass has (L-1) // tgt_len steps; pass p >= 1 uses the corpus
rotated by a random offset keyed by (seed, p) — the original `batchify(..., num_passes)` random rotations, so the
N - B*L dropped tail tokens differ per pass. `stream_reset[r]` is True at the first step of each pass.

Process p of P materialises global rows [p*B/P, (p+1)*B/P) only; `batch(step)` is a pure function of
(seed, step, rows). Evaluation (`finite=True`) is one unrotated pass of `ceil((L-1)/tgt_len)` steps; the last
segment is right-padded and `label_mask` marks the real targets. Scored: B * (L - 1) tokens, i.e. every token
except the final N - B*L and the first token of each row (the corpus's first token and the B - 1 row starts are
inputs only, never predicted), as the original `LMOrderedIterator` / `batchify`.
"""

from __future__ import annotations

import math

import numpy as np

from data_pipelines import rng as rng_lib
from data_pipelines.corpus import TokenCorpus


def rows_of_process(global_batch_size: int, process_index: int, process_count: int, what: str = "batch_size"):
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"bad process_index={process_index} / process_count={process_count}")
    if global_batch_size % process_count:
        raise ValueError(f"data.{what}={global_batch_size} is not divisible by process_count={process_count}")
    n = global_batch_size // process_count
    return process_index * n, n


class LMStreamPipeline:
    """`batch(step)` -> {input_ids int32 [b,l], labels int32 [b,l], label_mask float32 [b,l], stream_reset bool [b]}."""

    def __init__(
        self,
        corpus: TokenCorpus,
        *,
        global_batch_size: int,
        tgt_len: int,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 1,
        rotate_passes: bool = True,
        finite: bool = False,
    ):
        self.corpus, self.tgt_len, self.seed = corpus, int(tgt_len), int(seed)
        self.global_batch_size = int(global_batch_size)
        self.row0, self.local_batch_size = rows_of_process(self.global_batch_size, process_index, process_count)
        self.rotate_passes, self.finite = rotate_passes, finite
        n = corpus.num_tokens
        self.row_len = n // self.global_batch_size
        if self.row_len < self.tgt_len + 1:
            raise ValueError(
                f"{corpus.description}: corpus too small: {n} tokens cannot fill one global batch of "
                f"{self.global_batch_size} streams x (tgt_len {self.tgt_len} + 1) tokens"
            )
        if finite:
            self.steps_per_pass = math.ceil((self.row_len - 1) / self.tgt_len)
        else:
            self.steps_per_pass = (self.row_len - 1) // self.tgt_len
        self.num_steps = self.steps_per_pass if finite else None
        self.tokenizer = corpus.tokenizer
        self.vocab_size = corpus.tokenizer.vocab_size

    def pass_offset(self, p: int) -> int:
        if p == 0 or not self.rotate_passes:
            return 0
        return int(rng_lib.keyed_rng(self.seed, rng_lib.PURPOSE_PASS, p).integers(self.corpus.num_tokens))

    def row_start(self, step: int, row: int) -> int:
        """Stream position (in the unrotated corpus, before the modulo) of row `row`'s first input at `step`."""
        p, t = divmod(step, self.steps_per_pass)
        return self.pass_offset(p) + row * self.row_len + t * self.tgt_len

    def describe_row(self, batch: dict, row: int) -> list:
        """Row `row` of a batch as text lines (`xlgen prepare show`): whether its stream restarts, and its input."""
        return [f"reset={bool(batch['stream_reset'][row])}", repr(self.tokenizer.decode(batch["input_ids"][row]))]

    def batch(self, step: int) -> dict:
        if step < 0 or (self.finite and step >= self.steps_per_pass):
            raise IndexError(f"step {step} out of range (this pipeline has {self.num_steps} steps)")
        return self.rows([(step, self.row0 + j) for j in range(self.local_batch_size)])

    def rows(self, coords) -> dict:
        """The batch made of the rows `coords` = [(step, global row), ...] (steps may differ: a mixture's rows)."""
        b, l = len(coords), self.tgt_len
        window = np.zeros((b, l + 1), np.int32)
        label_mask = np.zeros((b, l), np.float32)
        reset = np.zeros((b,), bool)
        for j, (step, row) in enumerate(coords):
            t = step % self.steps_per_pass
            avail = min(l, self.row_len - 1 - t * l)  # < l only on the last (padded) eval segment
            window[j, : avail + 1] = self.corpus.tokens(self.row_start(step, row), avail + 1)
            label_mask[j, :avail] = 1.0
            reset[j] = t == 0
        return {"input_ids": window[:, :-1], "labels": window[:, 1:], "label_mask": label_mask, "stream_reset": reset}

    def __iter__(self):
        step = 0
        while self.num_steps is None or step < self.num_steps:
            yield self.batch(step)
            step += 1
