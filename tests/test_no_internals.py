"""The package uses no CPython internals outside the one module that must (issue 27):
no private module or attribute of the standard library, no C API through ctypes.

The one exception, batchinfer/runtime/_level_names.py (logging has no public way to
remove a level name), has its own test that fails loudly on an interpreter where it changed
(tests/test_runtime_api.py)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import batchinfer

PACKAGE = Path(batchinfer.__file__).parent
#: Modules allowed to use a private name of the standard library, and which.
ISOLATED = {"runtime/_level_names.py": {"logging._levelToName", "logging._nameToLevel"}}
#: Underscored names the standard library documents as public.
PUBLIC = {"os._exit"}
#: What the process plumbing used before (and must not come back), found as text too:
#: in a string (getattr, importlib) the syntax tree below would miss them.
FORBIDDEN_TEXT = (
    "_posixshmem",
    "forkserver._",
    "._forkserver",
    "PyThreadState_SetAsyncExc",
    "pythonapi",
    "resource_tracker._",
)
_STDLIB = set(sys.stdlib_module_names)


def _private_uses(tree: ast.AST) -> set[str]:
    """``module._name`` for every private name of a standard-library module used, and
    ``_module`` for every private standard-library module imported. Annotations are left
    out: never evaluated (``from __future__ import annotations``), they name types that
    only the type checker's stubs have (``hashlib._Hash``)."""
    aliases: dict[str, str] = {}  # local name -> standard-library module
    found = set()
    annotations = set()
    for node in ast.walk(tree):
        for note in _annotations(node):
            annotations.update(id(n) for n in ast.walk(note))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in _STDLIB:
                    aliases[alias.asname or top] = (alias.asname and alias.name) or top
                    if any(part.startswith("_") for part in alias.name.split(".")):
                        found.add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0]
            if top not in _STDLIB or top == "__future__":
                continue
            if any(part.startswith("_") for part in node.module.split(".")):
                found.add(node.module)
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.add(f"{node.module}.{alias.name}")
                else:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and id(node) not in annotations
        ):
            found.add(f"{aliases[node.value.id]}.{node.attr}")
    return found - PUBLIC


def _annotations(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        notes = [a.annotation for a in every if a is not None and a.annotation is not None]
        return notes + ([node.returns] if node.returns is not None else [])
    if isinstance(node, ast.AnnAssign):
        return [node.annotation]
    return []


def test_no_private_name_of_the_standard_library_outside_the_isolated_module():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        uses = _private_uses(ast.parse(text)) - ISOLATED.get(rel, set())
        uses |= {word for word in FORBIDDEN_TEXT if word in text}
        if uses:
            found[rel] = sorted(uses)
    assert found == {}


def test_the_check_sees_what_the_plumbing_used_before():
    before = """
import ctypes, logging
from multiprocessing import forkserver, resource_tracker
import _posixshmem
forkserver._forkserver._forkserver_pid
resource_tracker._resource_tracker
logging._levelToName
"""
    assert _private_uses(ast.parse(before)) == {
        "_posixshmem",
        "multiprocessing.forkserver._forkserver",
        "multiprocessing.resource_tracker._resource_tracker",
        "logging._levelToName",
    }
