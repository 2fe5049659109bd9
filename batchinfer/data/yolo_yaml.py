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
        raise DatasetError(f"{file} is not valid YAML ({exc}).") from None
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
        if where.is_dir():
            for rel, kind in walk(str(where)):
                if kind == FILE and os.path.splitext(rel)[1].lower() in IMAGE_EXTENSIONS:
                    paths.append(_relative(where / rel, root))
        elif where.is_file():
            for line in where.read_text(encoding="utf-8").splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    paths.append(_relative(where.parent / line, root))
        else:
            raise DatasetError(f"The val split {split!r} of {file} ({where}) does not exist.")
    if not paths:
        raise DatasetError(f"The val split of {file} names no image.")
    return PathList("yaml", str(file), root, paths, places="image")


def _relative(path: Path, root: Path) -> str:
    full = os.path.normpath(os.path.join(root, path))
    rel = os.path.relpath(full, root)
    return full if rel.startswith("..") else rel.replace(os.sep, "/")
