"""Answer decoding for SQuAD from per-window model outputs (XLNet `squad_utils.write_predictions`).

XLNet's beam head gives, per window, the top `start_n_top` start positions with log-probs and, for each of them,
the top `end_n_top` ends conditioned on that start, plus an answerability logit `cls_logits` (higher = more likely
unanswerable). A candidate (start, end) is kept when both are paragraph pieces, the start piece has its maximum
context in this window, end >= start and the span has at most `max_answer_length` pieces; its score is
`start_log_prob + end_log_prob`. The best candidate over all windows of a question is its answer text (the original
characters the pieces cover, stripped); the question's null score is the minimum `cls_logits` over its windows.

Heads that give plain `start_logits`/`end_logits` (Funnel, BERT-style) go through `logits_to_beam` first.
"""

from __future__ import annotations

import collections
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def logits_to_beam(
    start_logits: np.ndarray, end_logits: np.ndarray, p_mask: np.ndarray, *, start_n_top: int = 5, end_n_top: int = 5
) -> Dict[str, np.ndarray]:
    """Independent start/end logits [N, L] -> the beam format (end candidates do not depend on the start)."""
    big = 1e30
    slp = _log_softmax(np.where(p_mask > 0, -big, start_logits.astype(np.float64)))
    elp = _log_softmax(np.where(p_mask > 0, -big, end_logits.astype(np.float64)))
    s_idx = np.argsort(-slp, axis=-1, kind="stable")[:, :start_n_top]
    e_idx = np.argsort(-elp, axis=-1, kind="stable")[:, :end_n_top]
    return {
        "start_top_log_probs": np.take_along_axis(slp, s_idx, -1),
        "start_top_index": s_idx,
        "end_top_log_probs": np.tile(np.take_along_axis(elp, e_idx, -1), (1, start_n_top)),
        "end_top_index": np.tile(e_idx, (1, start_n_top)),
    }


def decode(
    examples: Sequence,
    features: Mapping[str, np.ndarray],
    outputs: Mapping[str, np.ndarray],
    *,
    start_n_top: int = 5,
    end_n_top: int = 5,
    max_answer_length: int = 64,
    n_best_size: int = 5,
) -> Tuple[Dict[str, str], Dict[str, float], Dict[str, List[dict]]]:
    """Returns (predictions qid -> best non-null text, null_odds qid -> null score, nbest qid -> candidates).

    `features`: example_index [N], tok_start_char / tok_end_char / max_context [N, L]. `outputs`: the beam arrays
    [N, start_n_top] / [N, start_n_top * end_n_top] and optionally cls_logits [N] (null score 0 without it)."""
    by_example = collections.defaultdict(list)
    for f, e in enumerate(np.asarray(features["example_index"])):
        by_example[int(e)].append(f)
    tsc, tec, mc = features["tok_start_char"], features["tok_end_char"], features["max_context"]
    slp, sidx = outputs["start_top_log_probs"], outputs["start_top_index"]
    elp, eidx = outputs["end_top_log_probs"], outputs["end_top_index"]
    cls = outputs.get("cls_logits")
    preds, null_odds, nbest = {}, {}, {}
    for ex_index, ex in enumerate(examples):
        cands, score_null = [], None
        for f in by_example.get(ex_index, []):
            if cls is not None:
                score_null = float(cls[f]) if score_null is None else min(score_null, float(cls[f]))
            for i in range(start_n_top):
                s = int(sidx[f, i])
                for j in range(end_n_top):
                    e = int(eidx[f, i * end_n_top + j])
                    if tsc[f, s] < 0 or tec[f, e] < 0 or not mc[f, s] or e < s or e - s + 1 > max_answer_length:
                        continue
                    cands.append((float(slp[f, i]) + float(elp[f, i * end_n_top + j]), f, s, e))
        cands.sort(key=lambda c: -c[0])
        seen, best = set(), []
        for score, f, s, e in cands:
            text = ex.context[int(tsc[f, s]) : int(tec[f, e])].strip()
            if text in seen:
                continue
            seen.add(text)
            best.append({"text": text, "score": score})
            if len(best) >= n_best_size:
                break
        preds[ex.qas_id] = best[0]["text"] if best else ""
        null_odds[ex.qas_id] = 0.0 if score_null is None else score_null
        nbest[ex.qas_id] = best
    return preds, null_odds, nbest


def apply_null_threshold(
    preds: Mapping[str, str], null_odds: Mapping[str, float], thresh: Optional[float]
) -> Dict[str, str]:
    """SQuAD 2.0 submission predictions: "" where the null score exceeds `thresh` (None = never)."""
    if thresh is None:
        return dict(preds)
    return {q: ("" if null_odds[q] > thresh else t) for q, t in preds.items()}
