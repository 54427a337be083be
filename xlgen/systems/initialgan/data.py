"""Sentence data of InitialGAN: one tokenized sentence per line, a word vocabulary built from the training file,
the length filter of the paper's short (COCO-like) and long (EMNLP-News-like) settings, and batches that are a pure
function of (seed, step), so a resumed run reads exactly the batches it would have read.

Ids: 0 <pad>, 1 <s> (the generator's first input), 2 </s>, 3 <mask> (the aligner's BERT corruption), 4 <unk>,
then words by descending frequency (ties alphabetical). A sentence of w words becomes w ids, </s>, then <pad> up to
`max_len`; sentences with more than `max_len - 1` words are dropped. With no `valid` file, a `valid_fraction` of
the training lines (chosen by `split_seed`) is held out as the reference set.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

PAD, BOS, EOS, MASK, UNK = 0, 1, 2, 3, 4
SPECIALS = ("<pad>", "<s>", "</s>", "<mask>", "<unk>")
FIRST_WORD = len(SPECIALS)
LENGTHS = {"short": 20, "long": 51}  # max_len (words + </s>) of the two settings


class WordVocab:
    def __init__(self, words: Sequence[str]):
        self.itos = list(SPECIALS) + [w for w in words if w not in SPECIALS]
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    @classmethod
    def build(cls, sentences: Sequence[Sequence[str]], max_size: int = 0) -> "WordVocab":
        counts = Counter(w for s in sentences for w in s if w not in SPECIALS)
        words = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        if max_size:
            words = words[: max(0, max_size - FIRST_WORD)]
        return cls(words)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, words: Sequence[str]) -> List[int]:
        return [self.stoi.get(w, UNK) for w in words]

    def decode(self, ids: Sequence[int]) -> str:
        """Words up to the first </s> (or <pad>), specials dropped."""
        out = []
        for i in ids:
            i = int(i)
            if i in (EOS, PAD):
                break
            if i >= FIRST_WORD or i == UNK:
                out.append(self.itos[i])
        return " ".join(out)

    def to_json(self) -> str:
        return json.dumps({"itos": self.itos})

    @classmethod
    def from_json(cls, text: str) -> "WordVocab":
        return cls(json.loads(text)["itos"][FIRST_WORD:])


def read_sentence_file(path: str) -> List[List[str]]:
    """Whitespace-tokenized non-blank lines; ValueError naming the file when there are none."""
    from data_pipelines import paths

    out = [line.split() for line in paths.read_text(path).splitlines()]
    out = [s for s in out if s]
    if not out:
        raise ValueError(f"{path}: no sentences (expected one tokenized sentence per line)")
    return out


def encode_rows(vocab: WordVocab, sentences: Sequence[Sequence[str]], max_len: int) -> np.ndarray:
    """int32 `[n, max_len]` rows (words, </s>, <pad>...) of the sentences with at most max_len - 1 words."""
    keep = [s for s in sentences if len(s) <= max_len - 1]
    rows = np.full((len(keep), max_len), PAD, np.int32)
    for r, s in enumerate(keep):
        ids = vocab.encode(s) + [EOS]
        rows[r, : len(ids)] = ids
    return rows


def split_sentences(
    train: List[List[str]], valid: Optional[List[List[str]]], fraction: float, seed: int
) -> Tuple[List[List[str]], List[List[str]]]:
    """(train, reference): `valid` when given, else a `fraction` of `train` drawn by `seed` (file order kept)."""
    if valid:
        return train, valid
    n_ref = int(round(len(train) * fraction))
    if n_ref <= 0 or n_ref >= len(train):
        raise ValueError(f"data.valid_fraction={fraction} leaves no train or no reference sentences of {len(train)}")
    ref = np.zeros(len(train), bool)
    ref[np.random.default_rng(seed).choice(len(train), n_ref, replace=False)] = True
    return [s for s, r in zip(train, ref) if not r], [s for s, r in zip(train, ref) if r]


def batch_rows(rows: np.ndarray, seed: int, step: int, batch: int, stream: int = 0) -> np.ndarray:
    """`batch` rows drawn without replacement (with, if there are fewer rows) as a function of (seed, step, stream)."""
    rng = np.random.default_rng([seed, step, stream])
    idx = rng.choice(len(rows), batch, replace=len(rows) < batch)
    return rows[idx]


def max_len(data_config) -> int:
    """Words + </s> per row: `data.max_len`, or the `data.length` setting's when 0."""
    if data_config.max_len:
        return int(data_config.max_len)
    if data_config.length not in LENGTHS:
        raise ValueError(f"config.data.length={data_config.length!r}: expected one of {sorted(LENGTHS)}")
    return LENGTHS[data_config.length]


def load(config) -> Dict:
    """{"vocab", "train" rows, "reference" sentences (strings, length-filtered), "max_len"} from `config.data`."""
    d = config.data
    if not d.train:
        raise ValueError("config.data.train is empty: pass --config.data.train=FILE (one sentence per line)")
    length = max_len(d)
    train = read_sentence_file(d.train)
    valid = read_sentence_file(d.valid) if d.valid else None
    train, ref = split_sentences(train, valid, float(d.valid_fraction), int(d.split_seed))
    vocab = WordVocab.build(train, int(d.max_vocab))
    rows = encode_rows(vocab, train, length)
    if len(rows) == 0:
        raise ValueError(f"{d.train}: no sentence has at most {length - 1} words (data.max_len={length})")
    reference = [" ".join(s) for s in ref if len(s) <= length - 1]
    return {"vocab": vocab, "train": rows, "reference": reference, "max_len": length}
