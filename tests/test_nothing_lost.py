"""Nothing lost (issue 48): no command deletes or overwrites what it did not create.

* Exports (`xlgen export --to-hf`, `xlgen convert --out`) write a new or empty directory, or replace a previous
  export (its marker `.xlgen-export`); a workdir, a non-empty directory, `.` or a file is refused, unchanged.
* Output paths that cannot be written (a file, under a file, a 300-byte name, a 4,400-byte path, a read-only
  filesystem, an empty `--workdir=`) are one-line errors, exit 2, nothing left behind.
"""

import hashlib
import os

import pytest

from xlgen import export, outdir


def tree_digest(root):
    """{relative path: sha256 of the bytes (files) | "dir" | "link -> target"} of everything under `root`."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            out[os.path.relpath(p, root)] = "link -> " + os.readlink(p) if os.path.islink(p) else "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            if os.path.islink(p):
                out[os.path.relpath(p, root)] = "link -> " + os.readlink(p)
                continue
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def tiny_txl():
    from flax import nnx

    from xlgen.models.transformer_xl import TransformerXLConfig, TransformerXLLM

    cfg = TransformerXLConfig(
        vocab_size=20, d_model=8, n_head=2, d_head=4, d_inner=16, n_layer=1, mem_len=2, cutoffs=()
    )
    return TransformerXLLM(cfg, rngs=nnx.Rngs(0))


def test_export_writes_only_new_empty_or_its_own_directories(tmp_path, tiny_txl, monkeypatch):
    """Item 1 / item 10 (`--to-hf=<a file>`): a non-empty directory, `.`, a file are refused with nothing changed;
    a new directory, an empty one and a previous export are written (the last replaced whole)."""
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    (busy / "checkpoints").mkdir()
    a_file = tmp_path / "model.bin"
    a_file.write_bytes(b"\x00weights")
    before = tree_digest(tmp_path)
    for target in (busy, a_file, busy / "notes.txt" / "sub"):
        with pytest.raises(outdir.OutputPathError) as e:
            export.export_model(tiny_txl, str(target))
        assert str(target) in str(e.value) and "\n" not in str(e.value)
    monkeypatch.chdir(busy)
    with pytest.raises(outdir.OutputPathError, match="non-empty directory|workdir"):
        export.export_model(tiny_txl, ".")
    assert tree_digest(tmp_path) == before  # nothing changed, no temporary directory left

    new = export.export_model(tiny_txl, str(tmp_path / "new" / "hf"))
    assert sorted(os.listdir(new)) == [".xlgen-export", "config.json", "model.safetensors"]
    empty = tmp_path / "empty"
    empty.mkdir()
    inode = os.stat(empty).st_ino
    assert export.export_model(tiny_txl, str(empty)) == str(empty)
    assert os.stat(empty).st_ino == inode and tree_digest(empty) == tree_digest(new)
    (empty / "model.safetensors").write_bytes(b"stale")  # a previous export is replaced, file for file
    (empty / "extra.json").write_text("{}")
    export.export_model(tiny_txl, str(empty))
    assert tree_digest(empty) == tree_digest(new)
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith(".")) == []  # no temporary siblings
