"""A local stand-in for SQuAD + unlabeled Wikipedia text: templated facts over a text corpus (not real questions).

    python -m xlgen.systems.gdan.standin --out=DIR [--names=TEXT --filler=TEXT --articles=60 --paragraphs=1000
                                          --seed=0]
    -> DIR/squad.json (SQuAD v1.1 format: articles, paragraphs, questions with answer_start)
       DIR/unlabeled.txt (paragraphs from the same generator, blank-line separated, no questions)

Each article is about a few people; each paragraph states 3-5 facts drawn from six relations (birth place and
year, occupation and its length, a founding, a marriage, possessions), in one of several sentence templates, mixed
with 1-2 filler sentences from the `filler` corpus (e.g. PTB), and each fact is asked about in one of several
question templates (paraphrases, not copies of the sentence). Names come from the `names` corpus (Shakespeare's
speakers become people, other capitalised words places), objects from the filler corpus' frequent words; without
corpora a built-in word list is used (the tests). It is what the thesis' method needs to show its effects — a
reader that must learn to match questions to paragraphs from little labeled data, a generator that can learn the
question templates and copy names, answer candidates a rule-based extractor finds — and nothing more.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from data_pipelines import paths

_PEOPLE = "Anna Boris Clara Dmitri Elena Felix Greta Hugo Irene Jonas Karla Lukas Mira Nikolai Olga Pavel".split()
_PLACES = "Arden Brixton Calder Dunmore Elsworth Farley Glenrock Harwick Ivesby Jarrow Kelso Lanark".split()
_THINGS = "mill school bakery library theatre orchard garden harbour museum bridge".split()
_JOBS = "baker teacher painter sailor farmer doctor printer weaver".split()
_FILLER = [
    "the weather that year was unusually mild .",
    "many families moved to the towns in search of work .",
    "the local newspaper reported the news a week later .",
    "prices for grain rose sharply during the winter .",
]

# (sentence templates, [(question templates, answer slot)])  slots: P person, P2 person, L place, Y year, N thing,
# J job, K count
RELATIONS = [
    (
        ["{P} was born in {L} in {Y} .", "In {Y} , {P} was born in {L} ."],
        [
            (["where was {P} born ?", "in which town was {P} born ?", "{P} was born where ?"], "L"),
            (["when was {P} born ?", "in what year was {P} born ?", "what year was {P} born in ?"], "Y"),
        ],
    ),
    (
        ["{P} worked as a {J} for {K} years .", "For {K} years {P} worked as a {J} ."],
        [
            (["what did {P} work as ?", "what was the job of {P} ?", "which trade did {P} follow ?"], "J"),
            (["how many years did {P} work as a {J} ?", "for how long did {P} work ?"], "K"),
        ],
    ),
    (
        ["In {Y} , {P} founded the {N} of {L} .", "{P} founded the {N} of {L} in {Y} ."],
        [
            (["who founded the {N} of {L} ?", "the {N} of {L} was founded by whom ?"], "P"),
            (["what did {P} found in {Y} ?", "what was founded by {P} ?"], "N"),
            (["when was the {N} of {L} founded ?", "in which year did {P} found the {N} ?"], "Y"),
        ],
    ),
    (
        ["{P} married {P2} , a {J} from {L} .", "{P2} , a {J} from {L} , married {P} ."],
        [
            (["whom did {P} marry ?", "who was the spouse of {P} ?"], "P2"),
            (["where was {P2} from ?", "which town did {P2} come from ?"], "L"),
        ],
    ),
    (
        ["{P} owned {K} {N}s near {L} .", "Near {L} , {P} owned {K} {N}s ."],
        [
            (["how many {N}s did {P} own ?", "what number of {N}s belonged to {P} ?"], "K"),
            (["near which town did {P} own {N}s ?", "where were the {N}s of {P} ?"], "L"),
        ],
    ),
]


def word_lists(names: Optional[str], filler: Optional[str]) -> Dict[str, List]:
    """people, places, things, jobs, filler sentences: from the corpora (module docstring) or the built-in list."""
    out = {"people": _PEOPLE, "places": _PLACES, "things": _THINGS, "jobs": _JOBS, "filler": _FILLER}
    if names:
        raw = open(names, encoding="utf-8").read()
        speakers = sorted({m.title() for m in re.findall(r"^([A-Z][A-Z]{3,}):$", raw, re.M)})
        caps = collections.Counter(re.findall(r"(?<=[a-z,;] )([A-Z][a-z]{3,})\b", raw))
        places = sorted(w for w, n in caps.items() if n >= 3 and w not in speakers)
        if len(speakers) >= 20 and len(places) >= 20:
            out["people"], out["places"] = speakers, places
    if filler:
        lines = [" ".join(line.split()) for line in open(filler, encoding="utf-8")]
        lines = [s for s in lines if 6 <= len(s.split()) <= 20 and "<unk>" not in s and " N " not in f" {s} "]
        counts = collections.Counter(w for s in lines for w in s.split())
        common = sorted(w for w, n in counts.items() if n >= 20 and w.isalpha() and 5 <= len(w) <= 9)
        if len(lines) >= 50 and len(common) >= 40:
            out["filler"] = [s + " ." for s in lines]
            out["things"], out["jobs"] = common[::2], common[1::2]
    return out


def _fill(template: str, slots: Dict[str, str]) -> str:
    return template.format(**slots)


def _paragraph(rng, words, people: Sequence[str]) -> Tuple[str, List[Tuple[str, str]]]:
    """(context, [(question, answer text)]): facts about `people`, the answer the first occurrence of its text in
    the fact's sentence."""
    sentences, qas = [], []
    n_facts = int(rng.integers(3, 6))
    for r in rng.choice(len(RELATIONS), n_facts, replace=True):
        templates, questions = RELATIONS[int(r)]
        p, p2 = rng.choice(people, 2, replace=False)
        slots = {
            "P": str(p),
            "P2": str(p2),
            "L": str(rng.choice(words["places"])),
            "Y": str(int(rng.integers(1700, 1950))),
            "N": str(rng.choice(words["things"])),
            "J": str(rng.choice(words["jobs"])),
            "K": str(int(rng.integers(2, 40))),
        }
        sentence = _fill(str(rng.choice(templates)), slots)
        offset = sum(len(s) + 1 for s in sentences)
        k = int(rng.integers(len(questions)))
        qt, slot = questions[k]
        answer = slots[slot]
        at = re.search(r"\b" + re.escape(answer) + r"\b", sentence).start()
        qas.append((_fill(str(rng.choice(qt)), slots), answer, offset + at))
        sentences.append(sentence)
        if rng.random() < 0.4:
            sentences.append(str(rng.choice(words["filler"])))
    return " ".join(sentences), qas


def generate(out_dir: str, *, names=None, filler=None, articles=60, paragraphs_per_article=4, unlabeled=1000, seed=0):
    """Write out_dir/squad.json and out_dir/unlabeled.txt (module docstring); returns their paths."""
    words = word_lists(names, filler)
    rng = np.random.default_rng(seed)
    data = []
    for a in range(articles):
        people = list(rng.choice(words["people"], 4, replace=False))
        paras = []
        for p in range(paragraphs_per_article):
            context, qas = _paragraph(rng, words, people)
            items = []
            for k, (q, ans, at) in enumerate(qas):
                assert context[at : at + len(ans)] == ans, (context, ans, at)
                items.append({"id": f"a{a}p{p}q{k}", "question": q, "answers": [{"text": ans, "answer_start": at}]})
            paras.append({"context": context, "qas": items})
        data.append({"title": f"article_{a}_{people[0]}", "paragraphs": paras})
    texts = []
    for _ in range(unlabeled):
        people = list(rng.choice(words["people"], 4, replace=False))
        texts.append(_paragraph(rng, words, people)[0])
    paths.makedirs(out_dir)
    squad, text = os.path.join(out_dir, "squad.json"), os.path.join(out_dir, "unlabeled.txt")
    paths.write_json_atomic(squad, {"version": "1.1", "data": data})
    paths.atomic_write_text(text, "\n\n".join(texts) + "\n")
    return squad, text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--names", default="")
    ap.add_argument("--filler", default="")
    ap.add_argument("--articles", type=int, default=60)
    ap.add_argument("--paragraphs", type=int, default=1000, help="unlabeled paragraphs")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    squad, text = generate(
        a.out, names=a.names or None, filler=a.filler or None, articles=a.articles, unlabeled=a.paragraphs, seed=a.seed
    )
    print(f"wrote {squad} and {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
