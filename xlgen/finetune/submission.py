"""GLUE submission files (the format gluebenchmark.com accepts): one `<Task>.tsv` per task with header
`index<TAB>prediction`, label strings for classification tasks, STS-B scores clipped to [0, 5]."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from data_pipelines.paths import atomic_write_text


def glue_submission_text(labels: Sequence[str] | None, ids: Sequence[str], preds: np.ndarray) -> str:
    lines = ["index\tprediction"]
    for i, p in zip(ids, np.asarray(preds)):
        if labels is None:
            lines.append(f"{i}\t{float(np.clip(p, 0.0, 5.0)):.3f}")
        else:
            lines.append(f"{i}\t{labels[int(p)]}")
    return "\n".join(lines) + "\n"


def write_glue_submission(path: str, labels: Sequence[str] | None, ids: Sequence[str], preds: np.ndarray) -> str:
    atomic_write_text(path, glue_submission_text(labels, ids, preds))
    return path
