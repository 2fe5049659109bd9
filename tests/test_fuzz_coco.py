"""Fuzz tier: COCO JSON, as a dataset (batchinfer/data/coco_source.py) and as an eval's
ground truth (batchinfer/evaluate/groundtruth.py). Every generated file is a one-line
usage error, or its images each one item with a unique id, under a memory bound
(tests/fuzz_support.py)."""

from __future__ import annotations

import json
import os

import pytest
from fuzz_support import (
    assert_clean,
    fuzz,
    ints,
    json_values,
    nasty_paths,
    nasty_text,
    nested,
    run_bounded,
)
from hypothesis import example, given
from hypothesis import strategies as st

from batchinfer.data.sources import open_source
from batchinfer.evaluate.groundtruth import read_coco

numbers = st.one_of(st.integers(-5, 700), st.floats(), st.sampled_from([2**63, 10**400]))
boxes = st.one_of(st.lists(numbers, min_size=4, max_size=4), json_values)

images = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"id": ints, "file_name": nasty_paths},
            optional={"width": numbers, "height": numbers},
        ),
        st.fixed_dictionaries({"id": json_values, "file_name": json_values}),
    ),
    max_size=6,
)
annotations = st.lists(
    st.fixed_dictionaries(
        {"id": ints, "image_id": ints, "category_id": ints, "bbox": boxes},
        optional={"area": numbers, "iscrowd": json_values},
    ),
    max_size=6,
)
categories = st.lists(
    st.fixed_dictionaries({"id": st.one_of(ints, json_values), "name": nasty_text}), max_size=4
)
coco = st.one_of(
    st.fixed_dictionaries(
        {"images": images},
        optional={"annotations": annotations, "categories": categories, "info": json_values},
    ),
    json_values,
)


def _as_dataset(path: str) -> dict[str, object]:
    ds = open_source(path)
    return {"count": len(ds), "ids": [item.id for item in ds.iter_from()]}


def _as_ground_truth(path: str, item_ids: list[str]) -> dict[str, object]:
    return read_coco(__import__("pathlib").Path(path), item_ids).summary()


def _names(data: object) -> list[str]:
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        return []
    return [i["file_name"] for i in data["images"] if isinstance(i, dict)
            and isinstance(i.get("file_name"), str)]  # fmt: skip


@fuzz
@given(data=coco)
def test_coco_as_a_dataset(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("coco") / "instances.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    outcome = run_bounded(lambda: _as_dataset(str(path)))
    assert_clean(outcome)
    if outcome.kind == "ok":
        ids = outcome.value["ids"]
        assert len(ids) == len(set(ids)) == outcome.value["count"] == len(data["images"])


@fuzz
@example(  # math.isfinite(10**400): an OverflowError traceback
    data={
        "images": [{"id": 1, "file_name": "a.png"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 10**400]}],
        "categories": [{"id": 1, "name": "x"}],
    }
)
@given(data=coco)
def test_coco_as_ground_truth(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("gt") / "instances.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    names = [n for n in _names(data) if n]
    outcome = run_bounded(lambda: _as_ground_truth(str(path), sorted(set(names))))
    assert_clean(outcome)


@fuzz
@example(data=b"9" * 5000 + b"]}")  # an integer of more digits than int() converts
@given(data=st.binary(max_size=300))
def test_coco_of_any_bytes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("bytes") / "instances.json"
    path.write_bytes(b'{"images": [' + data)
    assert_clean(run_bounded(lambda: _as_dataset(str(path))))
    assert_clean(run_bounded(lambda: _as_ground_truth(str(path), ["a.png"])))


# --------------------------------------------------------------------------- issue 40 defects


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_a_deeply_nested_coco_file_is_a_usage_error(tmp_path, kind):
    path = tmp_path / "instances.json"
    path.write_text(
        '{"images": [], "annotations": [], "categories": [], "x": ' + nested(100_000, kind) + "}"
    )
    outcome = run_bounded(lambda: _as_ground_truth(str(path), ["a.png"]))
    assert outcome.kind == "usage", str(outcome)
    outcome = run_bounded(lambda: _as_dataset(str(path)))
    assert outcome.kind == "usage", str(outcome)


def test_repeated_annotation_ids_are_refused(tmp_path):
    path = tmp_path / "instances.json"
    box = {"id": 7, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 4]}
    path.write_text(
        json.dumps(
            {
                "images": [{"id": 1, "file_name": "a.png"}],
                "annotations": [box, dict(box)],
                "categories": [{"id": 1, "name": "x"}],
            }
        )
    )
    outcome = run_bounded(lambda: _as_ground_truth(str(path), ["a.png"]))
    assert outcome.kind == "usage" and "7" in outcome.error, str(outcome)


def test_a_fifo_named_as_a_coco_file_is_refused_as_not_regular(tmp_path):
    path = tmp_path / "p.json"
    os.mkfifo(path)
    outcome = run_bounded(lambda: _as_dataset(str(path)), timeout=1)
    assert outcome.kind == "usage" and "not a regular file" in outcome.error, str(outcome)
    outcome = run_bounded(lambda: _as_ground_truth(str(path), ["a.png"]), timeout=1)
    assert outcome.kind == "usage" and "not a regular file" in outcome.error, str(outcome)
