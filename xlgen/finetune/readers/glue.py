"""GLUE readers for the official TSV files (`train.tsv`, `dev.tsv`, `test.tsv`; MNLI `dev_matched.tsv`,
`dev_mismatched.tsv`, `test_matched.tsv`, `test_mismatched.tsv`).

Columns are found by header name (CoLA's train/dev files have no header: source, label, original mark, sentence).
Fields are split on tabs with no quote processing, as the GLUE baseline does. A row with the wrong number of fields
or a label outside the task's label set raises `TaskDataError` naming the file and line, unless
`skip_malformed=True`, which skips such rows and reports how many (the official QQP train file has a few).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Dict, List, Optional, Tuple

from xlgen.finetune.readers.examples import TaskDataError, TextExample, read_task_text, where


@dataclasses.dataclass(frozen=True)
class GlueSpec:
    text_a: str  # header name of the first sentence
    text_b: Optional[str]  # second sentence, None for single-sentence tasks
    label: Optional[str]  # header name of the label ("@last" = last column)
    labels: Optional[Tuple[str, ...]]  # label strings in class-index order; None = regression
    test_id: str = "index"  # id column of test.tsv (used in the submission file)
    submission: str = ""  # submission file stem, e.g. "CoLA"
    splits: Tuple[Tuple[str, str], ...] = (("train", "train.tsv"), ("dev", "dev.tsv"), ("test", "test.tsv"))


_NLI3 = ("contradiction", "entailment", "neutral")
_RTE = ("entailment", "not_entailment")

GLUE_TASKS: Dict[str, GlueSpec] = {
    "cola": GlueSpec("sentence", None, "label", ("0", "1"), submission="CoLA"),
    "sst2": GlueSpec("sentence", None, "label", ("0", "1"), submission="SST-2"),
    "mrpc": GlueSpec("#1 String", "#2 String", "Quality", ("0", "1"), submission="MRPC"),
    "stsb": GlueSpec("sentence1", "sentence2", "score", None, submission="STS-B"),
    "qqp": GlueSpec("question1", "question2", "is_duplicate", ("0", "1"), test_id="id", submission="QQP"),
    "mnli": GlueSpec(
        "sentence1",
        "sentence2",
        "gold_label",
        _NLI3,
        submission="MNLI",
        splits=(
            ("train", "train.tsv"),
            ("dev", "dev_matched.tsv"),
            ("dev_mismatched", "dev_mismatched.tsv"),
            ("test", "test_matched.tsv"),
            ("test_mismatched", "test_mismatched.tsv"),
        ),
    ),
    "qnli": GlueSpec("question", "sentence", "label", _RTE, submission="QNLI"),
    "rte": GlueSpec("sentence1", "sentence2", "label", _RTE, submission="RTE"),
    "wnli": GlueSpec("sentence1", "sentence2", "label", ("0", "1"), submission="WNLI"),
    # Diagnostic set: predicted with an MNLI model, submitted as AX.tsv; test only.
    "ax": GlueSpec("sentence1", "sentence2", None, _NLI3, submission="AX", splits=(("test", "diagnostic.tsv"),)),
}

_COLA_NO_HEADER = ("source", "label", "mark", "sentence")


def glue_file(task: str, data_dir: str, split: str) -> str:
    spec = GLUE_TASKS[task]
    files = dict(spec.splits)
    if split not in files:
        raise ValueError(f"glue/{task}: unknown split {split!r}; available: {sorted(files)}")
    return os.path.join(data_dir, files[split])


def read_glue(task: str, data_dir: str, split: str, *, skip_malformed: bool = False) -> List[TextExample]:
    """Examples of `split` ("train", "dev", "test"; MNLI also "dev_mismatched", "test_mismatched")."""
    if task not in GLUE_TASKS:
        raise ValueError(f"unknown GLUE task {task!r}; known: {sorted(GLUE_TASKS)}")
    spec = GLUE_TASKS[task]
    path = glue_file(task, data_dir, split)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: missing (glue/{task} split {split!r})")
    lines = read_task_text(path, "utf-8-sig").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
    is_test = split.startswith("test")
    headerless = task == "cola" and not is_test
    if headerless:
        header, body, first_line = list(_COLA_NO_HEADER), lines, 1
    else:
        if not lines:
            raise TaskDataError(f"{where(path, 1)}: empty file (expected a header row)")
        header, body, first_line = lines[0].split("\t"), lines[1:], 2

    def col(name: Optional[str], required: bool = True) -> Optional[int]:
        if name is None:
            return None
        if name == "@last":
            return len(header) - 1
        if name in header:
            return header.index(name)
        if required:
            raise TaskDataError(f"{where(path, 1)}: header has no column {name!r} (glue/{task}); header: {header}")
        return None

    ia, ib = col(spec.text_a), col(spec.text_b)
    il = None if is_test else col(spec.label)
    iid = col(spec.test_id, required=False) if is_test else None
    examples, skipped = [], 0
    for k, line in enumerate(body):
        lineno = first_line + k
        fields = line.split("\t")
        try:
            if len(fields) != len(header):
                raise TaskDataError(
                    f"{where(path, lineno)}: expected {len(header)} tab-separated fields "
                    f"({'headerless CoLA layout' if headerless else 'as in the header'}), got {len(fields)}"
                )
            label = None
            if il is not None:
                raw = fields[il].strip()
                if spec.labels is None:
                    try:
                        label = float(raw)
                    except ValueError:
                        raise TaskDataError(
                            f"{where(path, lineno)}: score {raw!r} is not a number (glue/{task})"
                        ) from None
                else:
                    if raw not in spec.labels:
                        raise TaskDataError(
                            f"{where(path, lineno)}: label {raw!r} is not one of {list(spec.labels)} (glue/{task})"
                        )
                    label = spec.labels.index(raw)
        except TaskDataError:
            if not skip_malformed:
                raise
            skipped += 1
            continue
        guid = fields[iid] if iid is not None else f"{split}-{k}"
        examples.append(TextExample(guid, fields[ia], fields[ib] if ib is not None else None, label))
    if skipped:
        print(f"{path}: skipped {skipped} malformed rows (skip_malformed=True)")
    return examples
