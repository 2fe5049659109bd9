"""Class maps: which label each class folder of a dataset gets, and where that came from.

Without a labels file, every visible top-level folder of a dataset with class folders
is a class, empty or not, so adding or emptying ``dog/`` never shifts ``zebra/``:

- all folder names are non-negative integers ("0", "7", "10"): the label is the integer;
- otherwise: the label is the folder's position among the sorted folder names.

A labels file fixes the map instead (see :func:`read_labels_file` for its formats), so
labels match a model's output order whatever folders a dataset happens to hold.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from batchinfer.data.parse_errors import parse_problem
from batchinfer.data.whole_file import LABELS_BOUND, NESTING_ERRORS, read_whole
from batchinfer.errors import DatasetError

#: Where a class map came from (:attr:`ClassMap.source`).
FROM_FOLDER_NAMES = "folder-names"  # position among the sorted folder names
FROM_FOLDER_NUMBERS = "folder-numbers"  # every folder name is its integer label
FROM_LABELS_FILE = "labels-file"
# A list's label column (batchinfer.data.listed): integers are the labels; class names get
# their position among the sorted names.
FROM_LABEL_NUMBERS = "label-numbers"
FROM_LABEL_NAMES = "label-names"

#: Largest label: the predictions' label column is int64.
LABEL_MAX = 2**63 - 1

LABELS_FILE_FORMATS = (
    "a text file with one class folder name per line (line 1 is label 0), a JSON list of "
    'names, a JSON object {"name": label}, or a Keras-style class index '
    '{"0": ["name", "description"]}'
)


@dataclass(frozen=True)
class ClassMap:
    """Class folder name -> label, and where that map came from (for the manifest)."""

    labels: dict[str, int] = field(hash=False)
    source: str
    file: str | None = None  # absolute path of the labels file, if one was given
    file_sha256: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The class names in label order (ties, i.e. names sharing a label, by name)."""
        return tuple(sorted(self.labels, key=lambda name: (self.labels[name], name)))

    def to_json(self) -> dict[str, object]:
        """A JSON-ready record of the map: source, file and its sha256, names, labels."""
        return {
            "source": self.source,
            "file": self.file,
            "file_sha256": self.file_sha256,
            "names": list(self.names),
            "labels": {name: self.labels[name] for name in self.names},
        }


def label_rule(class_map: ClassMap) -> str:
    """How a class map's labels were assigned, in words (said once per run, kept in the
    manifest)."""
    if class_map.source == FROM_FOLDER_NUMBERS:
        return "class folders are integers: label = folder name"
    if class_map.source == FROM_FOLDER_NAMES:
        return f"sorted class folder names -> 0..{len(class_map.labels) - 1}"
    if class_map.source == FROM_LABEL_NUMBERS:
        return "the label column's integers are the labels"
    if class_map.source == FROM_LABEL_NAMES:
        return f"sorted class names of the label column -> 0..{len(class_map.labels) - 1}"
    return f"from the labels file {class_map.file}"


def odd_folder_names(class_map: ClassMap) -> tuple[str, ...]:
    """Class folders that spoil an otherwise integer (or otherwise named) set of folders.

    When integer names and other names are mixed, labels are positions among the sorted
    names, so folder ``7`` is usually not label 7: the smaller group (the non-integer names
    on a tie) is most likely the mistake. Empty unless the map came from mixed folder names.
    """
    if class_map.source != FROM_FOLDER_NAMES:
        return ()
    numbers = [name for name in class_map.labels if re.fullmatch(r"[0-9]+", name)]
    others = [name for name in class_map.labels if not re.fullmatch(r"[0-9]+", name)]
    if not numbers or not others:
        return ()
    return tuple(sorted(numbers if len(numbers) < len(others) else others))


def class_map_from_folders(names: Iterable[str], root: Path) -> ClassMap:
    """The class map of a dataset's top-level folders (see the module docstring)."""
    names = sorted(set(names))
    if names and all(re.fullmatch(r"[0-9]+", name) for name in names):
        seen: dict[int, str] = {}
        for name in names:
            value = int(name)
            if value in seen:
                raise DatasetError(
                    f"The class folders {seen[value]!r} and {name!r} in {root} both mean "
                    f"label {value}; rename or merge one of them, or pass a labels file."
                )
            seen[value] = name
        return ClassMap({name: int(name) for name in names}, FROM_FOLDER_NUMBERS)
    return ClassMap({name: i for i, name in enumerate(names)}, FROM_FOLDER_NAMES)


def read_labels_file(path: Path | str) -> ClassMap:
    """Read a labels file into a ClassMap; DatasetError if it is missing or malformed.

    Formats (by extension):

    - ``.json``: a list of class names (position = label); an object ``{"name": label}``
      (torchvision's ``class_to_idx``; several names may share a label); or a Keras-style
      class index ``{"0": ["folder", "description"], ...}`` (``imagenet_class_index.json``).
    - anything else: UTF-8 text, one class folder name per line, line 1 being label 0
      (ImageNet's synset lists, ``coco.names``, most labelling tools' exports).
      Surrounding whitespace is stripped; empty lines are refused except at the end,
      since skipping one would shift every later label.
    """
    file = Path(path).expanduser().absolute()
    data = read_whole(file, "The labels file", LABELS_BOUND, hint=f"pass {LABELS_FILE_FORMATS}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"The labels file {file} is not UTF-8 text (byte {exc.start}); save it as UTF-8."
        ) from exc
    if file.suffix.lower() == ".json":
        labels = _json_labels(text, file)
    else:
        labels = _text_labels(text, file)
    if not labels:
        raise DatasetError(f"The labels file {file} names no class; pass {LABELS_FILE_FORMATS}.")
    return ClassMap(labels, FROM_LABELS_FILE, str(file), hashlib.sha256(data).hexdigest())


def _text_labels(text: str, file: Path) -> dict[str, int]:
    lines = [line.strip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    labels: dict[str, int] = {}
    for i, name in enumerate(lines):
        where = f"Line {i + 1} of the labels file {file}"
        if not name:
            raise DatasetError(
                f"{where} is empty, and every line is one label (line 1 is label 0); "
                "remove the line or write the class name there."
            )
        _check_name(name, where)
        if name in labels:
            raise DatasetError(
                f"{where} repeats {name!r} (line {labels[name] + 1}); name each class once."
            )
        labels[name] = i
    return labels


def _json_labels(text: str, file: Path) -> dict[str, int]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(
            f"The labels file {file} is not valid JSON (line {exc.lineno}: {exc.msg}); fix it."
        ) from exc
    except NESTING_ERRORS:
        raise DatasetError(
            f"The labels file {file} nests JSON deeper than it can be read; use "
            f"{LABELS_FILE_FORMATS}."
        ) from None
    except ValueError as exc:  # an integer of thousands of digits
        raise DatasetError(
            f"The labels file {file} cannot be read ({parse_problem(exc)}); fix it."
        ) from None
    bad = DatasetError(
        f"The labels file {file} is JSON of an unknown shape; use {LABELS_FILE_FORMATS}."
    )
    labels: dict[str, int] = {}
    if isinstance(data, list):
        if not all(isinstance(name, str) for name in data):
            raise bad
        for i, name in enumerate(data):
            _check_name(name, f"Entry {i} of the labels file {file}")
            if name in labels:
                raise DatasetError(
                    f"The labels file {file} lists {name!r} twice (entries {labels[name]} "
                    f"and {i}); name each class once."
                )
            labels[name] = i
        return labels
    if not isinstance(data, dict):
        raise bad
    values = list(data.values())
    if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        for name, label in data.items():
            _check_name(name, f"The key {name!r} of the labels file {file}")
            _check_label(label, f"The key {name!r} of the labels file {file}")
            labels[name] = label
        return labels
    keras = all(
        re.fullmatch(r"[0-9]+", key) and isinstance(v, list) and v and isinstance(v[0], str)
        for key, v in data.items()
    )
    if not keras:
        raise bad
    for key, value in data.items():
        name = value[0]
        _check_name(name, f"The entry {key!r} of the labels file {file}")
        _check_label(int(key), f"The entry {key!r} of the labels file {file}")
        if name in labels:
            raise DatasetError(
                f"The labels file {file} gives {name!r} twice (labels {labels[name]} and "
                f"{key}); name each class once."
            )
        labels[name] = int(key)
    return labels


def _check_label(label: int, where: str) -> None:
    if label > LABEL_MAX:
        raise DatasetError(
            f"{where} gives the label {label}, more than the largest a prediction can hold "
            f"({LABEL_MAX}); labels are class indices: number the classes from 0."
        )


def _check_name(name: str, where: str) -> None:
    if not name or "/" in name:
        raise DatasetError(f"{where} is {name!r}, which cannot be a folder name; fix it.")
    if name.startswith("."):
        raise DatasetError(
            f"{where} is {name!r}, a hidden name, and datasets skip hidden folders; rename "
            "the folder and the entry."
        )
