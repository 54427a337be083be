"""`xlgen prepare corpus --tfds / --hf` (data_pipelines/dataset_sources.py): a TFDS dataset the test builds
(array_record, in a temp dir) and Hugging Face `datasets` on-disk layouts (a `save_to_disk` DatasetDict and a cache
directory, Arrow IPC streams written with pyarrow as the library writes them) give the same shards, token for token,
as the same text through files; a missing dataset, split or text field is one line naming it, exit 2."""

import json
import os

import numpy as np
import pytest

from data_pipelines import prepare

DOCS = {
    "train": [
        "First record, first line.\nIts second line.",
        "A second document\nwith\nthree lines.",
        "One line only.",
        "Para one.\n\nPara two after a blank line.",
        "Ünïcödé — text, 123, and more.",
    ],
    "validation": ["Held out.\nTwo lines.", "Another held-out record."],
}


def _as_file(path, docs):
    """The file route's input: one document per record, a blank line between records."""
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    import tensorflow_datasets as tfds

    class XlgenTinyText(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(
                    {"text": tfds.features.Text(), "label": tfds.features.ClassLabel(num_classes=2)}
                ),
            )

        def _split_generators(self, dl_manager):
            del dl_manager  # nothing to download
            return {s: self._generate_examples(d) for s, d in DOCS.items()}

        def _generate_examples(self, docs):
            for i, d in enumerate(docs):
                yield i, {"text": d, "label": i % 2}

    root = str(tmp_path_factory.mktemp("tfds"))
    XlgenTinyText(data_dir=root, file_format="array_record").download_and_prepare()
    return root


def _hf_arrow(path, docs, extra=True):
    """An Arrow IPC stream file as `datasets` writes its data files (ArrowWriter: RecordBatchStreamWriter)."""
    import pyarrow as pa

    cols = {"id": pa.array(range(len(docs)), pa.int64()), "text": pa.array(docs, pa.string())}
    table = pa.table(cols if extra else {"text": cols["text"]})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=2):  # several record batches
            w.write_batch(batch)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    saved = root / "saved"  # DatasetDict.save_to_disk: dataset_dict.json + one Dataset directory per split
    saved.mkdir()
    (saved / "dataset_dict.json").write_text(json.dumps({"splits": list(DOCS)}))
    for split, docs in DOCS.items():
        d = saved / split
        d.mkdir()
        _hf_arrow(d / "data-00000-of-00001.arrow", docs)
        (d / "state.json").write_text(
            json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": split})
        )
        (d / "dataset_info.json").write_text("{}")
    cache = root / "cache"  # the library's cache: <user>___<name>/<config>/<version>/<hash>/<builder>-<split>.arrow
    d = cache / "someone___tiny" / "default" / "0.0.0" / "abc123"
    d.mkdir(parents=True)
    (d / "dataset_info.json").write_text("{}")
    docs = DOCS["train"]
    _hf_arrow(d / "tiny-train-00000-of-00002.arrow", docs[:3], extra=False)
    _hf_arrow(d / "tiny-train-00001-of-00002.arrow", docs[3:], extra=False)
    return str(saved), str(cache)


def _prepare(out, *argv):
    return prepare.main(
        ["corpus", "--tokenizer", "char", "--layout", "sentences", "--output", str(out), "--quiet", *argv]
    )


def _shards(out, split="train"):
    with open(os.path.join(out, "manifest.json")) as f:
        m = json.load(f)
    arrays = []
    for sh in m["splits"][split]["shards"]:
        arrays.append(
            (np.load(os.path.join(out, sh["tokens"])), np.load(os.path.join(out, sh["sentences"])), sh["num_lines"])
        )
    return m, arrays


def _stream(arrays):
    return np.concatenate([a for a, _, _ in arrays]), np.concatenate([s for _, s, _ in arrays])


def _same_tokens(out_a, out_b, split="train"):
    ma, a = _shards(out_a, split)
    mb, b = _shards(out_b, split)
    assert ma["tokenizer"]["sha256"] == mb["tokenizer"]["sha256"]  # char vocabulary built from the same text
    ta, sa = _stream(a)
    tb, sb = _stream(b)
    np.testing.assert_array_equal(ta, tb)
    np.testing.assert_array_equal(sa, sb)
    if len(a) == len(b):  # line counts per shard (a shard's lines exclude the blank line after its last record)
        assert [n for _, _, n in a] == [n for _, _, n in b]
    for key in ("num_tokens", "num_documents"):
        assert ma["splits"][split][key] == mb["splits"][split][key]


def test_tfds_source_gives_the_file_route_shards(tfds_dir, tmp_path):
    import tensorflow_datasets as tfds

    # the file holds the records in the dataset's stored order (TFDS orders examples by a hash of their keys)
    order = {
        s: [r["text"].decode() for r in tfds.data_source("xlgen_tiny_text", split=s, data_dir=tfds_dir, download=False)]
        for s in DOCS
    }
    assert sorted(order["train"]) == sorted(DOCS["train"])
    files = {s: _as_file(tmp_path / f"{s}.txt", d) for s, d in order.items()}
    assert _prepare(tmp_path / "f", "--train", files["train"], "--valid", files["validation"]) == 0
    name = "xlgen_tiny_text"
    code = _prepare(tmp_path / "t", f"--tfds={name}", "--valid", f"tfds:{name}:validation", "--tfds_data_dir", tfds_dir)
    assert code == 0
    _same_tokens(tmp_path / "f", tmp_path / "t")
    _same_tokens(tmp_path / "f", tmp_path / "t", "valid")
    m, _ = _shards(tmp_path / "t")
    assert m["splits"]["train"]["shards"][0]["source"] == f"tfds:{name}"
    # idempotent like files: a second run rewrites nothing
    assert (
        _prepare(tmp_path / "t", f"--tfds={name}", "--valid", f"tfds:{name}:validation", "--tfds_data_dir", tfds_dir)
        == 0
    )


def test_hf_sources_give_the_file_route_shards(hf_dirs, tmp_path, monkeypatch):
    saved, cache = hf_dirs
    files = {s: _as_file(tmp_path / f"{s}.txt", d) for s, d in DOCS.items()}
    assert _prepare(tmp_path / "f", "--train", files["train"], "--valid", files["validation"]) == 0
    assert _prepare(tmp_path / "s", f"--hf={saved}", "--valid", f"hf:{saved}:validation") == 0
    _same_tokens(tmp_path / "f", tmp_path / "s")
    _same_tokens(tmp_path / "f", tmp_path / "s", "valid")
    monkeypatch.setenv("HF_DATASETS_CACHE", cache)  # a cached dataset by name; two Arrow files -> two shards
    assert _prepare(tmp_path / "c", "--hf=someone/tiny:train") == 0
    m, arrays = _shards(tmp_path / "c")
    assert len(arrays) == 2
    assert [sh["source"] for sh in m["splits"]["train"]["shards"]] == [
        "hf:someone/tiny:train[1/2]",
        "hf:someone/tiny:train[2/2]",
    ]
    _same_tokens(tmp_path / "f", tmp_path / "c")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tfds=no_such_dataset"], "--tfds=no_such_dataset: no TFDS dataset 'no_such_dataset'"),
        (["--tfds=xlgen_tiny_text:dev"], "has no split 'dev' (has train, validation)"),
        (["--tfds=xlgen_tiny_text", "--text_field=body"], "--text_field=body: not a feature of 'xlgen_tiny_text'"),
        (["--tfds=xlgen_tiny_text", "--text_field=label"], "--text_field=label: a ClassLabel, not Text"),
        (["--hf=missing/thing"], "--hf=missing/thing: no dataset 'missing/thing'"),
        (["--hf=SAVED:test"], "has no split 'test' (has train, validation)"),
        (["--hf=SAVED", "--text_field=body"], "--text_field=body: not a column of"),
    ],
)
def test_missing_dataset_split_or_field_is_one_line(tfds_dir, hf_dirs, tmp_path, capsys, argv, message):
    argv = [a.replace("SAVED", hf_dirs[0]) for a in argv]
    assert _prepare(tmp_path / "out", *argv, "--tfds_data_dir", tfds_dir) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()  # nothing left behind
