"""Task data: the tokenizer (from `tokenizer` or `init_from`), the task's examples and their features, cached as
`.npz` under `workdir/cache/` keyed by everything that affects them."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
from typing import Dict, Optional

import numpy as np

from data_pipelines import paths


def _local_tokenizer_file(path: str) -> str:
    """A remote tokenizer file or model directory (gs://) -> a local cached copy of its tokenizer file."""
    from data_pipelines.vocab import TOKENIZER_FILES

    p = paths.as_path(path)
    if not paths.is_remote(p):
        return path
    if p.is_dir():
        for name in TOKENIZER_FILES:
            if (p / name).exists():
                p = p / name
                break
        else:
            raise FileNotFoundError(f"{p}: no {', '.join(TOKENIZER_FILES)} in this directory")
    data = p.read_bytes()
    local = os.path.join(paths.cache_dir("tokenizers", hashlib.sha256(data).hexdigest()[:16]), p.name)
    if not os.path.exists(local):
        paths.atomic_write_bytes(local, data)
    return local


def load_tokenizer(config):
    """The task tokenizer (`data_pipelines.vocab`): `config.tokenizer`, else the one stored in (or found in) `init_from`,
    framing inputs in the model family's layout."""
    from data_pipelines.vocab import load_tokenizer_file
    from xlgen import registry
    from xlgen.finetune.record import input_style

    path = config.tokenizer or (config.init_from if config.init_from else "")
    if config.init_from:  # an xlgen pretraining workdir carries its tokenizer (xlgen/train/tokenizer_store.py)
        from xlgen.train import tokenizer_store

        stored = tokenizer_store.file_path(config.init_from)
        if stored and config.tokenizer:
            tokenizer_store.check_same(config.init_from, config.tokenizer)
        elif stored:
            path = stored
    if not path:
        raise ValueError("config.tokenizer is empty and there is no init_from to find spiece.model / vocab.txt in")
    lower = None if config.data.lower is None else bool(config.data.lower)
    tok = load_tokenizer_file(_local_tokenizer_file(path), lower=lower)
    tok.check_task_input(path)
    # The input layout follows the model: XLNet (<cls> last, left padding) or Funnel/BERT (<cls> first).
    tok.style = input_style(registry.get(config.model.family))
    if tok.vocab_size > int(config.model.vocab_size):
        raise ValueError(f"tokenizer {path} has {tok.vocab_size} pieces but model.vocab_size={config.model.vocab_size}")
    return tok


def _files_fingerprint(data_dir: str) -> str:
    h = hashlib.sha1()
    if data_dir.startswith("tfds:"):
        return hashlib.sha1(data_dir.encode()).hexdigest()[:16]
    for root, _, files in sorted(os.walk(data_dir)):
        for name in sorted(files):
            p = os.path.join(root, name)
            st = os.stat(p)
            h.update(f"{os.path.relpath(p, data_dir)}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:16]


def localize_data_dir(config):
    """A copy of `config` whose `data_dir` is local: a gs:// data_dir is mirrored into the local cache
    (task readers read plain files; GLUE/SQuAD/RACE directories are small)."""

    if not config.get("data_dir") or str(config.data_dir).startswith("tfds:") or not paths.is_remote(config.data_dir):
        return config
    local = copy.deepcopy(config)
    with local.unlocked():
        local.data_dir = paths.local_dir_copy(config.data_dir, subdir="task_data")
    return local


def _load_npz(path: str) -> Optional[Dict[str, np.ndarray]]:

    p = paths.as_path(path)
    if not p.exists():
        return None
    with np.load(io.BytesIO(p.read_bytes()) if paths.is_remote(p) else str(p)) as z:
        return {k: z[k] for k in z.files}


def _save_npz(path: str, arrays: Dict[str, np.ndarray]) -> None:

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    paths.makedirs(paths.as_path(path).parent)
    paths.atomic_write_bytes(path, buf.getvalue())


def split_examples_and_features(config, tokenizer, split: str, workdir: Optional[str]):
    """(examples, features) of `split`, features cached in `workdir/cache/`."""
    from xlgen.finetune.objective import max_segments
    from xlgen.finetune.readers.features import choice_features, text_features
    from xlgen.finetune.readers.squad import squad_features
    from xlgen.finetune.tasks import get_task

    task = get_task(config.task)
    d = config.data
    n_seg = max_segments(config)
    examples = task.read(config.data_dir, split, skip_malformed=bool(d.skip_malformed))
    if not examples:
        raise ValueError(f"{config.data_dir}: split {split!r} of {task.name} has no examples")
    key = json.dumps(
        {
            "task": task.name,
            "split": split,
            "files": _files_fingerprint(config.data_dir),
            "tok": [
                config.tokenizer or config.init_from,
                tokenizer.vocab_size,
                tokenizer.style,
                tokenizer.settings(),
                "features-v2",  # XLNet "<digits>," split as pretraining, Funnel RACE qa first: older caches are stale
            ],
            "data": {k: d[k] for k in ("max_seq_length", "doc_stride", "max_query_length", "max_qa_length")},
            **({"max_segments": n_seg} if n_seg else {}),
        },
        sort_keys=True,
    )
    cache = None
    if workdir and d.cache:
        cache = paths.join(workdir, "cache", f"{split}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.npz")
        cached = _load_npz(cache)
        if cached is not None:
            return examples, cached
    if task.kind == "squad":
        feats = squad_features(
            examples,
            tokenizer,
            max_seq_length=int(d.max_seq_length),
            doc_stride=int(d.doc_stride),
            max_query_length=int(d.max_query_length),
            is_training=split == "train",
        )
    elif task.kind == "token_classification":
        from xlgen.finetune.readers.conll import token_features

        feats = token_features(examples, tokenizer, task.label_names, max_seq_length=int(d.max_seq_length))
    elif task.kind == "multiple_choice":
        feats = choice_features(
            examples,
            tokenizer,
            max_seq_length=max(n_seg, 1) * int(d.max_seq_length),
            max_qa_length=int(d.max_qa_length),
        )
    else:
        feats = text_features(
            examples,
            tokenizer,
            max_seq_length=max(n_seg, 1) * int(d.max_seq_length),
            regression=task.kind == "regression",
        )
    if n_seg:
        feats = segmented(feats, n_seg, int(d.max_seq_length))
    if cache and _is_main():
        _save_npz(cache, feats)
    return examples, feats


def segmented(feats: Dict[str, np.ndarray], n_seg: int, seq_len: int) -> Dict[str, np.ndarray]:
    """Features packed to n_seg * seq_len pieces -> `[..., n_seg, seq_len]`: consecutive segments of the document.
    In the XLNet layout (left padding, `<cls>` last) a short document's leading segments are all padding (the
    bucket's unused slots) and the last segment always ends with `<cls>`; the recurrence skips empty slots."""
    out = dict(feats)
    for k in ("input_ids", "token_type_ids", "attention_mask"):
        v = feats[k]
        out[k] = v.reshape(v.shape[:-1] + (n_seg, seq_len))
    return out


def _is_main() -> bool:
    import jax

    return jax.process_index() == 0
