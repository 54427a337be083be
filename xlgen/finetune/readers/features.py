"""Model inputs for sequence-level tasks, in each model family's convention.

XLNet (`classifier_utils.py`, `run_race.py`):   [<pad>...] A <sep> [B <sep>] <cls>
    LEFT padding, `<cls>` last; segment ids A=0 (with its <sep>), B=1 (with its <sep>), CLS=2, PAD=4.
Funnel / BERT:                                  [CLS] A [SEP] [B [SEP]] [PAD]...
    right padding; token types CLS=2 (Funnel's `cls_token_type_id`), A=0, B=1, padding 0.

`attention_mask` is 1 on real tokens (HF convention; XLNet's `input_mask` = 1 - attention_mask).
Truncation as the originals: a pair drops pieces from the end of the longer text; a single text keeps its head;
RACE keeps the last `max_qa_length` pieces of question+option and the head of the article; XLNet puts the article
first (`article <sep> qa <sep> <cls>`, `run_race.py`), Funnel the question+option (`[CLS] qa [SEP] article [SEP]`,
Funnel `race.py`). Each option starts from a fresh copy of the article (the original `run_race.py` appends the
options onto one shared context list when the article needs no truncation, so later options carry the earlier ones).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from xlgen.finetune.readers.examples import ChoiceExample, TextExample

SEG_A, SEG_B, SEG_CLS, SEG_SEP, SEG_PAD = 0, 1, 2, 3, 4
INPUT_STYLES = ("cls_last", "cls_first")  # `Finetuning.input_style`: XLNet's layout, BERT's (Funnel)


def cls_last(tokenizer) -> bool:
    """Whether `tokenizer.style` (the model family's `input_style`) puts `<cls>` last (XLNet) or first (BERT)."""
    if tokenizer.style not in INPUT_STYLES:
        raise ValueError(
            f"task input style {tokenizer.style!r}: not one of {INPUT_STYLES} (a model family without "
            "`input_style` has no finetuning inputs)"
        )
    return tokenizer.style == "cls_last"


def truncate_pair(a: List[int], b: List[int], max_total: int) -> Tuple[List[int], List[int]]:
    """`_truncate_seq_pair`: pop from the end of the longer list until the pair fits."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_total:
        (a if len(a) > len(b) else b).pop()
    return a, b


def pack(
    tokenizer, ids_a: Sequence[int], ids_b: Optional[Sequence[int]], max_seq_length: int
) -> Tuple[List[int], List[int], List[int]]:
    """(input_ids, token_type_ids, attention_mask) of one already-truncated input, length `max_seq_length`."""
    ids_a = list(ids_a)
    if cls_last(tokenizer):
        body = ids_a + [tokenizer.sep_id]
        seg = [SEG_A] * (len(ids_a) + 1)
        if ids_b is not None:
            body += list(ids_b) + [tokenizer.sep_id]
            seg += [SEG_B] * (len(ids_b) + 1)
        body.append(tokenizer.cls_id)
        seg.append(SEG_CLS)
        pad = max_seq_length - len(body)
        if pad < 0:
            raise ValueError(f"input of {len(body)} pieces exceeds max_seq_length={max_seq_length}")
        return [tokenizer.pad_id] * pad + body, [SEG_PAD] * pad + seg, [0] * pad + [1] * len(body)
    body = [tokenizer.cls_id] + ids_a + [tokenizer.sep_id]
    seg = [SEG_CLS] + [0] * (len(ids_a) + 1)
    if ids_b is not None:
        body += list(ids_b) + [tokenizer.sep_id]
        seg += [1] * (len(ids_b) + 1)
    pad = max_seq_length - len(body)
    if pad < 0:
        raise ValueError(f"input of {len(body)} pieces exceeds max_seq_length={max_seq_length}")
    return body + [tokenizer.pad_id] * pad, seg + [0] * pad, [1] * len(body) + [0] * pad


def text_features(
    examples: Sequence[TextExample], tokenizer, *, max_seq_length: int, regression: bool = False
) -> Dict[str, np.ndarray]:
    """input_ids / token_type_ids / attention_mask [N, L] int32 and labels [N] (int32, float32 for regression;
    -1 / NaN for unlabelled test rows)."""
    ids, segs, masks, labels = [], [], [], []
    for ex in examples:
        a = tokenizer.encode(ex.text_a)
        if ex.text_b is not None:
            a, b = truncate_pair(a, tokenizer.encode(ex.text_b), max_seq_length - 3)
        else:
            a, b = a[: max_seq_length - 2], None
        i, s, m = pack(tokenizer, a, b, max_seq_length)
        ids.append(i), segs.append(s), masks.append(m)
        labels.append((np.nan if regression else -1) if ex.label is None else ex.label)
    L = max_seq_length
    return {
        "input_ids": np.asarray(ids, np.int32).reshape(-1, L),
        "token_type_ids": np.asarray(segs, np.int32).reshape(-1, L),
        "attention_mask": np.asarray(masks, np.int32).reshape(-1, L),
        "labels": np.asarray(labels, np.float32 if regression else np.int32),
    }


def choice_features(
    examples: Sequence[ChoiceExample], tokenizer, *, max_seq_length: int, max_qa_length: int = 128
) -> Dict[str, np.ndarray]:
    """RACE: input_ids / token_type_ids / attention_mask [N, num_options, L], labels [N] (-1 unlabelled),
    level [N] (0 = middle, 1 = high)."""
    out = {k: [] for k in ("input_ids", "token_type_ids", "attention_mask", "labels", "level")}
    for ex in examples:
        ctx = tokenizer.encode(ex.context)
        per = [[], [], []]
        for ending in ex.endings:
            qa = tokenizer.encode(ending)[-max_qa_length:]
            c = ctx[: max_seq_length - 3 - len(qa)]
            # XLNet run_race.py: article <sep> qa <sep> <cls>; Funnel race.py: [CLS] qa [SEP] article [SEP]
            first, second = (c, qa) if cls_last(tokenizer) else (qa, c)
            for lst, v in zip(per, pack(tokenizer, first, second, max_seq_length)):
                lst.append(v)
        for k, v in zip(("input_ids", "token_type_ids", "attention_mask"), per):
            out[k].append(v)
        out["labels"].append(-1 if ex.label is None else ex.label)
        out["level"].append(1 if ex.level == "high" else 0)
    n_opt = len(examples[0].endings) if examples else 4
    arrays = {
        k: np.asarray(out[k], np.int32).reshape(-1, n_opt, max_seq_length)
        for k in ("input_ids", "token_type_ids", "attention_mask")
    }
    arrays["labels"] = np.asarray(out["labels"], np.int32)
    arrays["level"] = np.asarray(out["level"], np.int32)
    return arrays
