"""Read finetuning tasks from prepared TFDS datasets without TensorFlow (`tfds.data_source`, ArrayRecord).

Use `data_dir="tfds:"` (default TFDS directory) or `data_dir="tfds:/path/to/tensorflow_datasets"`. The dataset must
have been prepared with `file_format="array_record"` (once, in an environment that can build it); nothing is
downloaded here (`download=False`). Records become the same examples as the official-file readers, with labels in
this project's label order (TFDS MNLI orders entailment/neutral/contradiction; GLUE files use the names).

    task          TFDS name                   splits (ours -> TFDS)
    glue/<t>      glue/<t> (sst2, cola, ...)  dev -> validation (MNLI: validation_matched / _mismatched)
    squad/v1.1    squad/v1.1                  dev -> validation
    squad/v2.0    squad/v2.0                  dev -> validation
    race[/lvl]    race/high + race/middle     dev -> dev
    imdb          imdb_reviews                dev -> test
    yelp2         yelp_polarity_reviews       dev -> test
    ag            ag_news_subset              dev -> test
"""

from __future__ import annotations

from typing import Any, List, Optional

from xlgen.finetune.readers.examples import ChoiceExample, SquadExample, TaskDataError, TextExample

TFDS_PREFIX = "tfds:"

# TFDS ClassLabel names per GLUE task, to map onto our label order (by name).
_TFDS_GLUE_NAMES = {
    "mnli": ("entailment", "neutral", "contradiction"),
    "ax": ("entailment", "neutral", "contradiction"),
    "qnli": ("entailment", "not_entailment"),
    "rte": ("entailment", "not_entailment"),
}
_GLUE_FIELDS = {
    "cola": ("sentence", None),
    "sst2": ("sentence", None),
    "mrpc": ("sentence1", "sentence2"),
    "stsb": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"),
    "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
    "ax": ("premise", "hypothesis"),
}
_CLS = {
    "imdb": ("imdb_reviews", ("text",)),
    "yelp2": ("yelp_polarity_reviews", ("text",)),
    "ag": ("ag_news_subset", ("title", "description")),
}


def _s(x) -> str:
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def _source(name: str, split: str, data_dir: Optional[str]):
    import tensorflow_datasets as tfds

    try:
        return tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
    except Exception as e:  # not prepared / not array_record: say what to do
        raise FileNotFoundError(
            f"tfds:{name} split {split!r} (data_dir={data_dir or 'default'}): cannot open a "
            f"prepared ArrayRecord dataset ({type(e).__name__}: {e}). Prepare it once with "
            f"tfds.builder({name!r}).download_and_prepare(file_format='array_record')."
        ) from e


def read_tfds(task_name: str, split: str, data_dir: str) -> List[Any]:
    """Examples of `task_name`/`split` from the TFDS directory in `data_dir` ("tfds:[DIR]")."""
    from xlgen.finetune.readers.glue import GLUE_TASKS

    root = data_dir[len(TFDS_PREFIX) :] if data_dir.startswith(TFDS_PREFIX) else data_dir
    if task_name.startswith("glue/"):
        t = task_name[5:]
        tsplit = {"dev": "validation", "dev_mismatched": "validation_mismatched", "test_mismatched": "test_mismatched"}
        tsplit = tsplit.get(split, split)
        if t == "mnli" and split in ("dev", "test"):
            tsplit += "_matched"
        src = _source(f"glue/{t}", tsplit, root)
        fa, fb = _GLUE_FIELDS[t]
        ours = GLUE_TASKS[t].labels
        theirs = _TFDS_GLUE_NAMES.get(t)
        out = []
        for i in range(len(src)):
            r = src[i]
            raw = r.get("label", -1)
            if ours is None:
                label = None if split.startswith("test") else float(raw)
            elif int(raw) < 0:
                label = None
            else:
                name = theirs[int(raw)] if theirs else ours[int(raw)]
                if name not in ours:
                    raise TaskDataError(f"tfds:glue/{t}[{tsplit}] record {i}: label {raw} outside the label set")
                label = ours.index(name)
            out.append(TextExample(str(int(r.get("idx", i))), _s(r[fa]), _s(r[fb]) if fb else None, label))
        return out
    if task_name.startswith("squad/"):
        src = _source(task_name, "validation" if split == "dev" else split, root)
        out = []
        for i in range(len(src)):
            r = src[i]
            ctx = _s(r["context"])
            texts = [_s(t) for t in r["answers"]["text"]]
            starts = [int(s) for s in r["answers"]["answer_start"]]
            for t, s in zip(texts, starts):
                if ctx[s : s + len(t)] != t:
                    raise TaskDataError(
                        f"tfds:{task_name}[{split}] record {i} (id {_s(r['id'])}): answer {t!r} "
                        f"is not at answer_start={s}"
                    )
            impossible = bool(r.get("is_impossible", not texts)) if task_name.endswith("v2.0") else False
            out.append(SquadExample(_s(r["id"]), _s(r["question"]), ctx, tuple(zip(texts, starts)), impossible))
        return out
    if task_name.startswith("race"):
        levels = (task_name.split("/")[1],) if "/" in task_name else ("middle", "high")
        out = []
        for level in levels:
            src = _source(f"race/{level}", split, root)
            for i in range(len(src)):
                r = src[i]
                for q, (question, options, answer) in enumerate(zip(r["questions"], r["options"], r["answers"])):
                    question, a = _s(question), _s(answer)
                    opts = [_s(o) for o in options]
                    endings = tuple(question.replace("_", o) if "_" in question else f"{question} {o}" for o in opts)
                    label = "ABCD".index(a) if a in ("A", "B", "C", "D") else None
                    out.append(
                        ChoiceExample(
                            f"{level}/{_s(r.get('example_id', i))}/{q}", _s(r["article"]), endings, label, level
                        )
                    )
        return out
    if task_name in _CLS:
        name, fields = _CLS[task_name]
        src = _source(name, "test" if split == "dev" else split, root)
        return [
            TextExample(
                f"{split}-{i}",
                " ".join(_s(src[i][f]) for f in fields).replace("<br />", " "),
                None,
                int(src[i]["label"]),
            )
            for i in range(len(src))
        ]
    raise ValueError(f"task {task_name!r} has no TFDS source; read its official files instead")
