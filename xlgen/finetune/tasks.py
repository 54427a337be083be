"""Finetuning task registry: what each task reads, predicts and is scored by.

Names: `glue/{cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte,wnli}`, `squad/v1.1`, `squad/v2.0`, `race` (also `race/high`,
`race/middle` to train/evaluate one level), and the long-text classification tasks `imdb`, `yelp2`, `yelp5`,
`dbpedia`, `ag`, `amazon2`, `amazon5` (also accepted with a `classification/` prefix), and CoNLL-2003 NER
`conll2003` (token classification, entity-level precision / recall / F1 by seqeval).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Tuple

from xlgen.finetune.readers import classification as _cls
from xlgen.finetune.readers import conll as _conll
from xlgen.finetune.readers import glue as _glue
from xlgen.finetune.readers import race as _race
from xlgen.finetune.readers import squad as _squad


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    kind: str  # "classification" | "regression" | "squad" | "multiple_choice" | "token_classification"
    num_labels: int  # classes (1 for regression / span tasks, options for RACE)
    label_names: Optional[Tuple[str, ...]]  # strings written to submission files
    metrics: Tuple[str, ...]  # metric names reported on dev
    primary_metric: str  # selects the best checkpoint (higher is better)
    eval_splits: Tuple[str, ...] = ("dev",)
    test_splits: Tuple[str, ...] = ("test",)
    submission: str = ""  # GLUE submission stem
    version: str = ""  # SQuAD version

    def read(self, data_dir: str, split: str, *, skip_malformed: bool = False):
        """Examples of `split` from the official files in `data_dir`, or from a prepared TFDS dataset when
        `data_dir` is "tfds:[TFDS_DIR]" (`xlgen.finetune.readers.tfds_source`)."""
        if data_dir.startswith("tfds:"):
            from xlgen.finetune.readers.tfds_source import read_tfds

            return read_tfds(self.name, split, data_dir)
        if self.name.startswith("glue/"):
            return _glue.read_glue(self.name[5:], data_dir, split, skip_malformed=skip_malformed)
        if self.kind == "squad":
            names = {
                "train": f"train-{self.version}.json",
                "dev": f"dev-{self.version}.json",
                "test": f"test-{self.version}.json",
            }
            path = os.path.join(data_dir, names.get(split, split))
            return _squad.read_squad(path, version=self.version, require_answers=split in ("train", "dev"))
        if self.kind == "token_classification":
            return _conll.read_conll(_conll.conll_file(data_dir, split))
        if self.kind == "multiple_choice":
            levels = (self.name.split("/")[1],) if "/" in self.name else _race.LEVELS
            return _race.read_race(data_dir, split, levels)
        return _cls.read_classification(self.name, data_dir, split)


def _glue_task(name: str) -> Task:
    spec = _glue.GLUE_TASKS[name]
    metrics = {
        "cola": ("mcc",),
        "mrpc": ("accuracy", "f1"),
        "qqp": ("accuracy", "f1"),
        "stsb": ("pearson", "spearman"),
    }.get(name, ("accuracy",))
    primary = {"cola": "mcc", "stsb": "pearson"}.get(name, "accuracy")
    eval_splits = ("dev", "dev_mismatched") if name == "mnli" else ("dev",)
    test_splits = ("test", "test_mismatched") if name == "mnli" else ("test",)
    return Task(
        f"glue/{name}",
        "regression" if spec.labels is None else "classification",
        1 if spec.labels is None else len(spec.labels),
        spec.labels,
        metrics,
        primary,
        eval_splits,
        test_splits,
        submission=spec.submission,
    )


TASKS = {f"glue/{n}": _glue_task(n) for n in _glue.GLUE_TASKS if n != "ax"}
for _v in ("v1.1", "v2.0"):
    # v2.0 "f1" is the F1 of predictions.json under the best realisable null threshold (see xlgen.finetune)
    TASKS[f"squad/{_v}"] = Task(f"squad/{_v}", "squad", 1, None, ("exact", "f1"), "f1", test_splits=(), version=_v)
for _n in ("race", "race/high", "race/middle"):
    TASKS[_n] = Task(_n, "multiple_choice", 4, ("A", "B", "C", "D"), ("accuracy",), "accuracy")
for _n, _k in _cls.NUM_CLASSES.items():
    TASKS[_n] = Task(
        _n, "classification", _k, tuple(str(i + 1) for i in range(_k)), ("accuracy",), "accuracy", test_splits=()
    )
# BIO tags of CoNLL-2003's four entity types (the IOB1 files are converted on reading)
CONLL2003_TAGS = ("O",) + tuple(f"{p}-{t}" for t in ("PER", "ORG", "LOC", "MISC") for p in ("B", "I"))
TASKS["conll2003"] = Task(
    "conll2003", "token_classification", len(CONLL2003_TAGS), CONLL2003_TAGS, ("precision", "recall", "f1"), "f1"
)


def get_task(name: str) -> Task:
    key = name[len("classification/") :] if name.startswith("classification/") else name
    if key not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    return TASKS[key]
