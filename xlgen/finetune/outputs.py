"""Output files of a finetune workdir (temp file + rename): `eval_results.json`, GLUE `dev_predictions*.tsv` and
submission TSVs (`submission/<Task>.tsv`), SQuAD `predictions.json`, `null_odds.json`, `nbest_predictions.json`,
CoNLL `predictions.txt` (word, gold and predicted tag per line)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from data_pipelines import paths
from xlgen.finetune.data import split_examples_and_features

EVAL_RESULTS = "eval_results.json"


def _write_text(path: str, text: str) -> None:

    paths.atomic_write_text(path, text)


def _write_json(path: str, obj: Any) -> None:
    _write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _write_tsv(path: str, header: List[str], rows: List[List[Any]]) -> None:
    _write_text(path, "\n".join(["\t".join(header)] + ["\t".join(str(x) for x in r) for r in rows]) + "\n")


def write_artefacts(workdir: str, results: Dict[str, Any], artefacts: Dict[str, Any]) -> None:

    for name, a in artefacts.items():
        path = paths.join(workdir, name)
        if name.endswith(".json"):
            _write_json(path, a)
        elif isinstance(a, str):  # a text file as it is (CoNLL predictions.txt)
            _write_text(path, a)
        else:
            _write_tsv(path, *a)
    _write_json(paths.join(workdir, EVAL_RESULTS), results)


def write_test_predictions(config, predictor, params, tokenizer, workdir: str) -> List[str]:
    """GLUE submission files from the test split(s), when the test files exist."""
    from xlgen.finetune.submission import glue_submission_text
    from xlgen.finetune.tasks import get_task

    task = get_task(config.task)
    written = []
    if not task.name.startswith("glue/"):
        return written
    from xlgen.finetune.readers.glue import glue_file

    for split in task.test_splits:
        if not os.path.exists(glue_file(task.name[5:], config.data_dir, split)):
            continue
        examples, feats = split_examples_and_features(config, tokenizer, split, workdir)
        out = predictor(params, feats)
        preds = out["logits"][:, 0] if task.kind == "regression" else out["logits"].argmax(-1)
        stem = task.submission
        if task.name == "glue/mnli":
            stem = "MNLI-mm" if split == "test_mismatched" else "MNLI-m"
        path = paths.join(workdir, "submission", f"{stem}.tsv")
        paths.makedirs(paths.as_path(path).parent)
        _write_text(path, glue_submission_text(task.label_names, [e.guid for e in examples], preds))
        written.append(path)
    return written
