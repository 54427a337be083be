"""Task readers: official layouts parse to the right examples; bad input names the file and line/record."""

import json
import types

import numpy as np
import pytest

from xlgen.finetune.readers import TaskDataError, synthetic
from xlgen.finetune.readers.classification import read_classification
from xlgen.finetune.readers.features import choice_features, pack, text_features
from xlgen.finetune.readers.glue import GLUE_TASKS, read_glue
from xlgen.finetune.readers.pipeline import FeaturePipeline, eval_batches
from xlgen.finetune.readers.race import read_race
from xlgen.finetune.readers.squad import read_squad
from xlgen.finetune.submission import glue_submission_text
from xlgen.finetune.tasks import TASKS, get_task


def test_every_glue_task_reads_every_split(tmp_path):
    for task, spec in GLUE_TASKS.items():
        if task == "ax":
            continue
        d = tmp_path / task
        synthetic.write_glue(str(d), task, n_train=10, n_dev=6, n_test=3)
        for split, _ in spec.splits:
            ex = read_glue(task, str(d), split)
            assert len(ex) == (10 if split == "train" else 6 if split.startswith("dev") else 3)
            if split.startswith("test"):
                assert all(e.label is None for e in ex) and ex[0].guid == "0"
            elif spec.labels is None:
                assert all(isinstance(e.label, float) for e in ex)
            else:
                assert all(0 <= e.label < len(spec.labels) for e in ex)
            assert (ex[0].text_b is None) == (spec.text_b is None)


def test_glue_columns_by_header(tmp_path):
    (tmp_path / "dev.tsv").write_text(
        "index\tsentence1\tsentence2\tlabel\n0\tA cat.\tA dog.\tnot_entailment\n1\tx\ty\tentailment\n"
    )
    ex = read_glue("rte", str(tmp_path), "dev")
    assert [(e.text_a, e.text_b, e.label) for e in ex] == [("A cat.", "A dog.", 1), ("x", "y", 0)]
    # CoLA train/dev have no header: source, label, mark, sentence
    (tmp_path / "train.tsv").write_text("gj04\t1\t\tThe sailors rode.\ngj04\t0\t*\tRode the.\n")
    ex = read_glue("cola", str(tmp_path), "train")
    assert [(e.text_a, e.label) for e in ex] == [("The sailors rode.", 1), ("Rode the.", 0)]


def test_glue_bad_rows_name_file_and_line(tmp_path):
    p = tmp_path / "dev.tsv"
    p.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tonly two fields\n")
    with pytest.raises(TaskDataError, match=r"dev\.tsv:3: expected 4 tab-separated fields"):
        read_glue("rte", str(tmp_path), "dev")
    assert len(read_glue("rte", str(tmp_path), "dev", skip_malformed=True)) == 1
    p.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    with pytest.raises(TaskDataError, match=r"dev\.tsv:2: label 'maybe' is not one of"):
        read_glue("rte", str(tmp_path), "dev")
    (tmp_path / "train.tsv").write_text("index\tsentence1\tsentence2\tscore\n0\ta\tb\tfive\n")
    with pytest.raises(TaskDataError, match=r"train\.tsv:2: score 'five' is not a number"):
        read_glue("stsb", str(tmp_path), "train")
    (tmp_path / "train.tsv").write_text("index\tsentence1\tsentence2\tgold\n0\ta\tb\t1\n")
    with pytest.raises(TaskDataError, match=r"train\.tsv:1: header has no column 'score'"):
        read_glue("stsb", str(tmp_path), "train")
    with pytest.raises(ValueError, match="unknown task 'glue/xyz'"):
        get_task("glue/xyz")


def test_zhang_csv_and_imdb(tmp_path):
    (tmp_path / "train.csv").write_text('"3","Title, with comma","Body line\\nnext ""quoted"""\n"1","t","b"\n')
    ex = read_classification("ag", str(tmp_path), "train")
    assert [e.label for e in ex] == [2, 0]
    assert ex[0].text_a == 'Title, with comma Body line next "quoted"'
    (tmp_path / "test.csv").write_text('"1","ok"\n"9","bad label"\n')
    with pytest.raises(TaskDataError, match=r"test\.csv:2: label '9' outside 1\.\.4"):
        read_classification("ag", str(tmp_path), "dev")  # dev reads the test file
    for split in ("train", "test"):
        for name in ("pos", "neg"):
            d = tmp_path / "aclImdb" / split / name
            d.mkdir(parents=True)
            (d / "0_7.txt").write_text(f"{name} review<br />more")
    ex = read_classification("imdb", str(tmp_path), "train")
    assert [(e.text_a, e.label) for e in ex] == [("neg review more", 0), ("pos review more", 1)]


def test_race_reader_and_errors(tmp_path):
    synthetic.write_race(str(tmp_path), n_articles=2)
    ex = read_race(str(tmp_path), "dev")
    assert len(ex) == 2 * 2 * 2 and {e.level for e in ex} == {"high", "middle"}
    assert ex[0].endings[0].startswith("which word is in the text ? ")
    assert "_" not in ex[1].endings[0] and ex[1].endings[0].startswith("the text mentions ")
    assert len(read_race(str(tmp_path), "dev", ("high",))) == 4
    bad = tmp_path / "train" / "high" / "0.txt"
    doc = json.loads(bad.read_text())
    doc["answers"][1] = "E"
    bad.write_text(json.dumps(doc))
    with pytest.raises(TaskDataError, match=r"high/0\.txt: record questions\[1\]: answer 'E'"):
        read_race(str(tmp_path), "train")
    bad.write_text('{"article": "x",\n "questions": [}')
    with pytest.raises(TaskDataError, match=r"high/0\.txt:2:16: invalid JSON"):
        read_race(str(tmp_path), "train")


def test_squad_reader_errors(tmp_path):
    synthetic.write_squad(str(tmp_path), "v2.0")
    ex = read_squad(str(tmp_path / "train-v2.0.json"), version="v2.0", require_answers=True)
    assert any(e.is_impossible for e in ex) and all(bool(e.answers) != e.is_impossible for e in ex)
    doc = json.loads((tmp_path / "dev-v2.0.json").read_text())
    qa = next(q for q in doc["data"][1]["paragraphs"][0]["qas"] if q["answers"])
    qa["answers"][0]["answer_start"] += 1
    (tmp_path / "dev-v2.0.json").write_text(json.dumps(doc))
    with pytest.raises(
        TaskDataError,
        match=r"dev-v2\.0\.json: record data\[1\]\.paragraphs\[0\]\.qas\[\d\] "
        r"\(id q\d+\): answer .* is not at answer_start",
    ):
        read_squad(str(tmp_path / "dev-v2.0.json"), version="v2.0", require_answers=True)
    with pytest.raises(TaskDataError, match="is_impossible in a SQuAD v1.1 task"):
        read_squad(str(tmp_path / "train-v2.0.json"), version="v1.1", require_answers=True)


_TOK = types.SimpleNamespace(
    style="cls_last", cls_id=3, sep_id=4, pad_id=5, encode=lambda s: [int(w) for w in s.split()]
)


def test_xlnet_and_funnel_input_layouts():
    # XLNet: left padding, A <sep> B <sep> <cls>, segments A=0 B=1 CLS=2 PAD=4
    assert pack(_TOK, [10, 11], [12], 8) == (
        [5, 5, 10, 11, 4, 12, 4, 3],
        [4, 4, 0, 0, 0, 1, 1, 2],
        [0, 0, 1, 1, 1, 1, 1, 1],
    )
    funnel = types.SimpleNamespace(style="cls_first", cls_id=101, sep_id=102, pad_id=0)
    assert pack(funnel, [10, 11], [12], 8) == (
        [101, 10, 11, 102, 12, 102, 0, 0],
        [2, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 0, 0],
    )
    # pair truncation pops from the longer text; labels kept
    from xlgen.finetune.readers.examples import ChoiceExample, TextExample

    f = text_features([TextExample("0", "1 2 3 4 5 6", "7 8", 1)], _TOK, max_seq_length=8)
    assert f["input_ids"][0].tolist() == [1, 2, 3, 4, 7, 8, 4, 3]  # 5 pieces fit: A keeps 3, B keeps 2
    assert f["token_type_ids"][0].tolist() == [0, 0, 0, 0, 1, 1, 1, 2] and f["labels"].tolist() == [1]
    # RACE: keep the LAST max_qa_length pieces of question+option and the HEAD of the article
    ex = ChoiceExample("q", "1 2 3 4 5 6 7 8 9", ("20 21 22", "30", "40", "50"), 2, "high")
    f = choice_features([ex], _TOK, max_seq_length=10, max_qa_length=2)
    assert f["input_ids"].shape == (1, 4, 10) and f["labels"].tolist() == [2] and f["level"].tolist() == [1]
    assert f["input_ids"][0, 0].tolist() == [1, 2, 3, 4, 5, 4, 21, 22, 4, 3]
    assert f["input_ids"][0, 1].tolist() == [1, 2, 3, 4, 5, 6, 4, 30, 4, 3]


def test_pipeline_is_a_pure_function_of_step_and_covers_epochs():
    feats = {"x": np.arange(10)}
    p = FeaturePipeline(feats, global_batch_size=4, seed=3)
    first = np.concatenate([p.batch(s)["x"] for s in range(5)])  # 20 rows = 2 epochs
    assert sorted(first[:10]) == list(range(10)) and sorted(first[10:]) == list(range(10))
    q = FeaturePipeline(feats, global_batch_size=4, seed=3)
    assert q.batch(3)["x"].tolist() == p.batch(3)["x"].tolist()  # resume = call batch(k)
    parts = [
        FeaturePipeline(feats, global_batch_size=4, seed=3, process_index=i, process_count=2).batch(3)["x"]
        for i in range(2)
    ]
    assert np.concatenate(parts).tolist() == p.batch(3)["x"].tolist()
    bs = list(eval_batches(feats, 4))
    assert [b["weights"].sum() for b in bs] == [4, 4, 2] and bs[-1]["x"].tolist()[:2] == [8, 9]


def test_task_registry_and_glue_submission():
    assert {
        "glue/cola",
        "glue/sst2",
        "glue/mrpc",
        "glue/stsb",
        "glue/qqp",
        "glue/mnli",
        "glue/qnli",
        "glue/rte",
        "glue/wnli",
        "squad/v1.1",
        "squad/v2.0",
        "race",
        "imdb",
        "yelp2",
        "yelp5",
        "dbpedia",
        "ag",
        "amazon2",
        "amazon5",
    } <= set(TASKS)
    assert get_task("classification/yelp5").num_labels == 5 and get_task("glue/stsb").kind == "regression"
    assert get_task("glue/mnli").eval_splits == ("dev", "dev_mismatched")
    text = glue_submission_text(get_task("glue/mnli").label_names, ["0", "1"], np.array([1, 2]))
    assert text == "index\tprediction\n0\tentailment\n1\tneutral\n"
    assert glue_submission_text(None, ["7"], np.array([5.4])) == "index\tprediction\n7\t5.000\n"


def test_tfds_records_map_to_the_same_examples(monkeypatch):
    """`data_dir="tfds:..."` reads `tfds.data_source` records (here: decoded records as TFDS returns them);
    TFDS MNLI label order (entailment, neutral, contradiction) is remapped to the GLUE label names."""
    import tensorflow_datasets as tfds

    records = {
        ("glue/mnli", "validation_matched"): [{"premise": b"p", "hypothesis": b"h", "label": 2, "idx": 7}],
        ("squad/v2.0", "validation"): [
            {
                "id": b"q1",
                "question": b"who?",
                "context": b"Ann met Bob.",
                "answers": {"text": [b"Bob"], "answer_start": [8]},
            }
        ],
        ("race/high", "dev"): [
            {
                "article": b"a",
                "questions": [b"q _ ."],
                "options": [[b"w", b"x", b"y", b"z"]],
                "answers": [b"C"],
                "example_id": b"h1",
            }
        ],
    }
    calls = []

    def data_source(name, *, split, data_dir, download):
        calls.append((name, split, data_dir, download))
        return records[(name, split)]

    monkeypatch.setattr(tfds, "data_source", data_source)
    (ex,) = get_task("glue/mnli").read("tfds:/data/tfds", "dev")
    assert ex == TextExample("7", "p", "h", GLUE_TASKS["mnli"].labels.index("contradiction"))
    (sq,) = get_task("squad/v2.0").read("tfds:", "dev")
    assert (sq.qas_id, sq.answers, sq.is_impossible) == ("q1", (("Bob", 8),), False)
    (rc,) = get_task("race/high").read("tfds:", "dev")
    assert rc.endings == ("q w .", "q x .", "q y .", "q z .") and rc.label == 2 and rc.level == "high"
    assert calls[0] == ("glue/mnli", "validation_matched", "/data/tfds", False)


from xlgen.finetune.readers.examples import TextExample  # noqa: E402
