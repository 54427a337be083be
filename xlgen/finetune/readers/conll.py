"""CoNLL-2003 NER files and their model inputs.

File format (`DIR/{train,valid|dev,test}.txt`): one token per line, columns separated by white space, the NER tag
last (`EU NNP B-NP B-ORG`); sentences separated by blank lines; `-DOCSTART-` lines separate documents. Tags in
IOB1 (the original release: `I-` opens an entity unless it continues one of the same type; `B-` only between two
adjacent entities of one type) are converted to BIO (IOB2), which seqeval's strict entity definition scores.

Inputs (`token_features`): each word is tokenized on its own; its first piece carries the word's label and the other
pieces are ignored (`label_mask` 0), as in Hugging Face's token-classification examples. The layout is the model
family's (`features.pack`: XLNet `[<pad>...] words <sep> <cls>`, Funnel `[CLS] words [SEP] [<pad>...]`); a sentence
longer than `max_seq_length - 2` pieces keeps its head, and the words cut off are predicted "O".
"""

from __future__ import annotations

import os
from typing import Dict, List, Sequence, Tuple

import numpy as np

from xlgen.finetune.readers.examples import TaskDataError, TokenExample, read_task_text, where
from xlgen.finetune.readers.features import cls_last, pack

SPLIT_FILES = {"train": ("train.txt",), "dev": ("valid.txt", "dev.txt", "testa.txt"), "test": ("test.txt", "testb.txt")}


def conll_file(data_dir: str, split: str) -> str:
    """The file of `split` in `data_dir` (`valid.txt` or `dev.txt` for dev); FileNotFoundError naming the options."""
    for name in SPLIT_FILES[split]:
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{data_dir}: no {' or '.join(SPLIT_FILES[split])} for the {split} split")


def iob1_to_bio(tags: Sequence[str]) -> Tuple[str, ...]:
    """IOB1 -> BIO: an `I-X` that does not continue an `X` entity opens one (`B-X`)."""
    out = []
    prev = "O"
    for t in tags:
        if t.startswith("I-") and (prev == "O" or prev[2:] != t[2:]):
            t = "B-" + t[2:]
        out.append(t)
        prev = t
    return tuple(out)


def read_conll(path: str) -> List[TokenExample]:
    """Sentences of a CoNLL file, tags converted to BIO; a malformed line is a `TaskDataError` naming it."""
    sentences: List[List[Tuple[str, str]]] = [[]]
    for n, line in enumerate(read_task_text(path).splitlines(), 1):
        cols = line.split()
        if not cols or cols[0] == "-DOCSTART-":
            if sentences[-1]:
                sentences.append([])
            continue
        if len(cols) < 2:
            raise TaskDataError(f"{where(path, n)}: expected 'word ... TAG' (at least two columns), got {line!r}")
        tag = cols[-1]
        if tag != "O" and not (tag[:2] in ("B-", "I-") and len(tag) > 2):
            raise TaskDataError(f"{where(path, n)}: tag {tag!r} is neither O nor B-TYPE / I-TYPE")
        sentences[-1].append((cols[0], tag))
    stem = os.path.splitext(os.path.basename(path))[0]
    return [
        TokenExample(f"{stem}-{i}", tuple(w for w, _ in s), iob1_to_bio([t for _, t in s]))
        for i, s in enumerate(x for x in sentences if x)
    ]


def token_features(
    examples: Sequence[TokenExample], tokenizer, labels: Sequence[str], *, max_seq_length: int
) -> Dict[str, np.ndarray]:
    """input_ids / token_type_ids / attention_mask / labels / word_index [N, L] int32 and label_mask [N, L] float32:
    `labels[i, p]` the tag id of the word whose first piece sits at p (0 elsewhere), `label_mask` 1 there,
    `word_index[i, p]` that word's index in the sentence (-1 elsewhere). Unknown tags are an error."""
    tag_id = {t: i for i, t in enumerate(labels)}
    L = max_seq_length
    out = {k: [] for k in ("input_ids", "token_type_ids", "attention_mask", "labels", "label_mask", "word_index")}
    for ex in examples:
        pieces, first = [], []
        for w, word in enumerate(ex.words):
            ids = tokenizer.encode(word)
            if not ids:  # no pieces (cannot happen for non-blank words): predicted "O"
                continue
            if len(pieces) + len(ids) > L - 2:
                break
            first.append((len(pieces), w))
            pieces.extend(ids)
        i, s, m = pack(tokenizer, pieces, None, L)
        offset = L - (len(pieces) + 2) if cls_last(tokenizer) else 1  # where piece 0 sits
        lab, mask, widx = np.zeros(L, np.int32), np.zeros(L, np.float32), np.full(L, -1, np.int32)
        for p, w in first:
            if ex.tags is not None:
                if ex.tags[w] not in tag_id:
                    raise ValueError(f"{ex.guid}: tag {ex.tags[w]!r} is not one of the task's labels {list(labels)}")
                lab[offset + p] = tag_id[ex.tags[w]]
            mask[offset + p] = 1.0
            widx[offset + p] = w
        for k, v in zip(("input_ids", "token_type_ids", "attention_mask"), (i, s, m)):
            out[k].append(v)
        out["labels"].append(lab), out["label_mask"].append(mask), out["word_index"].append(widx)
    arrays = {k: np.asarray(v, np.int32).reshape(-1, L) for k, v in out.items() if k != "label_mask"}
    arrays["label_mask"] = np.asarray(out["label_mask"], np.float32).reshape(-1, L)
    return arrays


def word_predictions(example: TokenExample, word_index: np.ndarray, pred: np.ndarray, labels: Sequence[str]):
    """The predicted tag of every word of `example` from piece-level predictions `pred [L]` (its first piece's),
    "O" for words cut off by `max_seq_length`."""
    tags = ["O"] * len(example.words)
    for p in np.nonzero(word_index >= 0)[0]:
        tags[int(word_index[p])] = labels[int(pred[p])]
    return tags


def conll_text(examples: Sequence[TokenExample], predictions: Sequence[Sequence[str]]) -> str:
    """`word gold predicted` per line, a blank line after each sentence (CoNLL evaluation format)."""
    lines = []
    for ex, pred in zip(examples, predictions):
        gold = ex.tags or ("O",) * len(ex.words)
        lines.extend(f"{w} {g} {p}" for w, g, p in zip(ex.words, gold, pred))
        lines.append("")
    return "\n".join(lines) + "\n"
