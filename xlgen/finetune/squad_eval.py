"""SQuAD evaluation with the official scripts' semantics.

v1.1 (`evaluate-v1.1.py`): answers normalised (lower-case, punctuation and articles a/an/the removed, whitespace
collapsed); EM and token F1 maximised over the gold answers; unanswered questions score 0; result
`{"exact": 100*EM, "f1": 100*F1, "total": n}` (the script calls EM `exact_match`).
v2.0 (`evaluate-v2.0.py`): gold answers that normalise to "" are dropped, no gold left means the gold is "";
F1 of two empty token lists is 1, of one empty list 0; a question is predicted unanswerable when its no-answer
score exceeds `na_prob_thresh` (then it scores 1 iff it has no answer); the result has `exact`, `f1`, `total`,
`HasAns_*`, `NoAns_*` and, given no-answer scores, `best_exact`, `best_exact_thresh`, `best_f1`, `best_f1_thresh`
(thresholds swept over the sorted scores, exactly as `find_best_thresh`).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Dict, List, Mapping, Optional

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _tokens(s: str) -> List[str]:
    return normalize_answer(s).split() if s else []


def exact_v1(pred: str, gold: str) -> float:
    return float(normalize_answer(pred) == normalize_answer(gold))


def f1_v1(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    same = sum((collections.Counter(p) & collections.Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def exact_v2(gold: str, pred: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(pred))


def f1_v2(gold: str, pred: str) -> float:
    g, p = _tokens(gold), _tokens(pred)
    if not g or not p:
        return float(g == p)
    same = sum((collections.Counter(g) & collections.Counter(p)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def evaluate_v1(gold: Mapping[str, List[str]], preds: Mapping[str, str]) -> Dict[str, float]:
    """`gold`: qid -> list of answer texts; `preds`: qid -> text."""
    em = f1 = 0.0
    for qid, answers in gold.items():
        if qid not in preds:
            continue
        em += max(exact_v1(preds[qid], a) for a in answers)
        f1 += max(f1_v1(preds[qid], a) for a in answers)
    n = len(gold)
    return {"exact": 100.0 * em / n, "f1": 100.0 * f1 / n, "total": n}


def _find_best_thresh(preds, scores, na_probs, has_ans, initial_thresh: float = 0.0):
    """The official sweep. Its starting point (score = #NoAns) means "every question predicted unanswerable",
    which the script reports as threshold 0.0; `initial_thresh=-inf` returns a threshold that reproduces it."""
    num_no_ans = sum(1 for k in has_ans if not has_ans[k])
    cur = best = num_no_ans
    best_thresh = initial_thresh
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if preds.get(qid) else 0
        cur += diff
        if cur > best:
            best, best_thresh = cur, na_probs[qid]
    return 100.0 * best / len(scores), best_thresh


def evaluate_v2(
    gold: Mapping[str, List[str]],
    preds: Mapping[str, str],
    na_probs: Optional[Mapping[str, float]] = None,
    na_prob_thresh: float = 1.0,
) -> Dict[str, float]:
    """`gold`: qid -> list of answer texts (empty for unanswerable); `preds`: qid -> text ("" = no answer);
    `na_probs`: qid -> no-answer score (defaults to 0 for every question, as the script does)."""
    has_ans = {qid: bool(answers) for qid, answers in gold.items()}
    exact_raw, f1_raw = {}, {}
    for qid, answers in gold.items():
        golds = [a for a in answers if normalize_answer(a)] or [""]
        if qid not in preds:  # the official script skips it and then fails in the HasAns/NoAns split; we score 0
            exact_raw[qid], f1_raw[qid] = 0, 0.0
            continue
        exact_raw[qid] = max(exact_v2(a, preds[qid]) for a in golds)
        f1_raw[qid] = max(f1_v2(a, preds[qid]) for a in golds)
    probs = dict(na_probs) if na_probs is not None else {k: 0.0 for k in preds}

    def thresholded(raw):
        return {qid: float(not has_ans[qid]) if probs.get(qid, 0.0) > na_prob_thresh else s for qid, s in raw.items()}

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)

    def block(qids):
        n = len(qids)
        return {
            "exact": 100.0 * sum(exact[k] for k in qids) / n,
            "f1": 100.0 * sum(f1[k] for k in qids) / n,
            "total": n,
        }

    out = block(list(gold))
    for name, sel in (("HasAns", True), ("NoAns", False)):
        qids = [k for k in gold if has_ans[k] == sel]
        if qids:
            out.update({f"{name}_{k}": v for k, v in block(qids).items()})
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = _find_best_thresh(preds, exact_raw, probs, has_ans)
        out["best_f1"], out["best_f1_thresh"] = _find_best_thresh(preds, f1_raw, probs, has_ans)
    return out


def best_f1_null_threshold(
    gold: Mapping[str, List[str]], preds: Mapping[str, str], na_probs: Mapping[str, float]
) -> float:
    """The no-answer threshold maximising the F1 actually obtained by `preds` with "" where na_prob > threshold.

    Same sweep as the official `find_best_thresh`, but over groups of equal scores: the official sweep may stop
    inside a group of tied no-answer scores, which no threshold can realise, so its `best_f1` is an upper bound
    that this threshold reaches exactly when there are no ties. -inf = abstain everywhere."""
    has_ans = {qid: bool(answers) for qid, answers in gold.items()}
    cur = best = float(sum(1 for k in has_ans if not has_ans[k]))
    best_thresh = float("-inf")
    qids = sorted((q for q in gold), key=lambda q: na_probs.get(q, 0.0))
    i = 0
    while i < len(qids):
        value = na_probs.get(qids[i], 0.0)
        while i < len(qids) and na_probs.get(qids[i], 0.0) == value:
            q = qids[i]
            golds = [a for a in gold[q] if normalize_answer(a)] or [""]
            if has_ans[q]:
                cur += max(f1_v2(a, preds.get(q, "")) for a in golds)
            elif preds.get(q):
                cur -= 1
            i += 1
        if cur > best:
            best, best_thresh = cur, value
    return best_thresh
