"""Ground truth for detection: a COCO instances JSON or a YOLO labels folder, matched to items.

Both readers give a :class:`GroundTruth`: COCO-style images, annotations and categories
for the dataset items that have ground truth, and what could not be matched, counted:

- ``unmatched_items``: dataset items that no ground-truth entry names. They are not
  scored (they could only count as images with no objects, which the ground truth does
  not say). An image that a COCO file lists with zero annotations is matched: it is a
  legitimate image with no objects, and a detection on it is a false positive.
- ``unknown_images``: ground-truth entries that name no dataset item (their annotations
  are dropped, so a dataset that lost files does not score as if the detector missed
  them).

Matching an entry to an item (item ids are paths relative to the dataset root):

- COCO ``file_name``: the relative path first (``val2017/000139.jpg``, backslashes and a
  leading ``./`` tolerated); else the base name, when exactly one item has it. Two
  entries that land on the same item are an error (the file is ambiguous).
- YOLO ``labels/**/x.txt``: the path relative to the labels folder without ``.txt``
  against the item's id without its extension (``train/x`` and ``train/x.jpg``); else the
  stem, when exactly one item and one label file have it. A YOLO line is
  ``class cx cy w h``, normalised to the image's width and height after EXIF orientation
  (as Ultralytics measures them), so every matched image's header is read for its size.
  An empty file is an image with no objects; an image without a file is unmatched (unless
  ``missing_is_empty``: Ultralytics' background images may have no file at all).

Category ids are COCO's own for a COCO file and the class index for YOLO labels.
:func:`category_ids_for` maps a model's class indices onto them.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from batchinfer.data.coco_file import (
    GroundTruthError,
    coco_images,
    is_number,
    read_coco_json,
    shown,
)
from batchinfer.data.whole_file import YOLO_LABELS_BOUND, open_regular, read_whole

#: How many unmatched names a record keeps (the counts are always complete).
NAMES_KEPT = 20
#: Repeated annotation ids named in the error (the count is always complete).
_REPEATS_SHOWN = 5

_ORIENTATION_TAG = 0x0112
_SWAPS_AXES = frozenset({5, 6, 7, 8})  # EXIF orientations that turn the image by 90°


#: One YOLO label line: class, then cx, cy, w, h normalised to the image.
_YoloBox = tuple[int, float, float, float, float]


@dataclass(frozen=True)
class Category:
    id: int
    name: str


@dataclass(frozen=True)
class GroundTruth:
    """Ground truth matched to a dataset's items (see the module docstring)."""

    source: dict[str, Any]  # format, path, sha256
    categories: tuple[Category, ...]
    image_ids: dict[str, int]  # item id -> COCO image id, for matched items
    images: tuple[dict[str, Any], ...]  # COCO image entries of matched items (file_name = item id)
    annotations: tuple[dict[str, Any], ...]  # COCO annotations of matched images
    unmatched_items: tuple[str, ...]  # items without ground truth, in dataset order
    unknown_images: tuple[str, ...]  # ground-truth names with no item
    dropped_annotations: int = 0  # annotations of unknown images
    notes: tuple[str, ...] = field(default=())

    def coco(self) -> dict[str, Any]:
        """A fresh COCO dataset dict (COCO API objects may add keys to what they get)."""
        return {
            "images": [dict(i) for i in self.images],
            "annotations": [
                {**a, "bbox": list(a["bbox"]), **{k: copy.deepcopy(a[k]) for k in _PARTS if k in a}}
                for a in self.annotations
            ],
            "categories": [{"id": c.id, "name": c.name} for c in self.categories],
        }

    @property
    def category_names(self) -> dict[int, str]:
        return {c.id: c.name for c in self.categories}

    def summary(self) -> dict[str, Any]:
        """Counts for the evaluation record: what was matched and what was not."""
        return {
            **self.source,
            "images": len(self.images),
            "annotations": len(self.annotations),
            "categories": len(self.categories),
            "unmatched_items": len(self.unmatched_items),
            "unmatched_items_first": list(self.unmatched_items[:NAMES_KEPT]),
            "unknown_images": len(self.unknown_images),
            "unknown_images_first": list(self.unknown_images[:NAMES_KEPT]),
            "dropped_annotations": self.dropped_annotations,
        }


# --------------------------------------------------------------------------- image size
def image_size(path: str | os.PathLike[str], exif_orientation: bool = True) -> tuple[int, int]:
    """(width, height) of the image at ``path`` as viewers show it, from its header only.

    Pillow opens lazily: the size and the EXIF block come from the header, no pixel is
    decoded. An EXIF orientation of 5-8 (turned by 90°) swaps width and height. The file is
    opened non-blocking and refused unless regular: a FIFO would block a plain open for ever.
    """
    hint = "YOLO labels are normalised to the image's size, so the image must be readable"
    with open(open_regular(os.fspath(path), "The image", GroundTruthError, hint), "rb") as file:
        try:
            with Image.open(file) as img:
                width, height = img.size
                if exif_orientation:
                    try:
                        orientation = img.getexif().get(_ORIENTATION_TAG, 1)
                    except Exception:  # a damaged EXIF block: as stored, as viewers do
                        orientation = 1
                    if orientation in _SWAPS_AXES:
                        width, height = height, width
        except (OSError, Image.UnidentifiedImageError, ValueError) as exc:
            raise GroundTruthError(f"cannot read the size of {path} ({exc}); {hint}.") from None
    return width, height


# --------------------------------------------------------------------------- matching
def _normalise(name: str) -> str:
    name = name.replace("\\", "/")
    while name.startswith("./"):
        name = name[2:]
    return name


def _unique_index(keys: Iterable[tuple[str, str]]) -> dict[str, str]:
    """key -> value for keys that occur once (a key seen twice maps to nothing)."""
    seen: dict[str, str] = {}
    twice: set[str] = set()
    for key, value in keys:
        if key in seen:
            twice.add(key)
        seen[key] = value
    return {k: v for k, v in seen.items() if k not in twice}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- COCO
def read_coco(
    path: Path, item_ids: Sequence[str], scored: Collection[str] | None = None
) -> GroundTruth:
    """The COCO instances file at ``path`` matched to ``item_ids`` (dataset order).

    ``scored``: the items evaluated (default: all); entries of the other items are matched
    (so they are not "unknown") but left out.
    """
    raw, data = read_coco_json(path)
    where = f"the ground truth {path}"
    if not isinstance(data, dict) or not all(
        isinstance(data.get(k), list) for k in ("images", "annotations", "categories")
    ):
        raise GroundTruthError(
            f"{where} is not a COCO instances file (it needs the lists images, annotations "
            "and categories)."
        )
    categories = []
    for n, c in enumerate(data["categories"]):
        if not isinstance(c, dict) or not isinstance(c.get("id"), int) or "name" not in c:
            raise GroundTruthError(
                f"{where}: category {n} (counting from 0) has no integer id or no name "
                f"({shown(c)})."
            )
        categories.append(Category(c["id"], str(c["name"])))
    if len({c.id for c in categories}) != len(categories):
        raise GroundTruthError(f"{where} lists a category id twice.")
    category_ids = {c.id for c in categories}

    by_path = {_normalise(i): i for i in item_ids}
    by_base = _unique_index((i.rsplit("/", 1)[-1], i) for i in item_ids)
    image_ids: dict[str, int] = {}
    item_of: dict[int, str] = {}  # COCO image id -> item id, matched images only
    images, unknown, known_ids = [], [], set()
    for entry in coco_images(data, where):
        name = entry["file_name"]
        known_ids.add(entry["id"])
        norm = _normalise(name)
        item = by_path.get(norm) or by_base.get(norm.rsplit("/", 1)[-1])
        if item is None:
            unknown.append(name)
            continue
        if item in image_ids:
            raise GroundTruthError(
                f"{where}: images {image_ids[item]} and {entry['id']} both name the dataset "
                f"item {item}; give each image one entry (file_name is matched as a path "
                "relative to the dataset folder, else by its base name)."
            )
        image_ids[item] = entry["id"]
        if scored is not None and item not in scored:
            continue
        item_of[entry["id"]] = item
        images.append(
            {
                "id": entry["id"],
                "file_name": item,
                "width": entry.get("width"),
                "height": entry.get("height"),
            }
        )

    matched_ids = set(image_ids.values())
    _check_annotation_ids(data["annotations"], where)
    annotations: list[dict[str, Any]] = []
    dropped = 0
    for n, a in enumerate(data["annotations"]):
        box = a.get("bbox")
        if not (isinstance(box, list) and len(box) == 4 and all(map(is_number, box))):
            raise GroundTruthError(
                f"{where}: annotation {a.get('id', n)} has no bbox [x, y, width, height]."
            )
        if box[2] < 0 or box[3] < 0:
            raise GroundTruthError(
                f"{where}: annotation {a.get('id', n)} has a negative width or height ({box})."
            )
        if a.get("image_id") not in known_ids:
            raise GroundTruthError(
                f"{where}: annotation {a.get('id', n)} names image {a.get('image_id')!r}, "
                "which the file does not list."
            )
        if a.get("category_id") not in category_ids:
            raise GroundTruthError(
                f"{where}: annotation {a.get('id', n)} names category "
                f"{a.get('category_id')!r}, which the file does not list."
            )
        if a["image_id"] not in item_of:
            dropped += a["image_id"] not in matched_ids  # an unknown image's, not unscored
            continue
        area = a.get("area")
        annotations.append(
            {
                # Our own ids from 1: COCO's matcher takes id 0 for "unmatched".
                "id": len(annotations) + 1,
                "image_id": a["image_id"],
                "category_id": a["category_id"],
                "bbox": [float(v) for v in box],
                "area": float(area) if is_number(area) else float(box[2] * box[3]),
                "iscrowd": 1 if a.get("iscrowd") else 0,
                # what COCO's segm and keypoints scoring read, kept as the file has them
                **{k: a[k] for k in _PARTS if a.get(k) is not None},
            }
        )
    evaluated = [i for i in item_ids if scored is None or i in scored]
    return GroundTruth(
        source={"format": "coco", "path": str(path), "sha256": _sha256(raw)},
        categories=tuple(categories),
        image_ids={i: image_ids[i] for i in evaluated if i in image_ids},
        images=tuple(images),
        annotations=tuple(annotations),
        unmatched_items=tuple(i for i in evaluated if i not in image_ids),
        unknown_images=tuple(unknown),
        dropped_annotations=dropped,
    )


#: An annotation's keys beside its box that COCO's ``segm`` / ``keypoints`` scoring reads.
_PARTS = ("segmentation", "keypoints", "num_keypoints")


def _check_annotation_ids(entries: list[Any], where: str) -> None:
    """GroundTruthError for an annotation that is not an object, has an id that is not an
    integer, or shares its id with another: a copied annotation would count twice (a
    second box on the object, scored as a miss), silently."""
    seen: set[int] = set()
    repeated: dict[int, None] = {}  # in the file's order
    for n, a in enumerate(entries):
        if not isinstance(a, dict):
            raise GroundTruthError(f"{where}: annotation {n} is not an object.")
        if "id" not in a:  # tolerated (our own ids replace them): nothing to repeat
            continue
        ident = a["id"]
        if not isinstance(ident, int) or isinstance(ident, bool):
            raise GroundTruthError(
                f"{where}: annotation {n} (counting from 0) has the id {shown(ident)}; an "
                "annotation id is an integer."
            )
        if ident in seen:
            repeated[ident] = None
        seen.add(ident)
    if repeated:
        ids = list(repeated)
        listed = ", ".join(map(str, ids[:_REPEATS_SHOWN]))
        more = f" and {len(ids) - _REPEATS_SHOWN} more" if len(ids) > _REPEATS_SHOWN else ""
        raise GroundTruthError(
            f"{where} gives {len(ids)} annotation id(s) to more than one annotation "
            f"({listed}{more}); each annotation needs its own id, and a repeated "
            "annotation would be scored as a second object."
        )


# --------------------------------------------------------------------------- YOLO
def _label_files(folder: Path) -> list[str]:
    """Label files under ``folder`` as relative POSIX paths, sorted (hidden ones left out)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = os.path.relpath(dirpath, folder)
        for name in filenames:
            if name.endswith(".txt") and not name.startswith("."):
                found.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
    return sorted(found)


def _parse_yolo(text: str, where: str, n_classes: int | None) -> list[_YoloBox]:
    rows = []
    for line_no, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 5:
            raise GroundTruthError(
                f"{where} line {line_no} has {len(parts)} values; a YOLO box is "
                "'class cx cy w h' (normalised to 0..1)."
            )
        try:
            cls = int(parts[0])
            cx, cy, w, h = (float(p) for p in parts[1:])
        except ValueError:
            raise GroundTruthError(
                f"{where} line {line_no} is not 'class cx cy w h': {line.strip()!r}."
            ) from None
        if cls < 0 or (n_classes is not None and cls >= n_classes):
            raise GroundTruthError(
                f"{where} line {line_no} names class {cls}"
                + (f"; the class names list {n_classes}." if n_classes is not None else ".")
            )
        if not all(math.isfinite(v) for v in (cx, cy, w, h)) or w < 0 or h < 0:
            raise GroundTruthError(f"{where} line {line_no} has a bad box: {line.strip()!r}.")
        rows.append((cls, cx, cy, w, h))
    return rows


def read_yolo(
    folder: Path,
    item_ids: Sequence[str],
    item_paths: Mapping[str, str | os.PathLike[str]],
    names: Sequence[str] | None = None,
    *,
    exif_orientation: bool = True,
    missing_is_empty: bool = False,
    scored: Collection[str] | None = None,
) -> GroundTruth:
    """The YOLO labels under ``folder`` matched to ``item_ids``.

    ``item_paths`` gives each item's file (its size denormalises the boxes); ``names``
    the class names (line n names class n; default: the class numbers seen); ``scored``
    the items evaluated, as :func:`read_coco`'s (only their headers are read).
    """
    if not folder.is_dir():
        raise GroundTruthError(
            f"the labels folder {folder} does not exist; give a folder of YOLO .txt files."
        )
    files = _label_files(folder)
    by_key = {i.rsplit(".", 1)[0] if "." in i.rsplit("/", 1)[-1] else i: i for i in item_ids}
    by_stem = _unique_index((k.rsplit("/", 1)[-1], i) for k, i in by_key.items())
    label_stems = Counter(f[:-4].rsplit("/", 1)[-1] for f in files)
    n_classes = len(names) if names is not None else None

    digest = hashlib.sha256()
    boxes_of: dict[str, list[_YoloBox]] = {}
    unknown = []
    dropped = 0
    for rel in files:
        key = rel[:-4]
        stem = key.rsplit("/", 1)[-1]
        item = by_key.get(key) or (by_stem.get(stem) if label_stems[stem] == 1 else None)
        path = folder / rel
        raw = read_whole(
            path,
            "the label file",
            YOLO_LABELS_BOUND,
            error=GroundTruthError,
            hint="give YOLO .txt label files",
        )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GroundTruthError(f"the label file {path} cannot be read ({exc}).") from None
        digest.update(rel.encode() + b"\0" + raw + b"\0")
        rows = _parse_yolo(text, f"the label file {path}", n_classes)
        if item is None:
            unknown.append(rel)
            dropped += len(rows)
            continue
        if item in boxes_of:  # train/x.txt and x.txt both for the item train/x.jpg
            raise GroundTruthError(
                f"two label files name the dataset item {item} (the second is {path}); keep one."
            )
        boxes_of[item] = rows
    evaluated = [i for i in item_ids if scored is None or i in scored]
    if missing_is_empty:
        for item in evaluated:
            boxes_of.setdefault(item, [])

    seen_classes = {r[0] for rows in boxes_of.values() for r in rows}
    if names is None:
        count = max(seen_classes) + 1 if seen_classes else 0
        names = [str(i) for i in range(count)]
    categories = tuple(Category(i, str(n)) for i, n in enumerate(names))

    image_ids: dict[str, int] = {}
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for item in evaluated:  # dataset order: image ids follow it
        if item not in boxes_of:
            continue
        image_id = len(images) + 1
        width, height = image_size(item_paths[item], exif_orientation)
        image_ids[item] = image_id
        images.append({"id": image_id, "file_name": item, "width": width, "height": height})
        for cls, cx, cy, w, h in boxes_of[item]:
            bw, bh = w * width, h * height
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": cls,
                    "bbox": [(cx - w / 2) * width, (cy - h / 2) * height, bw, bh],
                    "area": bw * bh,
                    "iscrowd": 0,
                }
            )
    return GroundTruth(
        source={"format": "yolo", "path": str(folder), "sha256": digest.hexdigest()},
        categories=categories,
        image_ids=image_ids,
        images=tuple(images),
        annotations=tuple(annotations),
        unmatched_items=tuple(i for i in evaluated if i not in image_ids),
        unknown_images=tuple(unknown),
        dropped_annotations=dropped,
    )


# --------------------------------------------------------------------------- classes
def category_ids_for(class_names: Sequence[str], gt: GroundTruth) -> list[int]:
    """The ground-truth category id of each model class (index = the model's class id).

    By name when every model class name is a category name (case and spaces ignored);
    else by order when the counts agree (the model's classes in the order of the sorted
    category ids: YOLO's 80 COCO classes against COCO's ids 1..90 with gaps). Otherwise
    GroundTruthError, naming both.
    """

    def key(name: str) -> str:
        return "".join(name.lower().split())

    by_name = defaultdict(list)
    for c in gt.categories:
        by_name[key(c.name)].append(c.id)
    if class_names and all(len(by_name.get(key(n), ())) == 1 for n in class_names):
        return [by_name[key(n)][0] for n in class_names]
    ordered = sorted(c.id for c in gt.categories)
    if len(ordered) == len(class_names):
        return ordered
    shown = ", ".join(list(class_names)[:5]) + (", ..." if len(class_names) > 5 else "")
    cats = ", ".join(c.name for c in gt.categories[:5]) + (
        ", ..." if len(gt.categories) > 5 else ""
    )
    raise GroundTruthError(
        f"the model's {len(class_names)} classes ({shown}) do not match the ground truth's "
        f"{len(gt.categories)} categories ({cats}) by name or by count; give the model's "
        "class names (a labels file) that the ground truth uses."
    )


__all__ = [
    "Category",
    "GroundTruth",
    "GroundTruthError",
    "category_ids_for",
    "image_size",
    "read_coco",
    "read_yolo",
]
