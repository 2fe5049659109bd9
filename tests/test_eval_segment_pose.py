"""``batchinfer eval`` of segment and pose jobs: the demo kit's segmenter and pose model on a
few demo scenes (the emulator against ONNX Runtime), and the scores in the record equal to
pycocotools' on the same predictions (the device's rows as items.parquet keeps them);
refusals of a pose job whose sigmas do not fit and of a segment job on YOLO labels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from batchinfer.cli import main
from batchinfer.demo import detection
from batchinfer.detect import coco_results

pytest.importorskip("faster_coco_eval")
COCO_API = pytest.importorskip("pycocotools.coco")
COCO_EVAL = pytest.importorskip("pycocotools.cocoeval")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ASSETS = Path(detection.__file__).parent / "assets"

JOB = """
name = "{name}"
task = "{task}"

[device]
model = "{model}"
[device.runtime]
backend = "sim"
cores = [0, 1]
[device.runtime.sim]
npu_ms = 0.2
host_ms = 0.0
[device.preprocess]
mean = [0, 0, 0]
std = [255, 255, 255]
[device.detect]
conf = 0.001

[reference]
model = "{model}"
[reference.runtime]
backend = "onnx"
cores = [0]
[reference.preprocess]
mean = [0, 0, 0]
std = [255, 255, 255]
[reference.detect]
conf = 0.001

[dataset]
path = "det/images"
ground_truth = "{ground_truth}"

[metrics]
bootstrap = 50
{metrics}

[gates.errors]
max = 0
"""


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("parts-eval")
    detection.write_detection(root / "det", n=12)
    return root


def _job(root: Path, name: str, task: str, model: str, gt: str, metrics: str = "") -> Path:
    job = root / f"{name}.toml"
    text = JOB.format(name=name, task=task, model=ASSETS / model, ground_truth=gt, metrics=metrics)
    job.write_text(text)
    return job


def _record_and_items(root: Path, name: str) -> tuple[dict, list[dict]]:
    folder = sorted((root / "eval" / name / "evals").glob("*"))[-1]
    record = json.loads((folder / "result.json").read_text())
    return record, pq.read_table(folder / "items.parquet").to_pylist()


def _pycocotools(gt_path: Path, rows: list[dict], iou_type: str, sigmas=None) -> np.ndarray:
    coco = COCO_API.COCO(str(gt_path))
    ids = {i["file_name"]: i["id"] for i in coco.dataset["images"]}
    results = coco_results([r for r in rows if r["boxes"] is not None], ids)
    assert results
    ev = COCO_EVAL.COCOeval(coco, coco.loadRes(results), iou_type)
    if sigmas is not None:
        ev.params.kpt_oks_sigmas = np.array(sigmas)
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    return ev.stats


@pytest.mark.slow  # two runs of 12 images and a report: 6-12 s (fast sibling below)
@pytest.mark.parametrize(
    ("task", "model", "gt", "iou_type", "prefix", "metrics", "sigmas"),
    [
        ("segment", "digits-seg.onnx", "instances-seg.json", "segm", "segm", "", None),
        ("pose", "digits-pose.onnx", "instances-pose.json", "keypoints", "kpt",
         "keypoint_sigmas = [0.1, 0.1, 0.1, 0.1]", [0.1] * 4),
    ],
)  # fmt: skip
def test_eval_scores_equal_pycocotools_on_the_same_predictions(
    scenes, task, model, gt, iou_type, prefix, metrics, sigmas
):
    job = _job(scenes, task, task, model, f"det/{gt}", metrics)
    result = invoke("eval", job)
    assert result.exit_code == 0, result.output
    record, rows = _record_and_items(scenes, task)
    assert record["task"] == task and len(rows) == 12
    part = "mask" if task == "segment" else "keypoints"
    assert all(part in b for r in rows for b in r["boxes"])
    stats = _pycocotools(scenes / "det" / gt, rows, iou_type, sigmas)
    parts = record["parts"]["device"]
    assert parts["map50_95"] == pytest.approx(stats[0], abs=1e-6)
    assert parts["map50"] == pytest.approx(stats[1], abs=1e-6)
    assert parts["map50_95"] > 0.3  # a real model, not an empty score
    bbox = _pycocotools(scenes / "det" / gt, rows, "bbox")
    assert record["metrics"]["map50_95"] == pytest.approx(bbox[0], abs=1e-6)
    # the float graph on the emulator and ONNX Runtime agree: no drop
    assert record["metrics"][f"{prefix}_map_drop"] == pytest.approx(0, abs=1e-9)
    assert f"COCO {iou_type}" in (scenes / "eval" / task / "summary.md").read_text()
    # the report's examples are drawn with their masks / keypoints
    shown = [b for w in record["worst"] for b in w["device_boxes"] + w["reference_boxes"]]
    assert shown and all(part in b for b in shown)


def test_a_pose_job_whose_sigmas_do_not_fit_the_keypoints_is_refused(scenes):
    job = _job(scenes, "pose-bad", "pose", "digits-pose.onnx", "det/instances-pose.json")
    result = invoke("eval", job)
    assert result.exit_code == 2, result.output
    assert "has 4 keypoints, but metrics.keypoint_sigmas" in result.output
    assert "COCO's person sigmas are 17" in result.output


def test_a_segment_job_on_yolo_labels_is_refused(scenes):
    labels = scenes / "labels"
    labels.mkdir(exist_ok=True)
    job = _job(scenes, "seg-yolo", "segment", "digits-seg.onnx", "labels")
    result = invoke("eval", job)
    assert result.exit_code == 2, result.output
    assert "reads its masks from a COCO instances .json file" in result.output


def _noisy_rows(coco: dict, rng: np.random.Generator) -> list[dict]:
    """Prediction rows from the ground truth, moved a little, with random scores, some
    missing and some classes wrong: a detector's rows with masks and keypoints."""
    from pycocotools import mask as mask_api

    by_image: dict[int, list[dict]] = {}
    for a in coco["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a)
    rows = []
    for image in coco["images"]:
        boxes = []
        for a in by_image.get(image["id"], []):
            if rng.random() < 0.15:
                continue
            dx, dy = (int(v) for v in rng.integers(-2, 3, 2))
            x, y, w, h = a["bbox"]
            box = {
                "class_id": a["category_id"] if rng.random() > 0.1 else (a["category_id"] + 1) % 10,
                "label": None, "score": float(rng.random()),
                "x1": x + dx, "y1": y + dy, "x2": x + w + dx, "y2": y + h + dy,
            }  # fmt: skip
            if "segmentation" in a:
                dense = np.roll(mask_api.decode(a["segmentation"]), (dy, dx), axis=(0, 1))
                rle = mask_api.encode(np.asfortranarray(dense))
                box["mask"] = {
                    "counts": rle["counts"].decode(),
                    "height": image["height"],
                    "width": image["width"],
                }
            if "keypoints" in a:
                points = np.array(a["keypoints"], float).reshape(-1, 3)
                points[:, :2] += rng.normal(0, 1.5, (len(points), 2))
                box["keypoints"] = [{"x": p[0], "y": p[1], "score": 0.9} for p in points]
            boxes.append(box)
        rows.append({"id": image["file_name"], "boxes": boxes})
    return rows


@pytest.mark.parametrize(
    ("gt", "iou_type", "sigmas"),
    [("instances-seg.json", "segm", None), ("instances-pose.json", "keypoints", [0.1] * 4)],
)
def test_the_part_scores_equal_pycocotools(scenes, gt, iou_type, sigmas):
    """The fast sibling of the end-to-end test: the scorer's COCO segm / keypoints score of
    the same predictions as pycocotools'."""
    from batchinfer.evaluate.groundtruth import read_coco
    from batchinfer.evaluate.scorers.instance_parts import PartInputs
    from batchinfer.evaluate.scorers.keypoints import KeypointItems
    from batchinfer.evaluate.scorers.segm import MaskItems

    path = scenes / "det" / gt
    coco = json.loads(path.read_text())
    rows = _noisy_rows(coco, np.random.default_rng(1))
    items_type = MaskItems if iou_type == "segm" else KeypointItems
    import pyarrow as pa

    from batchinfer.evaluate.scorers.instances_items import BOX_TYPE

    box_type = pa.struct([*BOX_TYPE, *items_type.PART_FIELDS])
    table = pa.table(
        {
            "index": pa.array(range(len(rows)), pa.int64()),
            "id": [r["id"] for r in rows],
            "boxes": pa.array([r["boxes"] for r in rows], pa.list_(box_type)),
        }
    )
    items = items_type.from_table(table)
    gt_read = read_coco(path, [r["id"] for r in rows])
    categories = sorted(c["id"] for c in coco["categories"])
    inputs = PartInputs(items, gt_read, categories).with_parts(iou_type, sigmas)
    stats = _pycocotools(path, table.to_pylist(), iou_type, sigmas)
    assert 0.2 < stats[0] < 0.95  # neither empty nor perfect
    assert inputs.part_score.map50_95 == pytest.approx(stats[0], abs=1e-6)
    assert inputs.part_score.map50 == pytest.approx(stats[1], abs=1e-6)
    assert inputs.part_score.map75 == pytest.approx(stats[2], abs=1e-6)
    # and the items keep their parts through items.parquet's table
    again = items_type.from_table(items.to_table())
    assert again.box_dicts(0) == items.box_dicts(0)
