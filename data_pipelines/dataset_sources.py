"""Text from dataset libraries for `xlgen prepare corpus`: TFDS and Hugging Face `datasets` on-disk data.

A source is written where a file would be (`--train`, `--valid`, `--test`), or with `--tfds=NAME[:SPLIT]` /
`--hf=NAME[:SPLIT]` for the train split:

  * `tfds:NAME[:SPLIT]` — a TFDS dataset prepared with `file_format="array_record"` in `--tfds_data_dir` (default:
    TFDS's own, `$TFDS_DATA_DIR` or ~/tensorflow_datasets), read with `tfds.data_source` (no TensorFlow, nothing
    downloaded). NAME may carry a config and version (`wiki40b/en:1.3.0`); SPLIT defaults to `train`.
  * `hf:NAME[:SPLIT]` — a Hugging Face `datasets` dataset on disk: a `save_to_disk` directory (a `DatasetDict` with
    `dataset_dict.json` and one directory per split, or one `Dataset` with `state.json`), a directory of the
    library's cache (`NAME-SPLIT.arrow`, `NAME-SPLIT-00000-of-00002.arrow`, ...), or a dataset name looked up in the
    cache (`$HF_DATASETS_CACHE`, `$HF_HOME/datasets`, ~/.cache/huggingface/datasets; `user/name` is stored as
    `user___name`, `name/config` selects a configuration). The Arrow IPC files those write are read with pyarrow
    batch by batch (the `datasets` package itself needs a huggingface-hub that tokenizers 0.14 excludes).

Each record's `--text_field` (default `text`) is one document: its lines are sentences, a blank line inside it also
ends a document, exactly as the same text in a file with a blank line between records. One xlgen shard per dataset
file (TFDS shard / Arrow file), so `--workers` parallelises over them. The text is read a batch of records at a time;
only the shard's token ids are held until written.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
from typing import Iterator, List, Optional

TFDS, HF = "tfds:", "hf:"
_BATCH = 256
_VERSION = re.compile(r"^\d+(\.\d+)*$")


def is_dataset_source(spec: str) -> bool:
    return str(spec).startswith((TFDS, HF))


@dataclasses.dataclass(frozen=True)
class DatasetPart:
    """One dataset file of a split: TFDS records [start, stop) of `file`, or one Arrow `file`."""

    library: str  # "tfds" | "hf"
    spec: str  # as given: tfds:NAME:SPLIT
    name: str
    split: str
    file: str
    text_field: str
    index: int
    count: int
    data_dir: Optional[str] = None  # TFDS data_dir
    start: int = 0
    stop: int = 0

    @property
    def display(self) -> str:
        return self.spec if self.count == 1 else f"{self.spec}[{self.index + 1}/{self.count}]"

    @property
    def stem(self) -> str:
        base = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{os.path.basename(self.name.rstrip('/'))}-{self.split}")
        return base if self.count == 1 else f"{base}-{self.index:05d}"

    def fingerprint(self) -> str:
        """sha256 of the part's file bytes, the record range and the text field (the shard's source key)."""
        h = hashlib.sha256()
        with open(self.file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        h.update(f"|{self.start}:{self.stop}|{self.text_field}".encode())
        return h.hexdigest()

    def texts(self) -> Iterator[str]:
        """The text field of every record of the part, in order."""
        if self.library == "tfds":
            import tensorflow_datasets as tfds

            src = tfds.data_source(self.name, split=self.split, data_dir=self.data_dir, download=False)
            for a in range(self.start, self.stop, _BATCH):
                for rec in src.__getitems__(list(range(a, min(a + _BATCH, self.stop)))):
                    v = rec[self.text_field]
                    yield v.decode("utf-8") if isinstance(v, bytes) else str(v)
            return
        import pyarrow as pa

        with pa.memory_map(self.file) as mm:
            for batch in pa.ipc.open_stream(mm):
                yield from (t if t is not None else "" for t in batch.column(self.text_field).to_pylist())

    def lines(self) -> Iterator[str]:
        """The part as lines of the equivalent text file: each record's lines, then a blank line."""
        for text in self.texts():
            yield from text.splitlines()
            yield ""


def _name_split(body: str, flag: str) -> tuple[str, str]:
    name, sep, tail = body.rpartition(":")
    if not sep or not name or _VERSION.match(tail) or "/" in tail:
        name, tail = body, "train"
    if not name:
        raise ValueError(f"{flag}: empty dataset name")
    return name, tail or "train"


def expand(spec: str, text_field: str = "text", tfds_data_dir: Optional[str] = None) -> List[DatasetPart]:
    """A `tfds:` / `hf:` source -> its parts (one per dataset file); errors name the dataset, split or field."""
    if spec.startswith(TFDS):
        return _tfds_parts(spec, text_field, tfds_data_dir)
    if spec.startswith(HF):
        return _hf_parts(spec, text_field)
    raise ValueError(f"{spec!r}: not a tfds: or hf: source")


# ----------------------------------------------------------------------------------------------------------------
# TFDS
# ----------------------------------------------------------------------------------------------------------------
def _tfds_parts(spec: str, text_field: str, data_dir: Optional[str]) -> List[DatasetPart]:
    import tensorflow_datasets as tfds

    flag = f"--tfds={spec[len(TFDS) :]}"
    name, split = _name_split(spec[len(TFDS) :], flag)
    where = data_dir or "the default TFDS data_dir"
    try:
        builder = tfds.builder(name, data_dir=data_dir or None)
        splits = builder.info.splits
        prepared = os.path.isdir(str(builder.data_dir)) and len(splits) > 0
    except Exception as e:  # DatasetNotFoundError, a malformed name, ...
        raise FileNotFoundError(f"{flag}: no TFDS dataset {name!r} in {where} ({type(e).__name__})") from None
    if not prepared:
        raise FileNotFoundError(
            f"{flag}: TFDS dataset {name!r} is not prepared in {where} (prepare it once with "
            f"tfds.builder({name!r}).download_and_prepare(file_format='array_record'))"
        )
    if split not in splits:
        raise ValueError(f"{flag}: dataset {name!r} has no split {split!r} (has {', '.join(sorted(splits))})")
    features = builder.info.features
    if text_field not in features:
        raise ValueError(f"{flag}: --text_field={text_field}: not a feature of {name!r} (has {', '.join(features)})")
    if type(features[text_field]).__name__ != "Text":
        raise ValueError(f"{flag}: --text_field={text_field}: a {type(features[text_field]).__name__}, not Text")
    if str(builder.info.file_format).rsplit(".", 1)[-1].lower() not in ("array_record", "fileformat.array_record"):
        raise ValueError(f"{flag}: stored as {builder.info.file_format}; xlgen reads file_format='array_record'")
    info = splits[split]
    files, lengths = [str(p) for p in info.filepaths], list(info.shard_lengths)
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    return [
        DatasetPart("tfds", spec, name, split, f, text_field, i, len(files), data_dir or None, bounds[i], bounds[i + 1])
        for i, f in enumerate(files)
    ]


# ----------------------------------------------------------------------------------------------------------------
# Hugging Face datasets (on disk)
# ----------------------------------------------------------------------------------------------------------------
def hf_cache_root() -> str:
    if os.environ.get("HF_DATASETS_CACHE"):
        return os.environ["HF_DATASETS_CACHE"]
    hf_home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(hf_home, "datasets")


def _cache_files(directory: str, split: str) -> List[str]:
    """Arrow files of `split` in a `datasets` cache directory (`<builder>-<split>[-NNNNN-of-NNNNN].arrow`)."""
    pat = re.compile(rf".+-{re.escape(split)}(-\d{{5}}-of-\d{{5}})?\.arrow$")
    return sorted(f for f in glob.glob(os.path.join(directory, "*.arrow")) if pat.match(os.path.basename(f)))


def _splits_in(directory: str) -> List[str]:
    names = {m.group(1) for f in glob.glob(os.path.join(directory, "*.arrow")) for m in [_SPLIT_RE.match(f)] if m}
    return sorted(names)


_SPLIT_RE = re.compile(r".*-([A-Za-z0-9_.]+?)(?:-\d{5}-of-\d{5})?\.arrow$")


def _saved_files(directory: str, split: str, flag: str, explicit: bool) -> Optional[List[str]]:
    """Arrow files of a `save_to_disk` directory (DatasetDict or Dataset), None if it is not one."""
    dd = os.path.join(directory, "dataset_dict.json")
    if os.path.isfile(dd):
        with open(dd, encoding="utf-8") as f:
            splits = json.load(f).get("splits", [])
        if split not in splits:
            raise ValueError(f"{flag}: {directory} has no split {split!r} (has {', '.join(splits)})")
        return _saved_files(os.path.join(directory, split), split, flag, False) or []
    st = os.path.join(directory, "state.json")
    if os.path.isfile(st):
        with open(st, encoding="utf-8") as f:
            state = json.load(f)
        saved_split = state.get("_split")
        if saved_split and saved_split != split and explicit:
            raise ValueError(f"{flag}: {directory} holds split {saved_split!r}, not {split!r}")
        return [os.path.join(directory, d["filename"]) for d in state.get("_data_files", [])]
    return None


def _hf_parts(spec: str, text_field: str) -> List[DatasetPart]:
    import pyarrow as pa

    body = spec[len(HF) :]
    flag = f"--hf={body}"
    name, split = _name_split(body, flag)
    explicit_split = body != name  # NAME:SPLIT given
    files: Optional[List[str]] = None
    if os.path.isdir(name):
        files = _saved_files(name, split, flag, explicit_split)
        if files is None:
            files = _cache_files(name, split)
            if not files:
                have = _splits_in(name)
                raise ValueError(
                    f"{flag}: {name} has no split {split!r}"
                    + (f" (has {', '.join(have)})" if have else " (not a datasets directory: no .arrow files)")
                )
    else:
        root = hf_cache_root()
        first, _, config = name.partition("/")
        candidates = [os.path.join(root, name.replace("/", "___"))]
        if config:
            candidates.append(os.path.join(root, first, config))
        dirs = sorted(
            {
                os.path.dirname(p)
                for c in candidates
                if os.path.isdir(c)
                for p in glob.glob(os.path.join(c, "**", "dataset_info.json"), recursive=True)
                if _cache_files(os.path.dirname(p), split)
            }
        )
        if not dirs:
            raise FileNotFoundError(
                f"{flag}: no dataset {name!r} with a {split!r} split: not a local directory, nor in the datasets "
                f"cache {root}"
            )
        if len(dirs) > 1:
            raise ValueError(f"{flag}: several cached versions of {name!r}; pass one directory: {', '.join(dirs)}")
        files = _cache_files(dirs[0], split)
    if not files:
        raise ValueError(f"{flag}: split {split!r} has no data files")
    for f in files:
        if not os.path.isfile(f):
            raise FileNotFoundError(f"{flag}: missing data file {f}")
    with pa.memory_map(files[0]) as mm:
        schema = pa.ipc.open_stream(mm).schema
    if text_field not in schema.names:
        raise ValueError(f"{flag}: --text_field={text_field}: not a column of {name!r} (has {', '.join(schema.names)})")
    if not (
        pa.types.is_string(schema.field(text_field).type) or pa.types.is_large_string(schema.field(text_field).type)
    ):
        raise ValueError(f"{flag}: --text_field={text_field}: a {schema.field(text_field).type} column, not text")
    return [DatasetPart("hf", spec, name, split, f, text_field, i, len(files)) for i, f in enumerate(files)]
