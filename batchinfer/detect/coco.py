"""COCO class names in YOLO order, YOLO -> COCO category ids, and COCO result JSON."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from batchinfer.errors import UsageError

#: The 80 COCO class names, in YOLO order (index = class id), spelled as in the COCO
#: annotations' categories.
COCO80: tuple[str, ...] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat",
    "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack",
    "umbrella", "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball",
    "kite", "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket",
    "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair",
    "couch", "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse",
    "remote", "keyboard", "cell phone", "microwave", "oven", "toaster", "sink",
    "refrigerator", "book", "clock", "vase", "scissors", "teddy bear", "hair drier",
    "toothbrush",
)  # fmt: skip

#: COCO category id of each YOLO class 0..79 (COCO numbers its 80 categories 1..90 with
#: gaps): pass it as ``category_ids`` to :func:`coco_results` for COCO-trained models.
COCO80_CATEGORY_IDS: tuple[int, ...] = (
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
    27, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47, 48, 49, 50, 51,
    52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 67, 70, 72, 73, 74, 75, 76, 77,
    78, 79, 80, 81, 82, 84, 85, 86, 87, 88, 89, 90,
)  # fmt: skip


def coco_results(
    rows: Iterable[Mapping[str, Any]],
    image_ids: Mapping[str, int],
    category_ids: Sequence[int] | None = None,
) -> list[dict]:
    """COCO result dicts ``{"image_id", "category_id", "bbox": [x, y, w, h], "score"}``.

    ``rows`` are prediction rows (mappings with ``id`` and ``boxes``, the list of
    ``{class_id, score, x1, y1, x2, y2, ...}`` in original-image pixels); rows whose
    ``boxes`` is None (error rows) add nothing. ``image_ids`` maps a row's ``id`` to its
    COCO image id; ``category_ids[class_id]`` is the category id written (None: the class
    id itself; :data:`COCO80_CATEGORY_IDS` for COCO-trained models). Coordinates are
    rounded to 3 decimals and scores to 5, as the model zoo and Ultralytics write them.
    A box with a ``mask`` (segment) adds ``segmentation``, one with ``keypoints`` (pose)
    adds the flat ``keypoints`` list: COCO's segm and keypoints results.
    """
    results: list[dict] = []
    for row in rows:
        boxes = row.get("boxes")
        if boxes is None:
            continue
        item = row["id"]
        if item not in image_ids:
            raise UsageError(
                f"Prediction {item!r} has no image in the annotations; check that the "
                "predictions and the annotations describe the same dataset."
            )
        image_id = int(image_ids[item])
        for box in boxes:
            class_id = int(box["class_id"])
            if category_ids is None:
                category = class_id
            elif 0 <= class_id < len(category_ids):
                category = int(category_ids[class_id])
            else:
                raise UsageError(
                    f"Prediction {item!r} has class {class_id}, but only "
                    f"{len(category_ids)} category ids were given; give one per class "
                    "of the model."
                )
            x1, y1 = float(box["x1"]), float(box["y1"])
            w, h = float(box["x2"]) - x1, float(box["y2"]) - y1
            result = {
                "image_id": image_id,
                "category_id": category,
                "bbox": [round(x1, 3), round(y1, 3), round(w, 3), round(h, 3)],
                "score": round(float(box["score"]), 5),
            }
            result.update(_parts(box))
            results.append(result)
    return results


def _parts(box: Mapping[str, Any]) -> dict[str, Any]:
    """A segment box's ``segmentation`` (its compressed RLE) and a pose box's flat
    ``keypoints`` [x, y, v, ...] (v: the keypoint's score, which COCO's keypoint scoring
    does not read for detections), as COCO's results have them; {} for a plain box."""
    out: dict[str, Any] = {}
    mask = box.get("mask")
    if mask is not None:
        out["segmentation"] = {
            "size": [int(mask["height"]), int(mask["width"])],
            "counts": str(mask["counts"]),
        }
    points = box.get("keypoints")
    if points is not None:
        out["keypoints"] = [
            round(float(p[k]), 3 if k != "score" else 5)
            for p in points
            for k in ("x", "y", "score")
        ]
    return out
