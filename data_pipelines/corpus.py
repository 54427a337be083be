"""Token corpora: one logical token stream per split (plus sentence-parity flags for the XLNet layout).

Sources:
  * the embedded demo corpus (`tinyshakespeare`, char-level, held-out tail as `valid`), no preparation step;
  * a raw text file with a char/byte/word vocabulary built on the fly;
  * a prepared directory (`xlgen prepare corpus`): `manifest.json` + memory-mapped `.npy` shards.
Text files and prepared directories may be URLs (`gs://bucket/corpus`): a remote shard is downloaded once into
the local cache (`$XLGEN_CACHE_DIR/shards`, default ~/.cache/xlgen), verified against the manifest's sha256, and
memory-mapped from there.

Layouts: "lm" = the text as one stream (newlines are tokens for char/byte; `<eos>` ends each line for words);
"sentences" = XLNet's convention: one sentence per line, sentence parity flips at every line, a blank line is
`<eod>` (use_eod) and flips the parity too (data_utils.py `_create_data`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from typing import Sequence

import numpy as np

from data_pipelines import paths
from data_pipelines import vocab as vocab_lib

ASSETS = os.path.join(os.path.dirname(__file__), "assets")
EMBEDDED = {"tinyshakespeare": os.path.join(ASSETS, "tinyshakespeare.txt")}
MANIFEST = "manifest.json"
FORMAT = "xlgen-token-shards/1"


@dataclasses.dataclass
class TokenCorpus:
    """A split as a list of token shards read as one stream (positions wrap modulo `num_tokens`).

    shards: int arrays (typically np.memmap of uint16/int32); sent: matching bool arrays (sentence parity) or None.
    """

    shards: list
    sent: list | None
    tokenizer: object
    description: str
    num_documents: int = 0

    def __post_init__(self):
        lengths = [len(s) for s in self.shards]
        self.bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.num_tokens = int(self.bounds[-1])
        if len(self.shards) == 1:  # fast path: one array
            self._flat, self._flat_sent = self.shards[0], (self.sent[0] if self.sent else None)
        else:
            self._flat = self._flat_sent = None
        # Sentence parity must flip where one shard ends and the next begins (else the last sentence of a shard and
        # the first of the next would read as one); like the original's `logical_not` when concatenating shards.
        self._sent_flip = [False] * len(self.shards)
        if self.sent and len(self.sent) > 1:
            for k in range(1, len(self.sent)):
                prev_last = bool(self.sent[k - 1][-1]) ^ self._sent_flip[k - 1]
                self._sent_flip[k] = bool(self.sent[k][0]) == prev_last

    def _gather(self, arrays, flat, start: int, length: int, flips=None) -> np.ndarray:
        n = self.num_tokens
        start %= n
        if flat is not None and start + length <= n:
            return np.asarray(flat[start : start + length])
        pos = (start + np.arange(length, dtype=np.int64)) % n
        if flat is not None:
            return np.asarray(flat[pos])
        out = []
        # contiguous runs inside each shard
        k = np.searchsorted(self.bounds, pos, side="right") - 1
        cuts = np.flatnonzero((np.diff(k) != 0) | (np.diff(pos) != 1)) + 1
        for seg in np.split(np.arange(length), cuts):
            s = int(k[seg[0]])
            a = int(pos[seg[0]] - self.bounds[s])
            piece = np.asarray(arrays[s][a : a + len(seg)])
            out.append(~piece if flips is not None and flips[s] else piece)
        return np.concatenate(out)

    def tokens(self, start: int, length: int) -> np.ndarray:
        """int32 [length]: stream positions start, start+1, ... (mod num_tokens)."""
        return self._gather(self.shards, self._flat, start, length).astype(np.int32, copy=False)

    def sentence_parity(self, start: int, length: int) -> np.ndarray:
        if self.sent is None:
            raise ValueError(f"{self.description}: has no sentence layout (prepare it with --layout=sentences)")
        return self._gather(self.sent, self._flat_sent, start, length, self._sent_flip).astype(bool, copy=False)


# ----------------------------------------------------------------------------------------------------------------
# Encoding text
# ----------------------------------------------------------------------------------------------------------------
def encode_lines(tokenizer, lines: Sequence[str], layout: str, use_eod: bool = True):
    """Returns (tokens int32 [n], sentence parity bool [n] or None, num_documents)."""
    if layout == "lm":
        if isinstance(tokenizer, vocab_lib.SymbolVocab):
            ids = tokenizer.encode_array("\n".join(lines) + "\n", add_eos=True)
        else:  # subword tokenizers: one encode per line, <eos>/<eod> are not part of the LM layout
            ids = np.asarray([i for line in lines if line.strip() for i in tokenizer.encode(line)], dtype=np.int32)
        docs = 1 + sum(1 for line in lines if not line.strip())
        return ids.astype(np.int32), None, docs
    if layout != "sentences":
        raise ValueError(f"unknown layout {layout!r} (lm, sentences)")
    eod = tokenizer.special_ids.get("eod")
    if use_eod and eod is None:
        raise ValueError(f"tokenizer {tokenizer.kind} has no <eod> symbol; use use_eod=False")
    chunks, parity, sent_id, docs = [], [], True, 1
    for line in lines:
        if not line.strip():
            docs += 1
            if not use_eod:
                continue
            sent_id = not sent_id
            cur = np.asarray([eod], dtype=np.int32)
        elif isinstance(tokenizer, vocab_lib.SymbolVocab):  # char/byte keep the newline; words get no <eos> here
            text = line.strip() + ("\n" if tokenizer.level != "word" else "")
            cur = tokenizer.encode_array(text, add_eos=False)
        else:
            cur = np.asarray(tokenizer.encode(line.strip()), dtype=np.int32)
        chunks.append(cur)
        parity.append(np.full(len(cur), sent_id, dtype=bool))
        sent_id = not sent_id
    if not chunks:
        return np.zeros(0, np.int32), np.zeros(0, bool), 0
    return np.concatenate(chunks).astype(np.int32), np.concatenate(parity), docs


def split_tail(text: str, valid_fraction: float) -> tuple[str, str]:
    """Train/valid split of one text: valid starts at the first blank line after (1 - valid_fraction) of the text."""
    if not 0.0 < valid_fraction < 1.0:
        raise ValueError(f"valid_fraction must be in (0, 1), got {valid_fraction}")
    cut = text.find("\n\n", int(len(text) * (1.0 - valid_fraction)))
    if cut < 0:
        cut = text.rfind("\n", 0, int(len(text) * (1.0 - valid_fraction)))
    if cut <= 0:
        raise ValueError("text too small to hold out a valid split")
    return text[: cut + 1], text[cut + 1 :].lstrip("\n")


@functools.lru_cache(maxsize=8)
def text_corpus(
    path: str,
    level: str,
    layout: str,
    split: str,
    valid_fraction: float = 0.1,
    valid_path: str | None = None,
    use_eod: bool = True,
    lower: bool = False,
) -> TokenCorpus:
    """A raw text file (or the embedded corpus) tokenized on the fly with a char/byte/word vocabulary.

    The vocabulary is built from the whole file (train + held-out tail) so the valid split has no unknowns;
    with a separate `valid_path`, from the training file only.
    """
    path = EMBEDDED.get(path, path)
    text = vocab_lib.read_text(path)
    if valid_path:
        train_text, valid_text = text, vocab_lib.read_text(valid_path)
        vocab_texts = [train_text]
    else:
        train_text, valid_text = split_tail(text, valid_fraction)
        vocab_texts = [text]
    tok = vocab_lib.SymbolVocab.build(level, vocab_texts, lower=lower)
    chosen = {"train": train_text, "valid": valid_text, "test": valid_text}.get(split)
    if chosen is None:
        raise ValueError(f"unknown split {split!r} (train, valid)")
    ids, sent, docs = encode_lines(tok, chosen.splitlines(), layout, use_eod=use_eod)
    if len(ids) == 0:
        raise ValueError(f"{path}: split {split!r} has no tokens")
    return TokenCorpus([ids], None if sent is None else [sent], tok, f"{path}[{split}]", docs)


# ----------------------------------------------------------------------------------------------------------------
# Prepared directories
# ----------------------------------------------------------------------------------------------------------------
def read_manifest(directory: str) -> dict:
    path = paths.as_path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no manifest; prepare the corpus with `xlgen prepare corpus ...`")
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: corrupt manifest ({e})") from e
    if m.get("format") != FORMAT:
        raise ValueError(f"{path}: format {m.get('format')!r}, expected {FORMAT!r}")
    return m


def load_manifest_tokenizer(directory: str, manifest: dict | None = None):
    m = manifest or read_manifest(directory)
    t = m["tokenizer"]
    path = paths.join(directory, t["file"])
    tok = vocab_lib.load_tokenizer(t["kind"], path, **t.get("settings", {}))
    if tok.fingerprint() != t["sha256"]:
        raise ValueError(
            f"{path}: vocabulary sha256 {tok.fingerprint()[:12]} does not match "
            f"{paths.join(directory, MANIFEST)} ({t['sha256'][:12]}); the shards were made with "
            f"another vocabulary. Re-run `xlgen prepare corpus`."
        )
    return tok


def check_tokenizer_matches(directory: str, manifest: dict, tokenizer_path: str) -> None:
    """Raises if the vocabulary the model expects (file at tokenizer_path) differs from the one the shards used."""
    t = manifest["tokenizer"]
    got = vocab_lib.load_tokenizer(t["kind"], tokenizer_path, **t.get("settings", {})).fingerprint()
    if got != t["sha256"]:
        raise ValueError(
            f"vocabulary mismatch: {tokenizer_path} (sha256 {got[:12]}) is not the vocabulary "
            f"{paths.join(directory, MANIFEST)} was prepared with ({t['file']}, sha256 "
            f"{t['sha256'][:12]})"
        )


def shard_info(path: str) -> dict:
    """{"sha256", "max"} of a local `.npy` shard (max: its largest value, -1 if empty), cached by the file's path,
    size and mtime under `paths.cache_dir("verified")` so that a shard is hashed once, not at every open."""
    st = os.stat(path)
    stamp = {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    cache = os.path.join(paths.cache_dir("verified"), hashlib.sha256(stamp["path"].encode()).hexdigest()[:24] + ".json")
    try:
        with open(cache) as f:
            hit = json.load(f)
        if all(hit.get(k) == v for k, v in stamp.items()):
            return hit
    except (OSError, ValueError):
        pass
    arr = np.load(path, mmap_mode="r")
    info = {**stamp, "sha256": paths.sha256_of(path), "max": int(arr.max()) if arr.size else -1}
    try:
        paths.write_json_atomic(cache, info)
    except OSError:  # a read-only cache only costs the next open a re-hash
        pass
    return info


def _load_shard(path: str, entry: dict, kind: str, vocab_size: int | None = None) -> np.ndarray:
    """Memory-maps a `.npy` shard; a remote one through a local cached copy named by its content hash (the
    manifest's `<kind>_sha256`; manifests written before it existed use the shard's key, verified by length). A
    local one is verified against that sha256 (`shard_info`, cached by mtime), and its token ids must be below
    `vocab_size`: either failing is an error naming the shard."""
    sha = entry.get(f"{kind}_sha256")
    if paths.is_remote(path):
        path = paths.local_copy(path, sha256=sha, key=None if sha else f"{entry['key']}.{kind}", subdir="shards")
    elif sha:
        info = shard_info(path)
        if info["sha256"] != sha:
            raise ValueError(
                f"{path}: sha256 {info['sha256'][:12]} does not match the manifest's {sha[:12]}: the shard is "
                f"corrupt; re-run the same `xlgen prepare corpus` command to rewrite it"
            )
        if kind == "tokens" and vocab_size is not None and info["max"] >= vocab_size:
            raise ValueError(f"{path}: token id {info['max']} >= the vocabulary size {vocab_size}")
    return np.load(path, mmap_mode="r")


def prepared_corpus(
    directory: str, split: str, *, expect_vocab_size: int | None = None, expect_tokenizer: str | None = None
) -> TokenCorpus:
    m = read_manifest(directory)
    tok = load_manifest_tokenizer(directory, m)
    if expect_tokenizer:
        check_tokenizer_matches(directory, m, expect_tokenizer)
    if expect_vocab_size is not None and int(expect_vocab_size) != tok.vocab_size:
        raise ValueError(
            f"vocabulary mismatch: config data.vocab_size={expect_vocab_size} but "
            f"{paths.join(directory, MANIFEST)} has vocab_size={tok.vocab_size}"
        )
    if split not in m["splits"]:
        raise ValueError(f"{paths.join(directory, MANIFEST)}: no split {split!r} (has {sorted(m['splits'])})")
    shards, sents, docs = [], [], 0
    for sh in m["splits"][split]["shards"]:
        p = paths.join(directory, sh["tokens"])
        arr = _load_shard(p, sh, "tokens", tok.vocab_size)
        if len(arr) != sh["num_tokens"]:
            raise ValueError(f"{p}: {len(arr)} tokens, manifest says {sh['num_tokens']}")
        if len(arr) == 0:
            continue
        shards.append(arr)
        if m["layout"] == "sentences":
            sents.append(_load_shard(paths.join(directory, sh["sentences"]), sh, "sentences"))
        docs += sh.get("num_documents", 0)
    if not shards:
        raise ValueError(f"{paths.join(directory, MANIFEST)}: split {split!r} has no tokens")
    return TokenCorpus(shards, sents if m["layout"] == "sentences" else None, tok, f"{directory}[{split}]", docs)


def corpus_from_config(cfg, split: str, layout: str) -> TokenCorpus:
    """Resolves `data.source` (embedded name, text file or prepared directory) for a split."""
    source = cfg.get("source", "tinyshakespeare")
    src = None if source in EMBEDDED or not source else paths.as_path(source)  # local or gs://
    if src is not None and paths.is_remote(src):
        source = str(src)
    if source in EMBEDDED or (src is not None and src.is_file()):
        if cfg.get("vocab", "char") not in ("char", "byte", "word"):
            raise ValueError(
                f"data.vocab={cfg.get('vocab')!r}: a raw text source needs char, byte or word; "
                f"prepare subword corpora with `xlgen prepare corpus`"
            )
        return text_corpus(
            source,
            cfg.get("vocab", "char"),
            layout,
            split,
            float(cfg.get("valid_fraction", 0.1)),
            cfg.get("valid_source") or None,
            bool(cfg.get("use_eod", True)),
            bool(cfg.get("lower", False)),
        )
    if src is not None and ((src / MANIFEST).exists() or src.is_dir()):
        m = read_manifest(source)
        if m["layout"] != layout and not (layout == "lm" and m["layout"] == "sentences"):
            raise ValueError(f"{paths.join(source, MANIFEST)}: layout {m['layout']!r}, this pipeline needs {layout!r}")
        return prepared_corpus(
            source,
            split,
            expect_vocab_size=cfg.get("vocab_size") or None,
            expect_tokenizer=cfg.get("tokenizer") or None,
        )
    raise FileNotFoundError(
        f"data.source={source!r}: not an embedded corpus ({sorted(EMBEDDED)}), a text file, "
        f"or a prepared directory (make one with `xlgen prepare corpus ... --output {source}`)"
    )
