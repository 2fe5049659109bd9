"""A COCO JSON file, read: the bytes and the parsed document, and its checked images.

Both uses of a COCO file read it here: as a dataset (batchinfer.data.coco_source) and as
detection ground truth (batchinfer.evaluate.groundtruth). The file is read as every file
read whole is (batchinfer.data.whole_file: a regular file under ``COCO_BOUND``); JSON that
is not UTF-8, not JSON or nested too deep is one line, never a traceback.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from batchinfer.data.parse_errors import parse_problem
from batchinfer.data.whole_file import COCO_BOUND, NESTING_ERRORS, read_whole
from batchinfer.errors import DatasetError


class GroundTruthError(DatasetError):
    """The ground truth cannot be read or is inconsistent (exit 2: nothing ran)."""


def is_number(value: Any) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past a float's range (JSON integers have no bound)
        return False


def shown(value: Any) -> str:
    """A value of a file as a message may show it: short, and never repr() of a structure
    (which may be huge, or nested deeper than repr() can go)."""
    if isinstance(value, dict):
        return f"an object of {len(value)} keys"
    if isinstance(value, list):
        return f"a list of {len(value)} values"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_coco_json(path: Path, what: str = "the ground truth") -> tuple[bytes, Any]:
    """(the bytes, the parsed JSON) of a COCO file; GroundTruthError if it is unreadable."""
    raw = read_whole(
        path, what, COCO_BOUND, error=GroundTruthError, hint="give a COCO instances file"
    )
    try:
        return raw, json.loads(raw)
    except ValueError as exc:  # not UTF-8, not JSON, or an integer of thousands of digits
        raise GroundTruthError(
            f"{what} {path} is not valid JSON ({parse_problem(exc)}); give a COCO instances file."
        ) from None
    except NESTING_ERRORS:
        raise GroundTruthError(
            f"{what} {path} nests JSON deeper than it can be read; give a COCO instances file."
        ) from None


def coco_images(data: Any, where: str) -> Iterator[dict[str, Any]]:
    """The entries of a COCO file's ``images`` list, each checked to have an integer id
    (not repeated) and a file_name; GroundTruthError for one that has not."""
    known: set[int] = set()
    for n, entry in enumerate(data["images"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), int):
            # Named by its place and kind, not its repr: an entry may be huge or nested
            # deeper than repr() can go.
            raise GroundTruthError(
                f"{where}: image {n} (counting from 0) has no integer id "
                f"({shown(entry.get('id') if isinstance(entry, dict) else entry)})."
            )
        if not isinstance(entry.get("file_name"), str):
            raise GroundTruthError(f"{where}: image {entry['id']} has no file_name.")
        if entry["id"] in known:
            raise GroundTruthError(f"{where} lists image id {entry['id']} twice.")
        known.add(entry["id"])
        yield entry
