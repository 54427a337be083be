"""The library's comments, docstrings and documents are reference text: they state what the code does and why, with
figures as current reference values, never the history of the work or the machine and occasion of a measurement.

Scanned (stdlib only, nothing imported or run): the comments and docstrings of every `.py` file under `xlgen/`,
`data_pipelines/` and `configs/`, the comment lines of `launch/` scripts, and every line of `README.md` and
`docs/**.md`. Not scanned: benchmark and reproduction result files (`docs/bench/`, `docs/reproductions/`), the
corpora in `data_pipelines/assets/`, and the block `make bench` writes into docs/performance.md (its labels name
the commits measured). A finding names file:line and the phrase.

The phrases are those of a lab notebook: the machine ("this VM", "this machine"), the occasion ("this session",
"this round", "until now"), the history ("previously", "no longer", "used to be", "was X, now Y", "before this
change", "we tried"), before → after figures in code comments, and commit ids (7+ hex digits) anywhere but in the
result files and their paths.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY_DIRS = ("xlgen", "data_pipelines", "configs")
SKIP_DIRS = ("docs/bench", "docs/reproductions", "data_pipelines/assets")
BENCH_BLOCK = re.compile(r"<!-- xlgen bench: begin -->.*?<!-- xlgen bench: end -->", re.S)

# (what it narrates, pattern); case-insensitive, matched within one line of text.
NARRATION = [
    ("the machine", r"\bthis (?:\S+ )?(?:vm|machine|box|computer|laptop|workstation)\b"),
    ("the machine", r"\b(?:on|of) (?:this|our|the shared|a shared) (?:\S+ ){0,2}(?:cpu|vm|host)\b"),
    ("the occasion", r"\b(?:this|that|last|the previous|the last) (?:session|round|sprint|iteration of the work)\b"),
    ("the occasion", r"\b(?:until|as of|so far|up to) (?:now|today|this \w+)\b"),
    ("history", r"\b(?:previously|formerly|anymore|no longer|hitherto)\b"),
    ("history", r"\b(?:used to be|we used to|it used to|used to (?:take|run|cost|read|write|call|fail|be))\b"),
    ("history", r"\b(?:before|after|since) (?:this|that|the) (?:change|commit|fix|patch|refactor|redesign|rewrite)\b"),
    ("history", r"\b(?:we|i) (?:tried|measured|found|changed|removed|replaced|decided|switched)\b"),
    ("history", r"\bwas\b[^.;:]{0,60}\bnow\b"),
    (
        "history",
        r"\b(?:the|an?) (?:old|older|earlier|original xlgen|previous) (?:code|version|method|implementation|run|runs|tree|form|behaviou?r)\b",
    ),
    ("history", r"\bwhat changed (?:this|in|since|it)\b|\bchanged in (?:this|the last)\b"),
    ("history", r"\btried and not kept\b"),
    ("history", r"\bearlier runs?\b|\bkept as (?:it|they) (?:was|were)\b|^\W*earlier:"),
    ("history", r"\b(?:earlier|older|previous) xlgen\b|\bxlgen(?:'s)? (?:before|earlier)\b"),
    ("history", r"\bbefore\b[^.;:(]{0,40}\bnow\b|\b(?:is|are|were|configs) now\b|^\W*now\b"),
    ("history", r"\bnow (?:run|runs|take|takes|equal|equals|use|uses|read|reads|gathered|constrained)\b"),
    ("the occasion", r"\b(?:issue|session)[- ]\d+\b|\bother jobs\b|\bunder heavy load\b"),
    (
        "the machine",
        r"\b(?:the|this|our) (?:heavily )?shared (?:\S+ )?(?:cpu|machine|load|vm)\b|\(heavily shared\)|(?<![\w.])/work/",
    ),
]
NARRATION = [(what, re.compile(p, re.I)) for what, p in NARRATION]
# a commit id: 7-40 hex digits with both a digit and a letter, not a 0x literal (an upstream repository's
# "snapshot <id>" is a citation)
COMMIT = re.compile(
    r"(?<!snapshot )(?<![0-9A-Za-z_x])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![0-9A-Za-z_])"
)
# a result folder's path may name the tree it measured (docs/bench/standard-set-<commit>/)
RESULT_PATH = re.compile(r"\bdocs/bench/[\w./-]*")
# before -> after figures: "23 → 6.6 ms", "1.17x -> 1.25x" (code comments and docstrings only)
BEFORE_AFTER = re.compile(r"\d(?:[\d.,]*\d)?\s*(?:%|×|x|ms|µs|s|GB|MB|GFLOP/s)?\s*(?:→|->)\s*\d")


def _python_text(path: str):
    """(line, text) of every comment and docstring of a Python file."""
    yield from _python_source_text(open(path, encoding="utf-8").read())


def _python_source_text(src: str):
    """(line, text) of every comment and docstring of Python source."""
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                doc = body[0].value
                if isinstance(doc.value, str):
                    for i, line in enumerate(doc.value.splitlines()):
                        yield doc.lineno + i, line


def _markdown_text(path: str):
    """(line, text) of a markdown file, without the block `make bench` generates."""
    src = open(path, encoding="utf-8").read()
    src = BENCH_BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), src)
    yield from enumerate(src.splitlines(), 1)


def _shell_text(path: str):
    for i, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.lstrip().startswith("#"):
            yield i, line


def _files():
    """(relative path, (line, text) iterator factory, is code) of every scanned file."""
    out = [("README.md", _markdown_text, False)]
    for top, reader, exts, code in [
        *[(d, _python_text, (".py",), True) for d in PY_DIRS],
        ("docs", _markdown_text, (".md",), False),
        ("launch", _shell_text, (".sh",), True),
    ]:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            rel_dir = os.path.relpath(dirpath, ROOT)
            dirnames[:] = sorted(d for d in dirnames if os.path.join(rel_dir, d) not in SKIP_DIRS)
            out += [(os.path.join(rel_dir, f), reader, code) for f in sorted(filenames) if f.endswith(exts)]
    return out


def findings(rel: str, reader, code: bool):
    """'file:line: what: "phrase"' for every narration in one file."""
    out = []
    for line, text in reader(os.path.join(ROOT, rel)):
        hits = [(what, m.group(0)) for what, rx in NARRATION for m in rx.finditer(text)]
        hits += [("a commit id", m.group(0)) for m in COMMIT.finditer(RESULT_PATH.sub("", text))]
        if code:
            hits += [("before/after figures", m.group(0)) for m in BEFORE_AFTER.finditer(text)]
        out += [f"{rel}:{line}: {what}: {phrase!r}" for what, phrase in hits]
    return out


def test_no_narration_in_comments_docstrings_and_docs():
    """Every comment, docstring and document line is free of the notebook phrases above (file:line listed)."""
    found = [f for rel, reader, code in _files() for f in findings(rel, reader, code)]
    assert not found, "narration in reference text (state what the code does, not its history):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "text",
    [
        "# on this 2-core VM the step takes 2.4 s",
        "# this was 23 ms, now 6.6 ms",
        '"""Previously the mask came from threefry."""',
        "# shift backward 23 → 6.6 ms per layer",
        "# measured at commit 4842bb7",
        "# until this session the article came first",
    ],
)
def test_the_scan_finds_each_kind_of_narration(text):
    """The scanner is not vacuous: each kind of phrase it is for is found, on its line."""
    found = findings("m.py", lambda _: _python_source_text(text + "\nx = 1\n"), True)
    assert found and {f.split(": ")[0] for f in found} == {"m.py:1"}


def test_reference_figures_and_code_pass():
    """What reference text says is not flagged: a stated setup, shapes, mappings, constants."""
    src = (
        '"""Measured on a 2-core CPU: 1.96× HF. pi: [..., ps] -> [..., m]. A key is used to draw the mask;\n'
        'kept on disk, out of the step list. 0x9E3779B9 is the golden-ratio constant. Step 4, 5 and 6."""\n'
        "x = 1  # [b, q] -> [b, q, d]\n"
    )
    assert findings("m.py", lambda _: _python_source_text(src), True) == []
