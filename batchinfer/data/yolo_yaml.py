"""An Ultralytics ``data.yaml`` as a dataset: the images of its ``val`` split.

As Ultralytics reads it: ``path`` is the dataset root (relative to the yaml's folder;
default that folder), and ``val`` is a folder of images (searched recursively), a ``.txt``
list of image paths, or a list of such; each relative to ``path``. Paths in a ``.txt``
list are relative to that file's folder (Ultralytics reads its ``./`` lines so; other
relative lines it reads against the current folder, which we do not depend on). Item ids
are paths relative to the root. The classes of ``names`` are a detector's, not labels.
"""

from __future__ import annotations

import os
from pathlib import Path

from batchinfer.data.dataset import IMAGE_EXTENSIONS
from batchinfer.data.listed import PathList
from batchinfer.data.listing import FILE, walk
from batchinfer.data.parse_errors import parse_problem
from batchinfer.errors import DatasetError


def is_yaml(spec: str) -> bool:
    return spec.lower().endswith((".yaml", ".yml"))


def yaml_entries(file: Path) -> PathList:
    """The val images of an Ultralytics data.yaml; DatasetError if there are none."""
    import yaml

    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DatasetError(f"Cannot read {file} ({exc.strerror or exc}).") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{file} is not valid YAML ({_one_line(exc)}).") from None
    except ValueError as exc:  # an integer of thousands of digits
        raise DatasetError(f"{file} cannot be read ({parse_problem(exc)}).") from None
    if not isinstance(data, dict) or not data.get("val"):
        raise DatasetError(
            f"{file} has no val split; an Ultralytics data.yaml names its validation images "
            "with val: (a folder, a .txt list or a list of them)."
        )
    root = file.parent / str(data.get("path") or ".")
    root = Path(os.path.abspath(root))
    splits = data["val"] if isinstance(data["val"], list) else [data["val"]]
    paths: list[str] = []
    for split in splits:
        where = root / str(split)
        try:
            is_dir, is_file = where.is_dir(), where.is_file()
        except OSError as exc:  # a name too long, a loop of links: not "does not exist"
            raise DatasetError(
                f"The val split {split!r:.100} of {file} cannot be used ({exc.strerror or exc})."
            ) from None
        if is_dir:
            for rel, kind in walk(str(where)):
                if kind == FILE and os.path.splitext(rel)[1].lower() in IMAGE_EXTENSIONS:
                    paths.append(_relative(where / rel, root))
        elif is_file:
            for line in _split_list(where, file).splitlines():
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
    return " ".join(str(exc).split())


def _split_list(where: Path, file: Path) -> str:
    """The text of a split's ``.txt`` list; DatasetError when it cannot be read as UTF-8."""
    try:
        return where.read_text(encoding="utf-8")
    except OSError as exc:
        raise DatasetError(
            f"Cannot read {where}, a val split of {file} ({exc.strerror or exc})."
        ) from None
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"The val split {where} of {file} is not UTF-8 text (byte {exc.start}); a split "
            "list names one image a line, saved as UTF-8."
        ) from None


def _relative(path: Path, root: Path) -> str:
    full = os.path.normpath(os.path.join(root, path))
    rel = os.path.relpath(full, root)
    return full if rel.startswith("..") else rel.replace(os.sep, "/")
