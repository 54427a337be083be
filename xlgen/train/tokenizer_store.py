"""The run's tokenizer, kept in its workdir so that a workdir alone is enough to evaluate, finetune or generate.

    DIR/tokenizer/<file>   the tokenizer's own file (spiece.model, vocab.txt, vocab.json), written by `save`
    DIR/config.json        "xlgen": {"tokenizer": "tokenizer/<file>", "tokenizer_kind", "tokenizer_settings",
                                     "tokenizer_sha256", "tokenizer_vocab_size"}

`save(workdir, tokenizer)` stores it (an existing, different one is an error naming both); `info(workdir)` reads
the record; `load(workdir)` returns the tokenizer (data_pipelines.vocab) or None; `check_same(workdir, path)`
raises when the tokenizer file `path` differs (size or content hash) from the workdir's. The record uses the
layout of the Workdir object (`xlgen/train/workdir.py`: "tokenizer": "tokenizer/<file>") so it can absorb this.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, Optional

from data_pipelines import paths

SUBDIR = "tokenizer"


def run_dir(path: str) -> str:
    """`DIR/checkpoints/<step>` (or `DIR/best/<step>`) -> `DIR`; other paths unchanged."""
    p = paths.as_path(path)
    if p.name.isdigit() and p.parent.name in ("checkpoints", "best"):
        return str(p.parent.parent)
    return str(path)


def info(workdir: str) -> Optional[Dict[str, Any]]:
    """The `xlgen` block's tokenizer record of `workdir/config.json`, or None."""
    p = paths.as_path(run_dir(workdir)) / "config.json"
    if not p.exists():
        return None
    try:
        block = json.loads(p.read_text()).get("xlgen") or {}
    except json.JSONDecodeError:
        return None
    return block if block.get("tokenizer") else None


def _describe(rec: Dict[str, Any], where: str) -> str:
    return f"{where} ({rec.get('tokenizer_vocab_size')} symbols, sha256 {str(rec.get('tokenizer_sha256'))[:12]})"


def save(workdir: str, tokenizer) -> Optional[Dict[str, Any]]:
    """Store `tokenizer` in `workdir/tokenizer/` and name it in config.json (process 0; atomic writes)."""

    if tokenizer is None or not hasattr(tokenizer, "save") or not hasattr(tokenizer, "fingerprint"):
        return None
    new = {
        "tokenizer_kind": getattr(tokenizer, "kind", ""),
        "tokenizer_settings": tokenizer.settings() if hasattr(tokenizer, "settings") else {},
        "tokenizer_sha256": tokenizer.fingerprint(),
        "tokenizer_vocab_size": int(tokenizer.vocab_size),
    }
    # config.json is rewritten at every (re)start: the stored files are the record of what the run used
    check_can_save(workdir, tokenizer)
    paths.makedirs(paths.join(workdir, SUBDIR))
    name = tokenizer.save(paths.join(workdir, SUBDIR))
    new["tokenizer"] = f"{SUBDIR}/{name}"
    p = paths.as_path(workdir) / "config.json"
    d = json.loads(p.read_text())
    d.setdefault("xlgen", {}).update(new)
    paths.write_json_atomic(str(p), d)
    return new


def check_can_save(workdir: str, tokenizer) -> None:
    """`save` would succeed: a tokenizer already stored in `workdir` that differs from `tokenizer` is an error
    naming both (checked before anything of the run is written)."""
    if tokenizer is None or not hasattr(tokenizer, "save") or not hasattr(tokenizer, "fingerprint"):
        return
    sha = tokenizer.fingerprint()
    d = paths.as_path(workdir) / SUBDIR
    stored = [f for f in d.iterdir() if f.is_file() and ".tmp" not in f.name] if d.is_dir() else []
    if stored and not any(hashlib.sha256(f.read_bytes()).hexdigest() == sha for f in stored):
        old = stored[0]
        raise ValueError(
            f"the data's tokenizer ({getattr(tokenizer, 'kind', '')}, {int(tokenizer.vocab_size)} symbols, sha256 "
            f"{sha[:12]}) differs from the one this workdir was trained with: {old} (sha256 "
            f"{hashlib.sha256(old.read_bytes()).hexdigest()[:12]}); use the same data/tokenizer to resume, or a new "
            f"--workdir"
        )


def load(workdir: str):
    """The workdir's tokenizer (data_pipelines.vocab object with encode/decode), or None if none is stored."""
    from data_pipelines import vocab as vocab_lib

    rec = info(workdir)
    if rec is None:
        return None
    return vocab_lib.load_tokenizer(rec["tokenizer_kind"], file_path(workdir), **(rec.get("tokenizer_settings") or {}))


def file_path(workdir: str) -> Optional[str]:
    rec = info(workdir)
    return paths.join(run_dir(workdir), rec["tokenizer"]) if rec else None


def check_same(workdir: str, tokenizer_path: str) -> None:
    """A tokenizer file that differs (content hash; vocabulary size) from `workdir`'s stored one is an error naming
    both files."""
    rec = info(workdir)
    if rec is None:
        return
    workdir = run_dir(workdir)
    data = paths.read_bytes(tokenizer_path)
    if hashlib.sha256(data).hexdigest() == rec.get("tokenizer_sha256"):
        return
    size = ""
    try:
        from data_pipelines import vocab as vocab_lib

        tok = vocab_lib.load_tokenizer(rec["tokenizer_kind"], tokenizer_path, **(rec.get("tokenizer_settings") or {}))
        size = f"{tok.vocab_size} symbols, "
    except Exception:  # noqa: BLE001  (a different kind of file: the hash already says it differs)
        pass
    raise ValueError(
        f"tokenizer mismatch: {tokenizer_path} ({size}sha256 {hashlib.sha256(data).hexdigest()[:12]}) is not the "
        f"tokenizer {workdir} was pretrained with: {_describe(rec, paths.join(workdir, rec['tokenizer']))}. "
        f"Leave --config.tokenizer unset to use the workdir's own."
    )
