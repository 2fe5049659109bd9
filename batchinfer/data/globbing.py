"""A glob as a dataset: ``'images/**/*.jpg'`` (``**`` matches folders at any depth).

The files that match, in code-point order of their paths; hidden names and folders are
not matched (as the shell does), nor are what tools leave behind (``__MACOSX``, ...).
Item ids are the paths relative to the pattern's fixed folder (``images/`` above), so a
glob over a whole folder gives the same ids as the folder; and the same labels: a file in a
subfolder of the fixed folder is labelled by that class folder (``images/cat/1.jpg`` is
``cat``), which the list machinery maps as a label column's values (integer names are the
labels, other names their position among the sorted names, or their line in a labels file).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path

from batchinfer.data.listed import PathList, Row
from batchinfer.data.listing import leftover_kind
from batchinfer.errors import DatasetError


def is_glob(spec: str) -> bool:
    """Whether ``spec`` is a pattern (holds ``*``, ``?`` or ``[``) rather than a path."""
    return glob.has_magic(spec) and not os.path.exists(spec)


def glob_entries(pattern: str) -> PathList:
    """The files ``pattern`` matches, as list entries; DatasetError when none does."""
    pattern = os.path.expanduser(pattern)
    parts = pattern.split(os.sep)
    fixed = []
    for part in parts:
        if glob.has_magic(part):
            break
        fixed.append(part)
    base = Path(os.path.abspath(os.sep.join(fixed) or "."))
    found = []
    for path in glob.iglob(pattern, recursive=True):
        if not os.path.isfile(path):
            continue
        rel = os.path.relpath(os.path.abspath(path), base)
        if any(leftover_kind(name) for name in rel.split(os.sep)):
            continue
        found.append(rel.replace(os.sep, "/"))
    if not found:
        raise DatasetError(f"The pattern {pattern!r} matches no file; check it (quote it).")
    found.sort()
    return GlobList("glob", pattern, base, found, places="match")


class GlobList(PathList):
    """The files a glob matched, each labelled by its class folder under the fixed folder."""

    def __iter__(self) -> Iterator[Row]:
        for where, path, written_id, _, columns, error in super().__iter__():
            folder, _, rest = (path or "").partition("/")
            yield where, path, written_id, folder if rest else None, columns, error
