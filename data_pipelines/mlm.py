"""Funnel-Transformer MLM / ELECTRA inputs (BERT-style masking; sample-level shuffling is allowed here).

Rows (`segment_pairs=True`, the original `create_pretrain_data.py`): the token stream is cut into C = (N - 1) //
(seq_len - 3) chunks; global example g = step * B + row reads chunk perm_e[g mod C] of epoch e = g // C, where
perm_e is a Philox-keyed permutation (training) or the identity (evaluation). From the chunk start, `split_a_and_b`
cuts segment A at a sentence boundary; B is the true continuation or, with probability 1/2 (and always when the
chunk holds no boundary), a random sentence-aligned span of the corpus; the two are trimmed to seq_len - 3 tokens
(A on the right, B on a random side, as the original):

    input_ids      = [CLS] A [SEP] B [SEP]
    token_type_ids =   2   0   0   1   1        (the original seg_id_cls / seg_id_a / seg_id_b)

This needs the corpus's sentence layout (text sources have it; `xlgen prepare corpus --layout=sentences`).
Deliberate deviation: A starts at the first sentence start inside its chunk (random access per (seed, step, row)),
where the original scans the stream sequentially and starts the next example where the previous one's A (negative
pair) or B (positive pair) ended. `segment_pairs=False`: `[CLS] chunk [SEP]`, token types all 0 (the "different
segment" attention bias then never receives a gradient).

Masking (Devlin et al. 2019): `mask_prob` of the non-special positions (at least one) are predicted; of those,
1 - random_prob - keep_prob become the mask symbol, random_prob a uniformly random non-special token, keep_prob
stay. `hide_masks_from_attention=True` (the original MLM, `input_func_builder.py`: `input_mask = is_mask | is_pad`
for encoder and decoder) sets `attention_mask` to 0 at the [MASK] symbols, so no position attends to them; the
original ELECTRA masks only padding. ELECTRA uses the same generator input; the discriminator's replacements are sampled inside the train step.
"""

from __future__ import annotations

import functools

import numpy as np

from data_pipelines import rng as rng_lib
from data_pipelines.corpus import TokenCorpus
from data_pipelines.lm import rows_of_process
from data_pipelines.vocab import visible_piece
from data_pipelines.xlnet import RowView, trim_to_length


def predictions_per_row(seq_len: int, mask_prob: float, segment_pairs: bool) -> int:
    """How many positions every row predicts: `mask_prob` of its non-special positions (seq_len - 3 with
    [CLS] A [SEP] B [SEP], seq_len - 2 with [CLS] chunk [SEP]), rounded, at least one. The same in every row."""
    content = int(seq_len) - (3 if segment_pairs else 2)
    return max(1, int(round(float(mask_prob) * content)))


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
        segment_pairs: bool = True,
        hide_masks_from_attention: bool = False,
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
        self.row0, self.local_batch_size = rows_of_process(self.global_batch_size, process_index, process_count)
        tok = corpus.tokenizer
        self.tokenizer, self.vocab_size = tok, tok.vocab_size
        sp = tok.special_ids
        self.cls_id, self.sep_id, self.mask_id = sp.get("cls"), sp.get("sep"), sp.get("mask")
        if None in (self.cls_id, self.sep_id, self.mask_id):
            raise ValueError(f"{corpus.description}: tokenizer {tok.kind} lacks cls/sep/mask symbols needed for MLM")
        special = {i for i in sp.values() if i is not None}
        self.normal_ids = np.array([i for i in range(self.vocab_size) if i not in special], np.int32)
        self.segment_pairs = bool(segment_pairs)
        self.hide_masks_from_attention = bool(hide_masks_from_attention)
        if self.segment_pairs:
            if corpus.sent is None:
                raise ValueError(
                    f"{corpus.description}: data.segment_pairs=True builds [CLS] A [SEP] B [SEP] rows at sentence "
                    "boundaries and needs the sentence layout (xlgen prepare corpus --layout=sentences); or set "
                    "data.segment_pairs=False"
                )
            self.chunk = self.seq_len - 3
            self.num_chunks = (corpus.num_tokens - 1) // self.chunk
            self._view = RowView(corpus, 0, corpus.num_tokens, False)
        else:
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

    def split_a_and_b(self, begin: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
        """The original `_split_a_and_b(data, sent_ids, begin, seq_len - 3)`: (A tokens, B tokens, label), label 1
        when B continues A. len(A) + len(B) = seq_len - 3."""
        view, tot, n = self._view, self.chunk, self.corpus.num_tokens
        lim = min(begin + tot, n - 1 - tot)
        first = view.next_boundary(begin, lim) if begin > 0 else 0
        begin = first if first < lim else begin  # A starts at the chunk's first sentence start, if it has one
        s = view.sent(begin, begin + tot)
        cut_points = (begin + 1 + np.flatnonzero(s[1:] != s[:-1])).tolist()
        end_idx = view.next_boundary(begin + tot, n)
        if not cut_points or rng.random() < 0.5:
            label = 0
            a_end = end_idx if not cut_points else cut_points[int(rng.integers(len(cut_points)))]
            b_len = max(1, tot - (a_end - begin))
            b_begin = int(rng.integers(0, n - b_len + 1))  # random.randint(0, data_len - b_len)
            b_end = view.sentence_end(b_begin + b_len, n)
            b_begin = view.sentence_start(b_begin)
        else:
            label = 1
            a_end = cut_points[int(rng.integers(len(cut_points)))]
            b_begin, b_end = a_end, end_idx
        la, lb = trim_to_length(a_end - begin, b_end - b_begin, tot)
        cut_b = b_end - b_begin - lb
        b_begin += int(rng.binomial(cut_b, 0.5)) if cut_b else 0  # each cut: left or right with probability 1/2
        return view.tokens(begin, begin + la), view.tokens(b_begin, b_begin + lb), label

    def describe_row(self, batch: dict, row: int) -> list:
        """Row `row` of a batch as text lines (`xlgen prepare show`): the masked input, then the labels."""
        piece = functools.partial(visible_piece, self.tokenizer)
        predicted = np.flatnonzero(batch["label_mask"][row].astype(bool))
        return [
            "  input:  " + " ".join(piece(i) for i in batch["input_ids"][row]),
            "  labels: " + " ".join(f"{piece(batch['labels'][row, i])}" for i in predicted),
        ]

    def batch(self, step: int) -> dict:
        if step < 0 or (self.num_steps is not None and step >= self.num_steps):
            raise IndexError(f"step {step} out of range (this pipeline has {self.num_steps} steps)")
        return self.rows([(step, self.row0 + j) for j in range(self.local_batch_size)])

    def rows(self, coords) -> dict:
        """The batch made of the rows `coords` = [(step, global row), ...] (steps may differ: a mixture's rows)."""
        b, S = len(coords), self.seq_len
        labels = np.empty((b, S), np.int32)
        types = np.zeros((b, S), np.int32)
        inputs = np.empty((b, S), np.int32)
        label_mask = np.zeros((b, S), np.float32)
        n_pred = predictions_per_row(S, self.mask_prob, self.segment_pairs)
        p_mask = 1.0 - self.random_prob - self.keep_prob
        for j, (step, g) in enumerate(coords):
            rng = rng_lib.row_rng(self.seed, rng_lib.PURPOSE_MLM, step, g)
            start = self.chunk_index(step, g) * self.chunk
            if self.segment_pairs:
                a, bb, _ = self.split_a_and_b(start, rng)
                la = len(a)
                labels[j] = np.concatenate([[self.cls_id], a, [self.sep_id], bb, [self.sep_id]])
                types[j, 0], types[j, 2 + la :] = 2, 1
                content = np.concatenate([np.arange(1, 1 + la), np.arange(2 + la, S - 1)])
            else:
                labels[j, 0], labels[j, -1] = self.cls_id, self.sep_id
                labels[j, 1:-1] = self.corpus.tokens(start, self.chunk)
                content = np.arange(1, S - 1)
            pos = content[rng.choice(self.chunk, n_pred, replace=False)]
            u = rng.random(n_pred)
            rand_tok = self.normal_ids[rng.integers(len(self.normal_ids), size=n_pred)]
            row = labels[j].copy()
            row[pos] = np.where(u < p_mask, self.mask_id, np.where(u < p_mask + self.random_prob, rand_tok, row[pos]))
            inputs[j] = row
            label_mask[j, pos] = 1.0
        attention = np.ones((b, S), np.int32)
        if self.hide_masks_from_attention:  # the original MLM: input_mask = is_mask | is_pad
            attention[inputs == self.mask_id] = 0
        return {
            "input_ids": inputs,
            "token_type_ids": types,
            "attention_mask": attention,
            "labels": labels,
            "label_mask": label_mask,
        }

    def __iter__(self):
        step = 0
        while self.num_steps is None or step < self.num_steps:
            yield self.batch(step)
            step += 1
