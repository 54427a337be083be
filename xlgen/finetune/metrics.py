"""Task metrics, computed by scikit-learn / SciPy (never re-derived by hand). Values are plain floats.

GLUE: CoLA `mcc`; SST-2, MNLI, QNLI, RTE, WNLI `accuracy`; MRPC and QQP `accuracy`, `f1` (positive class 1);
STS-B `pearson`, `spearman`. RACE: `accuracy` for `all`, `middle`, `high`.
"""

from __future__ import annotations

from typing import Dict, Sequence

import numpy as np
from scipy import stats
from sklearn import metrics as skm


def accuracy(labels, preds) -> float:
    return float(skm.accuracy_score(labels, preds))


def f1(labels, preds) -> float:
    return float(skm.f1_score(labels, preds, pos_label=1, average="binary", zero_division=0.0))


def mcc(labels, preds) -> float:
    return float(skm.matthews_corrcoef(labels, preds))


def pearson(labels, preds) -> float:
    return float(stats.pearsonr(np.asarray(labels, np.float64), np.asarray(preds, np.float64))[0])


def spearman(labels, preds) -> float:
    return float(stats.spearmanr(np.asarray(labels, np.float64), np.asarray(preds, np.float64))[0])


METRICS = {"accuracy": accuracy, "f1": f1, "mcc": mcc, "pearson": pearson, "spearman": spearman}


def compute(names: Sequence[str], labels, preds) -> Dict[str, float]:
    return {n: METRICS[n](labels, preds) for n in names}


def race_accuracy(labels, preds, level) -> Dict[str, float]:
    """RACE accuracy overall and per level (`level` 0 = middle, 1 = high); a level with no questions is omitted."""
    labels, preds, level = map(np.asarray, (labels, preds, level))
    out = {"accuracy": accuracy(labels, preds)}
    for name, code in (("middle", 0), ("high", 1)):
        sel = level == code
        if sel.any():
            out[f"accuracy_{name}"] = accuracy(labels[sel], preds[sel])
    out["accuracy_all"] = out["accuracy"]
    return out
