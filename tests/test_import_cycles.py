"""batchinfer's modules import one another without circles.

A circle (a imports b, b imports a, at any depth) works only while the imports happen in
a lucky order, and it hides which module is the lower layer. The graph is read from the
source files with ``ast``: every ``import`` counts, at the top of a module, inside a
function or under ``if TYPE_CHECKING:`` alike (moving an import into a function hides a
circle from Python, not from the design). ``from package import name`` is an edge to the
submodule ``package.name`` when there is one, else to the package itself.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import batchinfer

ROOT = Path(batchinfer.__file__).resolve().parent

#: Circles left on purpose, each as the set of its modules.
KNOWN: set[frozenset[str]] = set()


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (source file, is a package's __init__)."""
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def _nearest(name: str, modules: dict[str, tuple[Path, bool]]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache  # read once for the module's tests (each parses the whole package)
def import_graph() -> dict[str, set[str]]:
    """Each batchinfer module -> the batchinfer modules it imports (itself left out).

    Shared between callers: read it, do not change it."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = name.split(".") if is_package else name.split(".")[:-1]
                    package = package[: len(package) - node.level + 1]
                    base = ".".join([*package, base] if base else package)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            else:
                continue
            for target in targets:
                if target.split(".")[0] == "batchinfer":
                    module = _nearest(target, modules)
                    if module is not None:
                        edges.add(module)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def test_the_finder_sees_a_circle_through_a_function_level_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_reads_every_kind_of_import() -> None:
    graph = import_graph()
    # Top level, from-import of a submodule, and one under TYPE_CHECKING (data/images.py).
    assert "batchinfer.errors" in graph["batchinfer.option_reading"]
    assert "batchinfer.data.input_spec" in graph["batchinfer.data.images"]
    # A submodule named in a package import: `from batchinfer.data import fast_jpeg`.
    assert "batchinfer.data.fast_jpeg" in graph["batchinfer.data.images"]


def test_batchinfer_has_no_import_circles() -> None:
    found = [sorted(c) for c in cycles(import_graph()) if c not in KNOWN]
    assert not found, (
        "import circles among batchinfer's modules (move what both sides need into a module "
        f"both import): {found}"
    )
