"""Issue 31: every command block of README.md and docs/getting-started.md runs as written, twice in a row, in a fresh
working directory, with tiny overrides appended (and paper-sized numbers or placeholders replaced) so that it takes
seconds on a CPU. Each command is checked for exit 0 and its documented effect.

The commands are read from the documents themselves (```bash / ```python blocks, and the `xlgen ...` cells of the
README's task table): a command that is added or changed in a document and not listed here (to run, or to skip with
the reason) fails the test. The working directory holds what the repository directory holds for a user: `configs/`,
`launch/` and `.venv` (links to this checkout and to this Python's environment); plain `xlgen` / `python` resolve
to the environment's (an activated venv, as the README's table assumes). Data the commands name (`a.txt`, `MRPC`,
`data/raw/*.txt`, ...) are written by the test, small. `make demo` itself is not run here (it creates a venv and
installs; it is run twice by hand on a fresh clone); its training command with tiny overrides makes `workdirs/demo`.

The README's commands fall into chains that share no file (`lm`: the Transformer-XL runs, the demo and the tools that
read them; `xlnet`: XLNet pretraining, finetuning, export and the multi-process launcher; `data`: tokenizers, corpora,
the Python API block): each chain runs in a fresh working directory of its own, in document order, twice in a row.
This file runs `readme-lm` and `readme-data`; tests/test_doc_commands_xlnet_start.py runs `readme-xlnet` and
docs/getting-started.md (`start`).
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from test_train_utils import CPU_FAST_COMPILE, REPO, TINY, TINY_XLNET, compile_cache, xlgen_env  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


def doc_commands(path):
    """Commands of a markdown file: each command of a ```bash block (continuation lines joined, comments dropped; a
    block with `source`, `cd` or a loop is one script), each ```python block, and the `xlgen ...` table cells."""
    text = open(os.path.join(REPO, path)).read()
    out = []
    for m in re.finditer(r"```(bash|python)\n(.*?)```", text, re.S):
        kind, body = m.groups()
        if kind == "python" or "<<'EOF'" in body or re.search(r"^(source|cd|for) ", body, re.M):
            out.append(body.strip())
            continue
        cur = ""
        for line in body.splitlines():
            line = "" if line.lstrip().startswith("#") else re.sub(r"\s+#\s.*$", "", line).rstrip()
            if line.endswith("\\"):
                cur += line[:-1].strip() + " "
                continue
            cur = (cur + line.strip()).strip()
            if cur:
                out.append(re.sub(r"\s+", " ", cur))
            cur = ""
    out += re.findall(r"^\| [^|]+ \| `((?:xlgen|\.venv/bin/xlgen) [^`]*)`", text, re.M)
    return out


def tiny(over):
    return " ".join(f"--config.{k}={v}" for k, v in over.items())


# One layer: the commands' effects do not depend on depth (the layers are unrolled: each one is compiled).
TXL = tiny({**TINY, "model.n_layer": 1, "total_steps": 4, "checkpoint.every_steps": 4, "eval.steps": 2, "mesh.data": 1})
XLNET = tiny(
    {**TINY_XLNET, "model.n_layer": 1, "total_steps": 4, "checkpoint.every_steps": 4, "eval.steps": 2, "mesh.data": 1}
)
DEMO = tiny(
    {
        **{k: v for k, v in TINY.items() if not k.startswith("data.eval")},
        "total_steps": 4,
        "checkpoint.every_steps": 4,
        "eval.steps": 2,
        "eval.mem_len": 16,
        "eval_every_steps": -1,
        "model.n_layer": 1,
    }
)
FINETUNE = tiny(
    {
        "data.max_seq_length": 32,
        "data.batch_size": 4,
        "data.eval_batch_size": 8,
        "total_steps": 2,
        "eval_every_steps": -1,
        "optimizer.warmup_steps": 0,
    }
)


# ----------------------------------------------------------------------------------------------------------------
# Effects (cwd, pass 0 | 1, completed process)
# ----------------------------------------------------------------------------------------------------------------


def trained(step, again=None):
    """`done: step <step>.`; the second time (`again`: the step the run has reached by then) nothing to train."""

    def check(cwd, n, p):
        assert f"done: step {step if n == 0 else again or step}." in p.stdout, p.stdout[-2000:]
        if n == 1:  # the same command again: a finished run resumes with nothing to train
            assert "nothing to train" in p.stdout and "compiling" not in p.stdout, p.stdout[-2000:]

    return check


def evaluated(cwd, n, p):
    assert re.match(r"eval: (step \d+  valid|mem_len \d+)  loss \d+\.\d{4}", p.stdout), p.stdout


def plotted(cwd, n, p):
    png = os.path.join(cwd, p.stdout.strip().split("plot: ")[1])  # --out=demo.png prints it as given
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def prepared(out, stable=True):
    """A corpus with its manifest; the second time nothing is rewritten (`stable`: the tokenizer is the same file; a
    SentencePiece / WordPiece model retrained by the command before may differ in bytes, and then it re-tokenizes)."""

    def check(cwd, n, p):
        assert os.path.exists(os.path.join(cwd, out, "manifest.json"))
        assert "0 up to date" in p.stdout if n == 0 else "0 shard(s) written" in p.stdout or not stable, p.stdout

    return check


def wrote(*files):
    def check(cwd, n, p):
        for f in files:
            assert os.path.exists(os.path.join(cwd, f)), (f, p.stdout[-1000:])

    return check


def stdout_has(*texts):
    def check(cwd, n, p):
        for t in texts:
            assert t in p.stdout, (t, p.stdout[-2000:])

    return check


def hf_parity(cwd, n, p):
    diff = float(p.stdout.split("max |xlgen - HF| =")[1])
    assert diff < 1e-4 and "(2, 8, 1000) 2 (16, 2, 64)" in p.stdout, p.stdout


GENERATED = {}


def same_text(cwd, n, p):
    assert len(p.stdout) > 200
    GENERATED.setdefault(cwd, p.stdout)
    assert p.stdout == GENERATED[cwd]  # same seed, same text (and the same the second time)


def finetuned(cwd, n, p):
    res = json.load(open(os.path.join(cwd, "runs/mrpc/eval_results.json")))
    assert {"accuracy", "f1"} <= set(res), res


def exported(cwd, n, p):
    """transformers loads the export; an XLNet exported from a bi_data run gives logits for batch 1."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(os.path.join(cwd, "hf/mrpc")).eval()
    with torch.no_grad():
        assert hf(input_ids=torch.tensor([[10, 11, 12, 4, 3]])).logits.shape == (1, 2)


def exported_bi_data(cwd, n, p):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    assert json.load(open(os.path.join(cwd, "runs/xlnet/config.json")))["model"]["bi_data"] is True
    assert "bi_data (pretraining's forward/backward batch halves) is off" in p.stdout
    hf = transformers.XLNetLMHeadModel.from_pretrained(os.path.join(cwd, "hf/xlnet")).eval()
    with torch.no_grad():
        assert hf(input_ids=torch.tensor([[10, 11, 12, 13]])).logits.shape == (1, 4, 74)


def ok(cwd, n, p):
    pass


# ----------------------------------------------------------------------------------------------------------------
# The commands, in document order: (command as written, appended arguments, {written: replacement}, effect)
# ----------------------------------------------------------------------------------------------------------------

NOT_RUN = {
    "make demo": "creates .venv and installs xlgen: run twice by hand on a fresh clone (issue 31 acceptance)",
    "make test": "the test suite itself",
    "xlgen train --config=configs/pretrain/xlnet_large.py --config.data.source=data/xlnet --workdir=...": (
        "a placeholder workdir; XLNet-Large"
    ),
    "python -m data_pipelines.bench": "a benchmark at the paper's sequence length (minutes)",
    "xlgen plan --config=configs/pretrain/xlnet_large.py --topology=v3:16x32": (
        "AOT-compiles XLNet-Large for 1024 TPU cores (minutes; tests/test_plan.py compiles small plans)"
    ),
    "xlgen plan --config=configs/pretrain/xlnet_large.py --topologies=v4:4x4x8,v5e:16x16,v5p:4x4x8,v6e:16x16": (
        "AOT-compiles XLNet-Large for four 256-chip slices (8-15 minutes each; tests/test_plan.py sweeps small plans)"
    ),
    ".venv/bin/tensorboard --logdir workdirs/demo/tensorboard": (
        "a server that runs until stopped (tests/test_user_edges.py starts the printed TensorBoard command)"
    ),
}

README = [
    ("lm", "xlgen train --config=configs/pretrain/txl_tiny.py --workdir=workdirs/txl_tiny", TXL, {}, trained(4)),
    (
        "lm",
        "xlgen train --config=configs/pretrain/txl_tiny.py --config.optimizer.learning_rate=1e-3 "
        "--config.model.n_layer=4 --config.total_steps=2000 --workdir=workdirs/txl4",
        tiny({**TINY, "checkpoint.every_steps": 4, "mesh.data": 1}),
        {"total_steps=2000": "total_steps=4", "n_layer=4": "n_layer=1"},
        trained(4, again=8),  # extended to 8 below
    ),
    ("lm", "xlgen train --config=configs/pretrain/txl_tiny.py --workdir=workdirs/txl_tiny", TXL, {}, trained(4)),
    (
        "lm",
        "xlgen train --workdir=workdirs/txl4 --config.total_steps=4000",
        "",
        {"total_steps=4000": "total_steps=8"},
        trained(8),
    ),
    ("lm", "xlgen eval --workdir=workdirs/txl_tiny", "--config.eval.steps=2", {}, evaluated),
    ("lm", "xlgen plot --workdir=workdirs/txl_tiny --workdir=workdirs/txl4", "", {}, plotted),
    (
        "xlnet",
        "launch/local_multiprocess.sh 2 train --config=configs/pretrain/xlnet_tiny.py --workdir=workdirs/mp",
        tiny({**TINY_XLNET, "model.n_layer": 1, "total_steps": 2, "checkpoint.every_steps": 2}),
        {},
        stdout_has("done: step 2."),
    ),
    (
        "data",
        "xlgen prepare spm --input data/raw/*.txt --model_prefix data/spm/spiece --vocab_size 32000",
        "",
        {"32000": "300"},
        wrote("data/spm/spiece.model"),
    ),
    (
        "data",
        "xlgen prepare corpus --train data/raw/train-*.txt --valid data/raw/valid.txt --tokenizer "
        "spm:data/spm/spiece.model --layout sentences --output data/xlnet --workers 8",
        "--quiet",
        {},
        prepared("data/xlnet", stable=False),
    ),
    (
        "data",
        "xlgen prepare corpus --train wikitext-103/wiki.train.tokens --valid wikitext-103/wiki.valid.tokens "
        "--tokenizer word --output data/wt103",
        "--quiet",
        {},
        prepared("data/wt103"),
    ),
    (
        "data",
        "xlgen prepare corpus --train enwik8/train.txt --valid enwik8/valid.txt --tokenizer byte --output data/enwik8",
        "--quiet",
        {},
        prepared("data/enwik8"),
    ),
    (
        "data",
        "xlgen prepare wordpiece --input data/raw/*.txt --output_dir data/wp --vocab_size 30522",
        "",
        {"30522": "400"},
        wrote("data/wp/vocab.txt"),
    ),
    (
        "data",
        "xlgen prepare corpus --train data/raw/*.txt --tokenizer wordpiece:data/wp/vocab.txt --output data/funnel",
        "--quiet",
        {},
        prepared("data/funnel", stable=False),
    ),
    ("data", "xlgen prepare show --help", "", {}, stdout_has("usage: xlgen prepare show")),
    ("data", "PYTHON_API", "", {}, hf_parity),
    ("xlnet", "xlgen train --config=configs/pretrain/xlnet_tiny.py --workdir=runs/xlnet", XLNET, {}, trained(4)),
    ("xlnet", "xlgen eval --workdir=runs/xlnet", "--config.eval.steps=2", {}, evaluated),
    (
        "xlnet",
        "xlgen plot --workdir=runs/a [--workdir=runs/b ...]",
        "",
        {"runs/a [--workdir=runs/b ...]": "runs/xlnet"},
        plotted,
    ),
    (
        "data",
        "xlgen config show --config=configs/pretrain/xlnet_tiny.py [--config.KEY=VALUE ...]",
        "",
        {" [--config.KEY=VALUE ...]": ""},
        stdout_has("total_steps = 200", "model.bi_data = True"),
    ),
    (
        "data",
        "xlgen prepare corpus --train a.txt --tokenizer spm:spiece.model --output data/xlnet",
        "--quiet",
        {"data/xlnet": "data/xlnet_a"},
        prepared("data/xlnet_a"),
    ),
    (
        "xlnet",
        "xlgen finetune --config=configs/finetune/glue.py --config.task=glue/mrpc --config.data_dir=MRPC "
        "--config.init_from=runs/xlnet --workdir=runs/mrpc",
        FINETUNE,
        {},
        finetuned,
    ),
    ("lm", "DEMO", "", {}, trained(4)),
    (
        "lm",
        'xlgen generate --workdir=workdirs/demo --prompt="ROMEO:" --max_new_tokens=200 --seed=0',
        "",
        {},
        same_text,
    ),
    (
        "lm",
        "xlgen eval --workdir=workdirs/demo --config.eval.mem_len=32,64,128,256",
        "--config.eval.steps=2",
        {},
        stdout_has("eval: mem_len 256  loss ", "sweep: "),
    ),
    (
        "lm",
        "xlgen analyze recl --workdir=A --workdir=B",
        "--delta=16 --max_context=32 --max_tokens=256 --segment=16",
        {"=A ": "=workdirs/demo ", "=B": "=workdirs/txl_tiny"},
        wrote("workdirs/demo/recl.json", "workdirs/demo/recl.png"),
    ),
    ("xlnet", "xlgen export --workdir=runs/mrpc --to-hf=hf/mrpc", "", {}, exported),
    ("xlnet", "EXPORT_BI_DATA", "", {}, exported_bi_data),
]

GETTING_STARTED = [
    ("start", "DEMO", "", {}, trained(4)),
    ("start", "source .venv/bin/activate\nxlgen --version", "", {}, stdout_has("xlgen ")),
    ("start", ".venv/bin/xlgen plot --workdir=workdirs/demo", "", {}, plotted),
    (
        "start",
        ".venv/bin/xlgen train --config=configs/pretrain/demo.py --config.optimizer.learning_rate=4e-3 "
        "--workdir=workdirs/b",
        DEMO,
        {},
        trained(4),
    ),
    ("start", ".venv/bin/xlgen plot --workdir=workdirs/demo --workdir=workdirs/b", "", {}, plotted),
    (
        "start",
        ".venv/bin/xlgen plot --workdir=workdirs/demo --out=/tmp/demo.png",
        "",
        {"/tmp/demo.png": "demo.png"},
        plotted,
    ),
    (
        "start",
        ".venv/bin/xlgen config show --config=configs/pretrain/demo.py",
        "",
        {},
        stdout_has("model.d_model = 96"),
    ),
    ("start", "PYTHON_SECTION_3", "", {}, stdout_has("ROMEO:")),
    (
        "start",
        ".venv/bin/xlgen prepare spm --input data/raw/*.txt --model_prefix data/spm/spiece --vocab_size 8000",
        "",
        {"8000": "300"},
        wrote("data/spm/spiece.model"),
    ),
    (
        "start",
        ".venv/bin/xlgen prepare corpus --train data/raw/train.txt --valid data/raw/valid.txt --tokenizer "
        "spm:data/spm/spiece.model --layout sentences --output data/mine",
        "--quiet",
        {},
        prepared("data/mine", stable=False),
    ),
    (
        "start",
        ".venv/bin/xlgen train --config=configs/pretrain/xlnet_tiny.py --config.data.source=data/mine "
        "--config.model.vocab_size=8000 --workdir=workdirs/mine",
        XLNET,
        {"vocab_size=8000": "vocab_size=300"},
        trained(4),
    ),
]

# Pseudo-entries: the document's multi-line blocks (matched by their first line) and the demo's training command.
BLOCKS = {
    "PYTHON_API": ".venv/bin/python - <<'EOF'",
    "PYTHON_SECTION_3": "import numpy as np",
}
EXTRA = {
    "DEMO": f".venv/bin/xlgen train --config=configs/pretrain/demo.py {DEMO} --workdir=workdirs/demo",
    "EXPORT_BI_DATA": "xlgen export --workdir=runs/xlnet --to-hf=hf/xlnet",
}
NOT_RUN_PREFIXES = {  # commands that need a download
    "xlgen finetune --config=configs/finetune/": "models/xlnet-large-cased",
    ".venv/bin/xlgen finetune --config=configs/finetune/glue.py:rte": "models/xlnet-base-cased",
    "xlgen eval --workdir=runs/rte": "",
    ".venv/bin/xlgen eval --workdir=runs/rte": "",
    ".venv/bin/xlgen plot --workdir=runs/rte": "",
    "mkdir -p models/xlnet-base-cased": "",
}


def _fixtures(cwd):
    """What the documents' commands read: text files cut from the embedded corpus, a SentencePiece model for
    `spm:spiece.model`, a synthetic MRPC directory."""
    from data_pipelines import vocab
    from xlgen.finetune.readers import synthetic

    text = open(os.path.join(REPO, "data_pipelines/assets/tinyshakespeare.txt")).read()
    paras = [p for p in text[:60000].split("\n\n") if p.strip()]
    files = {
        "data/raw/train-0.txt": paras[0::3],
        "data/raw/train-1.txt": paras[1::3],
        "data/raw/valid.txt": paras[2::3][:20],
        "data/raw/train.txt": paras[0::3] + paras[1::3],
        "a.txt": paras[:40],
        "wikitext-103/wiki.train.tokens": paras[:60],
        "wikitext-103/wiki.valid.tokens": paras[60:80],
        "enwik8/train.txt": paras[:60],
        "enwik8/valid.txt": paras[60:80],
    }
    for name, ps in files.items():
        os.makedirs(os.path.join(cwd, os.path.dirname(name)), exist_ok=True)
        with open(os.path.join(cwd, name), "w") as f:
            f.write("\n\n".join(ps) + "\n")
    vocab.train_sentencepiece([os.path.join(cwd, "a.txt")], os.path.join(cwd, "spiece"), vocab_size=200)
    synthetic.write_glue(os.path.join(cwd, "MRPC"), "mrpc", n_train=32, n_dev=16, n_test=4)
    for name in ("configs", "launch"):
        os.symlink(os.path.join(REPO, name), os.path.join(cwd, name))
    os.symlink(sys.prefix, os.path.join(cwd, ".venv"))


def _resolve(entries, written, chain):
    """(label, script to run, effect) per entry of `chain`, in document order; asserts the whole list covers the
    document exactly."""
    covered, out = set(), []
    for name, cmd, extra, replace, check in entries:
        if cmd in BLOCKS:
            block = next(c for c in written if c.startswith(BLOCKS[cmd]))
            covered.add(block)
            script = block if block.startswith(".venv/bin/") else f".venv/bin/python - <<'EOF'\n{block}\nEOF"
        elif cmd in EXTRA:
            script = EXTRA[cmd]
        else:
            assert cmd in written, f"not in the document any more: {cmd}"
            covered.add(cmd)
            script = cmd
        for a, b in replace.items():
            assert a in script, (a, script)
            script = script.replace(a, b)
        if extra:
            script = (
                script.replace(" --workdir=", f" {extra} --workdir=", 1)
                if "--workdir=" in script
                else (f"{script} {extra}")
            )
        if name == chain:
            out.append((cmd, script, check))
    skipped = {c for c in written if c in NOT_RUN or any(c.startswith(p) for p in NOT_RUN_PREFIXES)}
    skipped |= {c for c in written if "curl" in c}
    missing = [c for c in written if c not in covered | skipped]
    assert not missing, f"document commands neither run nor skipped (add them to {__file__}): {missing}"
    assert out, f"no command of {chain!r}"
    return out


DOCS = {"readme": ("README.md", README), "start": ("docs/getting-started.md", GETTING_STARTED)}


def run_chain_twice(doc_chain, tmp_path, compile_cache):  # noqa: F811
    """Runs the commands of one chain of a document (`readme-lm`: commands that read each other's outputs; the
    chains share nothing) in a fresh working directory, in document order, then all of them again in that order;
    checks each one's exit status and effect after each run."""
    if not os.path.exists(os.path.join(sys.prefix, "bin", "xlgen")):
        pytest.skip("the documents' commands name the environment's `xlgen` script, which is not installed here")
    doc, chain = doc_chain.split("-") if "-" in doc_chain else (doc_chain, doc_chain)
    path, entries = DOCS[doc]
    script_list = _resolve(entries, doc_commands(path), chain)
    cwd = str(tmp_path / "fresh")
    os.makedirs(cwd)
    _fixtures(cwd)
    env = xlgen_env(compile_cache, devices=1)
    env["PATH"] = os.path.join(sys.prefix, "bin") + os.pathsep + env["PATH"]
    env["XLGEN_XLA_FLAGS"] = CPU_FAST_COMPILE  # launch/local_multiprocess.sh sets its own device count:
    env["DEVICES_PER_PROCESS"] = "1"  # its 2 processes hold one device each (the default is 4)
    for n in range(2):
        for label, script, check in script_list:
            p = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
            assert p.returncode == 0, (
                f"pass {n + 1}: {script}\nexit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
            )
            check(cwd, n, p)
    if os.path.exists(os.path.join(cwd, "workdirs/demo")):
        assert np.isfinite(json.load(open(os.path.join(cwd, "workdirs/demo/summary.json")))["last_eval"]["loss"])


# Two chains here, two in tests/test_doc_commands_xlnet_start.py (pytest-xdist gives each file to one worker).
@pytest.mark.parametrize("doc_chain", ["readme-lm", "readme-data"])
def test_document_commands_run_twice(doc_chain, tmp_path, compile_cache):  # noqa: F811
    run_chain_twice(doc_chain, tmp_path, compile_cache)
