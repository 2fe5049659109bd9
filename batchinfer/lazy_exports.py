"""Names a package exports but imports on first use (PEP 562's module ``__getattr__``), so
that importing the package stays cheap: ``batchinfer`` and ``batchinfer.engine`` for the
reader and core worker processes, ``batchinfer.bench`` for the CLI's start, and
``batchinfer.sink`` for a module that needs one writer.

A package maps each name to the module that holds it and gives ``__getattr__`` to
:func:`attribute`::

    _WHERE = {"run": "batchinfer.engine.runner", ...}
    __all__ = sorted(_WHERE)

    def __getattr__(name: str):
        return attribute(_WHERE, name)
"""

from __future__ import annotations

import importlib

# No typing import here (2 ms): `import batchinfer` in a reader or core worker goes without.


def attribute(where: dict[str, str], name: str) -> object:
    """``name`` from the module ``where`` maps it to (imported now if it was not yet);
    AttributeError for a name ``where`` does not have."""
    module = where.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(module), name)
