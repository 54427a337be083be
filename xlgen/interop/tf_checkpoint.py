"""Reading TensorFlow checkpoints without TensorFlow: the V2 tensor-bundle format (`PREFIX.index` +
`PREFIX.data-SSSSS-of-NNNNN`) that `tf.compat.v1.train.Saver` and `tf.train.Checkpoint` write, and in which the
original XLNet, Funnel-Transformer and Transformer-XL releases were saved.

    PREFIX.index      an SSTable (LevelDB table format, blocks uncompressed): key "" -> BundleHeaderProto
                      (num_shards, endianness), key <variable name> -> BundleEntryProto (dtype, shape, shard_id,
                      offset, size, masked crc32c of the bytes)
    PREFIX.data-*     the tensors' raw bytes (little-endian, C order), at `offset` in shard `shard_id`

The two protobuf messages are decoded from the wire format here (a handful of scalar fields), so `xlgen convert
--from-tf` needs neither TensorFlow nor its .proto files. The tensors' crc32c checksums are verified when
`google-crc32c` is installed (the `tf` extra brings it). Partitioned variables (entries with slices) and string
tensors are not read: an error names the variable.
"""

from __future__ import annotations

import os
import struct
from typing import Dict, Iterator, List, Tuple

import numpy as np

_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_LEN = 48  # two BlockHandles padded to 40 bytes + the 8-byte magic number

# TensorFlow's DataType enum (tensorflow/core/framework/types.proto) -> NumPy
_DTYPES = {
    1: np.float32,
    2: np.float64,
    3: np.int32,
    4: np.uint8,
    5: np.int16,
    6: np.int8,
    9: np.int64,
    10: np.bool_,
    17: np.uint16,
    19: np.float16,
    22: np.uint32,
    23: np.uint64,
}
_DT_BFLOAT16 = 14


class CheckpointError(ValueError):
    """A malformed or unsupported checkpoint; the message names the file (and variable)."""


def _varint(buf: bytes, pos: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise CheckpointError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _proto_fields(buf: bytes) -> Iterator[Tuple[int, object]]:
    """(field number, value) of a serialized protobuf message: varints as int, fixed32/64 as int,
    length-delimited as bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = int.from_bytes(buf[pos : pos + 8], "little"), pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = bytes(buf[pos : pos + n]), pos + n
        elif wire == 5:
            value, pos = int.from_bytes(buf[pos : pos + 4], "little"), pos + 4
        else:
            raise CheckpointError(f"unsupported protobuf wire type {wire}")
        yield field, value


def _block_entries(block: bytes) -> Iterator[Tuple[bytes, bytes]]:
    """(key, value) pairs of one SSTable block: prefix-compressed keys, then the restart array."""
    if len(block) < 4:
        raise CheckpointError("truncated table block")
    (num_restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 - 4 * num_restarts
    pos, key = 0, b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        vlen, pos = _varint(block, pos)
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared
        yield key, block[pos : pos + vlen]
        pos += vlen


def _read_block(table: bytes, handle: bytes) -> bytes:
    offset, pos = _varint(handle, 0)
    size, _ = _varint(handle, pos)
    if offset + size + 5 > len(table):
        raise CheckpointError("table block past the end of the file")
    if table[offset + size] != 0:  # block trailer: compression type (0 = none), then a crc
        raise CheckpointError(f"compressed table block (type {table[offset + size]}); TensorFlow writes none")
    return table[offset : offset + size]


def _table(path: str) -> Iterator[Tuple[bytes, bytes]]:
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < _FOOTER_LEN or int.from_bytes(data[-8:], "little") != _TABLE_MAGIC:
        raise CheckpointError("not a TensorFlow checkpoint index (no SSTable footer)")
    footer = data[-_FOOTER_LEN:]
    _, pos = _varint(footer, 0)  # metaindex handle (offset, size): unused
    _, pos = _varint(footer, pos)
    index = _read_block(data, footer[pos:])
    for _, handle in _block_entries(index):
        yield from _block_entries(_read_block(data, handle))


def _shape(buf: bytes) -> Tuple[int, ...]:
    dims = []
    for field, value in _proto_fields(buf):
        if field == 2:  # Dim {size = 1; name = 2}
            dims.append(next((v for f, v in _proto_fields(value) if f == 1), 0))
        elif field == 3 and value:
            raise CheckpointError("a tensor of unknown rank")
    return tuple(int(d) for d in dims)


def _mask_crc(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


class TFCheckpoint:
    """The variables of a TensorFlow checkpoint, by name: `names()`, `shape(name)`, `name in ckpt`, `ckpt[name]`
    (a NumPy array read on demand; bfloat16 as float32).

    `prefix` is what `tf.train.Saver.save` returned (`.../model.ckpt-1000000`, without `.index`), or a directory
    holding one checkpoint (its `checkpoint` file's `model_checkpoint_path`, else the only `*.index`)."""

    def __init__(self, prefix: str):
        self.prefix = resolve_prefix(prefix)
        index = self.prefix + ".index"
        self._entries: Dict[str, Tuple[int, Tuple[int, ...], int, int, int, int]] = {}
        num_shards = 1
        try:
            for key, value in _table(index):
                fields = list(_proto_fields(value))
                if key == b"":  # BundleHeaderProto {num_shards = 1; endianness = 2; version = 3}
                    f = dict((k, v) for k, v in fields if k in (1, 2))
                    num_shards = int(f.get(1, 1))
                    if f.get(2, 0) != 0:
                        raise CheckpointError("a big-endian checkpoint")
                    continue
                name = key.decode("utf-8")
                dtype, shape, shard, offset, size, crc = 0, (), 0, 0, 0, None
                for k, v in fields:
                    if k == 1:
                        dtype = int(v)
                    elif k == 2:
                        shape = _shape(v)
                    elif k == 3:
                        shard = int(v)
                    elif k == 4:
                        offset = int(v)
                    elif k == 5:
                        size = int(v)
                    elif k == 6:
                        crc = int(v)
                    elif k == 7:
                        raise CheckpointError(f"variable {name!r} is partitioned (slices); not supported")
                self._entries[name] = (dtype, shape, shard, offset, size, crc)
        except CheckpointError as e:
            raise CheckpointError(f"{index}: {e}") from None
        self.num_shards = num_shards

    def names(self) -> List[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def _entry(self, name: str):
        if name not in self._entries:
            raise KeyError(f"{self.prefix}: no variable {name!r}")
        return self._entries[name]

    def shape(self, name: str) -> Tuple[int, ...]:
        return self._entry(name)[1]

    def _data_path(self, shard: int) -> str:
        return f"{self.prefix}.data-{shard:05d}-of-{self.num_shards:05d}"

    def __getitem__(self, name: str) -> np.ndarray:
        dtype, shape, shard, offset, size, crc = self._entry(name)
        path = self._data_path(shard)
        if dtype == _DT_BFLOAT16:
            import ml_dtypes

            np_dtype = np.dtype(ml_dtypes.bfloat16)
        elif dtype in _DTYPES:
            np_dtype = np.dtype(_DTYPES[dtype])
        else:
            raise CheckpointError(f"{self.prefix}: variable {name!r} has TensorFlow dtype {dtype} (not numeric)")
        if size != int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize:
            raise CheckpointError(f"{self.prefix}: variable {name!r}: {size} bytes for shape {shape} of {np_dtype}")
        with open(path, "rb") as f:
            f.seek(offset)
            raw = f.read(size)
        if len(raw) != size:
            raise CheckpointError(f"{path}: truncated (variable {name!r})")
        if crc is not None:
            _check_crc(raw, crc, path, name)
        array = np.frombuffer(raw, dtype=np_dtype).reshape(shape)  # little-endian data, as on every host we run on
        return array.astype(np.float32) if dtype == _DT_BFLOAT16 else array.copy()

    def __repr__(self) -> str:
        return f"TFCheckpoint({self.prefix!r}, {len(self._entries)} variables)"


def _check_crc(raw: bytes, masked: int, path: str, name: str) -> None:
    try:
        import google_crc32c
    except ImportError:  # the `tf` extra installs it; without it the bytes are taken as read
        return
    if _mask_crc(google_crc32c.value(raw)) != masked:
        raise CheckpointError(f"{path}: checksum mismatch for variable {name!r} (a corrupt or truncated file)")


def resolve_prefix(prefix: str) -> str:
    """The checkpoint prefix for a prefix, a `PREFIX.index` path or a directory (its `checkpoint` state file's
    `model_checkpoint_path`, else its only `*.index`); FileNotFoundError naming what is missing."""
    prefix = os.fspath(prefix)
    if prefix.endswith(".index"):
        prefix = prefix[: -len(".index")]
    if os.path.isdir(prefix):
        state = os.path.join(prefix, "checkpoint")
        if os.path.exists(state):
            with open(state, encoding="utf-8") as f:
                for line in f:
                    if line.startswith("model_checkpoint_path:"):
                        p = line.split(":", 1)[1].strip().strip('"')
                        return p if os.path.isabs(p) else os.path.join(prefix, p)
        indexes = sorted(n for n in os.listdir(prefix) if n.endswith(".index"))
        if len(indexes) != 1:
            raise FileNotFoundError(
                f"{prefix}: a directory with {len(indexes)} *.index files; pass the checkpoint prefix "
                "(e.g. DIR/model.ckpt-1000000)"
            )
        return os.path.join(prefix, indexes[0][: -len(".index")])
    if not os.path.exists(prefix + ".index"):
        raise FileNotFoundError(f"{prefix}.index: no such file (expected a TensorFlow checkpoint prefix)")
    return prefix
