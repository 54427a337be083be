"""Source rules of the layout (issue 29's acceptance), checked over every module of `xlgen/` and `data_pipelines/`
with stdlib `ast` (nothing imported, nothing run):

* a system is answered for by its own package: no comparison against a family / system name, and no lookup in a
  literal keyed by one, outside that system's package (and its reproduction script); no comparison of a data
  pipeline name outside `data_pipelines/`, the package that defines the pipelines;
* no module imports a system's package except that package itself and the registry (a system is imported when a
  run asks for it);
* the relative-attention core holds no platform-specific code.

Import cycles (between modules and between packages) are `tests/test_import_graph.py`.
"""

from __future__ import annotations

import ast
import os

from test_import_graph import _modules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# config.model.family -> the package that owns it (xlgen.registry.SYSTEMS, read as text: this test imports nothing)
PIPELINE_NAMES = ("lm", "xlnet", "mlm", "electra")  # data_pipelines.PIPELINES


def _systems():
    """{system name: package directory (relative)} from the `SYSTEMS` literal of xlgen/registry.py."""
    tree = ast.parse(open(os.path.join(ROOT, "xlgen", "registry.py"), encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "SYSTEMS":
            refs = ast.literal_eval(node.value)
            return {name: ref.split(":")[0].rsplit(".", 1)[0].replace(".", "/") for name, ref in refs.items()}
    raise AssertionError("xlgen/registry.py: no SYSTEMS literal")


def _owned_by(rel: str, package: str) -> bool:
    """A file belongs to a system: its package, or its reproduction script `xlgen/reproductions/<package name>.py`."""
    return rel.startswith(package + "/") or rel == f"xlgen/reproductions/{package.rsplit('/', 1)[-1]}.py"


def _names_in(node) -> set:
    """String constants of a node: a constant, or the constants of a literal tuple / list / set / dict's keys."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    if isinstance(node, ast.Dict):
        return {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return set()


def name_branches(tree):
    """(line, names, source) of every comparison against string constants (`x == "a"`, `x in ("a", "b")`,
    `match` cases) and every lookup in a dict literal (`{"a": ...}[x]`, `{"a": ...}.get(x)`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = set().union(*(_names_in(o) for o in operands))
            other = " ".join(ast.unparse(o) for o in operands if not _names_in(o))
            yield node.lineno, names, other
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict):
            yield node.lineno, _names_in(node.value), ast.unparse(node.slice)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and isinstance(node.func.value, ast.Dict)
        ):
            yield node.lineno, _names_in(node.func.value), " ".join(ast.unparse(a) for a in node.args)
        elif isinstance(node, ast.match_case):
            yield (
                node.pattern.lineno,
                {
                    n.value.value
                    for n in ast.walk(node.pattern)
                    if isinstance(n, ast.MatchValue) and isinstance(n.value, ast.Constant)
                },
                "",
            )


def _trees():
    for path in sorted(_modules().values()):
        rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
        with open(path, encoding="utf-8") as f:
            yield rel, ast.parse(f.read(), filename=path)


def test_the_rules_see_what_they_look_for():
    """Not vacuous: every form of branch is found, and the systems are read from the registry."""
    code = (
        "if f == 'xlnet': pass\n"
        "if f in ('funnel', 'x'): pass\n"
        "y = {'transformer_xl': 'lm'}.get(f, 'x')\n"
        "z = {'xlnet': 1}[f]\n"
        "if config.data.pipeline != 'mlm': pass\n"
        "match f:\n    case 'funnel': pass\n"
    )
    found = sorted((line, names) for line, names, _ in name_branches(ast.parse(code)) if names)
    assert found == [(1, {"xlnet"}), (2, {"funnel", "x"}), (3, {"transformer_xl"}), (4, {"xlnet"}), (5, {"mlm"}),
                     (7, {"funnel"})], found  # fmt: skip
    systems = _systems()
    assert systems["xlnet"] == "xlgen/models/xlnet" and systems["cegan"] == "xlgen/systems/gan"
    assert _owned_by("xlgen/reproductions/gan.py", systems["badgan"])
    assert not _owned_by("xlgen/interop/export.py", systems["transformer_xl"])


def test_no_system_or_pipeline_name_branches_outside_their_package():
    systems = _systems()
    offenders = []
    for rel, tree in _trees():
        if rel == "xlgen/registry.py":
            continue
        for line, names, other in name_branches(tree):
            for name in sorted(names):
                if name in PIPELINE_NAMES and "pipeline" in other:  # "xlnet" names a pipeline and a family
                    if not rel.startswith("data_pipelines/"):
                        offenders.append(f"{rel}:{line}: pipeline {name!r} ({other})")
                elif name in systems and not _owned_by(rel, systems[name]):
                    offenders.append(f"{rel}:{line}: {name!r} ({other})")
    assert not offenders, "branches on a system or pipeline name outside its package:\n" + "\n".join(offenders)


def test_systems_are_imported_only_through_the_registry():
    """No module outside a system's package imports it (the registry names it by module path and imports it when a
    run asks for it); `xlgen.reproductions.<package name>` may, being that system's experiments."""
    systems = _systems()
    packages = {p.replace("/", ".") for p in systems.values()}
    offenders = []
    for rel, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                for pkg in packages:
                    if (target == pkg or target.startswith(pkg + ".")) and not _owned_by(rel, pkg.replace(".", "/")):
                        offenders.append(f"{rel}:{node.lineno}: imports {target}")
    assert not offenders, "system packages imported outside the registry:\n" + "\n".join(sorted(set(offenders)))


def test_relative_attention_core_has_no_platform_code():
    """`xlgen/models/relative_attention.py` reads as the papers: no backend queries, no platform switches, no
    import of the platform-tuning module."""
    path = os.path.join(ROOT, "xlgen", "models", "relative_attention.py")
    tree = ast.parse(open(path, encoding="utf-8").read())
    platform_calls = {"default_backend", "platform_dependent", "devices", "local_devices", "get_backend"}
    offenders = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in platform_calls | {"platform"}:
            offenders.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in platform_calls:
            offenders.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] + ([node.module] if getattr(node, "module", None) else [])
            mods += [f"{node.module}.{a.name}" for a in node.names] if getattr(node, "module", None) else []
            if any(m.split(".")[-1] in ("xla_cpu", "platforms") for m in mods):
                offenders.append(f"{node.lineno}: imports {mods}")
        elif isinstance(node, ast.Constant) and node.value in ("cpu", "tpu", "gpu", "cuda", "rocm"):
            offenders.append(f"{node.lineno}: {node.value!r}")
    assert not offenders, "platform-specific code in relative_attention.py:\n" + "\n".join(offenders)
