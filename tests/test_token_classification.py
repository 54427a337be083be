"""Token classification (NER): the CoNLL-2003 reader (IOB1 -> BIO, documents, errors), word-piece alignment in both
families' layouts, seqeval's entity-level scores on a hand-made case, and a learnable synthetic CoNLL task finetuned
through the real trainer to a high entity F1 with `predictions.txt` in CoNLL format. (HF parity of the heads:
tests/test_xlnet.py, tests/test_funnel.py; export round trips: tests/test_export.py.)"""

import json
import os
import types

import numpy as np
import pytest

from xlgen.finetune.readers import conll, synthetic
from xlgen.finetune.readers.examples import TaskDataError, TokenExample

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_iob1_to_bio_and_reader(tmp_path):
    assert conll.iob1_to_bio(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG"]) == (
        "B-PER",
        "I-PER",
        "O",
        "B-LOC",
        "B-LOC",
        "B-ORG",
    )
    p = tmp_path / "train.txt"
    p.write_text(
        "-DOCSTART- -X- -X- O\n\nEU NNP B-NP I-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP I-MISC\n\n"
        "-DOCSTART- -X- -X- O\n\nPeter NNP B-NP I-PER\nBlackburn NNP I-NP I-PER\n"
    )
    ex = conll.read_conll(str(p))
    assert [e.words for e in ex] == [("EU", "rejects", "German"), ("Peter", "Blackburn")]
    assert [e.tags for e in ex] == [("B-ORG", "O", "B-MISC"), ("B-PER", "I-PER")]
    (tmp_path / "dev.txt").write_text("a NN O\n")
    assert conll.conll_file(str(tmp_path), "dev").endswith("dev.txt")  # valid.txt or dev.txt
    bad = tmp_path / "bad.txt"
    bad.write_text("EU NNP B-NP I-ORG\nrejects\n")
    with pytest.raises(TaskDataError, match=r"bad.txt:2: expected 'word \.\.\. TAG'"):
        conll.read_conll(str(bad))
    bad.write_text("EU NNP B-NP X-ORG\n")
    with pytest.raises(TaskDataError, match=r"bad.txt:1: tag 'X-ORG'"):
        conll.read_conll(str(bad))


def _tok(style):
    vocab = {"Peter": [10, 11], "Blackburn": [12], "rejects": [13, 14, 15]}
    return types.SimpleNamespace(style=style, cls_id=3, sep_id=4, pad_id=5, encode=lambda w: vocab[w])


@pytest.mark.parametrize("style", ["cls_last", "cls_first"])
def test_first_piece_carries_the_label_in_both_layouts(style):
    ex = TokenExample("s", ("Peter", "Blackburn", "rejects"), ("B-PER", "I-PER", "O"))
    labels = ("O", "B-PER", "I-PER")
    f = conll.token_features([ex], _tok(style), labels, max_seq_length=10)
    ids = f["input_ids"][0].tolist()
    if style == "cls_last":  # XLNet: left padding, pieces <sep> <cls>
        assert ids == [5, 5, 10, 11, 12, 13, 14, 15, 4, 3]
        first = [2, 4, 5]
    else:  # Funnel / BERT: [CLS] pieces [SEP] padding
        assert ids == [3, 10, 11, 12, 13, 14, 15, 4, 5, 5]
        first = [1, 3, 4]
    assert np.nonzero(f["label_mask"][0])[0].tolist() == first
    assert f["labels"][0][first].tolist() == [1, 2, 0] and f["labels"][0].sum() == 3
    assert f["word_index"][0][first].tolist() == [0, 1, 2] and (f["word_index"][0] >= 0).sum() == 3
    pred = np.zeros(10, np.int32)
    pred[first] = [1, 2, 2]
    assert conll.word_predictions(ex, f["word_index"][0], pred, labels) == ["B-PER", "I-PER", "I-PER"]
    # a sentence longer than the window keeps its head; the words cut off are predicted "O"
    short = conll.token_features([ex], _tok(style), labels, max_seq_length=6)
    assert (short["word_index"][0] >= 0).sum() == 2
    assert conll.word_predictions(ex, short["word_index"][0], pred[:6], labels)[2] == "O"


def test_seqeval_entity_scores_on_a_hand_made_case():
    """Gold: PER (2 words), LOC, ORG; predicted: PER right, LOC with the wrong type, ORG missed, one spurious MISC.
    Entity-level: 1 of 3 predicted entities correct, 1 of 3 gold found -> P = R = F1 = 1/3."""
    from seqeval.metrics import f1_score, precision_score, recall_score
    from seqeval.scheme import IOB2

    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-MISC"], ["O", "O", "B-MISC"]]
    kw = dict(mode="strict", scheme=IOB2)
    assert precision_score(gold, pred, **kw) == pytest.approx(1 / 3)
    assert recall_score(gold, pred, **kw) == pytest.approx(1 / 3)
    assert f1_score(gold, pred, **kw) == pytest.approx(1 / 3)
    # a half-right span is wrong at the entity level
    assert f1_score([["B-PER", "I-PER"]], [["B-PER", "O"]], **kw) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("config", ["configs/finetune/tiny.py", "configs/finetune/tiny_funnel.py"])
def test_synthetic_conll_learns_to_high_entity_f1(tmp_path, config):
    """A tiny model finetuned on the learnable synthetic CoNLL task through the real trainer reaches a high entity F1
    on the dev file and writes eval_results.json and predictions.txt (word gold predicted)."""
    from xlgen import finetune as ft

    d = tmp_path / "conll"
    synthetic.write_conll(str(d), n_train=256, n_dev=64, n_test=8)
    texts = [" ".join(e.words) for e in conll.read_conll(str(d / "train.txt"))]
    synthetic.train_sentencepiece(texts, str(tmp_path / "spiece.model"), vocab_size=120)
    wd = str(tmp_path / "wd")
    over = {
        "task": "conll2003",
        "data_dir": str(d),
        "tokenizer": str(tmp_path / "spiece.model"),
        "total_steps": "200",
        "eval_every_steps": "0",
        "optimizer.learning_rate": "3e-3",
        "optimizer.warmup_steps": "10",
        "data.max_seq_length": "48",
        "mesh.num_devices": "1",
    }
    cfg = ft.load_finetune_config(os.path.join(ROOT, config), over, wd)
    best = ft.finetune(cfg, wd)
    res = json.load(open(os.path.join(wd, "eval_results.json")))
    assert res == best and {"precision", "recall", "f1"} <= set(res)
    print(f"conll2003 synthetic {config}: entity P {res['precision']:.3f} R {res['recall']:.3f} F1 {res['f1']:.3f}")
    assert res["f1"] > 0.9, res
    lines = open(os.path.join(wd, "predictions.txt")).read().split("\n\n")
    first = lines[0].splitlines()
    assert len(lines) - 1 == 64 and all(len(line.split()) == 3 for line in first)
    correct = sum(line.split()[1] == line.split()[2] for block in lines for line in block.splitlines())
    assert correct > 0.9 * sum(len(block.splitlines()) for block in lines)
