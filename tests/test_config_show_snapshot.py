"""`xlgen config show` of every config file, every `get_config(ARG)` variant the docs name and a few command-line
overrides they use, byte for byte against the fixtures in tests/fixtures/config_show/ (one file per config; `:` of
`path:ARG` spelled `__`). A refactor of configs/ must leave every resolved config as it was; a change of a key's
value or a new key is regenerated on purpose, in its own commit:

    PYTHONPATH=$PWD python tests/test_config_show_snapshot.py --regenerate
"""

import glob
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "config_show")

# get_config(ARG) variants named in README, docs/ and CONTRACTS.md
VARIANTS = (
    [f"configs/finetune/glue.py:{task}" for task in ("cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb")]
    + ["configs/finetune/glue.py:wnli"]
    + [f"configs/pretrain/xlnet.py:{arg}" for arg in ("large", "large_bsz8192", "base", "tiny")]
    + ["configs/pretrain/funnel.py:B6-3x2-3x2H768_electra", "configs/pretrain/funnel.py:B4-4-4H768_mlm"]
    + ["configs/textgan/initialgan.py:tiny", "configs/textgan/initialgan.py:small"]
)
# (name, config, overrides): documented command lines whose overrides change more than the key they set
OVERRIDES = (
    (
        "funnel_tiny_electra",
        "configs/pretrain/funnel_tiny.py",
        {"objective": "funnel_electra", "data.pipeline": "electra"},
    ),
    ("txl_tiny_mos", "configs/pretrain/txl_tiny.py", {"model.output_layer": "mos"}),
    ("finetune_tiny_funnel_race", "configs/finetune/tiny_funnel.py", {"task": "race"}),
)


def config_files():
    """Every config file under configs/ (a module with `get_config`), as a path relative to the repository."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            if "\ndef get_config(" in f.read():
                out.append(os.path.relpath(path, ROOT))
    return out


def cases():
    """{fixture name: (config spec, overrides)}."""
    out = {}
    for spec in config_files() + VARIANTS:
        out[spec.removeprefix("configs/").replace(":", "__") + ".txt"] = (spec, {})
    for name, spec, overrides in OVERRIDES:
        out[f"overrides/{name}.txt"] = (spec, overrides)
    return out


def render(spec: str, overrides: dict) -> str:
    """What `xlgen config show --config=SPEC --config.K=V ...` prints, run from the repository root."""
    from xlgen import cli
    from xlgen import config as config_lib

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        return cli.config_show_text(config_lib.load_config(spec, overrides))
    finally:
        os.chdir(cwd)


CASES = cases()


def test_every_config_file_has_a_fixture():
    have = {os.path.relpath(p, FIXTURES) for p in glob.glob(os.path.join(FIXTURES, "**", "*.txt"), recursive=True)}
    assert set(CASES) == have, "regenerate: PYTHONPATH=$PWD python tests/test_config_show_snapshot.py --regenerate"


@pytest.mark.parametrize("name", sorted(CASES))
def test_config_show_unchanged(name):
    spec, overrides = CASES[name]
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        want = f.read()
    assert render(spec, overrides) == want, f"xlgen config show --config={spec} {overrides or ''} changed"


def regenerate():
    for path in glob.glob(os.path.join(FIXTURES, "**", "*.txt"), recursive=True):
        os.remove(path)
    for name, (spec, overrides) in sorted(CASES.items()):
        path = os.path.join(FIXTURES, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(render(spec, overrides))
    print(f"wrote {len(CASES)} fixtures under {os.path.relpath(FIXTURES)}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(f"usage: {sys.argv[0]} --regenerate")
    regenerate()
