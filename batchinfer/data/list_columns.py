"""The label and the other columns of a list file's rows (data/listed.py): a label as
written checked and read (an int, a class name, or none), the class map of a list's
labels, and the Arrow struct type the other columns (``meta``) are stored as."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchinfer.data.classes import (
    FROM_LABEL_NAMES,
    FROM_LABEL_NUMBERS,
    ClassMap,
    read_labels_file,
)
from batchinfer.errors import DatasetError

# ----------------------------------------------------------------------------- labels
#: The largest label: predictions store labels as Arrow int64, so a larger one (a list's
#: label, a shard's .cls member) would stop a run at its first Parquet part: it is refused.
MAX_LABEL = 2**63 - 1


def label_value(value: object, where: str, source: str) -> int | str | None:
    """A label as written -> an int (a label), a str (a class name) or None (none).

    Every label of a list is checked here when the list is opened (:class:`Scan`), so a
    label the predictions cannot hold is a usage error naming its line, before anything
    runs, as a label of the wrong type is (not a write error at the first part).
    """
    if value is None:
        return None
    shown = None
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        if not (text.isdecimal() and text.isascii()):
            return text
        shown = text if len(text) <= 40 else f"an integer of {len(text)} digits"
        # int() refuses text of over 4,300 digits: compare lengths first
        value = int(text) if len(text) <= len(str(MAX_LABEL)) else MAX_LABEL + 1
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_LABEL:
        return value
    if isinstance(value, (list, dict)):  # not repr(): it may be huge, or nested deep
        shown = "a JSON list" if isinstance(value, list) else "a JSON object"
    elif shown is None:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise DatasetError(
        f"The label column of {source} holds {shown} at {where}; a label is a "
        "non-negative integer below 2**63 (what the predictions' int64 label column holds) "
        "or a class name."
    )


def class_map_of(numbers: set[int], names: set[str], labels_file: Path | str | None, source: str):
    if numbers and names:
        raise DatasetError(
            f"The label column of {source} mixes integers ({min(numbers)}, ...) and class "
            f"names ({sorted(names)[0]!r}, ...); use one or the other."
        )
    if labels_file is not None:
        given = read_labels_file(labels_file)
        unknown = sorted(names - given.labels.keys())
        if unknown:
            raise DatasetError(
                f"{len(unknown)} label(s) of {source} are not in the labels file "
                f"{given.file}: {', '.join(map(repr, unknown[:5]))}; add them to the file."
            )
        return given
    if names:
        return ClassMap({n: i for i, n in enumerate(sorted(names))}, FROM_LABEL_NAMES)
    return ClassMap({str(n): n for n in sorted(numbers)}, FROM_LABEL_NUMBERS)


# ----------------------------------------------------------------------------- meta types
def value_tag(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "json"


def meta_type_of(tags: dict[str, set[str]]):
    """The struct type of the other columns, from the kinds of value each held."""
    import pyarrow as pa

    fields = []
    for name, seen in tags.items():
        if seen <= {"int"}:
            t = pa.int64() if seen else pa.string()
        elif seen <= {"int", "float"}:
            t = pa.float64()
        elif seen == {"bool"}:
            t = pa.bool_()
        else:  # text, or a mix: text (values that are not strings as JSON)
            t = pa.string()
        fields.append(pa.field(name, t))
    return pa.struct(fields) if fields else None


def coercer(meta_type: Any) -> Callable[[dict[str, Any] | None], dict[str, Any] | None]:
    """Makes a row's columns fit ``meta_type`` (a string field gets JSON for non-strings)."""
    if meta_type is None:
        return lambda columns: None
    import pyarrow as pa

    names = [f.name for f in meta_type]
    text = {f.name for f in meta_type if pa.types.is_string(f.type)}

    def coerce(columns: dict[str, Any] | None) -> dict[str, Any] | None:
        if columns is None:
            return dict.fromkeys(names)
        out = {}
        for name in names:
            v = columns.get(name)
            if name in text and v is not None and not isinstance(v, str):
                v = json.dumps(v)
            out[name] = v
        return out

    return coerce
