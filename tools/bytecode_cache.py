"""Benchmarks measure what an installed batchinfer costs: its modules' bytecode cached.

An environment with ``PYTHONDONTWRITEBYTECODE`` set (this development VM has it) never
writes ``__pycache__``, so every command, fork server and child of an editable checkout
compiles batchinfer's modules from source again: several tenths of a second per process
that no pip-installed copy pays (pip compiles at install). The benchmark tools call
:func:`ensure` first; it writes the caches once (``compileall``; a cache is read whatever
that variable says).
"""

from __future__ import annotations

import compileall
from pathlib import Path

import batchinfer


def ensure() -> None:
    """Compile batchinfer's modules into their ``__pycache__`` if they are not already."""
    compileall.compile_dir(Path(batchinfer.__file__).parent, quiet=1)
