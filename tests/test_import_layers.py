"""Layers that a test enforces (issue 36, item 4): no import cycle among the project's modules and no
import of another module's ``_private`` name.

``lint-imports`` (pyproject.toml, run first by ``make test``) checks the layers between packages;
layer contracts do not see a cycle inside one package, so this test reads every module's source
(``ast``: lazy, in-function imports count as much as top-level ones) and looks for both.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("dpsynth", "dpsynth_core", "ray_jobs", "serving", "tune_spaces")

Sources = dict[str, tuple[str, bool]]  # dotted module name -> (source, is a package's __init__)


def project_sources() -> Sources:
    sources = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            sources[".".join(parts)] = (path.read_text(encoding="utf-8"), is_package)
    return sources


def imports_in(source: str, package: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import statement of ``source``, a
    module of ``package`` (which resolves its relative imports), inside functions too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found += [(base, alias.name, node.lineno) for alias in node.names]
    return found


def module_imports(sources: Sources) -> dict[str, list[tuple[str, str | None, int]]]:
    return {name: imports_in(source, name if is_package else name.rpartition(".")[0])
            for name, (source, is_package) in sources.items()}


def owner(name: str, sources: Sources) -> str | None:
    """The project module that defines ``name`` (the longest importable prefix), or None (third party)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in sources:
            return ".".join(parts[:end])
    return None


def import_graph(sources: Sources) -> dict[str, set[str]]:
    """Module -> the project modules it imports. ``from P import x`` imports the module ``P.x`` when
    that is one; when ``P`` is the importer's own package it also reads ``P``'s namespace, which is
    still being initialised if ``P/__init__`` imports the importer: an edge to ``P`` too."""
    graph: dict[str, set[str]] = {m: set() for m in sources}
    for importer, imports in module_imports(sources).items():
        for module, name, _ in imports:
            target = owner(module, sources)
            if target is None:
                continue
            submodule = f"{module}.{name}" if name else None
            if submodule in sources:
                graph[importer].add(submodule)
                if importer.startswith(module + "."):
                    graph[importer].add(module)
            else:
                graph[importer].add(target)
        graph[importer].discard(importer)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(graph[root])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def private_imports(sources: Sources) -> list[str]:
    """``from M import _x`` where ``M`` is another project module, and imports of a ``_private``
    module from outside the package that holds it."""
    private = lambda name: name.startswith("_") and not name.startswith("__")  # noqa: E731
    found = set()
    for importer, imports in module_imports(sources).items():
        for module, name, _ in imports:
            target = owner(module, sources)
            if target is None:
                continue
            submodule = f"{module}.{name}" if name else module
            if submodule in sources:
                package, _, leaf = submodule.rpartition(".")
                if private(leaf) and importer != package and not importer.startswith(package + "."):
                    found.add(f"{importer} imports the private module {submodule}")
            elif name and private(name) and target != importer:
                found.add(f"{importer} imports {target}.{name}")
    return sorted(found)


def test_lazy_and_relative_imports_are_seen():
    source = "import os\n\ndef f():\n    from dpsynth_core.errors import ConfigError\n    from . import ledger\n"
    assert imports_in(source, "dpsynth_core.privacy") == [
        ("os", None, 1), ("dpsynth_core.errors", "ConfigError", 4), ("dpsynth_core.privacy", "ledger", 5)]


def test_a_lazy_import_through_the_own_package_closes_a_cycle():
    sources = {"p": ("from p.a import run\n", True),
               "p.a": ("def run():\n    from p import b\n", False),
               "p.b": ("import os\n", False),
               "q": ("from p.a import run\nimport p.b\n", False)}
    assert import_graph(sources) == {"p": {"p.a"}, "p.a": {"p", "p.b"}, "p.b": set(), "q": {"p.a", "p.b"}}
    assert cycles(import_graph(sources)) == [["p", "p.a"]]


def test_private_names_and_modules_are_found_across_modules_only():
    sources = {"p": ("from p import _impl\n", True),
               "p._impl": ("def _helper():\n    pass\n", False),
               "p.a": ("from p._impl import _helper\nfrom p import _impl\n", False),
               "q": ("import p._impl\n", False)}
    assert private_imports(sources) == ["p.a imports p._impl._helper", "q imports the private module p._impl"]


def test_no_import_cycle_among_the_project_modules():
    assert cycles(import_graph(project_sources())) == []


def test_no_module_imports_another_modules_private_names():
    assert private_imports(project_sources()) == []
