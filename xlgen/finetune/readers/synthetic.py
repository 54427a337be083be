"""Small synthetic task data in the OFFICIAL file formats, for tests, demos and smoke runs.

* `write_glue(dir, task)`: GLUE TSVs with the task's real header/columns. The label is learnable from the text:
  the sentence contains one of a few class-specific cue words among random filler words.
* `write_squad(dir, version)`: SQuAD JSON; answers are word spans of the context (v2.0 adds unanswerable
  questions); the question repeats the word before the answer, so the span is findable.
* `write_race(dir)`: RACE `{train,dev}/{high,middle}/*.txt` JSON files; the correct option is in the article.
* `write_conll(dir)`: CoNLL-2003 `train.txt` / `valid.txt` / `test.txt` with IOB1 tags (as the original release):
  entities are a first word and an optional continuation word from small lexicons per type, among filler words,
  sometimes adjacent to another entity of the same type (the IOB1 `B-` case).
* `write_long_documents(dir)`: AG-News-format `train.csv` / `test.csv` (4 classes) of long documents whose label
  needs both ends: class = 2 * (key word among the first words) + (query word among the last words), so a model
  reading one head-truncated window sees at most the key (<= 1/2 accuracy) and one with memory can see both.
* `train_sentencepiece(texts, path)`: a tiny XLNet-recipe SentencePiece model (control symbols <cls> <sep> <pad>
  <mask> <eod>, punctuation as user-defined symbols).
"""

from __future__ import annotations

import io
import json
import os
from typing import Iterable, List

import numpy as np

from data_pipelines.vocab import XLNET_CONTROL_SYMBOLS, XLNET_USER_SYMBOLS

FILLER = (
    "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud paper garden "
    "window yellow silent market"
).split()
CUES = (("awful", "poor", "bad"), ("great", "lovely", "good"), ("maybe", "perhaps", "unclear"))

_HEADERS = {
    "sst2": ["sentence", "label"],
    "mrpc": ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
    "stsb": [
        "index",
        "genre",
        "filename",
        "year",
        "old_index",
        "source1",
        "source2",
        "sentence1",
        "sentence2",
        "score",
    ],
    "qqp": ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
    "mnli": [
        "index",
        "promptID",
        "pairID",
        "genre",
        "sentence1_binary_parse",
        "sentence2_binary_parse",
        "sentence1_parse",
        "sentence2_parse",
        "sentence1",
        "sentence2",
        "label1",
        "gold_label",
    ],
    "qnli": ["index", "question", "sentence", "label"],
    "rte": ["index", "sentence1", "sentence2", "label"],
    "wnli": ["index", "sentence1", "sentence2", "label"],
}
_TEST_HEADERS = {
    "cola": ["index", "sentence"],
    "sst2": ["index", "sentence"],
    "mrpc": ["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
    "qqp": ["id", "question1", "question2"],
}


def _sentence(rng, cue=None, n=8) -> str:
    words = list(rng.choice(FILLER, size=n))
    if cue is not None:
        words[int(rng.integers(0, n))] = cue
    return " ".join(words)


def write_glue(data_dir: str, task: str, *, n_train: int = 64, n_dev: int = 32, n_test: int = 8, seed: int = 0) -> None:
    """Write `task`'s train/dev/test files (MNLI: dev_matched/dev_mismatched/test_matched/test_mismatched)."""
    from xlgen.finetune.readers.glue import GLUE_TASKS

    spec = GLUE_TASKS[task]
    rng = np.random.default_rng(seed)
    os.makedirs(data_dir, exist_ok=True)
    for split, fname in spec.splits:
        n = n_train if split == "train" else n_dev if split.startswith("dev") else n_test
        is_test = split.startswith("test")
        rows = []
        for i in range(n):
            if spec.labels is None:
                score = float(rng.integers(0, 6))
                label_str = f"{score:.3f}"
                cue = CUES[1][0] if score >= 2.5 else CUES[0][0]
                k = int(score >= 2.5)
            else:
                k = int(rng.integers(0, len(spec.labels)))
                label_str = spec.labels[k]
                cue = str(rng.choice(CUES[k % len(CUES)]))
            a, b = _sentence(rng, cue), _sentence(rng)
            row = {
                "sentence": a,
                "label": label_str,
                "Quality": label_str,
                "#1 ID": str(i),
                "#2 ID": str(i + 1),
                "#1 String": a,
                "#2 String": b,
                "index": str(i),
                "genre": "g",
                "filename": "f",
                "year": "y",
                "old_index": str(i),
                "source1": "s",
                "source2": "s",
                "sentence1": a,
                "sentence2": b,
                "score": label_str,
                "id": str(i),
                "qid1": str(2 * i),
                "qid2": str(2 * i + 1),
                "question1": a,
                "question2": b,
                "is_duplicate": label_str,
                "promptID": str(i),
                "pairID": str(i),
                "sentence1_binary_parse": a,
                "sentence2_binary_parse": b,
                "sentence1_parse": a,
                "sentence2_parse": b,
                "label1": label_str,
                "gold_label": label_str,
                "question": b,
            }
            if task == "qnli":
                row["question"], row["sentence"] = a, b
            rows.append(row)
        if task == "cola" and not is_test:
            lines = [f"src\t{r['label']}\t{'*' if r['label'] == '0' else ''}\t{r['sentence']}" for r in rows]
        else:
            if is_test:
                header = _TEST_HEADERS.get(task) or ["index"] + [
                    c for c in _HEADERS[task] if c not in ("label", "score", "gold_label", "label1", "index")
                ]
                if task == "stsb":
                    header = _HEADERS["stsb"][:-1]
            else:
                header = _HEADERS[task]
            lines = ["\t".join(header)] + ["\t".join(r[c] for c in header) for r in rows]
        with open(os.path.join(data_dir, fname), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


_SYLLABLES = "ka lo mi ne ru ta vo si pe du fa go hi ju ze".split()
PSEUDO_WORDS = [a + b for a in _SYLLABLES for b in _SYLLABLES]


def squad_json(
    version: str, *, n_paragraphs: int = 8, questions_per_paragraph: int = 3, context_words: int = 60, seed: int = 0
) -> dict:
    """Contexts of pseudo-words (plus accented / quoted / punctuated words to exercise the alignment). A question
    "what follows W ?" is answered by the 1-3 words after the word W, which occurs once in the context; an
    unanswerable (v2.0) question asks about a word that does not occur."""
    rng = np.random.default_rng(seed)
    extra = ["café", "naïve", "``quoted''", "(paren)", "x-ray", "12.5", "£3", "Zürich"]
    vocab = PSEUDO_WORDS + extra
    data = []
    qid = 0
    for p in range(n_paragraphs):
        words = [str(w) for w in rng.choice(vocab, size=context_words)]
        context = " ".join(words) + "."
        starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
        unique = [i for i in range(1, context_words - 3) if words.count(words[i - 1]) == 1]
        absent = [w for w in PSEUDO_WORDS if w not in words]
        qas = []
        for _ in range(questions_per_paragraph):
            impossible = version == "v2.0" and rng.random() < 0.3
            i = int(rng.choice(unique))
            n = int(rng.integers(1, 4))
            text = " ".join(words[i : i + n])
            cue = str(rng.choice(absent)) if impossible else words[i - 1]
            qa = {
                "id": f"q{qid}",
                "question": f"what follows {cue} ?",
                "answers": []
                if impossible
                else [
                    {"text": text, "answer_start": int(starts[i])},
                    {"text": words[i], "answer_start": int(starts[i])},
                ],
            }
            if version == "v2.0":
                qa["is_impossible"] = bool(impossible)
            qas.append(qa)
            qid += 1
        data.append({"title": f"t{p}", "paragraphs": [{"context": context, "qas": qas}]})
    return {"version": version, "data": data}


def write_squad(data_dir: str, version: str, *, seed: int = 0, **kw) -> None:
    os.makedirs(data_dir, exist_ok=True)
    for i, split in enumerate(("train", "dev")):
        with open(os.path.join(data_dir, f"{split}-{version}.json"), "w", encoding="utf-8") as f:
            json.dump(squad_json(version, seed=seed + i, **kw), f, ensure_ascii=False)


def write_race(data_dir: str, *, n_articles: int = 6, seed: int = 0, splits=("train", "dev")) -> None:
    rng = np.random.default_rng(seed)
    for s, split in enumerate(splits):
        for level in ("middle", "high"):
            d = os.path.join(data_dir, split, level)
            os.makedirs(d, exist_ok=True)
            for a in range(n_articles):
                article = _sentence(rng, n=30) + " ."
                art_words = article.split()
                qs, opts, ans = [], [], []
                for q in range(2):
                    correct = str(rng.choice(art_words[:-1]))
                    wrong = [w for w in ("orange", "purple", "violet", "silver", "golden")]
                    options = list(rng.choice(wrong, size=3, replace=False)) + [correct]
                    order = rng.permutation(4)
                    options = [options[k] for k in order]
                    qs.append("which word is in the text ?" if q == 0 else "the text mentions _ .")
                    opts.append(options)
                    ans.append("ABCD"[int(np.where(order == 3)[0][0])])
                with open(os.path.join(d, f"{a}.txt"), "w", encoding="utf-8") as f:
                    json.dump(
                        {"id": f"{level}{a}.txt", "article": article, "questions": qs, "options": opts, "answers": ans},
                        f,
                    )


# per entity type: (first words, continuation words); an entity is a first word and optionally a continuation, so
# where one entity ends and an adjacent one of the same type begins is readable from the words
ENTITIES = {
    "PER": (("Anna", "Boris", "Chen", "Dara"), ("Smith", "Okafor", "Ivanova")),
    "ORG": (("Acme", "Globex", "Initech"), ("Corp", "Group", "Labs")),
    "LOC": (("Paris", "Lagos", "Quito", "Oslo"), ("City", "Bay", "North")),
    "MISC": (("Olympic", "Nobel", "Euro"), ("Games", "Prize", "Cup")),
}


def conll_sentences(rng, n: int) -> List[List[tuple]]:
    """`n` sentences of (word, IOB1 tag): 6-12 filler words with 1-3 entities of one or two lexicon words."""
    out = []
    for _ in range(n):
        words = [(str(w), "O") for w in rng.choice(FILLER, size=int(rng.integers(6, 13)))]
        for _ in range(int(rng.integers(1, 4))):
            kind = str(rng.choice(sorted(ENTITIES)))
            first, cont = ENTITIES[kind]
            ent = [str(rng.choice(first))] + ([str(rng.choice(cont))] if rng.random() < 0.5 else [])
            at = int(rng.integers(0, len(words) + 1))
            prev = words[at - 1][1] if at > 0 else "O"
            first = "B-" if prev[2:] == kind else "I-"  # IOB1: B- only right after an entity of the same type
            words[at:at] = [(w, (first if i == 0 else "I-") + kind) for i, w in enumerate(ent)]
        out.append(words)
    return out


LONG_KEYS, LONG_QUERIES = ("apple", "berry"), ("north", "south")


def write_long_documents(
    data_dir: str, *, n_train: int = 256, n_dev: int = 64, n_words=(18, 24), seed: int = 0
) -> None:
    """`train.csv` / `test.csv` in the Zhang et al. CSV format (task `ag`, labels 1..4) of `n_words` filler words;
    the key word sits among the first 3 words, the query word among the last 3; label = 2 * key + query + 1."""
    import csv

    rng = np.random.default_rng(seed)
    os.makedirs(data_dir, exist_ok=True)
    for name, n in (("train.csv", n_train), ("test.csv", n_dev)):
        with open(os.path.join(data_dir, name), "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f, quoting=csv.QUOTE_ALL)
            for _ in range(n):
                words = list(rng.choice(FILLER, size=int(rng.integers(n_words[0], n_words[1] + 1))))
                key, query = int(rng.integers(0, 2)), int(rng.integers(0, 2))
                words[int(rng.integers(0, 3))] = LONG_KEYS[key]
                words[-1 - int(rng.integers(0, 3))] = LONG_QUERIES[query]
                w.writerow([str(2 * key + query + 1), " ".join(words)])


def write_conll(data_dir: str, *, n_train: int = 200, n_dev: int = 50, n_test: int = 20, seed: int = 0) -> None:
    """CoNLL-2003-format files (`word POS chunk TAG`, `-DOCSTART-` documents, IOB1 tags) in `data_dir`."""
    rng = np.random.default_rng(seed)
    os.makedirs(data_dir, exist_ok=True)
    for name, n in (("train.txt", n_train), ("valid.txt", n_dev), ("test.txt", n_test)):
        lines = ["-DOCSTART- -X- -X- O", ""]
        for s in conll_sentences(rng, n):
            lines.extend(f"{w} NN B-NP {t}" for w, t in s)
            lines.append("")
        with open(os.path.join(data_dir, name), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


def train_sentencepiece(texts: Iterable[str], path: str | None = None, *, vocab_size: int = 200) -> bytes:
    """Train a tiny unigram model with XLNet's special symbols; returns the serialized model (also written to
    `path` if given)."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(list(texts)),
        model_writer=buf,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        control_symbols=list(XLNET_CONTROL_SYMBOLS),
        user_defined_symbols=[*XLNET_USER_SYMBOLS, ","],  # XLNet's, and the comma as a piece of its own
        hard_vocab_limit=False,
        minloglevel=2,
    )
    proto = buf.getvalue()
    if path:
        with open(path, "wb") as f:
            f.write(proto)
    return proto


def corpus_for(data_dir: str) -> List[str]:
    """All text of the task files under `data_dir` (to train a matching tiny tokenizer): TSV lines, the text fields
    of CSV rows (Zhang et al.: the label column and the quoting left out, so words are not glued to quotes), and the
    string values of JSON files (SQuAD, RACE)."""
    import csv

    def strings(x):
        if isinstance(x, str):
            yield x
        elif isinstance(x, dict):
            for v in x.values():
                yield from strings(v)
        elif isinstance(x, list):
            for v in x:
                yield from strings(v)

    out = []
    for root, _, files in os.walk(data_dir):
        for name in sorted(files):
            if not name.endswith((".tsv", ".csv", ".json", ".txt")):
                continue
            with open(os.path.join(root, name), encoding="utf-8") as f:
                text = f.read()
            if name.endswith(".csv"):
                out.extend(" ".join(row[1:]) for row in csv.reader(io.StringIO(text)) if "".join(row[1:]).strip())
            elif text.lstrip().startswith("{"):
                out.extend(t for t in strings(json.loads(text)) if t.strip())
            else:
                out.extend(line for line in text.replace("\\n", "\n").split("\n") if line.strip())
    return out
