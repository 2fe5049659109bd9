"""Ground truth for a video dataset's frames: a COCO JSON naming ``<video>#<frame>``, or a
MOT-style ``gt.txt``, matched to the frames evaluated.

Both give the :class:`~batchinfer.evaluate.groundtruth.GroundTruth` the detection
evaluation scores (its image ids, images and annotations), and are matched against
*every* frame of the videos, not only the frames the sampling keeps (``every``, ``fps``,
``keyframes``, ``start_s``/``end_s``): an entry for a frame that was not sampled is
matched and left out of the score, not "unknown"; an entry for a frame the video does
not have is unknown, its annotations dropped and counted.

- **COCO** (:func:`~batchinfer.evaluate.groundtruth.read_coco`): ``file_name`` is the
  frame's item id, ``<video id>#<frame>`` with the 0-based frame index in decode order
  (``clips/a.mp4#12``; the video id as the run's ids have it, else its base name when
  only one video has it). A frame the file does not list is not scored.
- **MOT** (a ``.txt`` file): one line per object and frame,
  ``frame,id,x,y,w,h,conf,class[,visibility...]`` as MOTChallenge and CVAT's "MOT 1.1"
  export write it. It describes one video: the dataset must hold exactly one. ``frame``
  is 1-based (MOT's): line frame ``f`` is the item ``<video>#<f-1>``. Every frame of the
  video is an image (a frame with no line has no objects). ``x, y`` are the box's left
  and top edges in pixels from the frame's corner, taken as written (CVAT's; MOTChallenge
  counts pixels from 1, a one-pixel shift). ``conf`` 0 marks an object to ignore: it
  becomes a COCO crowd region (a detection on it is neither a hit nor a false positive).
  ``class`` is 1-based: class ``c`` is line ``c`` of ``labels.txt`` beside the file
  when there is one (CVAT's layout), else the model's class ``c - 1``; a missing or ``-1``
  class (MOT15's) is class 1, allowed only when there is one class. Category ids are the
  0-based class indices.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from batchinfer.data.coco_file import GroundTruthError
from batchinfer.data.video.ids import frame_id
from batchinfer.data.whole_file import YOLO_LABELS_BOUND, read_whole
from batchinfer.evaluate.groundtruth import Category, GroundTruth, read_coco

#: A gt.txt is read whole, within this bound (a night of 30 fps video with 50 objects a
#: frame is about 200 MB: split it into one file per video).
MOT_BOUND = max(YOLO_LABELS_BOUND, 256 << 20)


def read_video_truth(
    path: Path,
    dataset: Any,
    scored: Collection[str] | None,
    names: Sequence[str] = (),
) -> GroundTruth:
    """The ground truth at ``path`` matched to the frames of ``dataset`` (a VideoDataset):
    MOT for a ``.txt`` file, else COCO. ``scored``: the frame ids evaluated (default: every
    item of the dataset); ``names``: the model's class names (MOT without labels.txt)."""
    items = [i.id for i in dataset]
    evaluated = set(items) if scored is None else set(scored) & set(items)
    if path.suffix.lower() == ".txt":
        return read_mot(path, dataset, evaluated, names)
    every_frame = [
        frame_id(v.item.id, f)
        for v in dataset.videos
        if v.info is not None
        for f in range(v.info.frames)
    ]
    return read_coco(path, every_frame, evaluated)


def _mot_lines(text: str, where: str) -> list[tuple[int, list[float]]]:
    """(line number, values) of each non-empty line of a MOT file."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            values = [float(v) for v in line.replace(" ", "").split(",")]
        except ValueError:
            raise GroundTruthError(
                f"{where} line {number} is not comma-separated numbers: {line.strip()!r}."
            ) from None
        if len(values) < 6 or not all(math.isfinite(v) for v in values):
            raise GroundTruthError(
                f"{where} line {number} is not 'frame,id,x,y,w,h,conf,class,...' (MOT): "
                f"{line.strip()!r}."
            )
        if values[0] < 1 or values[0] != int(values[0]) or values[4] < 0 or values[5] < 0:
            raise GroundTruthError(
                f"{where} line {number} has frame {values[0]:g} (MOT counts frames from 1) "
                f"or a negative width or height: {line.strip()!r}."
            )
        out.append((number, values))
    return out


def _class_names(
    path: Path, names: Sequence[str], lines: list[tuple[int, list[float]]]
) -> list[str]:
    """labels.txt beside the file, else the model's names, else numbers up to the largest."""
    beside = path.parent / "labels.txt"
    if beside.is_file():
        raw = read_whole(beside, "the labels file", YOLO_LABELS_BOUND, error=GroundTruthError)
        listed = [n.strip() for n in raw.decode("utf-8", "replace").splitlines() if n.strip()]
        if listed:
            return listed
    if names:
        return list(names)
    return [str(c) for c in range(max((_class(v) for _, v in lines), default=1))]


def _class(values: list[float]) -> int:
    """The 1-based class of a line (a missing or -1 class is 1)."""
    return int(values[7]) if len(values) > 7 and values[7] != -1 else 1


def read_mot(
    path: Path, dataset: Any, evaluated: Collection[str], names: Sequence[str] = ()
) -> GroundTruth:
    """A MOT ``gt.txt`` matched to the one video of ``dataset`` (module docstring)."""
    where = f"the ground truth {path}"
    videos = [v for v in dataset.videos if v.info is not None]
    if len(dataset.videos) != 1 or not videos:
        raise GroundTruthError(
            f"{where} is a MOT file, which describes one video; the dataset holds "
            f"{len(videos)} readable of {len(dataset.videos)} video(s). Evaluate one video "
            "per job, or give a COCO JSON whose file_name is <video>#<frame>."
        )
    video = videos[0]
    raw = read_whole(path, "the ground truth", MOT_BOUND, error=GroundTruthError)
    lines = _mot_lines(raw.decode("utf-8", "replace"), where)
    classes = _class_names(path, names, lines)
    for number, values in lines:
        if not 1 <= _class(values) <= len(classes):
            raise GroundTruthError(
                f"{where} line {number} names class {_class(values)}; MOT classes count from "
                f"1 and there are {len(classes)} ({', '.join(classes[:5])}"
                f"{', ...' if len(classes) > 5 else ''})."
            )
    frames = video.info.frames
    images = []
    image_ids = {}
    for f in range(frames):
        item = frame_id(video.item.id, f)
        if item in evaluated:  # image id = MOT's frame number
            image_ids[item] = f + 1
            images.append({"id": f + 1, "file_name": item, "width": video.info.width,
                           "height": video.info.height})  # fmt: skip
    annotations: list[dict[str, Any]] = []
    unknown: dict[str, None] = {}
    dropped = 0
    for _, values in lines:
        frame = int(values[0]) - 1
        if frame >= frames:
            unknown[frame_id(video.item.id, frame)] = None
            dropped += 1
            continue
        if frame_id(video.item.id, frame) not in evaluated:
            continue
        x, y, w, h = values[2:6]
        ignore = len(values) > 6 and values[6] == 0
        annotations.append(
            {
                "id": len(annotations) + 1,
                "image_id": frame + 1,
                "category_id": _class(values) - 1,
                "bbox": [x, y, w, h],
                "area": w * h,
                "iscrowd": 1 if ignore else 0,
            }
        )
    return GroundTruth(
        source={"format": "mot", "path": str(path), "sha256": hashlib.sha256(raw).hexdigest()},
        categories=tuple(Category(i, n) for i, n in enumerate(classes)),
        image_ids=image_ids,
        images=tuple(images),
        annotations=tuple(annotations),
        unmatched_items=tuple(
            i for i in (i.id for i in dataset) if i in evaluated and i not in image_ids
        ),
        unknown_images=tuple(unknown),
        dropped_annotations=dropped,
    )


__all__ = ["read_mot", "read_video_truth"]
