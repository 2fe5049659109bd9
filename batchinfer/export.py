"""Exports of a run folder for other tools: COCO result JSON of a detection run.

    from batchinfer.export import export_coco
    export_coco("runs/night", "results.json", annotations="instances_val2017.json")

writes the list of ``{"image_id", "category_id", "bbox": [x, y, w, h], "score"}`` that
pycocotools' ``COCO.loadRes``, faster-coco-eval and most detection tools read; a segment
run's results add ``segmentation`` (compressed RLE), a pose run's ``keypoints`` (x, y,
score per keypoint): COCO's segm and keypoints results. :func:`export_dota` writes an obb
run's rotated boxes as DOTA's Task1 result files.

Image ids: with ``annotations`` (a COCO instances JSON), each prediction's ``id`` (its path
in the dataset) is matched to an image's ``file_name``: the whole path, else its last
component when that is unique. Without, the COCO image ids a run over a COCO file carried
(each row's ``meta.image_id``); else an image whose name is a number (COCO's own
``000000397133.jpg``) gets that number, else every image gets its row's ``index``.
Category ids: with annotations, by class name (the run's labels) among the categories;
without, the category ids of the COCO file the run read (the manifest's
``task.category_ids``), else COCO's ids for a run with COCO's 80 names, else the class ids
themselves.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from batchinfer.data.parse_errors import parse_problem
from batchinfer.data.whole_file import COCO_BOUND, NESTING_ERRORS, read_whole
from batchinfer.errors import RunFailedError, UsageError
from batchinfer.results import read_run
from batchinfer.sink.atomic import write_bytes_atomically

#: The tasks whose rows hold boxes: ``export coco`` writes them (segment adds each box's
#: ``segmentation``, pose its ``keypoints``; obb's boxes are the enclosing axis-aligned ones).
BOX_TASKS = ("detect", "segment", "pose", "obb")


@dataclass(frozen=True)
class CocoExport:
    """What :func:`export_coco` wrote."""

    path: Path | None
    results: list[dict]
    images: int  # prediction rows with boxes (error rows are left out)
    image_ids: str  # how image ids were found
    category_ids: str  # how category ids were found


def _load_annotations(path: Path) -> dict[str, Any]:
    # Read as a run reads a COCO file: a regular file, bounded, its nesting a usage error.
    raw = read_whole(path, "The annotations", COCO_BOUND, error=UsageError, hint="pass a COCO file")
    try:
        data = json.loads(raw)
    except ValueError as e:  # not UTF-8, not JSON, an integer of thousands of digits
        raise UsageError(
            f"The annotations {path} are not JSON ({parse_problem(e)}); pass a COCO file."
        ) from None
    except NESTING_ERRORS:
        raise UsageError(
            f"The annotations {path} nest JSON deeper than it can be read; pass a COCO file."
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise UsageError(
            f"The annotations {path} have no 'images' list; pass a COCO instances JSON."
        )
    return data


def _ids_from_annotations(ids: Sequence[str], data: Mapping[str, Any], path: Path) -> dict:
    by_name: dict[str, int] = {}
    by_base: dict[str, list[int]] = {}
    for image in data["images"]:
        name, image_id = str(image.get("file_name", "")), image.get("id")
        if not isinstance(image_id, int):
            raise UsageError(f"An image of {path} has no integer id: {image!r}.")
        by_name[name] = image_id
        by_base.setdefault(PurePosixPath(name).name, []).append(image_id)
    out, missing = {}, []
    for item in ids:
        if item in by_name:
            out[item] = by_name[item]
        elif len(by_base.get(PurePosixPath(item).name, ())) == 1:
            out[item] = by_base[PurePosixPath(item).name][0]
        else:
            missing.append(item)
    if missing:
        raise UsageError(
            f"{len(missing)} prediction(s) match no image of {path} by file name (first: "
            f"{missing[0]!r}); check that the run and the annotations are the same dataset."
        )
    return out


def _category_ids(
    names: Sequence[str], data: Mapping[str, Any] | None, path: Path | None, coco80: bool
) -> tuple[list[int] | None, str]:
    from batchinfer.detect import COCO80_CATEGORY_IDS

    if data is None or not data.get("categories"):
        if coco80:
            return list(COCO80_CATEGORY_IDS), "COCO's category ids of the 80 class names"
        return None, "the class ids"
    by_name = {str(c.get("name")): c.get("id") for c in data["categories"]}
    if names and all(n in by_name for n in names):
        return [int(by_name[n]) for n in names], f"the categories of {path}, by name"
    unknown = [n for n in names if n not in by_name]
    if not unknown:
        raise UsageError(
            f"The run has no class names to match with the categories of {path}; run it with "
            "--labels FILE (one name per line)."
        )
    raise UsageError(
        f"The run's class {unknown[0]!r} names no category of {path}; check that the labels "
        "the run used are the annotations' category names."
    )


def _rows(run: Any) -> list[dict[str, Any]]:
    """The prediction rows' index, id, boxes and (a run over a COCO file) meta."""
    try:
        table = run.predictions(["index", "id", "boxes", "meta"])
    except RunFailedError:  # no meta column: the dataset carried no columns of its own
        table = run.predictions(["index", "id", "boxes"])
    return table.to_pylist()


def _carried_id(row: Mapping[str, Any]) -> int | None:
    """The COCO image id a row carried from its dataset (``meta.image_id``), or None."""
    value = (row.get("meta") or {}).get("image_id")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def export_coco(
    run_dir: Path | str,
    dest: Path | str | None = None,
    annotations: Path | str | None = None,
) -> CocoExport:
    """COCO result dicts of the detection run in ``run_dir``, written to ``dest`` as JSON
    (atomically) when given; see the module docstring for the ids. UsageError when the run
    is not a detection run, or the annotations do not fit it."""
    from batchinfer.detect import coco_results
    from batchinfer.detect.class_names import NAMES_COCO80

    run = read_run(run_dir)
    task = run.manifest.raw.get("task") or {}
    if task.get("task") not in BOX_TASKS:
        raise UsageError(
            f"{run_dir} is not a detection run (its task is {task.get('task', 'classify')}); "
            "COCO results come from a run with boxes."
        )
    rows = [r for r in _rows(run) if r["boxes"] is not None]
    ids = [r["id"] for r in rows]
    data = None
    if annotations is not None:
        data = _load_annotations(Path(annotations))
        image_ids = _ids_from_annotations(ids, data, Path(annotations))
        how_images = f"the images of {annotations}, by file name"
    elif ids and all(_carried_id(r) is not None for r in rows):
        image_ids = {r["id"]: _carried_id(r) for r in rows}
        how_images = "the COCO image ids the run carried (meta.image_id)"
    elif ids and all(PurePosixPath(i).stem.isdigit() for i in ids):
        image_ids = {i: int(PurePosixPath(i).stem) for i in ids}
        how_images = "the numbers the image files are named by"
    else:
        image_ids = {r["id"]: int(r["index"]) for r in rows}
        how_images = "each row's index (dataset order)"
    names = task.get("names") or []
    carried = task.get("category_ids")
    if annotations is None and carried and len(carried) == len(names):
        category_ids: list[int] | None = [int(c) for c in carried]
        how_categories = "the category ids of the COCO file the run read"
    else:
        category_ids, how_categories = _category_ids(
            names,
            data,
            None if annotations is None else Path(annotations),
            task.get("names_source") == NAMES_COCO80,
        )
    results = coco_results(rows, image_ids, category_ids)
    path = None
    if dest is not None:
        path = Path(dest)
        write_bytes_atomically(json.dumps(results).encode(), path)
    return CocoExport(path, results, len(rows), how_images, how_categories)


def export_dota(run_dir: Path | str, dest: Path | str) -> dict[str, int]:
    """An obb run's rotated boxes as DOTA's Task1 results: in folder ``dest``, one
    ``Task1_<class>.txt`` per class with lines ``<image> <score> x1 y1 x2 y2 x3 y3 x4 y4``
    (the image's file name without its extension, the corners in original pixels, in
    Ultralytics' ``xywhr2xyxyxyxy`` order). Returns the boxes written per file name.
    UsageError when the run is not an obb run."""
    import numpy as np

    from batchinfer.detect.rotated import corners

    run = read_run(run_dir)
    task = run.manifest.raw.get("task") or {}
    if task.get("task") != "obb":
        raise UsageError(
            f"{run_dir} is not an oriented-box run (its task is "
            f"{task.get('task', 'classify')}); DOTA results come from a --task obb run."
        )
    names = list(task.get("names") or [])
    lines: dict[str, list[str]] = {}
    for row in _rows(run):
        for box in row["boxes"] or ():
            c = int(box["class_id"])
            name = names[c] if 0 <= c < len(names) else str(c)
            xywhr = np.array([[box[k] for k in ("cx", "cy", "w", "h", "angle")]], np.float64)
            quad = " ".join(f"{v:.1f}" for v in corners(xywhr).reshape(-1).tolist())
            image = PurePosixPath(str(row["id"])).stem
            lines.setdefault(name, []).append(f"{image} {float(box['score']):.5f} {quad}")
    folder = Path(dest)
    folder.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, rows in sorted(lines.items()):
        path = folder / f"Task1_{name.replace('/', '_').replace(' ', '_')}.txt"
        write_bytes_atomically(("\n".join(rows) + "\n").encode(), path)
        counts[path.name] = len(rows)
    return counts
