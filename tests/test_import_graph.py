"""The packages import in one direction: no module of ``caliber_core`` or
``caliber_dashboard`` reaches itself again through imports.

Every ``import`` statement counts, wherever it stands (a function body too: a
lazy import still closes a circle), except under ``if TYPE_CHECKING:``. An
edge goes to the module named; ``from a.b import c`` goes to ``a.b.c`` when
that is a module, else to the package ``a.b``. Importing a module runs its
parent packages' ``__init__`` first, so each edge also reaches every package
above its target (the importer's own packages included): a package whose
``__init__`` imports a submodule that imports anything of that package is a
circle here, so package ``__init__`` files hand their names on lazily.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("caliber_core", "caliber_dashboard")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node outside ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.If) and _is_type_checking(node.test) and child in node.body:
                continue
            stack.append(child)


def _targets(node, module: str, is_package: bool, known: set[str]) -> set[str]:
    names: set[str] = set()
    if isinstance(node, ast.Import):
        names = {alias.name for alias in node.names}
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        for alias in node.names:
            sub = f"{prefix}.{alias.name}"
            names.add(sub if sub in known else prefix)
    out = set()
    for name in names:
        parts = name.split(".")
        # The named module (or its nearest known ancestor) and every package above it.
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if candidate in known:
                out.add(candidate)
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (and their parent packages)."""
    modules = _modules()
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        edges = set()
        for node in _imports(tree):
            edges |= _targets(node, name, is_package, known)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    graph = import_graph()
    assert len(graph) > 100  # both packages were read
    found = cycles(graph)
    assert found == [], "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_the_graph_sees_lazy_imports_and_skips_type_checking(tmp_path):
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from caliber_core.config import Config\n"
        "def f():\n    from caliber_core.loading import load\n"
    )
    known = {"caliber_core", "caliber_core.config", "caliber_core.loading", "caliber_core.loading.load"}
    edges = set()
    for node in _imports(tree):
        edges |= _targets(node, "caliber_core.x", False, known)
    assert edges == {"caliber_core", "caliber_core.loading", "caliber_core.loading.load"}


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_cycle_finder(graph, expected):
    assert cycles(graph) == expected
