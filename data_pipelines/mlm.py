"""Funnel-Transformer MLM / ELECTRA inputs (BERT-style masking; sample-level shuffling is allowed here).

The token stream is cut into C = N // (seq_len - 2) chunks; example `[CLS] chunk [SEP]` (Funnel puts [CLS]
first). Global example g = step * B + row reads chunk perm_e[g mod C] of epoch e = g // C, where perm_e is a
Philox-keyed permutation (training) or the identity (evaluation). Masking (Devlin et al. 2019): `mask_prob` of
the non-special positions (at least one) are predicted; of those, 1 - random_prob - keep_prob become the mask
symbol, random_prob a uniformly random non-special token, keep_prob stay. ELECTRA uses the same generator input;
the discriminator's replacements are sampled inside the train step.
"""

from __future__ import annotations

import functools

import numpy as np

from data_pipelines import rng as rng_lib
from data_pipelines.corpus import TokenCorpus
from data_pipelines.lm import process_rows


class MLMPipeline:
    """`batch(step)` -> input_ids (masked), token_type_ids, attention_mask int32 [b,S]; labels int32 [b,S];
    label_mask float32 [b,S] (1 = predict)."""

    def __init__(
        self,
        corpus: TokenCorpus,
        *,
        global_batch_size: int,
        seq_len: int = 128,
        mask_prob: float = 0.15,
        random_prob: float = 0.1,
        keep_prob: float = 0.1,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 1,
        shuffle: bool = True,
        num_steps: int | None = None,
    ):
        self.corpus, self.seq_len, self.seed, self.shuffle = corpus, int(seq_len), int(seed), shuffle
        self.mask_prob, self.random_prob, self.keep_prob = float(mask_prob), float(random_prob), float(keep_prob)
        if not (
            0 < self.mask_prob < 1
            and self.random_prob >= 0
            and self.keep_prob >= 0
            and self.random_prob + self.keep_prob <= 1
        ):
            raise ValueError("need 0 < mask_prob < 1, random_prob, keep_prob >= 0, random_prob + keep_prob <= 1")
        self.global_batch_size = int(global_batch_size)
        self.row0, self.local_batch_size = process_rows(self.global_batch_size, process_index, process_count)
        tok = corpus.tokenizer
        self.tokenizer, self.vocab_size = tok, tok.vocab_size
        sp = tok.special_ids
        self.cls_id, self.sep_id, self.mask_id = sp.get("cls"), sp.get("sep"), sp.get("mask")
        if None in (self.cls_id, self.sep_id, self.mask_id):
            raise ValueError(f"{corpus.description}: tokenizer {tok.kind} lacks cls/sep/mask symbols needed for MLM")
        special = {i for i in sp.values() if i is not None}
        self.normal_ids = np.array([i for i in range(self.vocab_size) if i not in special], np.int32)
        self.chunk = self.seq_len - 2
        self.num_chunks = corpus.num_tokens // self.chunk
        if self.num_chunks < self.global_batch_size:
            raise ValueError(
                f"{corpus.description}: corpus too small: {corpus.num_tokens} tokens make "
                f"{self.num_chunks} examples of seq_len {self.seq_len}, fewer than one global batch "
                f"({self.global_batch_size})"
            )
        epoch_steps = self.num_chunks // self.global_batch_size
        self.num_steps = None if shuffle else (min(num_steps, epoch_steps) if num_steps else epoch_steps)

    @functools.lru_cache(maxsize=2)
    def _perm(self, epoch: int) -> np.ndarray:
        return rng_lib.keyed_rng(self.seed, rng_lib.PURPOSE_SHUFFLE, epoch).permutation(self.num_chunks)

    def chunk_index(self, step: int, row: int) -> int:
        e, k = divmod(step * self.global_batch_size + row, self.num_chunks)
        return int(self._perm(e)[k]) if self.shuffle else k

    def batch(self, step: int) -> dict:
        if step < 0 or (self.num_steps is not None and step >= self.num_steps):
            raise IndexError(f"step {step} out of range (this pipeline has {self.num_steps} steps)")
        b, S = self.local_batch_size, self.seq_len
        labels = np.empty((b, S), np.int32)
        labels[:, 0], labels[:, -1] = self.cls_id, self.sep_id
        inputs = np.empty((b, S), np.int32)
        label_mask = np.zeros((b, S), np.float32)
        n_pred = max(1, int(round(self.mask_prob * self.chunk)))
        p_mask = 1.0 - self.random_prob - self.keep_prob
        for j in range(b):
            g = self.row0 + j
            labels[j, 1:-1] = self.corpus.tokens(self.chunk_index(step, g) * self.chunk, self.chunk)
            rng = rng_lib.row_rng(self.seed, rng_lib.PURPOSE_MLM, step, g)
            pos = 1 + rng.choice(self.chunk, n_pred, replace=False)
            u = rng.random(n_pred)
            rand_tok = self.normal_ids[rng.integers(len(self.normal_ids), size=n_pred)]
            row = labels[j].copy()
            row[pos] = np.where(u < p_mask, self.mask_id, np.where(u < p_mask + self.random_prob, rand_tok, row[pos]))
            inputs[j] = row
            label_mask[j, pos] = 1.0
        return {
            "input_ids": inputs,
            "token_type_ids": np.zeros((b, S), np.int32),
            "attention_mask": np.ones((b, S), np.int32),
            "labels": labels,
            "label_mask": label_mask,
        }

    def __iter__(self):
        step = 0
        while self.num_steps is None or step < self.num_steps:
            yield self.batch(step)
            step += 1
