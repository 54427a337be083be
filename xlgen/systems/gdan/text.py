"""GDAN's text side: word tokenisation with character offsets, the shared vocabulary, answer-candidate extractors
and the context baseline's questions (thesis §3.2.3, §3.2.5).

Generator and reader share one word vocabulary (so a sampled question is the reader's input as it is):

    0 <pad>  1 <unk>  2 <sep>  3 <cls>  4 <bos>  5 <eos>  6 <d_true>  7 <d_gen>   then words by count (ties: a-z)

Words are lower-cased runs of letters/digits or single punctuation marks (`WORD_RE`); the offsets index the
original text, so a predicted word span maps back to the original characters the official scorer reads.

Answer candidates (thesis §3.2.5 tags words with the Stanford POS tagger and NER and keeps chunks of SQuAD's ten
answer types). xlgen has no tagger; the default extractor `rules` is a documented deviation that uses surface
rules only: runs of capitalised words (allowing "of", "the", "de", "and" inside: persons, places, organisations),
numbers with an optional following unit or month word (dates, quantities), and short noun phrases after a
determiner ("the old mill"). `EXTRACTORS` is the registry of extractors; `config.data.extractor` names one, or is
"package.module:function" for a user's own `(text) -> [(char_start, char_end), ...]`.
"""

from __future__ import annotations

import collections
import importlib
import re
from typing import Callable, Dict, Iterable, List, Sequence, Tuple

import numpy as np

PAD, UNK, SEP, CLS, BOS, EOS, D_TRUE, D_GEN = range(8)
SPECIALS = ("<pad>", "<unk>", "<sep>", "<cls>", "<bos>", "<eos>", "<d_true>", "<d_gen>")
WORD_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)

Span = Tuple[int, int]


def words_with_offsets(text: str) -> Tuple[List[str], List[int], List[int]]:
    """(lower-cased words, char starts, char ends) of `text`."""
    ws, ss, es = [], [], []
    for m in WORD_RE.finditer(text):
        ws.append(m.group().lower())
        ss.append(m.start())
        es.append(m.end())
    return ws, ss, es


def words(text: str) -> List[str]:
    return [m.group().lower() for m in WORD_RE.finditer(text)]


class Vocab:
    """Word <-> id with the specials first (module docstring)."""

    def __init__(self, itos: Sequence[str]):
        self.itos = list(itos)
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    @classmethod
    def build(cls, texts: Iterable[str], max_size: int) -> "Vocab":
        counts = collections.Counter(w for t in texts for w in words(t))
        ranked = sorted((w for w in counts if w not in SPECIALS), key=lambda w: (-counts[w], w))
        return cls(list(SPECIALS) + ranked[: max(0, int(max_size) - len(SPECIALS))])

    def __len__(self) -> int:
        return len(self.itos)

    def ids(self, ws: Sequence[str]) -> List[int]:
        return [self.stoi.get(w, UNK) for w in ws]

    def decode(self, ids: Sequence[int]) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            if i != PAD:
                out.append(self.itos[i] if 0 <= i < len(self.itos) else "<unk>")
        return " ".join(out)


# -------------------------------------------------------------------------------------------------------------
# Answer candidates
# -------------------------------------------------------------------------------------------------------------

_CAP_INNER = {"of", "the", "de", "and", "von", "van", "la", "le", "du"}
_DETERMINERS = {"the", "a", "an", "this", "that", "these", "those", "his", "her", "its", "their", "our"}
_STOP = {"and", "or", "but", "was", "were", "is", "are", "of", "in", "on", "at", "to", "for", "by", "with", "from"}
_UNITS = {
    "percent",
    "years",
    "year",
    "days",
    "people",
    "miles",
    "km",
    "million",
    "billion",
    "thousand",
    "hundred",
    "dollars",
    "pounds",
} | {m.lower() for m in "January February March April May June July August September October November December".split()}


def rule_candidates(text: str) -> List[Span]:
    """Character spans of answer candidates by surface rules (module docstring): capitalised runs, numbers with a
    unit, determiner noun phrases (at most three words after the determiner, stopping at punctuation or a stop
    word). Sorted, duplicates removed."""
    toks = [(m.group(), m.start(), m.end()) for m in WORD_RE.finditer(text)]
    spans = set()
    i, n = 0, len(toks)
    while i < n:
        w = toks[i][0]
        if w[:1].isupper() and w.isalpha():
            j = i + 1
            while j < n and (
                (toks[j][0][:1].isupper() and toks[j][0].isalpha())
                or (toks[j][0] in _CAP_INNER and j + 1 < n and toks[j + 1][0][:1].isupper())
            ):
                j += 1
            sentence_start = i == 0 or toks[i - 1][0] in ".!?"
            if not (sentence_start and j == i + 1 and w.lower() in _DETERMINERS | _STOP):
                spans.add((toks[i][1], toks[j - 1][2]))
            i = j
            continue
        if w[:1].isdigit():
            j = i + 1
            while j + 1 < n and toks[j][0] in ",." and toks[j + 1][0].isdigit():
                j += 2
            if j < n and toks[j][0].lower() in _UNITS:
                j += 1
            spans.add((toks[i][1], toks[j - 1][2]))
            i = j
            continue
        if w.lower() in _DETERMINERS and i + 1 < n and toks[i + 1][0].isalpha():
            j = i + 1
            while j < n and j < i + 4 and toks[j][0].isalpha() and toks[j][0].lower() not in _STOP:
                j += 1
            if j > i + 1:
                spans.add((toks[i + 1][1], toks[j - 1][2]))
        i += 1
    return sorted(spans)


EXTRACTORS: Dict[str, Callable[[str], List[Span]]] = {"rules": rule_candidates}


def extractor(name: str) -> Callable[[str], List[Span]]:
    """`config.data.extractor`: a key of `EXTRACTORS` or "package.module:function"."""
    if name in EXTRACTORS:
        return EXTRACTORS[name]
    if ":" in name:
        module, attr = name.split(":", 1)
        return getattr(importlib.import_module(module), attr)
    raise ValueError(f"config.data.extractor={name!r}: expected one of {sorted(EXTRACTORS)} or 'module:function'")


def word_span(starts: Sequence[int], ends: Sequence[int], c0: int, c1: int) -> Tuple[int, int]:
    """The word indices (first, last) covering characters [c0, c1); (-1, -1) when none does."""
    first = next((k for k, e in enumerate(ends) if e > c0), -1)
    last = next((k for k in range(len(starts) - 1, -1, -1) if starts[k] < c1), -1)
    if first < 0 or last < first:
        return -1, -1
    return first, last


def context_question(ws: Sequence[str], start: int, end: int, window: int) -> List[str]:
    """The context baseline's question (§3.2.3): the `window` words before the answer and the `window` after it,
    (p_{j-W}, ..., p_{j-1}, p_{k+1}, ..., p_{k+W})."""
    return list(ws[max(0, start - window) : start]) + list(ws[end + 1 : end + 1 + window])


def window_start(n: int, start: int, end: int, width: int) -> int:
    """First word of the `width`-word window of an n-word paragraph that centres the answer [start, end]."""
    if n <= width:
        return 0
    centre = (start + end) // 2
    return int(np.clip(centre - width // 2, 0, n - width))
