"""Names a package exports but imports on first use (PEP 562's module ``__getattr__``), so
that importing the package stays cheap: ``batchinfer`` and ``batchinfer.engine`` for the
reader and core worker processes, ``batchinfer.bench`` for the CLI's start, and
``batchinfer.sink`` for a module that needs one writer.

A package maps each name to the module that holds it and takes both its ``__all__`` and
its ``__getattr__`` from :func:`exports`::

    _WHERE = {"run": "batchinfer.engine.runner", ...}
    __all__, __getattr__ = exports(_WHERE)

mypy reads a module ``__getattr__`` (a function or a variable of a callable type) for the
names it does not find, so these names are ``Any`` to it, as they were with a ``def``.
"""

from __future__ import annotations

import importlib

# No typing import here (2 ms): `import batchinfer` in a reader or core worker goes without;
# mypy takes any name TYPE_CHECKING for its own.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def attribute(where: dict[str, str], name: str) -> object:
    """``name`` from the module ``where`` maps it to (imported now if it was not yet);
    AttributeError for a name ``where`` does not have."""
    module = where.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(module), name)


def exports(where: dict[str, str]) -> tuple[list[str], Callable[[str], Any]]:
    """A package's ``__all__`` (``where``'s names, sorted) and its ``__getattr__``."""

    def getattr_(name: str) -> Any:
        return attribute(where, name)

    return sorted(where), getattr_
