"""Refuse a list whose files are read against the wrong folder.

A COCO JSON's ``file_name`` is read against ``--image-root`` or, by default, the JSON's own
folder; COCO itself keeps its images elsewhere (``annotations/instances_val2017.json``
beside ``val2017/``), and so does the demo (``detection/instances.json`` beside
``detection/images/``). Given no image root, such a run used to start and end with one
error row per image, each saying "No such file or directory". A list file's relative paths
have the same trap. So before a run starts, the first few files the list names are
looked for: if none exists, the run is refused (exit 2) with the folder they were read
against and, when they are all found one folder away, that folder.

Only a few files are looked at: a list may name millions, on slow storage. A list whose
first files are missing but whose later ones exist runs as before, with error rows for
the missing ones. A data.yaml's paths start at its ``path:`` key, which ``--image-root``
does not move: its refusal says to check that key instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from batchinfer.errors import DatasetError
from batchinfer.messages import setting

#: How many of the list's first files are looked for.
PROBE = 5
#: Folders looked at when searching for where the files are (a folder of images may hold
#: millions of entries: it is scanned only this far).
_SCAN_LIMIT = 10_000


def check_some_exist(form: str, source: str, base: str, paths: Iterable[str | None]) -> None:
    """DatasetError (exit 2) when none of the first :data:`PROBE` files ``paths`` name
    (relative to ``base``, or absolute) exists; rows without a path are not counted."""
    tried: list[str] = []
    for path in paths:
        if not path:  # a row without a path is its own error row
            continue
        if os.path.exists(os.path.join(base, path)):
            return
        tried.append(path)
        if len(tried) == PROBE:
            break
    if not tried:
        return
    first = tried[0]
    named = _named_by(form, source)
    if len(tried) == 1:
        text, shown, they = f"The first file {named} does not exist", "", "it looks"
    else:
        text = f"None of the first {len(tried)} files {named} exists"
        shown, they = "the first: ", "they look"
    if os.path.isabs(first):
        raise DatasetError(f"{text} ({shown}{first}); check the paths it holds.")
    text += f" under {base} ({shown}{os.path.join(base, first)})"
    elsewhere = _folder_holding(tried, base)
    if form == "yaml":  # its paths start at its path: key, which no image root moves
        where = f" ({they} to be in {elsewhere})" if elsewhere else ""
        raise DatasetError(f"{text}{where}; check its path: key and its val split.")
    if elsewhere is not None:
        raise DatasetError(
            f"{text}; {they} to be in {elsewhere}: give it as " + setting("image_root") + "."
        )
    folder = "the folder it is in" if len(tried) == 1 else "the folder they are in"
    raise DatasetError(f"{text}; give {folder} as " + setting("image_root") + ".")


def _named_by(form: str, source: str) -> str:
    if form == "coco":
        return f"the COCO file {source} names"
    if form == "yaml":
        return f"the data.yaml {source} lists"
    return f"the list {source} names"


def _folder_holding(paths: list[str], base: str) -> str | None:
    """A folder under ``base`` or beside it (one level) that holds every one of ``paths``,
    else None (all of them: one file of a common name is no evidence)."""
    parent = os.path.dirname(base.rstrip(os.sep)) or base
    for folder in (base, parent):
        for sub in sorted(_subfolders(folder)):
            if sub != base and all(os.path.exists(os.path.join(sub, p)) for p in paths):
                return sub
    return None


def _subfolders(folder: str) -> Iterator[str]:
    try:
        with os.scandir(folder) as it:
            for i, entry in enumerate(it):
                if i == _SCAN_LIMIT:
                    return
                try:
                    if entry.is_dir():
                        yield entry.path
                except OSError:
                    continue
    except OSError:
        return
