"""GDAN's data: labeled SQuAD-format JSON split by article, unlabeled paragraphs from one text file with extracted
answer candidates, and the batch stream (thesis §3.2.3, §3.2.5).

    labeled   `config.data.labeled` (SQuAD v1.1 JSON). Articles are permuted with `data.split_seed` and cut into
              test (`test_fraction` of the articles), dev (`dev_fraction`) and train, so the paragraphs of one
              article are in one set only (the thesis splits SQuAD's training set 90/10 by article). The labeled
              set L is the first articles of the train part holding at least `labeling_rate` x its questions.
    unlabeled `config.data.unlabeled`: a text file of paragraphs separated by blank lines (a file without blank
              lines: one paragraph per line). Per paragraph, the extractor's candidates (xlgen.systems.gdan.text)
              are subsampled to `answers_per_paragraph` (seeded by split_seed): U = {(a, p)}.

Every instance is a window of `paragraph_len` words that centres its answer (answers longer than
`max_answer_words` words are skipped), with its question as at most `question_len - 1` words:

    p [N, Tp] int32 word ids (0-padded), plen [N];  start, end [N]: the answer's word indices in the window
    q [N, Tq], qlen [N]: the question (labeled) or the context baseline's question (unlabeled, `context_window`
                         words each side of the answer); gq [N, Tq]: the question + <eos>, the generator's target

Evaluation splits (dev, test) keep every question with all its gold answers and cover each paragraph with windows
every `paragraph_len // 2` words (xlgen.finetune.squad_decode picks the window with the most context per word).

`Pipeline.batch(step)` draws `labeled_batch_size` rows of L and `unlabeled_batch_size` rows of U i.i.d. from
numpy's generator seeded by (data.seed, step): a pure function of the step (exact resume).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Dict, List, Sequence, Tuple

import numpy as np

from data_pipelines import paths
from xlgen.finetune.readers.examples import SquadExample
from xlgen.finetune.readers.squad import read_squad
from xlgen.systems.gdan import text as T


@dataclasses.dataclass
class Instances:
    """Training rows (module docstring)."""

    p: np.ndarray
    plen: np.ndarray
    start: np.ndarray
    end: np.ndarray
    q: np.ndarray
    qlen: np.ndarray
    gq: np.ndarray

    def __len__(self) -> int:
        return int(self.p.shape[0])


@dataclasses.dataclass
class EvalSplit:
    examples: List[SquadExample]
    p: np.ndarray  # [W, Tp] windows
    plen: np.ndarray
    q: np.ndarray
    qlen: np.ndarray
    example_index: np.ndarray  # [W]
    tok_start_char: np.ndarray  # [W, Tp] original characters of each window word (-1 = padding)
    tok_end_char: np.ndarray
    max_context: np.ndarray  # [W, Tp] bool

    def gold(self) -> Dict[str, List[str]]:
        return {ex.qas_id: [a for a, _ in ex.answers] for ex in self.examples}


@dataclasses.dataclass
class Dataset:
    vocab: T.Vocab
    labeled: Instances
    unlabeled: Instances
    dev: EvalSplit
    test: EvalSplit
    record: Dict  # what the run keeps of its data (workdir/gdan_data.json)
    unlabeled_text: List[Tuple[str, Tuple[int, int]]]  # (paragraph, answer chars) per unlabeled row


def _empty(tp: int, tq: int) -> Instances:
    z = np.zeros((0,), np.int32)
    return Instances(np.zeros((0, tp), np.int32), z, z, z, np.zeros((0, tq), np.int32), z, np.zeros((0, tq), np.int32))


def read_articles(path: str) -> Tuple[List[SquadExample], np.ndarray, List[str]]:
    """(examples, article index of each, article titles) of a SQuAD v1.1 JSON file (official reader's checks)."""
    examples = read_squad(path, version="v1.1", require_answers=True)
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    art, titles = [], []
    for a, article in enumerate(doc["data"]):
        titles.append(str(article.get("title", a)))
        for para in article.get("paragraphs", []):
            art += [a] * len(para["qas"])
    return examples, np.asarray(art, np.int64), titles


def read_paragraphs(path: str) -> List[str]:
    """Paragraphs of a text file: blank-line separated, or one per line when the file has no blank line."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: missing (config.data.unlabeled: a text file of paragraphs)")
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    blocks = [" ".join(b.split()) for b in raw.replace("\r\n", "\n").split("\n\n")]
    if len([b for b in blocks if b]) <= 1:
        blocks = [" ".join(line.split()) for line in raw.splitlines()]
    return [b for b in blocks if b]


def _instance(vocab, ws, start, end, question: Sequence[str], tp: int, tq: int):
    w0 = T.window_start(len(ws), start, end, tp)
    win = ws[w0 : w0 + tp]
    q = list(question)[: tq - 1]
    return (
        _pad(vocab.ids(win), tp),
        len(win),
        start - w0,
        end - w0,
        _pad(vocab.ids(q), tq),
        len(q),
        _pad(vocab.ids(q) + [T.EOS], tq),
    )


def _pad(ids: Sequence[int], n: int) -> List[int]:
    return list(ids)[:n] + [T.PAD] * max(0, n - len(ids))


def _stack(rows, tp: int, tq: int) -> Instances:
    if not rows:
        return _empty(tp, tq)
    cols = list(zip(*rows))
    a = lambda k: np.asarray(cols[k], np.int32)  # noqa: E731
    return Instances(a(0), a(1), a(2), a(3), a(4), a(5), a(6))


def labeled_instances(examples: Sequence[SquadExample], vocab, tp, tq, max_answer) -> Instances:
    rows = []
    for ex in examples:
        ws, ss, es = T.words_with_offsets(ex.context)
        text, c0 = ex.answers[0]
        s, e = T.word_span(ss, es, c0, c0 + len(text))
        if s < 0 or e - s + 1 > max_answer:
            continue
        rows.append(_instance(vocab, ws, s, e, T.words(ex.question), tp, tq))
    return _stack(rows, tp, tq)


def unlabeled_instances(paragraphs, extract, per_paragraph, seed, vocab, tp, tq, max_answer, window):
    """(Instances of U with the context baseline's questions, [(paragraph, (c0, c1))])."""
    rows, shown = [], []
    rng = np.random.default_rng(seed)
    for para in paragraphs:
        ws, ss, es = T.words_with_offsets(para)
        cands = []
        for c0, c1 in extract(para):
            s, e = T.word_span(ss, es, c0, c1)
            if s >= 0 and e - s + 1 <= max_answer:
                cands.append((s, e, c0, c1))
        if len(cands) > per_paragraph:
            keep = np.sort(rng.choice(len(cands), per_paragraph, replace=False))
            cands = [cands[k] for k in keep]
        for s, e, c0, c1 in cands:
            ctx = T.context_question(ws, s, e, window)
            row = list(_instance(vocab, ws, s, e, ctx, tp, tq))
            row[6] = _pad(vocab.ids(ctx[: tq - 1]) + [T.EOS], tq)  # unused: U has no human question
            rows.append(tuple(row))
            shown.append((para, (c0, c1)))
    return _stack(rows, tp, tq), shown


def eval_split(examples: Sequence[SquadExample], vocab, tp: int, tq: int) -> EvalSplit:
    cols: Dict[str, list] = {k: [] for k in ("p", "plen", "q", "qlen", "ex", "tsc", "tec", "mc")}
    stride = max(1, tp // 2)
    for i, ex in enumerate(examples):
        ws, ss, es = T.words_with_offsets(ex.context)
        q = T.words(ex.question)[: tq - 1]
        spans, s0 = [], 0
        while True:
            n = min(tp, len(ws) - s0)
            spans.append((s0, n))
            if s0 + n >= len(ws):
                break
            s0 += stride
        for k, (s0, n) in enumerate(spans):
            cols["p"].append(_pad(vocab.ids(ws[s0 : s0 + n]), tp))
            cols["plen"].append(n)
            cols["q"].append(_pad(vocab.ids(q), tq))
            cols["qlen"].append(len(q))
            cols["ex"].append(i)
            cols["tsc"].append(_pad([c + 1 for c in ss[s0 : s0 + n]], tp))  # +1 / -1 below: -1 = padding
            cols["tec"].append(_pad([c + 1 for c in es[s0 : s0 + n]], tp))
            cols["mc"].append(_pad([_most_context(spans, k, s0 + j) for j in range(n)], tp))
    i32 = lambda k, shape=(): np.asarray(cols[k], np.int32).reshape((-1,) + shape)  # noqa: E731
    return EvalSplit(
        list(examples),
        i32("p", (tp,)),
        i32("plen"),
        i32("q", (tq,)),
        i32("qlen"),
        i32("ex"),
        i32("tsc", (tp,)) - 1,
        i32("tec", (tp,)) - 1,
        np.asarray(cols["mc"], bool).reshape(-1, tp),
    )


def _most_context(spans, k, pos) -> int:
    """Whether window k gives word `pos` the most context (BERT/XLNet `_check_is_max_context`)."""
    best, best_k = None, None
    for j, (s0, n) in enumerate(spans):
        if s0 <= pos < s0 + n:
            score = min(pos - s0, s0 + n - 1 - pos) + 0.01 * n
            if best is None or score > best:
                best, best_k = score, j
    return int(best_k == k)


def load(d) -> Dataset:
    """The run's Dataset from `config.data` (module docstring)."""
    if not d.labeled:
        raise ValueError("config.data.labeled: the SQuAD-format JSON of labeled questions is required")
    for key in ("labeling_rate", "test_fraction", "dev_fraction"):
        v = float(d[key])
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"config.data.{key}={v}: expected a fraction in [0, 1]")
    tp, tq, max_answer = int(d.paragraph_len), int(d.question_len), int(d.max_answer_words)
    if not 0 < max_answer <= tp or tq < 2:
        raise ValueError(
            f"config.data: need 0 < max_answer_words <= paragraph_len and question_len >= 2 (got "
            f"{max_answer}, {tp}, {tq})"
        )
    examples, art, titles = read_articles(d.labeled)
    order = np.random.default_rng(int(d.split_seed)).permutation(len(titles))
    n_test = int(round(float(d.test_fraction) * len(titles)))
    n_dev = int(round(float(d.dev_fraction) * len(titles)))
    test_a, dev_a, train_a = order[:n_test], order[n_test : n_test + n_dev], order[n_test + n_dev :]
    per_article = np.bincount(art, minlength=len(titles))
    need = float(d.labeling_rate) * per_article[train_a].sum()
    take = int(np.searchsorted(np.cumsum(per_article[train_a]), need - 1e-9) + 1) if need > 0 else 0
    lab_a = train_a[: min(take, len(train_a))]

    def pick(arts):
        keep = set(arts.tolist())
        return [ex for ex, a in zip(examples, art) if a in keep]

    lab, dev, test = pick(lab_a), pick(dev_a), pick(test_a)
    if not lab:
        raise ValueError(f"{d.labeled}: labeling_rate={d.labeling_rate} leaves no labeled question")
    if not test:
        raise ValueError(f"{d.labeled}: {len(titles)} articles leave no test article (test_fraction)")
    paragraphs = read_paragraphs(d.unlabeled) if d.unlabeled else []
    if int(d.max_unlabeled_paragraphs) > 0:
        paragraphs = paragraphs[: int(d.max_unlabeled_paragraphs)]
    texts = [ex.question for ex in lab] + sorted({ex.context for ex in lab}) + paragraphs
    vocab = T.Vocab.build(texts, int(d.vocab_size))
    labeled = labeled_instances(lab, vocab, tp, tq, max_answer)
    unlabeled, shown = unlabeled_instances(
        paragraphs,
        T.extractor(str(d.extractor)),
        int(d.answers_per_paragraph),
        int(d.split_seed),
        vocab,
        tp,
        tq,
        max_answer,
        int(d.context_window),
    )
    record = {
        "labeled": {"path": os.path.abspath(d.labeled), "sha256_16": paths.sha256_of(d.labeled)[:16]},
        "unlabeled": {"path": os.path.abspath(d.unlabeled), "sha256_16": paths.sha256_of(d.unlabeled)[:16]}
        if d.unlabeled
        else None,
        "articles": {k: [titles[i] for i in v] for k, v in (("labeled", lab_a), ("dev", dev_a), ("test", test_a))},
        "num_questions": {
            "labeled": len(lab),
            "dev": len(dev),
            "test": len(test),
            "train_split": int(per_article[train_a].sum()),
        },
        "num_instances": {"labeled": len(labeled), "unlabeled": len(unlabeled), "paragraphs": len(paragraphs)},
        "vocab_size": len(vocab),
    }
    return Dataset(
        vocab, labeled, unlabeled, eval_split(dev, vocab, tp, tq), eval_split(test, vocab, tp, tq), record, shown
    )


_KEYS = (
    "labeled",
    "unlabeled",
    "labeling_rate",
    "split_seed",
    "test_fraction",
    "dev_fraction",
    "paragraph_len",
    "question_len",
    "max_answer_words",
    "vocab_size",
    "extractor",
    "answers_per_paragraph",
    "context_window",
    "max_unlabeled_paragraphs",
)


def dataset(data_config) -> Dataset:
    """The run's Dataset, read once per process and data config."""
    return _dataset(json.dumps({k: data_config[k] for k in _KEYS}, sort_keys=True))


@functools.lru_cache(maxsize=4)
def _dataset(key: str) -> Dataset:
    import ml_collections

    return load(ml_collections.ConfigDict(json.loads(key)))


def take(inst: Instances, idx: np.ndarray, prefix: str) -> Dict[str, np.ndarray]:
    return {prefix + k: getattr(inst, k)[idx] for k in ("p", "plen", "start", "end", "q", "qlen", "gq")}


class Pipeline:
    """`batch(step)`: labeled and unlabeled rows drawn i.i.d. with numpy's generator seeded by (data.seed, step);
    `record(workdir)` writes DIR/gdan_data.json (files, article split, sizes) and refuses a different one."""

    num_steps = None

    def __init__(self, data_config, split: str = "train", process_index: int = 0, process_count: int = 1):
        if process_count > 1:
            raise ValueError("GDAN runs in one process (the data are small)")
        self.ds = dataset(data_config)
        self.seed = int(data_config.seed)
        self.bl, self.bu = int(data_config.labeled_batch_size), int(data_config.unlabeled_batch_size)
        self.global_batch_size = self.local_batch_size = self.bl  # rows of the batch's first key (the loop's check)

    def batch(self, step: int) -> Dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, int(step)])
        out = take(self.ds.labeled, rng.integers(0, len(self.ds.labeled), self.bl), "l_")
        n_u = len(self.ds.unlabeled)
        out.update(take(self.ds.unlabeled, rng.integers(0, max(n_u, 1), self.bu) if n_u else np.zeros(0, int), "u_"))
        if not n_u:  # no unlabeled data (SL): zero rows of the right shapes
            out.update({k: np.zeros((self.bu,) + v.shape[1:], np.int32) for k, v in out.items() if k[:2] == "u_"})
        return out

    def record(self, workdir: str) -> None:
        path = os.path.join(workdir, "gdan_data.json")
        rec = self.ds.record
        if paths.as_path(path).exists():
            old = json.loads(paths.read_text(path))
            if old != json.loads(json.dumps(rec)):
                raise ValueError(f"{path}: this run's data (files, split, labeling_rate) differ from the stored ones")
            return
        paths.write_json_atomic(path, rec)


def batch_shapes(data_config) -> Dict[str, Tuple[Tuple[int, ...], type]]:
    tp, tq = int(data_config.paragraph_len), int(data_config.question_len)
    out = {}
    for prefix, b in (("l_", int(data_config.labeled_batch_size)), ("u_", int(data_config.unlabeled_batch_size))):
        out.update({prefix + k: ((b,), np.int32) for k in ("plen", "start", "end", "qlen")})
        out.update(
            {prefix + "p": ((b, tp), np.int32), prefix + "q": ((b, tq), np.int32), prefix + "gq": ((b, tq), np.int32)}
        )
    return out
