"""An Ultralytics ``data.yaml`` as a dataset: the images of its ``val`` split.

As Ultralytics reads it: ``path`` is the dataset root (relative to the yaml's folder;
default that folder), and ``val`` is a folder of images (searched recursively), a ``.txt``
list of image paths, or a list of such; each relative to ``path``. Paths in a ``.txt``
list are relative to that file's folder (Ultralytics reads its ``./`` lines so; other
relative lines it reads against the current folder, which we do not depend on). Item ids
are paths relative to the root. The classes of ``names`` are a detector's, not labels.

A data.yaml may come from anywhere, so it is read as hostile: the file is bounded
(batchinfer.data.whole_file), and every key used is type-checked before it is used
(``path`` a string, a split a string or a list of strings, ``names`` a list or a mapping
of strings, bounded). YAML aliases are shared references when loaded (cheap), but a
"billion laughs" file nests them nine deep, nine wide: anything that walks the value
(``str()``, iteration) makes 9^9 strings. The checks look at one level, never walk a
value, and name the key in a usage error (exit 2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchinfer.data.dataset import IMAGE_EXTENSIONS
from batchinfer.data.listed import PathList
from batchinfer.data.listing import FILE, walk
from batchinfer.data.parse_errors import parse_problem
from batchinfer.data.whole_file import NESTING_ERRORS, PATH_LIST_BOUND, YAML_BOUND, read_whole
from batchinfer.errors import DatasetError

#: At most this many splits in ``val`` and classes in ``names`` (LVIS has 1,203 classes,
#: ImageNet-21k 21,841).
MAX_SPLITS = 1000
MAX_NAMES = 100_000
#: A class name or a path written in the file, in characters.
MAX_TEXT = 4096
#: Pseudo file systems a ``path`` may not name (``path: /proc/self`` walked a process's
#: open descriptors, which vanish while listed).
_SYSTEM_TREES = ("/proc", "/sys", "/dev")


@dataclass(frozen=True)
class DataYaml:
    """The keys of a data.yaml that batchinfer uses, checked."""

    file: Path
    root: Path  # ``path``, absolute
    val: tuple[str, ...]  # the val split's folders and .txt lists, as written
    names: tuple[str, ...] | None  # class names by index, when the file gives them


def is_yaml(spec: str) -> bool:
    return spec.lower().endswith((".yaml", ".yml"))


def read_data_yaml(file: Path) -> DataYaml:
    """The checked keys of the data.yaml ``file``; DatasetError (exit 2) naming the key
    that is wrong, or saying why the file cannot be read."""
    import yaml

    raw = read_whole(file, "The data.yaml", YAML_BOUND, hint="give an Ultralytics data.yaml")
    # libyaml's loader when PyYAML has it: it refuses nesting over 1,000 levels at once,
    # where the pure-Python one takes seconds to reach its RecursionError.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load(raw.decode("utf-8"), Loader=loader)  # a safe loader (above)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{file} is not valid YAML ({_one_line(exc)}).") from None
    except NESTING_ERRORS:
        raise DatasetError(
            f"{file} nests YAML deeper than it can be read; give an Ultralytics data.yaml."
        ) from None
    except ValueError as exc:  # an integer of thousands of digits
        raise DatasetError(f"{file} cannot be read ({parse_problem(exc)}).") from None
    if not isinstance(data, dict):
        raise DatasetError(
            f"{file} is not an Ultralytics data.yaml: it holds {_kind(data)}, not keys "
            "(path:, val:, names:)."
        )
    val = data.get("val")
    if not val:
        raise DatasetError(
            f"{file} has no val split; an Ultralytics data.yaml names its validation images "
            "with val: (a folder, a .txt list or a list of them)."
        )
    path = data.get("path")
    if path is None or path == "":
        path = "."
    _check_text(path, file, "path", "the dataset root (a folder)")
    if isinstance(val, str):
        _check_text(val, file, "val", "a folder or a .txt list of images")
        splits: list[str] = [val]
    elif isinstance(val, list):
        if len(val) > MAX_SPLITS:
            raise DatasetError(
                f"The val key of {file} lists {len(val)} splits; at most {MAX_SPLITS}."
            )
        splits = list(val)
        for n, split in enumerate(splits):
            _check_text(split, file, f"val[{n}]", "a folder or a .txt list of images")
    else:
        raise DatasetError(
            f"The val key of {file} holds {_kind(val)}; it must be a folder, a .txt list of "
            "images, or a list of them."
        )
    root = Path(os.path.abspath(file.parent / path))
    real = os.path.realpath(root)
    if any(real == top or real.startswith(top + "/") for top in _SYSTEM_TREES):
        raise DatasetError(
            f"The path key of {file} is {path!r}, which is {real}: the system's own view of "
            "processes and devices, whose entries come and go, not a dataset folder."
        )
    return DataYaml(file, root, tuple(splits), _names(data.get("names"), file))


def _names(names: Any, file: Path) -> tuple[str, ...] | None:
    """``names``: a list of class names, or a mapping {index: name} with the indexes
    0..n-1 (both are Ultralytics'); checked one level deep, bounded."""
    if names is None:
        return None
    if not isinstance(names, (list, dict)):
        raise DatasetError(
            f"The names key of {file} holds {_kind(names)}; it must be a list of class names "
            "or a mapping {index: name}."
        )
    if len(names) > MAX_NAMES:
        raise DatasetError(
            f"The names key of {file} gives {len(names)} classes; at most {MAX_NAMES}."
        )
    if isinstance(names, list):
        for n, name in enumerate(names):
            _check_text(name, file, f"names[{n}]", "a class name")
        return tuple(names)
    for index, name in names.items():
        if not isinstance(index, int) or isinstance(index, bool):
            raise DatasetError(
                f"The names key of {file} has the key {_kind(index)}; its keys are the class "
                "indexes 0, 1, 2, ..."
            )
        _check_text(name, file, f"names[{index}]", "a class name")
    if set(names) != set(range(len(names))):
        missing = min(set(range(len(names))) - set(names))
        raise DatasetError(
            f"The names key of {file} gives {len(names)} classes but not class {missing}; "
            "its keys must be 0 to the number of classes - 1."
        )
    return tuple(names[i] for i in range(len(names)))


def _check_text(value: Any, file: Path, key: str, what: str) -> None:
    if not isinstance(value, str):
        raise DatasetError(f"The {key} key of {file} holds {_kind(value)}; it must be {what}.")
    if len(value) > MAX_TEXT or "\0" in value:
        raise DatasetError(
            f"The {key} key of {file} holds text of {len(value)} characters"
            + (" with a NUL" if "\0" in value else "")
            + f"; it must be {what}."
        )


def _kind(value: Any) -> str:
    """What a value is, in words, without walking it (see the module docstring)."""
    if isinstance(value, dict):
        return f"a mapping of {len(value)} keys"
    if isinstance(value, list):
        return f"a list of {len(value)} values"
    if isinstance(value, str):
        return "text" if len(value) > 60 else repr(value)
    if value is None:
        return "nothing"
    if isinstance(value, (bool, int, float)):
        return f"the {type(value).__name__} {value!r:.60}"
    return f"a {type(value).__name__}"


def yaml_entries(file: Path) -> PathList:
    """The val images of an Ultralytics data.yaml; DatasetError if there are none."""
    config = read_data_yaml(file)
    root = config.root
    paths: list[str] = []
    for split in config.val:
        where = root / split
        try:
            is_dir, exists = where.is_dir(), where.exists()
        except OSError as exc:  # a name too long, a loop of links: not "does not exist"
            raise DatasetError(
                f"The val split {split!r:.100} of {file} cannot be used ({exc.strerror or exc})."
            ) from None
        if is_dir:
            for rel, kind in walk(str(where)):
                if kind == FILE and os.path.splitext(rel)[1].lower() in IMAGE_EXTENSIONS:
                    paths.append(_relative(where / rel, root))
        elif exists:
            raw = read_whole(
                where,
                f"{file}: the val split",
                PATH_LIST_BOUND,
                hint="give a folder of images or a .txt list of image paths",
            )
            try:
                text = raw.decode("utf-8-sig")
            except UnicodeDecodeError as exc:
                raise DatasetError(
                    f"The val split {where} of {file} is not UTF-8 text (byte {exc.start}); "
                    "save it as UTF-8."
                ) from None
            for line in text.splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    paths.append(_relative(where.parent / line, root))
        else:
            raise DatasetError(f"The val split {split!r} of {file} ({where}) does not exist.")
    if not paths:
        raise DatasetError(f"The val split of {file} names no image.")
    return PathList("yaml", str(file), root, paths, places="image")


def _one_line(exc: Exception) -> str:
    """A YAML error in one line: PyYAML's own message quotes the offending line and marks
    its column on the lines below it."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {' '.join(problem.split())}"
    return " ".join(str(exc).split())[:300]


def _relative(path: Path, root: Path) -> str:
    full = os.path.normpath(os.path.join(root, path))
    rel = os.path.relpath(full, root)
    return full if rel.startswith("..") else rel.replace(os.sep, "/")
