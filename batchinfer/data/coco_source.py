"""A COCO JSON as a dataset: the images its ``images`` list names, in the file's order.

Each image's ``file_name`` is read against the image root (``--image-root``, the job's
``dataset.image_root``; default: the JSON's folder); the item id is that name, so rows
match the ground truth's images by name. The COCO image id is carried as the predictions'
``meta.image_id``. The file is parsed as the detection ground truth parses it
(batchinfer.data.coco_file), which checks every image entry.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from batchinfer.data.coco_file import coco_images, read_coco_json
from batchinfer.data.listed import PathList
from batchinfer.errors import DatasetError


def coco_entries(file: Path, image_root: Path | None = None) -> PathList:
    """The images a COCO JSON names, as list entries; DatasetError (exit 2) for a file
    that is not COCO JSON or names no image."""
    raw, data = read_coco_json(file, "the COCO file")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DatasetError(
            f"{file} is not a COCO JSON file: it has no images list (each image with an id "
            "and a file_name)."
        )
    where = f"the COCO file {file}"
    paths, columns = [], []
    for entry in coco_images(data, where):
        name = entry["file_name"].replace("\\", "/")
        while name.startswith("./"):
            name = name[2:]
        paths.append(name)
        columns.append({"image_id": entry["id"]})
    return PathList(
        "coco",
        str(file),
        image_root if image_root is not None else file.parent,
        paths,
        places="image",
        columns=columns,
        sha256=hashlib.sha256(raw).hexdigest(),
    )
