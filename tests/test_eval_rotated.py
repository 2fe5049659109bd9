"""The obb task's scorer: rotated mAP50 of a run's items equal to the DOTA devkit's
``voc_eval`` written one detection at a time (tests/rotated_reference.py), on ground truth
read from a COCO file with 4-corner polygons; and ``batchinfer eval`` of an obb job end to
end on a constant-output fake model (slow)."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest
import rotated_reference as rr

from batchinfer.evaluate.groundtruth import read_coco
from batchinfer.evaluate.scorers.instances_items import BOX_TYPE
from batchinfer.evaluate.scorers.rotated import RotatedItems, rotated_score

pytest.importorskip("faster_coco_eval")


def _scene(rng: np.random.Generator, n_images: int = 6, classes: int = 3):
    """Ground-truth rotated boxes per image and predictions near them (moved, turned, some
    missing, some extra, some of the wrong class), with a few difficult ones."""
    images, truth, rows = [], [], []
    for i in range(n_images):
        images.append({"id": 100 + i, "file_name": f"{i}.png", "width": 800, "height": 600})
        boxes = []
        for _ in range(int(rng.integers(2, 6))):
            cx, cy = rng.uniform(100, 700), rng.uniform(100, 500)
            w, h, a = rng.uniform(30, 120), rng.uniform(20, 80), rng.uniform(0, math.pi / 2)
            c = int(rng.integers(0, classes))
            quad = [v for p in rr.corners((cx, cy, w, h, a)) for v in p]
            x, y = min(quad[0::2]), min(quad[1::2])
            truth.append({
                "id": len(truth) + 1, "image_id": 100 + i, "category_id": c + 1,
                "bbox": [x, y, max(quad[0::2]) - x, max(quad[1::2]) - y],
                "segmentation": [quad], "area": w * h, "iscrowd": int(rng.random() < 0.1),
            })  # fmt: skip
            for _ in range(int(rng.integers(0, 3))):
                moved = (cx + rng.normal(0, 8), cy + rng.normal(0, 8), w * rng.uniform(0.8, 1.2),
                         h * rng.uniform(0.8, 1.2), a + rng.normal(0, 0.2))  # fmt: skip
                wrong = rng.random() < 0.1
                boxes.append((moved, (c + 1) % classes if wrong else c, float(rng.random())))
        boxes.append(((400.0, 300.0, 50.0, 50.0, 0.3), 0, float(rng.random())))  # a stray
        rows.append(boxes)
    coco = {
        "images": images,
        "annotations": truth,
        "categories": [{"id": c + 1, "name": f"c{c}"} for c in range(classes)],
    }
    return coco, rows


def _items(rows) -> RotatedItems:
    structs = []
    for boxes in rows:
        out = []
        for (cx, cy, w, h, a), c, s in boxes:
            quad = np.array(rr.corners((cx, cy, w, h, a)))
            (x1, y1), (x2, y2) = quad.min(0), quad.max(0)
            out.append({"class_id": c, "label": None, "score": s, "x1": x1, "y1": y1,
                        "x2": x2, "y2": y2, "cx": cx, "cy": cy, "w": w, "h": h,
                        "angle": a})  # fmt: skip
        structs.append(out)
    box_type = pa.struct([*BOX_TYPE, *RotatedItems.PART_FIELDS])
    table = pa.table(
        {
            "index": pa.array(range(len(rows)), pa.int64()),
            "id": [f"{i}.png" for i in range(len(rows))],
            "boxes": pa.array(structs, pa.list_(box_type)),
        }
    )
    return RotatedItems.from_table(table)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rotated_map50_equals_the_devkits(tmp_path, seed):
    coco, rows = _scene(np.random.default_rng(seed))
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(coco))
    items = _items(rows)
    gt = read_coco(path, [f"{i}.png" for i in range(len(rows))])
    got = rotated_score(items, gt, [1, 2, 3])
    dets = [(i, s, rr.corners(box), c + 1) for i, boxes in enumerate(rows) for box, c, s in boxes]
    gts = [
        (a["image_id"] - 100, [tuple(p) for p in np.reshape(a["segmentation"][0], (4, 2))],
         a["category_id"], bool(a["iscrowd"]))
        for a in coco["annotations"]
    ]  # fmt: skip
    want = {c: rr.dota_voc_eval(dets, gts, c, 0.5) for c in (1, 2, 3)}
    want = {c: v for c, v in want.items() if v is not None}
    assert got.per_class.keys() == want.keys()
    for c, v in want.items():
        assert got.per_class[c] == pytest.approx(v, abs=1e-9)
    assert got.map50 == pytest.approx(np.mean(list(want.values())), abs=1e-9)
    assert 0.05 < got.map50 < 0.99


JOB = """
name = "obb"
task = "obb"

[device]
model = "obb.onnx"
[device.runtime]
backend = "sim"
cores = [0, 1]
[device.runtime.sim]
npu_ms = 0.2
host_ms = 0.0
[device.detect]
conf = 0.01

[reference]
model = "obb.onnx"
[reference.runtime]
backend = "onnx"
cores = [0]
[reference.detect]
conf = 0.01

[dataset]
path = "images"
ground_truth = "gt.json"

[metrics]
bootstrap = 50

[gates.rotated_map50]
min = 0.3

[gates.rotated_map50_drop]
max = 0.0
"""


@pytest.mark.slow  # two runs and a report: ~6 s (the scorer's fast test is above)
def test_an_obb_job_scores_the_rows_as_the_devkit(tmp_path):
    import pose_obb_outputs as F
    import pyarrow.parquet as pq
    from fake_heads import write_fake_model
    from PIL import Image
    from test_cli import invoke

    from batchinfer.detect.letterbox import letterbox_geometry

    rng = np.random.default_rng(7)
    lb = letterbox_geometry(517, 333, 640, 640)
    planted = F.random_instances(rng, lb, 5, 3, rotated=True)
    write_fake_model(tmp_path / "obb.onnx", F.zoo_outputs((640, 640), 3, planted), (640, 640))
    (tmp_path / "images").mkdir()
    images, truth = [], []
    for i in range(4):  # the same picture size: the same boxes in each
        Image.new("RGB", (517, 333), (i * 40, 90, 90)).save(tmp_path / "images" / f"{i}.png")
        images.append({"id": i + 1, "file_name": f"{i}.png", "width": 517, "height": 333})
        for p in planted[: 3 + i % 3]:  # the truth: the planted boxes, some images lack some
            box = ((p.cx - lb.pad_x) / lb.scale, (p.cy - lb.pad_y) / lb.scale,
                   p.w / lb.scale, p.h / lb.scale, p.angle)  # fmt: skip
            quad = [v for q in rr.corners(box) for v in q]
            x, y = min(quad[0::2]), min(quad[1::2])
            truth.append({"id": len(truth) + 1, "image_id": i + 1, "category_id": p.cls,
                          "bbox": [x, y, max(quad[0::2]) - x, max(quad[1::2]) - y],
                          "segmentation": [quad], "area": box[2] * box[3],
                          "iscrowd": 0})  # fmt: skip
    coco = {"images": images, "annotations": truth,
            "categories": [{"id": c, "name": f"class{c}"} for c in range(3)]}  # fmt: skip
    (tmp_path / "gt.json").write_text(json.dumps(coco))
    (tmp_path / "obb.toml").write_text(JOB)
    result = invoke("eval", tmp_path / "obb.toml")
    assert result.exit_code == 0, result.output
    folder = sorted((tmp_path / "eval" / "obb" / "evals").glob("*"))[-1]
    record = json.loads((folder / "result.json").read_text())
    rows = pq.read_table(folder / "items.parquet").to_pylist()
    keys = ("cx", "cy", "w", "h", "angle")
    dets = [
        (int(r["id"][0]), b["score"], rr.corners(tuple(b[k] for k in keys)), b["class_id"])
        for r in rows for b in r["boxes"]
    ]  # fmt: skip
    gts = [
        (a["image_id"] - 1, [tuple(p) for p in np.reshape(a["segmentation"][0], (4, 2))],
         a["category_id"], False)
        for a in truth
    ]  # fmt: skip
    aps = [v for c in range(3) if (v := rr.dota_voc_eval(dets, gts, c, 0.5)) is not None]
    assert record["metrics"]["rotated_map50"] == pytest.approx(np.mean(aps), abs=1e-9)
    assert 0.3 < record["metrics"]["rotated_map50"] <= 1.0
    assert "Rotated mAP50" in (tmp_path / "eval" / "obb" / "summary.md").read_text()
