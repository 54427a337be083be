"""Task tokenizers that also return character offsets into the ORIGINAL text.

Finetuning needs two things the pretraining tokenizers do not: the ids of the special tokens that frame a task input
(`<cls>`, `<sep>`, `<pad>`), and, for SQuAD, where each piece came from in the original text so that a predicted
piece span maps back to the exact original characters.

* `SentencePieceTaskTokenizer` (XLNet, `spiece.model`): the ids are exactly pretraining's
  (`data_pipelines.vocab.SentencePieceTokenizer`, the original `prepro_utils.encode_ids`: `preprocess_text`, then
  SentencePiece, then "<digits>," pieces re-split so the comma is its own piece). For offsets, `preprocess_text` is
  applied character by character while remembering the source index of every output character; SentencePiece
  reports byte offsets of every piece in the preprocessed text (re-split pieces: of their re-encoding); composing the
  two gives exact original character spans. This replaces the original's approximate LCS alignment
  (`run_squad.py`) with an exact one: same pieces, same spans whenever the LCS succeeds.
* `WordPieceTaskTokenizer` (Funnel/BERT, `vocab.txt`): the `tokenizers` library reports original offsets itself.
* `SymbolTaskTokenizer` (an xlgen character or byte `vocab.json`, what the tiny pretraining configs use): one id
  per character (byte), each covering its own character; `<cls>`, `<sep>`, `<pad>` are among the vocabulary's XLNet
  special symbols, so a workdir pretrained on a character vocabulary finetunes with its own tokenizer.

Both expose `encode(text) -> list[int]` and `encode_with_offsets(text) -> (ids, starts, ends)` where
`text[starts[i]:ends[i]]` is the original text piece i covers (leading whitespace excluded; zero width for pieces
that cover only whitespace, e.g. a lone "▁").
"""

from __future__ import annotations

import os
from typing import List, Sequence, Tuple

import numpy as np

Offsets = Tuple[List[int], List[int], List[int]]
TOKENIZER_FILES = ("spiece.model", "tokenizer.model", "vocab.txt", "vocab.json")  # looked for in a directory


def preprocess_with_map(
    text: str, *, lower: bool = False, keep_accents: bool = False, remove_space: bool = True
) -> Tuple[str, List[int], List[int]]:
    """XLNet `prepro_utils.preprocess_text` (`data_pipelines.vocab.preprocess_text`) applied character by character,
    remembering where every output character came from: new_text equals `preprocess_text(text, ...)` (whitespace
    stripped and runs collapsed to one space, `` and '' -> ", accents stripped unless keep_accents, optional
    lower-casing; the one exception is Python's context-dependent final sigma under `lower`).
    Returns (new_text, src, src_end): new_text[k] comes from text[src[k]:src_end[k]] (two characters for `` and '',
    the first character of a collapsed whitespace run)."""
    from data_pipelines.vocab import LATEX_QUOTES, preprocess_text

    out: List[str] = []
    src: List[int] = []
    src_end: List[int] = []
    i, n = 0, len(text)
    if remove_space:  # " ".join(text.strip().split()): drop the ends, one space per interior whitespace run
        while i < n and text[i].isspace():
            i += 1
        while n > i and text[n - 1].isspace():
            n -= 1
    while i < n:
        if remove_space and text[i].isspace():
            out.append(" ")
            src.append(i)
            src_end.append(i + 1)
            while i < n and text[i].isspace():
                i += 1
            continue
        if text[i : i + 2] in LATEX_QUOTES:  # LaTeX-style quotes -> "
            out.append('"')
            src.append(i)
            src_end.append(i + 2)
            i += 2
            continue
        pieces = preprocess_text(text[i], lower=lower, remove_space=False, keep_accents=keep_accents)
        for c in pieces:
            out.append(c)
            src.append(i)
            src_end.append(i + 1)
        i += 1
    return "".join(out), src, src_end


def _byte_to_char(s: str) -> np.ndarray:
    """b2c[k] = index of the character that UTF-8 byte k of `s` belongs to; b2c[len(bytes)] = len(s)."""
    lens = [len(c.encode("utf-8")) for c in s]
    b2c = np.repeat(np.arange(len(s), dtype=np.int64), lens)
    return np.concatenate([b2c, [len(s)]])


class SentencePieceTaskTokenizer:
    """XLNet-style SentencePiece tokenizer with exact original-character offsets."""

    style = "cls_last"

    def __init__(
        self,
        model_file: str | None = None,
        *,
        model_proto: bytes | None = None,
        lower: bool = False,
        keep_accents: bool = False,
    ):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor()
        if model_proto is not None:
            self.sp.LoadFromSerializedProto(model_proto)
        else:
            if not model_file or not os.path.exists(model_file):
                raise FileNotFoundError(f"{model_file}: SentencePiece model not found")
            self.sp.Load(model_file)
        self.lower, self.keep_accents = lower, keep_accents
        self.vocab_size = self.sp.GetPieceSize()

        def special(piece: str) -> int:
            i = self.sp.PieceToId(piece)
            if i == self.sp.unk_id() and piece != self.sp.IdToPiece(self.sp.unk_id()):
                raise ValueError(
                    f"{model_file or '<proto>'}: SentencePiece model has no {piece} piece "
                    "(train it with --control_symbols=<cls>,<sep>,<pad>,<mask>,<eod>)"
                )
            return i

        self.cls_id, self.sep_id, self.pad_id = special("<cls>"), special("<sep>"), special("<pad>")

    def _pieces_with_spans(self, pre: str) -> List[Tuple[int, int, int]]:
        """(id, begin, end) per piece of `encode_pieces(sp, pre)`; begin/end are character offsets into `pre`."""
        from data_pipelines.vocab import SPIECE_UNDERLINE, split_digit_comma

        b2c = _byte_to_char(pre)
        out = []
        for p in self.sp.encode(pre, return_type="proto").pieces:
            b, e = int(b2c[p.begin]), int(b2c[p.end])
            split = split_digit_comma(self.sp, p.piece)
            if split is None:
                out.append((p.id, b, e))
                continue
            # "<digits>," -> the digits re-encoded, then ","; the comma is the last character of the surface.
            ids = [self.sp.PieceToId(q) for q in split]
            bd = b
            while bd < e - 1 and pre[bd].isspace():
                bd += 1
            sub = [
                (q.piece, int(q.begin), int(q.end)) for q in self.sp.encode(pre[bd : e - 1], return_type="proto").pieces
            ]
            if p.piece[0] != SPIECE_UNDERLINE and sub and sub[0][0][0] == SPIECE_UNDERLINE:  # as split_digit_comma
                sub = sub[1:] if len(sub[0][0]) == 1 else [(sub[0][0][1:],) + sub[0][1:]] + sub[1:]
            if [q for q, _, _ in sub] == split[:-1]:
                s2c = _byte_to_char(pre[bd : e - 1])
                spans = [(bd + int(s2c[qb]), bd + int(s2c[qe])) for _, qb, qe in sub]
            else:  # normalisation made the re-encoding differ: the first piece covers all digits
                spans = [(bd, e - 1)] + [(e - 1, e - 1)] * (len(split) - 2)
            out.extend((i, sb, se) for i, (sb, se) in zip(ids, spans + [(e - 1, e)]))
        return out

    def encode_with_offsets(self, text: str) -> Offsets:
        """ids exactly as `encode` (= pretraining's `encode_pieces`), with original-character spans."""
        pre, src, src_end = preprocess_with_map(text, lower=self.lower, keep_accents=self.keep_accents)
        ids, starts, ends = [], [], []
        for i, b, e in self._pieces_with_spans(pre):
            while b < e and pre[b].isspace():  # "▁word" covers the space before the word
                b += 1
            ids.append(i)
            if b >= e:  # whitespace-only or empty surface: zero width at its end
                o = src[e] if e < len(src) else len(text)
                starts.append(o)
                ends.append(o)
            else:
                starts.append(src[b])
                ends.append(src_end[e - 1])
        # Zero-width pieces take the start of the next real piece so spans stay monotone.
        for k in range(len(ids) - 2, -1, -1):
            if starts[k] == ends[k] and k + 1 < len(ids):
                starts[k] = ends[k] = min(starts[k], starts[k + 1])
        return ids, starts, ends

    def encode(self, text: str) -> List[int]:
        """XLNet `prepro_utils.encode_ids(sp, preprocess_text(text))`: the same ids as pretraining's tokenizer
        (`data_pipelines.vocab.SentencePieceTokenizer.encode`), "<digits>," split included."""
        from data_pipelines.vocab import encode_pieces, preprocess_text

        pre = preprocess_text(text, lower=self.lower, keep_accents=self.keep_accents)
        return [self.sp.PieceToId(q) for q in encode_pieces(self.sp, pre)]


class WordPieceTaskTokenizer:
    """BERT/Funnel WordPiece (`vocab.txt`) through the `tokenizers` library; offsets come from the library."""

    style = "cls_first"

    def __init__(self, vocab_file: str, *, lower: bool = True):
        from tokenizers import BertWordPieceTokenizer

        if not os.path.exists(vocab_file):
            raise FileNotFoundError(f"{vocab_file}: WordPiece vocabulary not found")
        self.tok = BertWordPieceTokenizer(vocab_file, lowercase=lower)
        self.vocab_size = self.tok.get_vocab_size()
        vocab = self.tok.get_vocab()
        for name in ("[CLS]", "[SEP]", "[PAD]"):
            if name not in vocab:
                raise ValueError(f"{vocab_file}: vocabulary has no {name} token")
        self.cls_id, self.sep_id, self.pad_id = vocab["[CLS]"], vocab["[SEP]"], vocab["[PAD]"]

    def encode_with_offsets(self, text: str) -> Offsets:
        enc = self.tok.encode(text, add_special_tokens=False)
        return list(enc.ids), [o[0] for o in enc.offsets], [o[1] for o in enc.offsets]

    def encode(self, text: str) -> List[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)


class SymbolTaskTokenizer:
    """An xlgen character/byte vocabulary (`vocab.json`) as a task tokenizer: the ids of pretraining
    (`data_pipelines.vocab.SymbolVocab.encode`, no `<eos>`), each piece covering the character it came from."""

    style = "xlnet"

    def __init__(self, vocab_file: str):
        from data_pipelines.vocab import SymbolVocab

        self.vocab = SymbolVocab.load(vocab_file)
        specials = {k: self.vocab.special_ids[k] for k in ("cls", "sep", "pad")}
        if self.vocab.level == "word" or None in specials.values():
            raise ValueError(
                f"{vocab_file}: a {self.vocab.level}-level vocabulary without <cls>/<sep>/<pad> symbols cannot frame "
                "task inputs; finetune from a character or byte vocab.json, a SentencePiece .model or a WordPiece "
                "vocab.txt (--config.tokenizer=FILE)"
            )
        self.vocab_size = self.vocab.vocab_size
        self.cls_id, self.sep_id, self.pad_id = specials["cls"], specials["sep"], specials["pad"]

    def encode(self, text: str) -> List[int]:
        return self.vocab.encode(text, add_eos=False)

    def encode_with_offsets(self, text: str) -> Offsets:
        ids, starts, ends = [], [], []
        for i, c in enumerate(text):  # a character -> one id (char level) or its UTF-8 bytes' ids (byte level)
            sub = self.vocab.encode(c, add_eos=False)
            ids.extend(sub)
            starts.extend([i] * len(sub))
            ends.extend([i + 1] * len(sub))
        return ids, starts, ends


def load_task_tokenizer(path: str, *, lower: bool | None = None):
    """A tokenizer from a file or a model directory: `spiece.model`/`*.model` -> SentencePiece (XLNet),
    `vocab.txt` -> WordPiece (Funnel), an xlgen `vocab.json` -> characters/bytes (its own `lower` setting).
    `lower` defaults to False for SentencePiece (released XLNet is cased) and True for WordPiece (released Funnel is
    uncased)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        for name in TOKENIZER_FILES:
            if os.path.exists(os.path.join(path, name)):
                return load_task_tokenizer(os.path.join(path, name), lower=lower)
        raise FileNotFoundError(f"{path}: no {', '.join(TOKENIZER_FILES)} in this directory")
    if path.endswith(".model"):
        return SentencePieceTaskTokenizer(path, lower=bool(lower))
    if path.endswith(".txt"):
        return WordPieceTaskTokenizer(path, lower=True if lower is None else lower)
    if path.endswith(".json"):
        return SymbolTaskTokenizer(path)
    raise ValueError(
        f"{path}: unknown tokenizer file (expected a SentencePiece .model, a WordPiece vocab.txt or an xlgen "
        "character/byte vocab.json)"
    )


def cover_span(starts: Sequence[int], ends: Sequence[int], char_start: int, char_end: int) -> Tuple[int, int]:
    """Smallest piece span [i, j] (inclusive) whose characters cover [char_start, char_end). Pieces of zero width
    are never chosen as span ends. Raises ValueError if no piece overlaps the span."""
    i = next((k for k in range(len(starts)) if ends[k] > char_start and ends[k] > starts[k]), None)
    j = next((k for k in range(len(starts) - 1, -1, -1) if starts[k] < char_end and ends[k] > starts[k]), None)
    if i is None or j is None or j < i:
        raise ValueError(f"no piece covers characters [{char_start}, {char_end})")
    return i, j
