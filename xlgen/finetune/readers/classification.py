"""Long-text classification readers (XLNet Table 4.3 / Funnel Table 5.x): IMDB, Yelp-2/5, DBpedia, AG News,
Amazon-2/5, from their usual releases.

* IMDB: the `aclImdb/` directory (`{train,test}/{pos,neg}/*.txt`; `<br />` becomes a space), labels neg=0, pos=1.
* Yelp, DBpedia, AG, Amazon: the Zhang et al. (2015) CSVs `train.csv` / `test.csv` — double-quoted fields,
  1-based class in the first column, then one or more text fields (title, body) joined by a space; the escaped
  `\\n` and `\\"` of those files are undone.

These datasets have no official dev split and the papers report test error, so split "dev" reads the test file.
"""

from __future__ import annotations

import csv
import glob
import io
import os
from typing import Dict, List

from xlgen.finetune.readers.examples import TaskDataError, TextExample, read_task_text, where

NUM_CLASSES: Dict[str, int] = {"imdb": 2, "yelp2": 2, "yelp5": 5, "dbpedia": 14, "ag": 4, "amazon2": 2, "amazon5": 5}

csv.field_size_limit(1 << 28)


def _clean(text: str) -> str:
    return text.replace("\\n", " ").replace('\\"', '"').replace("<br />", " ").strip()


def read_imdb(data_dir: str, split: str) -> List[TextExample]:
    split = "test" if split == "dev" else split
    root = os.path.join(data_dir, "aclImdb") if os.path.isdir(os.path.join(data_dir, "aclImdb")) else data_dir
    examples = []
    for label, name in enumerate(("neg", "pos")):
        d = os.path.join(root, split, name)
        if not os.path.isdir(d):
            raise FileNotFoundError(f"{d}: missing (imdb expects the aclImdb layout {{train,test}}/{{pos,neg}}/*.txt)")
        for path in sorted(glob.glob(os.path.join(d, "*.txt"))):
            text = read_task_text(path)
            examples.append(TextExample(f"{name}/{os.path.basename(path)}", _clean(text), None, label))
    return examples


def read_zhang_csv(task: str, data_dir: str, split: str) -> List[TextExample]:
    split = "test" if split == "dev" else split
    path = os.path.join(data_dir, f"{split}.csv")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: missing ({task} split {split!r})")
    k = NUM_CLASSES[task]
    examples = []
    reader = csv.reader(io.StringIO(read_task_text(path), newline=""))
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            raise TaskDataError(f"{where(path, reader.line_num)}: malformed CSV ({e})") from None
        line = reader.line_num
        if len(row) < 2:
            raise TaskDataError(
                f"{where(path, line)}: expected a label and at least one text field, got {len(row)} fields"
            )
        try:
            label = int(row[0]) - 1
        except ValueError:
            raise TaskDataError(f"{where(path, line)}: label {row[0]!r} is not an integer class 1..{k}") from None
        if not 0 <= label < k:
            raise TaskDataError(f"{where(path, line)}: label {row[0]!r} outside 1..{k} ({task})")
        text = " ".join(_clean(x) for x in row[1:] if x.strip())
        examples.append(TextExample(f"{split}-{len(examples)}", text, None, label))
    return examples


def read_classification(task: str, data_dir: str, split: str) -> List[TextExample]:
    if task not in NUM_CLASSES:
        raise ValueError(f"unknown text-classification task {task!r}; known: {sorted(NUM_CLASSES)}")
    return read_imdb(data_dir, split) if task == "imdb" else read_zhang_csv(task, data_dir, split)
