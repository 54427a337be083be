"""The layers of `xlgen/` and `data_pipelines/`: every import (function-local ones included, as `test_import_graph`
reads them) goes to the importer's own layer or one below it, and the top of `xlgen/` stays small.

    data        data_pipelines                           corpora, tokenizers, batch pipelines, paths
    core        xlgen.version, platforms, domains,       the version, platform set-up, config-key domains,
                sharding                                 logical-axis sharding
    models      xlgen.models                             model families, the `Family` / `Objective` records
    registry    xlgen.registry, xlgen.config             the systems by name, config loading
    train       xlgen.train                              program, loop, optimizer, checkpoints, workdir
    apps        xlgen.systems, finetune, plan, bench,    what runs on the trainer: systems that are not LM
                analyze, interop, deploy, generate,      families, finetuning, planning, benchmarks, analyses,
                pretrained                               other frameworks' formats, serving, sampling, loading
    entry       xlgen (the package: `from_pretrained`),  the Python API and the command line
                xlgen.cli
    scripts     xlgen.reproductions                      experiment scripts that drive the command line

What a lower layer needs from a higher one it receives from its caller (the optimizer gets the family's
`layer_ids`, the FLOP count the family's `FlopCount`); the registry reaches the systems by module path, imported
when a run names one, not by an import statement. A system's record module (the module the registry's `SYSTEMS`
names, e.g. `xlgen.models.xlnet.family`) is an application whichever package holds it: nothing imports it, and it
names the optional records the applications define (`Finetuning`, `Interop`, `Stream`, ...).
"""

from __future__ import annotations

import ast
import os

from test_import_graph import PACKAGES, ROOT, _modules, import_graph

LAYERS = (
    ("data", ("data_pipelines",)),
    ("core", ("xlgen.version", "xlgen.platforms", "xlgen.domains", "xlgen.sharding")),
    ("models", ("xlgen.models",)),
    ("registry", ("xlgen.registry", "xlgen.config")),
    ("train", ("xlgen.train",)),
    (
        "apps",
        (
            "xlgen.systems",
            "xlgen.finetune",
            "xlgen.plan",
            "xlgen.bench",
            "xlgen.analyze",
            "xlgen.interop",
            "xlgen.deploy",
            "xlgen.generate",
            "xlgen.pretrained",
        ),
    ),
    ("entry", ("xlgen", "xlgen.cli")),
    ("scripts", ("xlgen.reproductions",)),
)
MAX_TOP_LEVEL_MODULES = 10  # modules directly in xlgen/ (.py files besides the package's __init__.py)


def record_modules() -> frozenset:
    """The system record modules named in the `SYSTEMS` literal of xlgen/registry.py (read as text)."""
    tree = ast.parse(open(os.path.join(ROOT, "xlgen", "registry.py"), encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "SYSTEMS":
            return frozenset(ref.split(":")[0] for ref in ast.literal_eval(node.value).values())
    raise AssertionError("xlgen/registry.py: no SYSTEMS literal")


RECORD_MODULES = record_modules()


def layer_of(module: str) -> int:
    """Index in LAYERS of the longest listed prefix of `module` (a package covers its submodules); a system's
    record module is in the applications layer."""
    if module in RECORD_MODULES:
        return [name for name, _ in LAYERS].index("apps")
    best, index = "", None
    for i, (_, members) in enumerate(LAYERS):
        for m in members:
            if (module == m or module.startswith(m + ".")) and len(m) > len(best):
                best, index = m, i
    if index is None:
        raise KeyError(module)
    return index


def upward_imports(graph):
    """[(importer, imported)] whose imported module sits in a higher layer than its importer."""
    return sorted((src, dst) for src, targets in graph.items() for dst in targets if layer_of(dst) > layer_of(src))


def test_every_module_has_a_layer():
    """A new top-level module or package is placed in LAYERS (it is not covered by accident)."""
    unplaced = []
    for m in _modules():
        try:
            layer_of(m)
        except KeyError:
            unplaced.append(m)
    assert not unplaced, f"modules in no layer (add them to LAYERS): {unplaced}"
    assert set(PACKAGES) <= {m for _, members in LAYERS for m in members}


def test_layer_order_is_checked():
    """The check is not vacuous: a model importing the trainer, the FLOP count importing the registry, the package
    facade reached from below are upward; the trainer importing a model is not."""
    assert layer_of("xlgen.models.xlnet.model") < layer_of("xlgen.train.loop") < layer_of("xlgen.cli")
    assert layer_of("xlgen.registry") > layer_of("xlgen.models.family")
    assert layer_of("xlgen.models.xlnet.family") == layer_of("xlgen.finetune.record") > layer_of("xlgen.models.xlnet")
    assert upward_imports({"xlgen.models.layers": {"xlgen.train.program"}}) == [
        ("xlgen.models.layers", "xlgen.train.program")
    ]
    assert upward_imports({"xlgen.models.cost": {"xlgen.registry"}}) == [("xlgen.models.cost", "xlgen.registry")]
    assert upward_imports({"xlgen.config": {"xlgen"}}) == [("xlgen.config", "xlgen")]
    assert upward_imports({"xlgen.train.program": {"xlgen.models.xlnet.model"}}) == []


def test_no_import_runs_up_the_layers():
    up = upward_imports(import_graph())
    assert not up, "imports running up the layers (importer -> imported):\n" + "\n".join(
        f"  {s} ({LAYERS[layer_of(s)][0]}) -> {d} ({LAYERS[layer_of(d)][0]})" for s, d in up
    )


def test_optimizer_and_flop_count_receive_the_system_hooks():
    """The optimizer and the FLOP count get the system's `layer_ids` / `train_flops` from their caller: neither
    looks a system up by name."""
    graph = import_graph()
    for module in ("xlgen.train.optim", "xlgen.models.cost"):
        assert "xlgen.registry" not in graph[module], module


def test_top_of_the_package_is_small():
    top = sorted(f for f in os.listdir(os.path.join(ROOT, "xlgen")) if f.endswith(".py") and f != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, (
        f"{len(top)} modules directly in xlgen/ (at most {MAX_TOP_LEVEL_MODULES}): {top}"
    )
