"""Tokenizers, one class per kind: character/byte and word vocabularies (`SymbolVocab`, Transformer-XL),
SentencePiece (`SentencePieceTokenizer`, XLNet), WordPiece (`WordPieceTokenizer`, Funnel). Pretraining pipelines,
finetuning readers, `xlgen export`, `xlgen generate` and `from_pretrained` all use these classes.

Every tokenizer has the same small surface (`Tokenizer`):
  `kind`, `vocab_size`, `encode(text) -> list[int]`, `decode(ids) -> str`, `id_to_piece(i)`,
  `special_ids` (dict: unk/cls/sep/pad/mask/eod/eos -> id or None), `is_start_table()` (bool [V]: the piece starts
  a word; used by XLNet span sampling), `fingerprint()` (sha256 of the vocabulary file), `save(dir) -> filename`,
  `settings()`; for finetuning `cls_id` / `sep_id` / `pad_id` (the pieces that frame a task input; checked by
  `check_task_input`) and `encode_with_offsets(text) -> (ids, starts, ends)`: the ids of `encode` with, per piece,
  the span `text[starts[i]:ends[i]]` of the ORIGINAL text it covers (leading whitespace excluded; zero width for
  pieces that cover only whitespace, e.g. a lone "▁"), so that a predicted SQuAD piece span maps back to the exact
  original characters.

XLNet ids (data_utils.py special_symbols): <unk>0 <s>1 </s>2 <cls>3 <sep>4 <pad>5 <mask>6 <eod>7 <eop>8. Our
char/byte vocabularies reserve the same nine ids, so one vocabulary serves the LM, XLNet and MLM pipelines.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import unicodedata
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

from data_pipelines import paths

XLNET_SPECIALS = ("<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>")
SPIECE_UNDERLINE = "\u2581"
# The original `_is_start_piece` punctuation set (note: it has no apostrophe; the doubled quote is verbatim).
_ORIG_START_PUNCT = set('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')
# XLNet's spm_train recipe (README): unigram, 32k, coverage 0.99995, control/user-defined symbols.
XLNET_CONTROL_SYMBOLS = ("<cls>", "<sep>", "<pad>", "<mask>", "<eod>")
XLNET_USER_SYMBOLS = ("<eop>", ".", "(", ")", '"', "-", "\u2013", "\u00a3", "\u20ac")
# XLNet's preprocess_text maps these LaTeX-style quotes to '"' (also used by `preprocess_with_map`).
LATEX_QUOTES = ("``", "''")
TOKENIZER_FILES = ("spiece.model", "tokenizer.model", "vocab.txt", "vocab.json")  # looked for in a directory
Offsets = Tuple[List[int], List[int], List[int]]


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str) -> str:
    """sha256 of a local file or URL (gs://...)."""
    return paths.sha256_of(path)


# ----------------------------------------------------------------------------------------------------------------
# XLNet text normalisation (prepro_utils.py)
# ----------------------------------------------------------------------------------------------------------------
def preprocess_text(text: str, lower: bool = False, remove_space: bool = True, keep_accents: bool = False) -> str:
    """XLNet's `preprocess_text`: collapse whitespace, `` and '' -> ", strip accents (NFKD + drop combining marks)
    unless keep_accents, optional lower-casing."""
    out = " ".join(text.strip().split()) if remove_space else text
    for quote in LATEX_QUOTES:
        out = out.replace(quote, '"')
    if not keep_accents:
        out = unicodedata.normalize("NFKD", out)
        out = "".join(c for c in out if not unicodedata.combining(c))
    if lower:
        out = out.lower()
    return out


def preprocess_with_map(
    text: str, *, lower: bool = False, keep_accents: bool = False, remove_space: bool = True
) -> Tuple[str, List[int], List[int]]:
    """`preprocess_text` applied character by character, remembering where every output character came from:
    new_text equals `preprocess_text(text, ...)` (the one exception is Python's context-dependent final sigma under
    `lower`). Returns (new_text, src, src_end): new_text[k] comes from text[src[k]:src_end[k]] (two characters for
    `` and '', the first character of a collapsed whitespace run)."""
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


def split_digit_comma(sp, piece: str) -> list[str] | None:
    """XLNet's `prepro_utils.encode_pieces` rule for one piece: a piece "<digits>," (e.g. "▁1," or "00,") is
    re-encoded without the comma, the comma becoming its own piece; the re-encoding loses its leading "▁" when the
    original piece had none. Returns None for every other piece (kept as is)."""
    if not (len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit()):
        return None
    cur = list(sp.EncodeAsPieces(piece[:-1].replace(SPIECE_UNDERLINE, "")))
    if piece[0] != SPIECE_UNDERLINE and cur and cur[0][0] == SPIECE_UNDERLINE:
        cur = cur[1:] if len(cur[0]) == 1 else [cur[0][1:]] + cur[1:]
    return cur + [piece[-1]]


def encode_pieces(sp, text: str, sample: bool = False) -> list[str]:
    """XLNet's `encode_pieces`: SentencePiece pieces, with "<digits>," re-split so the comma is its own piece
    (`split_digit_comma`): the original `prepro_utils.encode_pieces`, for pretraining and finetuning alike."""
    pieces = sp.SampleEncodeAsPieces(text, 64, 0.1) if sample else sp.EncodeAsPieces(text)
    out = []
    for piece in pieces:
        split = split_digit_comma(sp, piece)
        out.extend([piece] if split is None else split)
    return out


def is_start_piece(piece: str) -> bool:
    """The original `_is_start_piece`: "▁"-prefixed, "<...>" symbols and single punctuation pieces start a word."""
    return piece.startswith(SPIECE_UNDERLINE) or piece.startswith("<") or piece in _ORIG_START_PUNCT


class Tokenizer:
    """What every tokenizer kind shares beyond its own encoding (see the module docstring)."""

    kind: str
    vocab_size: int
    special_ids: dict
    # finetuning's input layout, `Finetuning.input_style` of the model it feeds ("cls_last" | "cls_first"); set by
    # `xlgen.finetune.data.load_tokenizer`, read by the task readers
    style: Optional[str] = None

    @property
    def cls_id(self) -> Optional[int]:
        return self.special_ids["cls"]

    @property
    def sep_id(self) -> Optional[int]:
        return self.special_ids["sep"]

    @property
    def pad_id(self) -> Optional[int]:
        return self.special_ids["pad"]

    def check_task_input(self, source: str) -> None:
        """ValueError naming `source` unless this tokenizer can frame a task input (has cls/sep/pad pieces)."""
        missing = [k for k in ("cls", "sep", "pad") if self.special_ids.get(k) is None]
        if missing:
            raise ValueError(f"{source}: {self._no_task_pieces(missing)}")

    def _no_task_pieces(self, missing: List[str]) -> str:
        return f"the tokenizer has no <{missing[0]}> piece to frame task inputs"


class SentencePieceTokenizer(Tokenizer):
    """An XLNet `spiece.model` (trained here with `train_sentencepiece`, or from a released checkpoint directory),
    from a file (local or gs://) or its serialized bytes (`model_proto`).

    `encode` is the original `prepro_utils.encode_ids(sp, preprocess_text(text))`: `preprocess_text`, then
    SentencePiece, then "<digits>," pieces re-split so the comma is its own piece. `encode_with_offsets` applies
    `preprocess_text` character by character remembering the source index of every output character
    (`preprocess_with_map`); SentencePiece reports byte offsets of every piece in the preprocessed text (re-split
    pieces: of their re-encoding); composing the two gives exact original character spans. This replaces the
    original's approximate LCS alignment (`run_squad.py`) with an exact one: same pieces, same spans whenever the
    LCS succeeds."""

    kind = "sentencepiece"

    def __init__(
        self,
        model_file: Optional[str] = None,
        *,
        model_proto: Optional[bytes] = None,
        uncased: bool = False,
        keep_accents: bool = False,
    ):
        import sentencepiece as spm

        if model_proto is None:
            if not model_file or not paths.as_path(model_file).is_file():
                raise FileNotFoundError(f"SentencePiece model not found: {model_file}")
            model_proto = paths.read_bytes(model_file)  # local or gs://
        self.model_file = model_file
        self._proto = model_proto
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(self._proto)
        except Exception as e:  # sentencepiece raises OSError/RuntimeError with little context
            raise ValueError(f"{model_file or '<proto>'}: not a SentencePiece model ({e})") from e
        self.uncased = uncased
        self.keep_accents = keep_accents
        self.vocab_size = self.sp.GetPieceSize()

        def pid(p):
            i = self.sp.PieceToId(p)
            return None if (i == self.sp.unk_id() and p != self.sp.IdToPiece(i)) else i

        self.special_ids = {
            "unk": self.sp.unk_id(),
            "cls": pid("<cls>"),
            "sep": pid("<sep>"),
            "pad": pid("<pad>"),
            "mask": pid("<mask>"),
            "eod": pid("<eod>"),
            "eop": pid("<eop>"),
            "eos": None,
        }

    def normalize(self, text: str) -> str:
        return preprocess_text(text, lower=self.uncased, keep_accents=self.keep_accents)

    def encode_as_pieces(self, text: str) -> list[str]:
        return encode_pieces(self.sp, self.normalize(text))

    def encode(self, text: str) -> list[int]:
        return [self.sp.PieceToId(p) for p in self.encode_as_pieces(text)]

    def _pieces_with_spans(self, pre: str) -> List[Tuple[int, int, int]]:
        """(id, begin, end) per piece of `encode_pieces(sp, pre)`; begin/end are character offsets into `pre`."""
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
        """The ids of `encode`, with original-character spans."""
        pre, src, src_end = preprocess_with_map(text, lower=self.uncased, keep_accents=self.keep_accents)
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

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.DecodeIds([int(i) for i in ids])

    def id_to_piece(self, i: int) -> str:
        return self.sp.IdToPiece(int(i))

    def is_start_table(self) -> np.ndarray:
        return np.array([is_start_piece(self.sp.IdToPiece(i)) for i in range(self.vocab_size)], dtype=bool)

    def fingerprint(self) -> str:
        return _sha256_bytes(self._proto)

    def save(self, directory: str) -> str:
        paths.atomic_write_bytes(paths.join(directory, "spiece.model"), self._proto)
        return "spiece.model"

    def settings(self) -> dict:
        return {"uncased": self.uncased, "keep_accents": self.keep_accents}

    def _no_task_pieces(self, missing: List[str]) -> str:
        return (
            f"SentencePiece model has no <{missing[0]}> piece "
            "(train it with --control_symbols=<cls>,<sep>,<pad>,<mask>,<eod>)"
        )


def train_sentencepiece(
    input_files: Sequence[str],
    model_prefix: str,
    vocab_size: int = 32000,
    character_coverage: float = 0.99995,
    input_sentence_size: int = 10_000_000,
    uncased: bool = False,
    extra_args: dict | None = None,
) -> str:
    """Trains a unigram SentencePiece model with XLNet's recipe; returns the `.model` path.

    Lines are passed through `preprocess_text` first (as XLNet's data is at encode time), into a temp file.
    Resulting ids: <unk>0 <s>1 </s>2 <cls>3 <sep>4 <pad>5 <mask>6 <eod>7 <eop>8, then the punctuation symbols.
    """
    import sentencepiece as spm

    os.makedirs(os.path.dirname(os.path.abspath(model_prefix)), exist_ok=True)
    tmp_txt = f"{model_prefix}.normalized.tmp-{os.getpid()}.txt"
    with open(tmp_txt, "w", encoding="utf-8") as out:
        for path in input_files:
            for line in read_text_lines(path):
                line = preprocess_text(line, lower=uncased)
                if line:
                    out.write(line + "\n")
    tmp_prefix = f"{model_prefix}.tmp-{os.getpid()}"
    try:
        kwargs = dict(
            input=tmp_txt,
            model_prefix=tmp_prefix,
            vocab_size=vocab_size,
            model_type="unigram",
            character_coverage=character_coverage,
            control_symbols=list(XLNET_CONTROL_SYMBOLS),
            user_defined_symbols=list(XLNET_USER_SYMBOLS),
            shuffle_input_sentence=True,
            input_sentence_size=input_sentence_size,
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=-1,
            minloglevel=2,
        )
        kwargs.update(extra_args or {})
        try:
            spm.SentencePieceTrainer.Train(**kwargs)
        except RuntimeError as e:  # e.g. "Vocabulary size too high (32000). Please set it to a value <= 1061."
            import re

            m = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", str(e))
            if m:
                raise ValueError(
                    f"--vocab_size {m.group(1)} is too large for this corpus ({', '.join(input_files)}): "
                    f"SentencePiece can build at most {m.group(2)} pieces from it; pass --vocab_size {m.group(2)} "
                    f"or less, or train on more text"
                ) from None
            raise ValueError(f"SentencePiece training failed: {str(e).splitlines()[0]}") from None
        # the model records its trainer's input and prefix, here per-process temp names: name the real ones, so the
        # same corpus and settings give the same bytes in every process (re-running `prepare spm` keeps a corpus
        # prepared with the model up to date)
        from sentencepiece import sentencepiece_model_pb2

        proto = sentencepiece_model_pb2.ModelProto()
        with open(f"{tmp_prefix}.model", "rb") as f:
            proto.ParseFromString(f.read())
        del proto.trainer_spec.input[:]
        proto.trainer_spec.input.extend(os.path.basename(p) for p in input_files)
        proto.trainer_spec.model_prefix = os.path.basename(model_prefix)
        paths.atomic_write_bytes(f"{model_prefix}.model", proto.SerializeToString())
        os.replace(f"{tmp_prefix}.vocab", f"{model_prefix}.vocab")
    finally:
        for p in (tmp_txt, f"{tmp_prefix}.model", f"{tmp_prefix}.vocab"):
            if os.path.exists(p):
                os.remove(p)
    return f"{model_prefix}.model"


# ----------------------------------------------------------------------------------------------------------------
# WordPiece (Funnel / BERT vocab.txt) through the `tokenizers` library
# ----------------------------------------------------------------------------------------------------------------
WORDPIECE_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class WordPieceTokenizer(Tokenizer):
    """A BERT/Funnel `vocab.txt` (WordPiece, `##` continuation pieces) through the `tokenizers` library, which also
    reports the original offsets of every piece."""

    kind = "wordpiece"

    def __init__(self, vocab_file: str, uncased: bool = True):
        from tokenizers import BertWordPieceTokenizer

        if not paths.as_path(vocab_file).is_file():
            raise FileNotFoundError(f"WordPiece vocabulary not found: {vocab_file}")
        self.vocab_file = vocab_file
        self.uncased = uncased
        self._bytes = paths.read_bytes(vocab_file)  # local or gs://; `tokenizers` needs a local file name
        try:
            self._bytes.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{vocab_file}: not a WordPiece vocab.txt (not UTF-8 text at byte {e.start})") from None
        local = paths.local_copy(vocab_file, sha256=_sha256_bytes(self._bytes), subdir="vocab")
        self.tok = BertWordPieceTokenizer(local, lowercase=uncased, strip_accents=uncased)
        self.vocab_size = self.tok.get_vocab_size()
        get = self.tok.token_to_id
        self.special_ids = {
            "unk": get("[UNK]"),
            "cls": get("[CLS]"),
            "sep": get("[SEP]"),
            "pad": get("[PAD]"),
            "mask": get("[MASK]"),
            "eod": None,
            "eop": None,
            "eos": None,
        }

    def encode_as_pieces(self, text: str) -> list[str]:
        return self.tok.encode(text, add_special_tokens=False).tokens

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_with_offsets(self, text: str) -> Offsets:
        enc = self.tok.encode(text, add_special_tokens=False)
        return list(enc.ids), [o[0] for o in enc.offsets], [o[1] for o in enc.offsets]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode([int(i) for i in ids])

    def id_to_piece(self, i: int) -> str:
        return self.tok.id_to_token(int(i))

    def is_start_table(self) -> np.ndarray:
        return np.array([not (self.tok.id_to_token(i) or "").startswith("##") for i in range(self.vocab_size)])

    def fingerprint(self) -> str:
        return _sha256_bytes(self._bytes)

    def save(self, directory: str) -> str:
        paths.atomic_write_bytes(paths.join(directory, "vocab.txt"), self._bytes)
        return "vocab.txt"

    def settings(self) -> dict:
        return {"uncased": self.uncased}

    def _no_task_pieces(self, missing: List[str]) -> str:
        return f"vocabulary has no [{missing[0].upper()}] token"


def train_wordpiece(
    input_files: Sequence[str], output_dir: str, vocab_size: int = 30522, min_frequency: int = 2, uncased: bool = True
) -> str:
    """Trains a BERT-style WordPiece vocabulary with `tokenizers`; returns the `vocab.txt` path."""
    from tokenizers import BertWordPieceTokenizer

    for p in input_files:
        _check_utf8(p)
    tok = BertWordPieceTokenizer(lowercase=uncased, strip_accents=uncased)
    tok.train(
        list(input_files),
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(WORDPIECE_SPECIALS),
        show_progress=False,
    )
    os.makedirs(output_dir, exist_ok=True)
    tmp_dir = os.path.join(output_dir, f".tmp-{os.getpid()}")
    os.makedirs(tmp_dir, exist_ok=True)
    tok.save_model(tmp_dir)
    os.replace(os.path.join(tmp_dir, "vocab.txt"), os.path.join(output_dir, "vocab.txt"))
    os.rmdir(tmp_dir)
    return os.path.join(output_dir, "vocab.txt")


# ----------------------------------------------------------------------------------------------------------------
# Transformer-XL vocabularies: characters / bytes (enwik8, text8) and words (WikiText-103, 1B Word, PTB)
# ----------------------------------------------------------------------------------------------------------------
class SymbolVocab(Tokenizer):
    """A list of symbols, stored as JSON (`vocab.json`).

    level="char": symbols are characters; "byte": symbols are byte values (text is UTF-8 encoded first);
    "word": symbols are whitespace-separated words, each line ends with `<eos>` (Transformer-XL `add_eos`).
    char/byte vocabularies start with the nine XLNet special symbols (same ids); word vocabularies start with
    `<unk>`, `<eos>` and then words by decreasing frequency (adaptive-softmax cutoffs rely on that order).
    A character or byte vocabulary frames task inputs with its XLNet specials, so a workdir pretrained on one
    finetunes with its own tokenizer: one id per character (byte), each covering its own character.
    """

    def __init__(self, level: str, symbols: Sequence, lower: bool = False):
        if level not in ("char", "byte", "word"):
            raise ValueError(f"unknown vocabulary level {level!r} (char, byte, word)")
        self.level, self.lower = level, lower
        self.kind = level
        self.symbols = list(symbols)
        self.index = {s: i for i, s in enumerate(self.symbols)}
        self.vocab_size = len(self.symbols)

        def get(*names, default=None):
            return next((self.index[n] for n in names if n in self.index), default)

        self.special_ids = {
            "unk": get("<unk>", "<UNK>"),
            "cls": get("<cls>"),
            "sep": get("<sep>"),
            "pad": get("<pad>"),
            "mask": get("<mask>"),
            "eod": get("<eod>"),
            "eop": get("<eop>"),
            "eos": get("<eos>", "</S>"),
        }  # <UNK>, </S>: the One Billion Word vocabulary file
        self._unk = get("<unk>", "<UNK>", default=0)
        if level in ("char", "byte"):
            self._lut = self._build_lut()

    def _build_lut(self):
        n = 256 if self.level == "byte" else 0x110000
        lut = np.full(n, self._unk, dtype=np.int32)
        for i, s in enumerate(self.symbols):
            if isinstance(s, int):
                lut[s] = i
            elif len(s) == 1 and self.level == "char":
                lut[ord(s)] = i
        return lut

    # --- construction ------------------------------------------------------------------------------------------
    @classmethod
    def build(
        cls, level: str, texts: Iterable[str], *, min_freq: int = 1, max_size: int | None = None, lower: bool = False
    ) -> "SymbolVocab":
        """Counts symbols over `texts` (an iterable of lines/strings)."""
        counter = collections.Counter()
        for t in texts:
            t = t.lower() if lower else t
            if level == "char":
                counter.update(t)
            elif level == "byte":
                counter.update(t.encode("utf-8"))
            else:
                counter.update(t.split())
        if level == "word":
            specials = ["<unk>", "<eos>"]
            for s in specials:
                counter.pop(s, None)
            words = [w for w, c in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])) if c >= min_freq]
            if max_size is not None:
                words = words[: max(0, max_size - len(specials))]
            return cls("word", specials + words, lower=lower)
        syms = sorted(s for s, c in counter.items() if c >= min_freq)
        return cls(level, list(XLNET_SPECIALS) + syms, lower=lower)

    @classmethod
    def load(cls, path: str) -> "SymbolVocab":
        """An xlgen `vocab.json`, or (word level) a plain vocabulary file: one symbol per line, first column (the
        Transformer-XL `vocab_file` format, e.g. One Billion Word's `1b_word_vocab.txt`), ids in file order."""
        if not path.endswith(".json"):
            syms = [line.split()[0] for line in read_text_lines(path) if line.strip()]
            if len(set(syms)) != len(syms):
                raise ValueError(f"{path}: duplicate symbols in the vocabulary file")
            v = cls("word", syms)
            if v.special_ids["unk"] is None:
                raise ValueError(f"{path}: word vocabulary has no <unk> (or <UNK>) symbol")
            return v
        try:
            d = json.loads(paths.read_text(path))
            return cls(d["level"], d["symbols"], lower=d.get("lower", False))
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{path}: not an xlgen vocabulary file ({e})") from e

    def to_json(self) -> str:
        return json.dumps({"level": self.level, "lower": self.lower, "symbols": self.symbols}, ensure_ascii=False)

    def save(self, directory: str) -> str:
        paths.atomic_write_bytes(paths.join(directory, "vocab.json"), self.to_json().encode("utf-8"))
        return "vocab.json"

    def fingerprint(self) -> str:
        return _sha256_bytes(self.to_json().encode("utf-8"))

    def settings(self) -> dict:
        return {"lower": self.lower}

    # --- encoding ----------------------------------------------------------------------------------------------
    def encode(self, text: str, add_eos: bool = True) -> list[int]:
        return self.encode_array(text, add_eos=add_eos).tolist()

    def encode_array(self, text: str, add_eos: bool = True) -> np.ndarray:
        """int32 ids. char/byte: one id per character/byte (newlines included). word: words of each line + <eos>."""
        if self.lower:
            text = text.lower()
        if self.level == "char":
            cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
            return self._lut[cps]
        if self.level == "byte":
            return self._lut[np.frombuffer(text.encode("utf-8"), dtype=np.uint8)]
        eos = self.special_ids["eos"]
        if add_eos and eos is None:
            raise ValueError("this word vocabulary has no <eos> (or </S>) symbol to end lines with")
        ids = []
        for line in text.splitlines():
            ids.extend(self.index.get(w, self._unk) for w in line.split())
            if add_eos:
                ids.append(eos)
        return np.asarray(ids, dtype=np.int32)

    def encode_with_offsets(self, text: str) -> Offsets:
        """char/byte: the ids of `encode`, each covering the character it came from (all bytes of a multi-byte
        character cover that character)."""
        ids, starts, ends = [], [], []
        for i, c in enumerate(text):
            sub = self.encode(c, add_eos=False)
            ids.extend(sub)
            starts.extend([i] * len(sub))
            ends.extend([i + 1] * len(sub))
        return ids, starts, ends

    def check_task_input(self, source: str) -> None:
        if self.level == "word":
            raise ValueError(f"{source}: {self._no_task_pieces(['cls'])}")
        super().check_task_input(source)

    def _no_task_pieces(self, missing: List[str]) -> str:
        return (
            f"a {self.level}-level vocabulary without <cls>/<sep>/<pad> symbols cannot frame task inputs; finetune "
            "from a character or byte vocab.json, a SentencePiece .model or a WordPiece vocab.txt "
            "(--config.tokenizer=FILE)"
        )

    def decode(self, ids: Iterable[int]) -> str:
        syms = [self.symbols[int(i)] for i in ids]
        if self.level == "word":
            return " ".join("\n" if s == "<eos>" else s for s in syms).replace(" \n ", "\n").replace(" \n", "\n")
        if self.level == "byte":
            return b"".join(bytes([s]) if isinstance(s, int) else s.encode() for s in syms).decode("utf-8", "replace")
        return "".join(syms)

    def id_to_piece(self, i: int) -> str:
        s = self.symbols[int(i)]
        return chr(s) if isinstance(s, int) and s < 128 else str(s)

    def is_start_table(self) -> np.ndarray:
        """Word starts for span sampling: words (word level); spaces, punctuation and <...> symbols (char/byte)."""
        if self.level == "word":
            return np.ones(self.vocab_size, dtype=bool)
        out = np.zeros(self.vocab_size, dtype=bool)
        for i, s in enumerate(self.symbols):
            c = chr(s) if isinstance(s, int) else s
            out[i] = len(c) > 1 or c.isspace() or c in _ORIG_START_PUNCT or c == "'"
        return out


# ----------------------------------------------------------------------------------------------------------------
# Reading text robustly
# ----------------------------------------------------------------------------------------------------------------
def _check_utf8(path: str) -> None:
    read_text(path)


def read_text(path: str) -> str:
    """Whole file as str; a clear error naming the file (and byte offset) for missing/empty/non-UTF-8 files."""
    try:
        data = paths.as_path(path).read_bytes()  # local or gs://
    except OSError as e:
        raise FileNotFoundError(f"{path}: cannot read ({e.strerror or e})") from e
    if not data.strip():
        raise ValueError(f"{path}: file is empty")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ValueError(f"{path}: not valid UTF-8 (line {line}, byte offset {e.start}: {e.reason})") from e


def read_text_lines(path: str) -> list[str]:
    return read_text(path).splitlines()


# ----------------------------------------------------------------------------------------------------------------
# Loading by spec
# ----------------------------------------------------------------------------------------------------------------
def load_tokenizer(kind: str, path: str, **settings):
    """Loads a tokenizer saved by `save` (kind in sentencepiece, wordpiece, char, byte, word)."""
    if kind == "sentencepiece":
        return SentencePieceTokenizer(
            path, uncased=settings.get("uncased", False), keep_accents=settings.get("keep_accents", False)
        )
    if kind == "wordpiece":
        return WordPieceTokenizer(path, uncased=settings.get("uncased", True))
    if kind in ("char", "byte", "word"):
        v = SymbolVocab.load(path)
        if v.level != kind:
            raise ValueError(f"{path}: vocabulary level is {v.level!r}, expected {kind!r}")
        return v
    raise ValueError(f"unknown tokenizer kind {kind!r} (sentencepiece, wordpiece, char, byte, word)")


def load_tokenizer_file(path: str, *, lower: Optional[bool] = None) -> Tokenizer:
    """A tokenizer from a file or a model directory (the first of `TOKENIZER_FILES` in it), by file name:
    `*.model` -> SentencePiece (XLNet), `*.txt` -> WordPiece (Funnel), an xlgen `vocab.json` -> characters/bytes/words
    (its own `lower` setting). `lower` defaults to False for SentencePiece (released XLNet is cased) and True for
    WordPiece (released Funnel is uncased)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        for name in TOKENIZER_FILES:
            if os.path.exists(os.path.join(path, name)):
                return load_tokenizer_file(os.path.join(path, name), lower=lower)
        raise FileNotFoundError(f"{path}: no {', '.join(TOKENIZER_FILES)} in this directory")
    if path.endswith(".model"):
        return SentencePieceTokenizer(path, uncased=bool(lower))
    if path.endswith(".txt"):
        return WordPieceTokenizer(path, uncased=True if lower is None else lower)
    if path.endswith(".json"):
        return SymbolVocab.load(path)
    raise ValueError(
        f"{path}: unknown tokenizer file (expected a SentencePiece .model, a WordPiece vocab.txt or an xlgen "
        "character/byte vocab.json)"
    )


def visible_piece(tokenizer, i: int) -> str:
    """Piece `i` with its whitespace made visible (so pieces joined by spaces split unambiguously)."""
    return tokenizer.id_to_piece(int(i)).replace(" ", "\u2581").replace("\n", "\\n").replace("\t", "\\t") or "''"
