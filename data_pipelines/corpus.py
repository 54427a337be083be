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
import zlib
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


SHARD_BLOCK_BYTES = 1 << 20  # the unit of `ChecksummedShard`'s checks: one CRC32 per MiB of a shard's data


def _open_npy(path: str) -> np.ndarray:
    """np.load(path, mmap_mode="r") with an error naming the file (a truncated shard fails to map)."""
    try:
        return np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(
            f"{path}: not a readable .npy shard ({e}; truncated?); re-run the same `xlgen prepare corpus` "
            f"command to rewrite it"
        ) from None


def _verified_cache_path(path: str) -> str:
    return os.path.join(paths.cache_dir("verified"), hashlib.sha256(path.encode()).hexdigest()[:24] + ".json")


def shard_info(path: str, *, rehash: bool = False) -> dict:
    """{"sha256", "max", "crc32", "block_bytes"} of a local `.npy` shard: the file's sha256, its largest value (-1
    if empty) and the CRC32 of each `block_bytes` block of its data, all computed from one reading of the bytes.
    Cached by the file's path, size and mtime under `paths.cache_dir("verified")`, so a shard is hashed once, not at
    every open; `rehash` ignores the cache (`xlgen prepare corpus` before it calls a shard up to date). What the
    cache cannot see (a changed byte that kept size and mtime) the block CRCs catch when the bytes are read
    (`ChecksummedShard`)."""
    st = os.stat(path)
    stamp = {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    cache = _verified_cache_path(stamp["path"])
    if not rehash:
        try:
            with open(cache) as f:
                hit = json.load(f)
            if all(hit.get(k) == v for k, v in stamp.items()) and hit.get("block_bytes") == SHARD_BLOCK_BYTES:
                return hit
        except (OSError, ValueError):
            pass
    arr = _open_npy(path)
    raw = np.memmap(path, dtype=np.uint8, mode="r") if st.st_size else np.zeros(0, np.uint8)
    digest = hashlib.sha256()
    for i in range(0, len(raw), 1 << 24):
        digest.update(raw[i : i + (1 << 24)])
    info = {
        **stamp,
        "sha256": digest.hexdigest(),
        "max": int(arr.max()) if arr.size else -1,
        "block_bytes": SHARD_BLOCK_BYTES,
        "crc32": shard_block_crcs(raw[arr.offset : arr.offset + arr.nbytes]),
    }
    try:
        paths.write_json_atomic(cache, info)
    except OSError:  # a read-only cache only costs the next open a re-hash
        pass
    return info


def shard_block_crcs(data: np.ndarray, block_bytes: int = SHARD_BLOCK_BYTES) -> list:
    """CRC32 (zlib) of each `block_bytes` block of `data` (uint8 [n]; the last block may be shorter)."""
    return [zlib.crc32(data[i : i + block_bytes]) for i in range(0, len(data), block_bytes)]


class ChecksummedShard:
    """A memory-mapped shard whose bytes are checked where they are read: the first read touching a block of
    `block_bytes` compares that block's CRC32 with the one recorded when the whole file was verified against the
    manifest's sha256 (`shard_info`), so each byte the pipeline reads is checked once per process. A mismatch is a
    one-line ValueError naming the file and the byte range, and drops the cached verification (the next open
    re-hashes the file and names it against the manifest).

    Reads like the 1-D array it wraps: `len`, `x[i]`, `x[a:b]`, `x[int array]` (values, as NumPy arrays), and
    `np.asarray(x)` (the whole shard, every block checked)."""

    def __init__(self, array: np.ndarray, path: str, crc32: Sequence[int], block_bytes: int = SHARD_BLOCK_BYTES):
        if array.ndim != 1 or block_bytes % array.itemsize:
            raise ValueError(f"{path}: a shard is a 1-D array (shape {array.shape}, block {block_bytes} bytes)")
        self.array, self.path, self.crc32 = array, path, list(crc32)
        self.block_bytes, self.block_items = block_bytes, block_bytes // array.itemsize
        if len(self.crc32) != -(-array.nbytes // block_bytes):
            raise ValueError(f"{path}: {len(self.crc32)} block checksums for {array.nbytes} bytes")
        self.checked = np.zeros(len(self.crc32), bool)
        self.dtype, self.shape = array.dtype, array.shape

    def __len__(self) -> int:
        return len(self.array)

    def check_blocks(self, first: int, last: int) -> None:
        """Verify blocks first..last (inclusive) that were not yet verified."""
        raw = self.array.view(np.uint8)
        for k in range(first, last + 1):
            if self.checked[k]:
                continue
            lo, hi = k * self.block_bytes, min((k + 1) * self.block_bytes, len(raw))
            got = zlib.crc32(raw[lo:hi])
            if got != self.crc32[k]:
                try:
                    os.remove(_verified_cache_path(os.path.abspath(self.path)))
                except OSError:
                    pass
                raise ValueError(
                    f"{self.path}: data bytes {lo}-{hi} have CRC32 {got:08x}, not the {self.crc32[k]:08x} recorded "
                    f"when the shard was verified: the shard is corrupt (changed since); re-run the same "
                    f"`xlgen prepare corpus` command to rewrite it"
                )
            self.checked[k] = True

    def __array__(self, dtype=None, copy=None):
        """The whole shard as an array (every block checked first)."""
        if len(self.crc32):
            self.check_blocks(0, len(self.crc32) - 1)
        return np.asarray(self.array, dtype=dtype)

    def __getitem__(self, key):
        n, b = len(self.array), self.block_items
        if isinstance(key, slice):
            start, stop, _ = key.indices(n)
            if stop > start:
                first, last = start // b, (stop - 1) // b
                if not (first == last and self.checked[first]):
                    self.check_blocks(first, last)
        elif isinstance(key, (int, np.integer)):
            k = (int(key) % n if n else 0) // b
            if not self.checked[k]:
                self.check_blocks(k, k)
        else:
            idx = np.asarray(key)
            if idx.size:
                blocks = np.unique((idx % n) // b)
                for k in blocks[~self.checked[blocks]]:
                    self.check_blocks(int(k), int(k))
        return self.array[key]


def _load_shard(path: str, entry: dict, kind: str, vocab_size: int | None = None):
    """Memory-maps a `.npy` shard; a remote one through a local cached copy named by its content hash (the
    manifest's `<kind>_sha256`; manifests written before it existed use the shard's key, verified by length). The
    local file is verified against that sha256 (`shard_info`, cached by size and mtime) and read through
    `ChecksummedShard` (each block's CRC32 checked when first read); its token ids must be below `vocab_size`. Any
    failure is an error naming the shard."""
    sha = entry.get(f"{kind}_sha256")
    if paths.is_remote(path):
        path = paths.local_copy(path, sha256=sha, key=None if sha else f"{entry['key']}.{kind}", subdir="shards")
    if not sha:
        return _open_npy(path)
    info = shard_info(path)
    if info["sha256"] != sha:
        raise ValueError(
            f"{path}: sha256 {info['sha256'][:12]} does not match the manifest's {sha[:12]}: the shard is "
            f"corrupt; re-run the same `xlgen prepare corpus` command to rewrite it"
        )
    if kind == "tokens" and vocab_size is not None and info["max"] >= vocab_size:
        raise ValueError(f"{path}: token id {info['max']} >= the vocabulary size {vocab_size}")
    return ChecksummedShard(_open_npy(path), path, info["crc32"], info["block_bytes"])


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
    """Resolves `data.source` (embedded name, text file or prepared directory) for a split. `cfg`: a data config
    with every key of its pipeline (`data_pipelines.resolved`)."""
    source = cfg.source
    src = None if source in EMBEDDED or not source else paths.as_path(source)  # local or gs://
    if src is not None and paths.is_remote(src):
        source = str(src)
    if source in EMBEDDED or (src is not None and src.is_file()):
        if cfg.vocab not in ("char", "byte", "word"):
            raise ValueError(
                f"data.vocab={cfg.vocab!r}: a raw text source needs char, byte or word; "
                f"prepare subword corpora with `xlgen prepare corpus`"
            )
        return text_corpus(
            source,
            cfg.vocab,
            layout,
            split,
            float(cfg.valid_fraction),
            cfg.valid_source or None,
            bool(cfg.use_eod),
            bool(cfg.lower),
        )
    if src is not None and ((src / MANIFEST).exists() or src.is_dir()):
        m = read_manifest(source)
        if m["layout"] != layout and not (layout == "lm" and m["layout"] == "sentences"):
            raise ValueError(f"{paths.join(source, MANIFEST)}: layout {m['layout']!r}, this pipeline needs {layout!r}")
        return prepared_corpus(
            source,
            split,
            expect_vocab_size=cfg.vocab_size or None,
            expect_tokenizer=cfg.tokenizer or None,
        )
    raise FileNotFoundError(
        f"data.source={source!r}: not an embedded corpus ({sorted(EMBEDDED)}), a text file, "
        f"or a prepared directory (make one with `xlgen prepare corpus ... --output {source}`)"
    )
