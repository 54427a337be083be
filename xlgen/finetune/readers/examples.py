"""Example records shared by every task reader, and the error type for malformed task files."""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple, Union


class TaskDataError(ValueError):
    """A task file is malformed. The message starts with `path:line:` (text files) or `path: record ...` (JSON)."""


def where(path: str, line: int | None = None, record: str | None = None) -> str:
    if line is not None:
        return f"{path}:{line}"
    if record is not None:
        return f"{path}: record {record}"
    return path


def read_task_text(path: str, encoding: str = "utf-8") -> str:
    """The text of a task file (`encoding` "utf-8" or "utf-8-sig", newlines as they are); bytes that are not UTF-8
    are a TaskDataError `path:LINE:COLUMN: not UTF-8 text (byte 0x..)`."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise TaskDataError(
            f"{path}:{line}:{column}: not UTF-8 text (byte 0x{data[e.start]:02x}); save the file as UTF-8"
        ) from None


def json_error(path: str, e) -> str:
    """`path:LINE:COLUMN: invalid JSON (...)` for a json.JSONDecodeError, saying when the file ends early."""
    size = len(e.doc or "")
    ends = e.pos >= len((e.doc or "").rstrip())
    more = f"; the file ends at character {size}: truncated?" if ends else ""
    return f"{path}:{e.lineno}:{e.colno}: invalid JSON ({e.msg} at line {e.lineno}, column {e.colno}, character {e.pos}{more})"


@dataclasses.dataclass(frozen=True)
class TextExample:
    """One (pair of) text(s) with a label: GLUE and long-text classification. `label` is an int class index,
    a float (regression) or None (unlabelled test split). `guid` is the id used in submission files."""

    guid: str
    text_a: str
    text_b: Optional[str]
    label: Union[int, float, None]


@dataclasses.dataclass(frozen=True)
class ChoiceExample:
    """RACE: one question with its options. `endings[k]` is the question completed with option k (the original's
    "_"-filling or "question option" concatenation)."""

    guid: str
    context: str
    endings: Tuple[str, ...]
    label: Optional[int]
    level: str  # "high" | "middle"


@dataclasses.dataclass(frozen=True)
class SquadExample:
    """One SQuAD question. `answers` are (text, char_start) into `context`; empty for unanswerable (v2.0) and for
    test files."""

    qas_id: str
    question: str
    context: str
    answers: Tuple[Tuple[str, int], ...]
    is_impossible: bool


@dataclasses.dataclass(frozen=True)
class TokenExample:
    """One sentence of a token-classification task (CoNLL-2003 NER): its words and their BIO tags (None for
    unlabelled text)."""

    guid: str
    words: Tuple[str, ...]
    tags: Optional[Tuple[str, ...]]


Example = Union[TextExample, ChoiceExample, SquadExample, TokenExample]
Examples = List[Example]
