"""The module import graph of `xlgen/` and `data_pipelines/` has no cycle, between modules nor between packages.

Built with stdlib `ast` from every `import` / `from ... import` statement of every module, including the imports
inside functions (a function-local import hides a cycle from Python's import machinery, not from the design). An
edge goes to the imported module itself: `from xlgen.models import family` -> `xlgen.models.family` when that
is a module, else -> `xlgen.models`. Importing a package runs its `__init__`, so `import xlgen.models.xlnet.model`
also reaches `xlgen.models.xlnet` (edges to the parent packages of the target, not counting the importer's own
ancestors, which Python has already imported).
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("xlgen", "data_pipelines")


def _modules():
    """{dotted module name: file path} of every .py file under the packages."""
    out = {}
    for pkg in PACKAGES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, pkg)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                if not f.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[: -len(".py")].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(dirpath, f)
    return out


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([name] if name else []))


def import_graph():
    """{module: set of modules it imports} restricted to the packages."""
    modules = _modules()
    graph = {m: set() for m in modules}

    def known(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def add(src, target):
        target = known(target)
        if target is None or target == src:
            return
        graph[src].add(target)
        parent = target.rpartition(".")[0]
        while parent:  # importing a submodule runs its packages' __init__ first
            if parent in modules and not src.startswith(parent + ".") and parent != src:
                graph[src].add(parent)
            parent = parent.rpartition(".")[0]

    for mod, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        is_package = path.endswith("__init__.py")
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(mod, alias.name)
            elif isinstance(node, ast.ImportFrom):
                base = (
                    _resolve_relative(mod, is_package, node.level, node.module) if node.level else (node.module or "")
                )
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    add(mod, full if full in modules else base)
    return graph


def find_cycle(graph):
    """One cycle as a list of modules [a, b, ..., a], or None (iterative DFS)."""
    color = {m: 0 for m in graph}  # 0 unvisited, 1 on the stack, 2 done
    for start in sorted(graph):
        if color[start]:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        color[start] = 1
        path = [start]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = 2
                stack.pop()
                path.pop()
            elif color[nxt] == 1:
                return path[path.index(nxt) :] + [nxt]
            elif color[nxt] == 0:
                color[nxt] = 1
                stack.append((nxt, iter(sorted(graph[nxt]))))
                path.append(nxt)
    return None


def all_cycles(graph):
    """Strongly connected components with more than one module (Tarjan), for a complete failure message."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = counter[0]
                counter[0] += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(graph[w]))))
            elif w in on:
                low[node] = min(low[node], index[w])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_graph_sees_function_local_imports_and_packages():
    """The builder is not vacuous: it records a function-local import and the package `__init__` an import runs."""
    graph = import_graph()
    assert "xlgen.registry" in graph["xlgen.pretrained"]  # imported inside from_pretrained()
    assert "xlgen.models" in graph["xlgen.finetune.peft"]  # the package of xlgen.models.lora (function-local)
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    graph = import_graph()
    cycles = all_cycles(graph)
    assert not cycles, "import cycles (strongly connected groups of modules):\n" + "\n".join(
        f"  {' <-> '.join(c)}  e.g. {' -> '.join(find_cycle({m: graph[m] & set(c) for m in c}))}" for c in cycles
    )


def package_of(module: str, modules) -> str:
    """The node of `module` in the package graph: its subpackage (`xlgen.train.loop` -> `xlgen.train`,
    `xlgen.models.xlnet.model` -> `xlgen.models.xlnet`); a package's `__init__` is the package; the modules directly
    under a root package (`xlgen.registry`, `data_pipelines.vocab`) are units of their own."""
    if module in PACKAGES:
        return module
    parent = module.rpartition(".")[0]
    is_package = modules[module].endswith("__init__.py")
    if is_package:
        return module
    return module if parent in PACKAGES else parent


def package_graph(graph):
    """{package: set of packages it imports}: `import_graph` with modules merged into `package_of`."""
    modules = _modules()
    out = {}
    for src, targets in graph.items():
        p = package_of(src, modules)
        out.setdefault(p, set()).update(package_of(t, modules) for t in targets)
        out[p].discard(p)
    return out


def test_no_import_cycles_between_packages():
    """A package imports another only if that one does not import it back (through any of their modules)."""
    modules = _modules()
    assert package_of("xlgen.train.loop", modules) == "xlgen.train"
    assert package_of("xlgen.models.xlnet.model", modules) == "xlgen.models.xlnet"
    assert package_of("xlgen.models.xlnet", modules) == "xlgen.models.xlnet"
    assert package_of("xlgen.registry", modules) == "xlgen.registry"
    graph = package_graph(import_graph())
    cycles = all_cycles(graph)
    assert not cycles, "import cycles between packages:\n" + "\n".join(
        f"  {' <-> '.join(c)}  e.g. {' -> '.join(find_cycle({m: graph[m] & set(c) for m in c}))}" for c in cycles
    )
