"""COCO names in YOLO order, YOLO class -> COCO category ids, COCO result dicts."""

from __future__ import annotations

import json

import pytest

from batchinfer.detect import COCO80, COCO80_CATEGORY_IDS, coco_results
from batchinfer.errors import UsageError


def test_coco80_names_in_yolo_order() -> None:
    assert len(COCO80) == 80 and len(set(COCO80)) == 80
    assert COCO80[:3] == ("person", "bicycle", "car")
    assert COCO80[56:63] == (
        "chair",
        "couch",
        "potted plant",
        "bed",
        "dining table",
        "toilet",
        "tv",
    )
    assert COCO80[-1] == "toothbrush"
    assert all(name == name.strip() for name in COCO80)


def test_category_ids_skip_the_ids_coco_left_unused() -> None:
    assert len(COCO80_CATEGORY_IDS) == 80
    assert list(COCO80_CATEGORY_IDS) == sorted(set(COCO80_CATEGORY_IDS))
    unused = set(range(1, 91)) - set(COCO80_CATEGORY_IDS)
    assert unused == {12, 26, 29, 30, 45, 66, 68, 69, 71, 83}
    assert COCO80_CATEGORY_IDS[COCO80.index("tv")] == 72
    assert COCO80_CATEGORY_IDS[COCO80.index("toothbrush")] == 90


ROWS = [
    {
        "id": "a.jpg",
        "boxes": [
            {"class_id": 0, "label": "person", "score": 0.912345678,
             "x1": 10.0, "y1": 20.0, "x2": 110.5, "y2": 220.25},
            {"class_id": 79, "label": "toothbrush", "score": 0.3,
             "x1": 1.23456, "y1": 2.0, "x2": 3.0, "y2": 4.0},
        ],
    },
    {"id": "broken.jpg", "boxes": None, "error": "unreadable"},
    {"id": "empty.jpg", "boxes": []},
]  # fmt: skip
IMAGE_IDS = {"a.jpg": 7, "broken.jpg": 8, "empty.jpg": 9}


def test_coco_results_with_the_coco_category_ids() -> None:
    got = coco_results(ROWS, IMAGE_IDS, COCO80_CATEGORY_IDS)
    assert got == [
        {"image_id": 7, "category_id": 1, "bbox": [10.0, 20.0, 100.5, 200.25], "score": 0.91235},
        {"image_id": 7, "category_id": 90, "bbox": [1.235, 2.0, 1.765, 2.0], "score": 0.3},
    ]
    json.dumps(got)  # plain Python types only


def test_coco_results_without_a_mapping_write_the_class_id() -> None:
    got = coco_results(ROWS, IMAGE_IDS)
    assert [r["category_id"] for r in got] == [0, 79]


def test_a_prediction_without_an_image_id_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"'a\.jpg' has no image in the annotations"):
        coco_results(ROWS, {"empty.jpg": 1})


def test_a_class_without_a_category_id_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="class 79, but only 10 category ids"):
        coco_results(ROWS, IMAGE_IDS, list(range(1, 11)))
