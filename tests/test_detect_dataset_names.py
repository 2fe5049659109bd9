"""A detection run names its classes by the dataset's own (a COCO file's categories, a
data.yaml's names) and export coco writes the ids the COCO file gave (issue 40, items 12
and 13).

The model is tests/detect_models.py's colour detector: a red patch on stride-8 cell (2, 2)
of a 64x64 image gives one box of class 0, a green one a box of class 1.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from detect_models import colour_detector, labels_file
from PIL import Image
from runs import config
from test_cli import invoke

from batchinfer import run
from batchinfer.export import export_coco
from batchinfer.results import read_run


def _patch(colour: tuple[int, int, int]) -> Image.Image:
    a = np.zeros((64, 64, 3), np.uint8)
    a[16:24, 16:24] = colour
    return Image.fromarray(a)


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    """Three images named 00000.png.. whose COCO image ids start at 1 (as the demo's do),
    and categories "red" (id 7) and "green" (id 9)."""
    root = Path(tmp_path_factory.mktemp("coco"))
    model = colour_detector(root)
    images = root / "images"
    images.mkdir()
    colours = [(255, 0, 0), (0, 255, 0), (255, 0, 0)]
    entries = []
    for n, colour in enumerate(colours):
        _patch(colour).save(images / f"{n:05d}.png")
        entries.append({"id": n + 1, "file_name": f"{n:05d}.png", "width": 64, "height": 64})
    instances = {
        "images": entries,
        "annotations": [],
        "categories": [{"id": 9, "name": "green"}, {"id": 7, "name": "red"}],
    }
    (root / "instances.json").write_text(json.dumps(instances))
    return root, model


def test_a_coco_run_names_its_classes_and_export_keeps_the_files_ids(coco, tmp_path):
    root, model = coco
    out = tmp_path / "o"
    cfg = config(root / "instances.json", model, backend="onnx", out=out)
    result = run(dataclasses.replace(cfg, image_root=root / "images"))
    assert result.errors == 0
    task = read_run(out).manifest.raw["task"]
    # class i is the i-th category by id: 7 "red" is class 0, 9 "green" class 1
    assert task["names"] == ["red", "green"] and task["names_source"] == "dataset"
    assert task["category_ids"] == [7, 9]
    rows = read_run(out).predictions(["id", "boxes"]).to_pylist()
    assert [b["label"] for r in rows for b in r["boxes"]] == ["red", "green", "red"]

    # Without annotations: the COCO ids the run carried, not the file names' numbers (0..2:
    # every image's boxes landed on its neighbour)
    plain = export_coco(out, tmp_path / "r.json")
    assert [(r["image_id"], r["category_id"]) for r in plain.results] == [(1, 7), (2, 9), (3, 7)]
    assert "meta.image_id" in plain.image_ids
    # With them (the detection guide's step, which failed: the run had no class names)
    exported = invoke(
        "export", "coco", out, "--out", tmp_path / "a.json",
        "--annotations", root / "instances.json",
    )  # fmt: skip
    assert exported.exit_code == 0, exported.output
    assert json.loads((tmp_path / "a.json").read_text()) == plain.results


def test_labels_win_and_a_count_that_differs_is_said(coco, tmp_path, caplog):
    root, model = coco
    cfg = config(root / "instances.json", model, backend="onnx", out=tmp_path / "a")
    cfg = dataclasses.replace(cfg, image_root=root / "images", labels=labels_file(tmp_path))
    run(cfg)
    task = read_run(tmp_path / "a").manifest.raw["task"]
    assert task["names"] == ["red", "green"] and task["names_source"] == "labels-file"
    assert "category_ids" not in task

    three = json.loads((root / "instances.json").read_text())
    three["categories"].append({"id": 11, "name": "blue"})
    (tmp_path / "three.json").write_text(json.dumps(three))
    cfg = config(tmp_path / "three.json", model, backend="onnx", out=tmp_path / "b")
    with caplog.at_level(logging.WARNING, logger="batchinfer"):
        run(dataclasses.replace(cfg, image_root=root / "images"))
    said = [r.getMessage() for r in caplog.records if "The dataset names" in r.getMessage()]
    assert len(said) == 1
    assert (
        "The dataset names 3 classes (the categories of three.json), but the model's head"
        in (said[0])
    )
    assert read_run(tmp_path / "b").manifest.raw["task"]["names"] == []


def test_a_data_yaml_names_the_classes(tmp_path):
    from batchinfer.detect.class_names import dataset_classes

    (tmp_path / "val").mkdir()
    for text, names in [
        ("names: [red, green]\n", ("red", "green")),
        ("names: {0: red, 1: green}\n", ("red", "green")),
        ("names: {1: red, 2: green}\n", None),  # ids not 0..N-1
        ("names: [[a], b]\n", None),  # not strings
        ("names: red\n", None),
        ("a: &a [x, x, x]\nnames: [*a, *a]\n", None),  # aliases are not names
    ]:
        (tmp_path / "data.yaml").write_text("path: .\nval: val\n" + text)
        found = dataset_classes(tmp_path / "data.yaml")
        assert (None if found is None else found.names) == names, text
        assert found is None or found.category_ids is None


def test_coco_categories_that_cannot_name_classes_are_ignored(tmp_path):
    from batchinfer.detect.class_names import dataset_classes

    path = tmp_path / "c.json"
    for categories in ([], [{"id": 1}], [{"id": "1", "name": "a"}], [{"id": 1, "name": "a"}] * 2):
        path.write_text(json.dumps({"images": [], "categories": categories}))
        assert dataset_classes(path) is None
    assert dataset_classes(tmp_path / "missing.json") is None
    assert dataset_classes(tmp_path) is None
    fifo = tmp_path / "data.yaml"
    os.mkfifo(fifo)  # not a regular file: never opened (it would block)
    assert dataset_classes(fifo) is None


def test_export_without_annotations_uses_the_carried_image_ids(coco, tmp_path):
    # Files 00000.png.. are COCO images 1..: the file names' numbers put every image's
    # boxes on its neighbour.
    root, model = coco
    cfg = config(root / "instances.json", model, backend="onnx", out=tmp_path / "o")
    run(dataclasses.replace(cfg, image_root=root / "images", labels=labels_file(tmp_path)))
    exported = invoke("export", "coco", tmp_path / "o", "--out", tmp_path / "r.json")
    assert exported.exit_code == 0, exported.output
    results = json.loads((tmp_path / "r.json").read_text())
    assert [(r["image_id"], r["category_id"]) for r in results] == [(1, 0), (2, 1), (3, 0)]
    assert "image ids: the COCO image ids the run carried (meta.image_id)" in exported.stdout
