"""RACE reader for the official layout `{train,dev,test}/{high,middle}/*.txt`, one JSON object per file with
`article`, `questions`, `options` (4 per question), `answers` ("A".."D") and `id`.

Each question becomes a `ChoiceExample` whose endings are the question completed with each option: the blank "_"
is filled with the option when present, otherwise "question option" (as `run_race.py`).
"""

from __future__ import annotations

import glob
import json
import os
from typing import List, Sequence

from xlgen.finetune.readers.examples import ChoiceExample, TaskDataError, json_error, read_task_text, where

LEVELS = ("middle", "high")
NUM_OPTIONS = 4


def read_race(data_dir: str, split: str, levels: Sequence[str] = LEVELS) -> List[ChoiceExample]:
    examples = []
    for level in levels:
        d = os.path.join(data_dir, split, level)
        if not os.path.isdir(d):
            raise FileNotFoundError(f"{d}: missing (RACE expects {{train,dev,test}}/{{high,middle}}/*.txt)")
        for path in sorted(glob.glob(os.path.join(d, "*.txt"))):
            try:
                doc = json.loads(read_task_text(path))
            except json.JSONDecodeError as e:
                raise TaskDataError(json_error(path, e)) from None
            for key in ("article", "questions", "options", "answers"):
                if key not in doc:
                    raise TaskDataError(f"{path}: missing key {key!r}")
            qs, opts, ans = doc["questions"], doc["options"], doc["answers"]
            if not (len(qs) == len(opts) == len(ans)):
                raise TaskDataError(
                    f"{path}: {len(qs)} questions, {len(opts)} option lists and {len(ans)} answers (must be equal)"
                )
            base = doc.get("id", os.path.basename(path))
            for i, (q, options, a) in enumerate(zip(qs, opts, ans)):
                rec = where(path, record=f"questions[{i}]")
                if len(options) != NUM_OPTIONS:
                    raise TaskDataError(f"{rec}: {len(options)} options (RACE has {NUM_OPTIONS})")
                if a is None or a == "":
                    label = None  # unlabelled test copies
                elif a not in "ABCD" or len(a) != 1:
                    raise TaskDataError(f"{rec}: answer {a!r} is not one of A, B, C, D")
                else:
                    label = "ABCD".index(a)
                endings = tuple(q.replace("_", o) if "_" in q else f"{q} {o}" for o in options)
                examples.append(ChoiceExample(f"{level}/{base}/{i}", doc["article"], endings, label, level))
    return examples
