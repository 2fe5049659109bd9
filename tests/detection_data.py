"""Random but realistic detection cases: ground truth and noisy detectors over it.

Boxes of several sizes, a few crowd boxes, detections that jitter the true boxes (and
sometimes the class), duplicates, and false positives at lower scores: enough for every
branch of COCO's matching to be taken.
"""

from __future__ import annotations

import numpy as np

from batchinfer.evaluate.groundtruth import Category, GroundTruth

WIDTH, HEIGHT = 640, 480


def ground_truth(
    seed: int, images: int = 200, classes: int = 6, crowd: float = 0.04
) -> GroundTruth:
    rng = np.random.default_rng(seed)
    entries, annotations = [], []
    for image_id in range(1, images + 1):
        entries.append(
            {"id": image_id, "file_name": f"{image_id}.jpg", "width": WIDTH, "height": HEIGHT}
        )
        for _ in range(int(rng.integers(0, 7))):
            w, h = rng.uniform(6, 260), rng.uniform(6, 260)
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": int(rng.integers(1, classes + 1)),
                    "bbox": [rng.uniform(0, WIDTH - w), rng.uniform(0, HEIGHT - h), w, h],
                    "area": w * h,
                    "iscrowd": int(rng.random() < crowd),
                }
            )
    return GroundTruth(
        source={"format": "test"},
        categories=tuple(Category(c, f"class {c}") for c in range(1, classes + 1)),
        image_ids={e["file_name"]: e["id"] for e in entries},
        images=tuple(entries),
        annotations=tuple(annotations),
        unmatched_items=(),
        unknown_images=(),
    )


def detector(
    gt: GroundTruth,
    seed: int,
    *,
    recall: float = 0.85,
    jitter: float = 0.08,
    false_positives: float = 1.5,
) -> list[dict]:
    """COCO results of a detector that finds a share ``recall`` of the boxes, ``jitter``
    (a share of the box's size) off, and ``false_positives`` stray boxes per image."""
    rng = np.random.default_rng(seed)
    classes = [c.id for c in gt.categories]
    out = []
    for a in gt.annotations:
        x, y, w, h = a["bbox"]
        for _ in range(int(rng.random() < recall) + int(rng.random() < 0.1)):
            j = rng.normal(0, jitter, 4) * [w, h, w, h]
            cat = a["category_id"] if rng.random() < 0.92 else int(rng.choice(classes))
            out.append(
                {
                    "image_id": a["image_id"],
                    "category_id": cat,
                    "bbox": [x + j[0], y + j[1], max(1.0, w + j[2]), max(1.0, h + j[3])],
                    "score": float(rng.uniform(0.2, 1.0)),
                }
            )
    for image in gt.images:
        for _ in range(int(rng.poisson(false_positives))):
            w, h = rng.uniform(6, 200), rng.uniform(6, 200)
            out.append(
                {
                    "image_id": image["id"],
                    "category_id": int(rng.choice(classes)),
                    "bbox": [rng.uniform(0, WIDTH - w), rng.uniform(0, HEIGHT - h), w, h],
                    "score": float(rng.uniform(0.0, 0.7)),
                }
            )
    return out
