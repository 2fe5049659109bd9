"""A segment, pose and obb run's exports: ``export coco`` with each box's segmentation (RLE
pycocotools decodes to the row's mask) or keypoints, ``export dota`` with each rotated box's
corners, and ``export draw`` drawing masks, keypoints and polygons (the fake models of
tests/fake_heads.py, as tests/test_tasks_end_to_end.py runs them)."""

from __future__ import annotations

import json

import numpy as np
import pose_obb_outputs as F
import pytest
from fake_heads import write_fake_model
from PIL import Image
from test_cli import assert_error, invoke
from test_seg_decode import _scene_outputs
from test_tasks_end_to_end import IMAGES, _pose_outputs, _run

from batchinfer.detect.letterbox import letterbox_geometry
from batchinfer.detect.rotated import corners

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _drawn_differs(tmp_path, out) -> int:
    """Images export draw wrote that differ from the plain image they came from."""
    drawn = tmp_path / "drawn"
    result = invoke("export", "draw", out, "--out", drawn, "--conf", "0.2")
    assert result.exit_code == 0, result.output
    changed = 0
    for w, h in IMAGES:
        (picture,) = drawn.glob(f"{w}x{h}*")
        plain = np.asarray(Image.open(tmp_path / "images" / f"{w}x{h}.png").convert("RGB"))
        changed += not np.array_equal(np.asarray(Image.open(picture).convert("RGB")), plain)
    return changed


def test_a_segment_runs_coco_export_has_its_masks(tmp_path):
    from pycocotools import mask as mask_api

    _, outputs, _ = _scene_outputs("yolov8-seg-zoo", (320, 320), 12, (517, 333), seed=3)
    model = write_fake_model(tmp_path / "seg.onnx", outputs, (320, 320))
    rows = _run(tmp_path, model, "segment")
    out = tmp_path / "out"
    result = invoke("export", "coco", out, "--out", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "r.json").read_text())
    boxes = [b for r in sorted(rows.values(), key=lambda r: r["index"]) for b in r["boxes"]]
    assert len(results) == len(boxes) > 0
    for got, box in zip(results, boxes, strict=True):
        m = box["mask"]
        assert got["segmentation"]["size"] == [m["height"], m["width"]]
        dense = mask_api.decode(
            {**got["segmentation"], "counts": got["segmentation"]["counts"].encode()}
        )
        assert int(dense.sum()) == int(
            mask_api.area({"size": [m["height"], m["width"]], "counts": m["counts"].encode()})
        )
    assert _drawn_differs(tmp_path, out) >= 3


def test_a_pose_runs_coco_export_has_its_keypoints(tmp_path):
    outputs = _pose_outputs("zoo", (640, 640), (17, 3))
    model = write_fake_model(tmp_path / "pose.onnx", outputs, (640, 640))
    rows = _run(tmp_path, model, "pose")
    result = invoke("export", "coco", tmp_path / "out", "--out", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "r.json").read_text())
    boxes = [b for r in sorted(rows.values(), key=lambda r: r["index"]) for b in r["boxes"]]
    assert len(results) == len(boxes) > 0
    for got, box in zip(results, boxes, strict=True):
        want = [v for p in box["keypoints"] for v in (p["x"], p["y"], p["score"])]
        np.testing.assert_allclose(got["keypoints"], want, atol=1e-3)
    assert _drawn_differs(tmp_path, tmp_path / "out") >= 3
    # a run of another task has no rotated boxes
    result = invoke("export", "dota", tmp_path / "out", "--out", tmp_path / "dota")
    assert_error(result, 2, "is not an oriented-box run (its task is pose)")


def test_an_obb_runs_dota_export_has_its_corners(tmp_path):
    rng = np.random.default_rng(7)
    lb = letterbox_geometry(517, 333, 640, 640)
    outputs = F.zoo_outputs((640, 640), 3, F.random_instances(rng, lb, 5, 3, rotated=True))
    model = write_fake_model(tmp_path / "obb.onnx", outputs, (640, 640))
    rows = _run(tmp_path, model, "obb")
    result = invoke("export", "dota", tmp_path / "out", "--out", tmp_path / "dota")
    assert result.exit_code == 0, result.output
    lines = [
        line.split() for f in sorted((tmp_path / "dota").glob("Task1_*.txt"))
        for line in f.read_text().splitlines()
    ]  # fmt: skip
    boxes = {
        (f"{w}x{h}", round(b["score"], 5)): b for (w, h), r in rows.items() for b in r["boxes"]
    }
    assert len(lines) == len(boxes) > 0
    for image, score, *quad in lines:
        box = boxes[(image, float(score))]
        want = corners(np.array([[box[k] for k in ("cx", "cy", "w", "h", "angle")]]))
        np.testing.assert_allclose(np.array(quad, float), want.reshape(-1), atol=0.06)
    assert _drawn_differs(tmp_path, tmp_path / "out") >= 3


# Each bench runs its own engine; the default tier keeps segment's, and pose's and obb's
# decoders are the default tier's in test_tasks_end_to_end.py (the same per-item CPU path).
@pytest.mark.parametrize(
    "task",
    [
        "segment",
        pytest.param("pose", marks=pytest.mark.slow),
        pytest.param("obb", marks=pytest.mark.slow),
    ],
)
def test_bench_reports_each_tasks_post_processing_per_item(tmp_path, task):
    """Issue 41 item 8: the decode's CPU travels per item for every task decoded in the
    core workers, and bench says it per item."""
    if task == "segment":
        _, outputs, _ = _scene_outputs("yolov8-seg-zoo", (320, 320), 12, (320, 320), seed=3)
        hw = (320, 320)
    elif task == "pose":
        hw = (320, 320)
        outputs = _pose_outputs("zoo", hw, (17, 3))
    else:
        hw = (640, 640)
        lb = letterbox_geometry(640, 640, 640, 640)
        rng = np.random.default_rng(7)
        outputs = F.zoo_outputs(hw, 3, F.random_instances(rng, lb, 5, 3, rotated=True))
    model = write_fake_model(tmp_path / f"{task}.onnx", outputs, hw)
    result = invoke(
        "bench", "--model", model, "--backend", "sim", "--sim-npu-ms", "1", "--cores", "0",
        "--warmup", "0.1", "--duration", "0.3", "--min-samples", "5", "--max-duration", "0.6",
        "--window", "0.1",
    )  # fmt: skip
    assert f"bench: {task}.onnx" in result.output, result.output
    line = next(x for x in result.output.splitlines() if "post-processing" in x)
    assert float(line.split(": ")[1].split(" ms CPU per item")[0]) > 0
