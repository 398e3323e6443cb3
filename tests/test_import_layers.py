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


def module_files() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the project's packages."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = module_files()


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def owner(name: str) -> str | None:
    """The project module that defines ``name`` (the longest importable prefix), or None (third party)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def imports_of(name: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import statement of module ``name``."""
    return imports_in(MODULES[name].read_text(encoding="utf-8"), name if is_package(name) else name.rpartition(".")[0])


def imports_in(source: str, package: str) -> list[tuple[str, str | None, int]]:
    """The imports of ``source``, a module of ``package`` (which resolves its relative imports)."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):  # every statement, inside functions too
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found += [(base, alias.name, node.lineno) for alias in node.names]
    return found


def edges() -> dict[str, set[str]]:
    """Module -> the project modules it imports. ``from P import x`` imports the module ``P.x`` when
    that is one; when ``P`` is the importer's own package it also reads ``P``'s namespace, which is
    still being initialised if ``P/__init__`` imports the importer: an edge to ``P`` too."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for importer in MODULES:
        for module, name, _ in imports_of(importer):
            if owner(module) is None:
                continue
            submodule = f"{module}.{name}" if name else None
            if submodule in MODULES:
                graph[importer].add(submodule)
                if importer.startswith(module + "."):
                    graph[importer].add(module)
            else:
                graph[importer].add(owner(module))
        graph[importer].discard(importer)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
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


def private_imports() -> list[str]:
    """``from M import _x`` where ``M`` is another project module, and imports of a ``_private``
    module from outside the package that holds it."""
    private = lambda name: name.startswith("_") and not name.startswith("__")  # noqa: E731
    found = set()
    for importer in MODULES:
        for module, name, _ in imports_of(importer):
            target = owner(module)
            if target is None:
                continue
            submodule = f"{module}.{name}" if name else module
            if submodule in MODULES:
                package, _, leaf = submodule.rpartition(".")
                if private(leaf) and importer != package and not importer.startswith(package + "."):
                    found.add(f"{importer} imports the private module {submodule}")
            elif name and private(name) and target != importer:
                found.add(f"{importer} imports {target}.{name}")
    return sorted(found)


# Today's cycles and private imports; each step of issue 36 deletes what it removes. Done is empty.
KNOWN_CYCLES: list[list[str]] = [
    ["dpsynth_core.data", "dpsynth_core.data.loaders", "dpsynth_core.data.public"],
]
KNOWN_PRIVATE_IMPORTS: list[str] = [
]


def test_lazy_and_relative_imports_are_seen():
    source = "import os\n\ndef f():\n    from dpsynth_core.errors import ConfigError\n    from . import ledger\n"
    assert imports_in(source, "dpsynth_core.privacy") == [
        ("os", None, 1), ("dpsynth_core.errors", "ConfigError", 4), ("dpsynth_core.privacy", "ledger", 5)]


def test_no_import_cycle_among_the_project_modules():
    assert cycles(edges()) == KNOWN_CYCLES


def test_no_module_imports_another_modules_private_names():
    assert private_imports() == KNOWN_PRIVATE_IMPORTS
