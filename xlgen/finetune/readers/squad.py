"""SQuAD 1.1 / 2.0: reader of the official JSON and XLNet-style feature creation.

Feature layout (XLNet, `squad_utils.py`; P before Q because in pretraining B is the shorter segment):

    [<pad> ...] P-window <sep> Q <sep> <cls>        (style "cls_last": LEFT padding, <cls> last)
    [<cls>] Q [<sep>] P-window [<sep>] [<pad> ...]  (style "cls_first": BERT layout, right padding)

* pieces with exact character offsets (`encode_with_offsets`, `data_pipelines.vocab`), question truncated to `max_query_length` pieces,
  windows of at most `max_seq_length - |Q| - 3` paragraph pieces every `doc_stride` pieces;
* segment ids (xlnet): P and its <sep> 0, Q and its <sep> 1, <cls> 2, padding 4 (A=0 B=1 CLS=2 SEP=3 PAD=4);
  left padding instead of the original's right padding + `cls_index` is equivalent for a relative-position model
  with padding masked, and keeps `<cls>` at the last position for every task;
* `p_mask` = 1 where an answer may NOT start/end (question, separators, padding), 0 on paragraph pieces and <cls>;
* training targets: the piece span covering the answer characters; windows that do not contain the whole answer,
  and unanswerable questions, point both ends at <cls> with `is_impossible` = 1;
* host-side metadata for decoding: per position the original character span of the piece (-1 off-paragraph) and
  whether this window is the piece's max-context window (BERT/XLNet `_check_is_max_context`).
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Sequence, Tuple

import numpy as np

from xlgen.finetune.readers.examples import SquadExample, TaskDataError, json_error, read_task_text, where
from xlgen.finetune.readers.features import cls_last

SEG_P, SEG_Q, SEG_CLS, SEG_PAD = 0, 1, 2, 4


def cover_span(starts: Sequence[int], ends: Sequence[int], char_start: int, char_end: int) -> Tuple[int, int]:
    """Smallest piece span [i, j] (inclusive) whose characters cover [char_start, char_end). Pieces of zero width
    are never chosen as span ends. Raises ValueError if no piece overlaps the span."""
    i = next((k for k in range(len(starts)) if ends[k] > char_start and ends[k] > starts[k]), None)
    j = next((k for k in range(len(starts) - 1, -1, -1) if starts[k] < char_end and ends[k] > starts[k]), None)
    if i is None or j is None or j < i:
        raise ValueError(f"no piece covers characters [{char_start}, {char_end})")
    return i, j


def read_squad(path: str, *, version: str, require_answers: bool) -> List[SquadExample]:
    """Examples from an official SQuAD JSON file. `require_answers`: every answerable question must have at least
    one answer whose `answer_start` indexes its text in the context (train and dev files)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: missing (SQuAD {version})")
    try:
        doc = json.loads(read_task_text(path))
    except json.JSONDecodeError as e:
        raise TaskDataError(json_error(path, e)) from None
    if not isinstance(doc, dict) or "data" not in doc:
        raise TaskDataError(f"{path}: no top-level 'data' list (not a SQuAD file)")
    examples = []
    for a, article in enumerate(doc["data"]):
        for p, para in enumerate(article.get("paragraphs", [])):
            rec = f"data[{a}].paragraphs[{p}]"
            if "context" not in para or "qas" not in para:
                raise TaskDataError(f"{where(path, record=rec)}: missing 'context' or 'qas'")
            context = para["context"]
            for q, qa in enumerate(para["qas"]):
                qrec = f"{rec}.qas[{q}] (id {qa.get('id', '?')})"
                for key in ("id", "question"):
                    if key not in qa:
                        raise TaskDataError(f"{where(path, record=qrec)}: missing {key!r}")
                impossible = bool(qa.get("is_impossible", False))
                if impossible and version == "v1.1":
                    raise TaskDataError(f"{where(path, record=qrec)}: is_impossible in a SQuAD v1.1 task")
                answers = []
                for ans in [] if impossible else qa.get("answers", []):
                    text, start = ans.get("text"), ans.get("answer_start")
                    if not isinstance(text, str) or not isinstance(start, int):
                        raise TaskDataError(
                            f"{where(path, record=qrec)}: answer needs 'text' (str) and 'answer_start' (int)"
                        )
                    if context[start : start + len(text)] != text:
                        raise TaskDataError(
                            f"{where(path, record=qrec)}: answer {text!r} is not at answer_start={start} "
                            f"(context has {context[start : start + len(text)]!r})"
                        )
                    answers.append((text, start))
                if require_answers and not impossible and not answers:
                    raise TaskDataError(f"{where(path, record=qrec)}: answerable question without answers")
                examples.append(SquadExample(qa["id"], qa["question"], context, tuple(answers), impossible))
    return examples


def _max_context(spans: List[Tuple[int, int]], span_index: int, pos: int) -> bool:
    """Whether window `span_index` gives piece `pos` the most context (min(left, right) + 0.01 * length)."""
    best, best_index = None, None
    for k, (start, length) in enumerate(spans):
        end = start + length - 1
        if pos < start or pos > end:
            continue
        score = min(pos - start, end - pos) + 0.01 * length
        if best is None or score > best:
            best, best_index = score, k
    return best_index == span_index


def squad_features(
    examples: List[SquadExample],
    tokenizer,
    *,
    max_seq_length: int = 512,
    doc_stride: int = 128,
    max_query_length: int = 64,
    is_training: bool,
) -> Dict[str, np.ndarray]:
    """Windows of every example. Model inputs: input_ids, token_type_ids, attention_mask (1 = real), p_mask,
    cls_index, start_positions, end_positions, is_impossible. Metadata: example_index, tok_start_char,
    tok_end_char (original character span of each position, -1 off-paragraph), tok_doc_index (piece index in the
    paragraph, -1 off-paragraph), max_context."""
    xlnet_layout = cls_last(tokenizer)
    L = max_seq_length
    out: Dict[str, list] = {
        k: []
        for k in (
            "input_ids",
            "token_type_ids",
            "attention_mask",
            "p_mask",
            "cls_index",
            "start_positions",
            "end_positions",
            "is_impossible",
            "example_index",
            "tok_start_char",
            "tok_end_char",
            "tok_doc_index",
            "max_context",
        )
    }
    for ex_index, ex in enumerate(examples):
        q_ids = tokenizer.encode(ex.question)[:max_query_length]
        d_ids, d_starts, d_ends = tokenizer.encode_with_offsets(ex.context)
        max_doc = L - len(q_ids) - 3
        if max_doc <= 0:
            raise ValueError(f"max_seq_length={L} leaves no room for the paragraph after a {len(q_ids)}-piece question")
        spans, start = [], 0
        while start < len(d_ids) or not spans:
            length = min(len(d_ids) - start, max_doc)
            spans.append((start, length))
            if start + length >= len(d_ids):
                break
            start += min(length, doc_stride)
        tok_answer = None
        if is_training and not ex.is_impossible and ex.answers:
            text, char_start = ex.answers[0]
            tok_answer = cover_span(d_starts, d_ends, char_start, char_start + len(text))
        for span_index, (s0, n) in enumerate(spans):
            window = list(range(s0, s0 + n))
            if xlnet_layout:
                body = [d_ids[i] for i in window] + [tokenizer.sep_id] + q_ids + [tokenizer.sep_id, tokenizer.cls_id]
                seg = [SEG_P] * (n + 1) + [SEG_Q] * (len(q_ids) + 1) + [SEG_CLS]
                pad = L - len(body)
                p_off, cls_pos = pad, L - 1
                ids = [tokenizer.pad_id] * pad + body
                seg = [SEG_PAD] * pad + seg
                mask = [0] * pad + [1] * len(body)
            else:  # funnel / BERT layout
                body = [tokenizer.cls_id] + q_ids + [tokenizer.sep_id] + [d_ids[i] for i in window] + [tokenizer.sep_id]
                seg = [SEG_CLS] + [0] * (len(q_ids) + 1) + [1] * (n + 1)
                pad = L - len(body)
                p_off, cls_pos = len(q_ids) + 2, 0
                ids = body + [tokenizer.pad_id] * pad
                seg = seg + [0] * pad
                mask = [1] * len(body) + [0] * pad
            p_mask = np.ones(L, np.float32)
            p_mask[p_off : p_off + n] = 0
            p_mask[cls_pos] = 0
            tsc = np.full(L, -1, np.int32)
            tec = np.full(L, -1, np.int32)
            mc = np.zeros(L, bool)
            tdi = np.full(L, -1, np.int32)
            tdi[p_off : p_off + n] = window
            tsc[p_off : p_off + n] = [d_starts[i] for i in window]
            tec[p_off : p_off + n] = [d_ends[i] for i in window]
            mc[p_off : p_off + n] = [_max_context(spans, span_index, i) for i in window]
            impossible = True
            sp = ep = cls_pos
            if tok_answer is not None and s0 <= tok_answer[0] and tok_answer[1] < s0 + n:
                impossible = False
                sp, ep = tok_answer[0] - s0 + p_off, tok_answer[1] - s0 + p_off
            for k, v in (
                ("input_ids", ids),
                ("token_type_ids", seg),
                ("attention_mask", mask),
                ("p_mask", p_mask),
                ("cls_index", cls_pos),
                ("start_positions", sp),
                ("end_positions", ep),
                ("is_impossible", float(impossible)),
                ("example_index", ex_index),
                ("tok_start_char", tsc),
                ("tok_end_char", tec),
                ("tok_doc_index", tdi),
                ("max_context", mc),
            ):
                out[k].append(v)
    dtypes = {"p_mask": np.float32, "is_impossible": np.float32, "max_context": bool}
    return {k: np.asarray(v, dtype=dtypes.get(k, np.int32)) for k, v in out.items()}
