"""Task metrics against their textbook definitions, and the SQuAD evaluator against the official scripts'
definitions on hand-made cases (normalisation, several gold answers, no-answer, HasAns/NoAns, best thresholds)."""

import math

import numpy as np
import pytest

from xlgen.finetune import metrics
from xlgen.finetune import squad_eval as se


def test_classification_and_regression_metrics_match_definitions():
    rng = np.random.default_rng(0)
    y, p = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    p[:120] = y[:120]
    tp, tn = np.sum((p == 1) & (y == 1)), np.sum((p == 0) & (y == 0))
    fp, fn = np.sum((p == 1) & (y == 0)), np.sum((p == 0) & (y == 1))
    assert metrics.accuracy(y, p) == pytest.approx((tp + tn) / 200, abs=1e-12)
    assert metrics.f1(y, p) == pytest.approx(2 * tp / (2 * tp + fp + fn), abs=1e-12)
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert metrics.mcc(y, p) == pytest.approx(mcc, abs=1e-12)
    a, b = rng.normal(size=100), rng.normal(size=100)
    b = a + 0.5 * b
    assert metrics.pearson(a, b) == pytest.approx(np.corrcoef(a, b)[0, 1], abs=1e-12)
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))  # no ties in continuous data
    assert metrics.spearman(a, b) == pytest.approx(np.corrcoef(ra, rb)[0, 1], abs=1e-12)
    r = metrics.race_accuracy([0, 1, 2, 3], [0, 1, 0, 0], [0, 0, 1, 1])
    assert r == {"accuracy": 0.5, "accuracy_all": 0.5, "accuracy_middle": 1.0, "accuracy_high": 0.0}


def test_normalisation():
    assert se.normalize_answer("The  Cat, sat!") == "cat sat"
    assert se.normalize_answer("an apple a day") == "apple day"
    assert se.normalize_answer("theatre") == "theatre"  # articles only as whole words


def test_v11_em_f1_multiple_gold():
    gold = {"a": ["Red dog", "the red dog barks"], "b": ["Paris"], "c": ["x"]}
    preds = {"a": "the big red dog", "b": "paris."}  # "c" unanswered -> 0
    # a: vs "red dog": p=2/3 r=1 -> 0.8; vs "red dog barks": p=2/3 r=2/3 -> 2/3; EM 0
    out = se.evaluate_v1(gold, preds)
    assert out["total"] == 3
    assert out["exact"] == pytest.approx(100 / 3)
    assert out["f1"] == pytest.approx(100 * (0.8 + 1.0 + 0) / 3)
    assert se.f1_v1("", "") == 0.0  # v1.1: no common tokens -> 0 even for two empties


def test_v20_no_answer_splits_and_thresholds():
    # has-answer is "the answers list is non-empty" (make_qid_to_has_ans); n2's only gold normalises to "",
    # so it counts as HasAns but is scored against "" (get_raw_scores)
    gold = {"h1": ["blue sky"], "h2": ["cat"], "n1": [], "n2": ["  the  "]}
    preds = {"h1": "blue", "h2": "cat", "n1": "", "n2": "dog"}
    out = se.evaluate_v2(gold, preds)
    # h1: EM 0, F1 p=1 r=1/2 -> 2/3; h2: 1, 1; n1: "" vs "" -> 1, 1; n2: "dog" vs "" -> 0, 0
    assert (out["total"], out["HasAns_total"], out["NoAns_total"]) == (4, 3, 1)
    assert out["exact"] == pytest.approx(50.0)
    assert out["f1"] == pytest.approx(100 * (2 / 3 + 1 + 1 + 0) / 4)
    assert out["HasAns_exact"] == pytest.approx(100 / 3) and out["NoAns_exact"] == pytest.approx(100.0)
    assert "best_f1" not in out
    # no-answer scores above the threshold predict "no answer": scores 1 iff the question has none
    na = {"h1": 0.1, "h2": 0.2, "n1": 0.9, "n2": 0.8}
    out = se.evaluate_v2(gold, {**preds, "n1": "something"}, na, na_prob_thresh=0.5)
    assert out["exact"] == pytest.approx(100 * (0 + 1 + 1 + 0) / 4)
    assert out["f1"] == pytest.approx(100 * (2 / 3 + 1 + 1 + 0) / 4)


def test_v20_best_threshold_hand_case():
    gold = {"h1": ["blue sky"], "h2": ["cat"], "n1": [], "n2": []}
    preds = {"h1": "blue", "h2": "dog", "n1": "", "n2": "dog"}
    na = {"h1": 0.1, "h2": 0.2, "n1": 0.9, "n2": 0.3}
    out = se.evaluate_v2(gold, preds, na)
    # cur starts at #NoAns = 2 (threshold below every score: all predicted no-answer).
    # h1 (0.1): +2/3 -> 2.667 (best, thresh 0.1); h2 (0.2): +0 -> 2.667; n2 (0.3): pred "dog" -> -1; n1: 0.
    assert out["best_f1"] == pytest.approx(100 * (2 + 2 / 3) / 4)
    assert out["best_f1_thresh"] == pytest.approx(0.1)
    # EM: h1 +0 (2, not > 2), h2 +0, n2 -1, n1 0 -> best stays 2 at thresh 0.0
    assert out["best_exact"] == pytest.approx(50.0) and out["best_exact_thresh"] == 0.0
    assert out["HasAns_total"] == 2 and out["NoAns_total"] == 2
