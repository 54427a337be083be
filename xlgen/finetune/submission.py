"""GLUE submission files (the format gluebenchmark.com accepts): one `<Task>.tsv` per task with header
`index<TAB>prediction`, label strings for classification tasks, STS-B scores clipped to [0, 5]."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def glue_submission_text(labels: Sequence[str] | None, ids: Sequence[str], preds: np.ndarray) -> str:
    lines = ["index\tprediction"]
    for i, p in zip(ids, np.asarray(preds)):
        if labels is None:
            lines.append(f"{i}\t{float(np.clip(p, 0.0, 5.0)):.3f}")
        else:
            lines.append(f"{i}\t{labels[int(p)]}")
    return "\n".join(lines) + "\n"
