"""Detection as a task of the engine: letterboxed reads, decoding in the core workers, boxes in
the original image's pixels, the schema, info, export, resume, bench.

The model is tests/detect_models.py's colour detector (the model-zoo YOLOv8 head layout):
a red (class 0) or green (class 1) patch covering a stride-8 cell of the letterboxed 64x64
input gives one 16x16 box centred on that cell, so every box below follows from where the
patch is and how the image is letterboxed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import models as M
import numpy as np
import pyarrow.parquet as pq
import pytest
from detect_models import CLASSES, cell_box, colour_detector, labels_file
from PIL import Image
from runs import config, fast_sim
from test_cli import FAST_SIM, assert_error, invoke

from batchinfer import run
from batchinfer.errors import UsageError
from batchinfer.export import export_coco
from batchinfer.results import read_boxes, read_run

EXIF_ORIENTATION = 0x0112


def _red_128x96() -> Image.Image:
    """128x96: letterboxed at scale 1/2 with 8 px of padding above and below; the red
    16x16 block at (32, 16) lands exactly on stride-8 cell (2, 2)."""
    a = np.zeros((96, 128, 3), np.uint8)
    a[16:32, 32:48] = (255, 0, 0)
    return Image.fromarray(a)


def _green_101x77() -> Image.Image:
    """An odd size: scale 64/101, the resized image 64x49, 7 px of padding on top; the
    green patch covers cell (4, 4) of the input (x, y 31.7..40.6) and only slivers of its
    neighbours."""
    a = np.zeros((77, 101, 3), np.uint8)
    a[39:53, 50:64] = (0, 255, 0)
    return Image.fromarray(a)


def _expected(cell: tuple[int, int], width: int, height: int) -> tuple[float, ...]:
    """The box of ``cell`` mapped back to a width x height image's pixels (the zoo's
    letterbox: scale to fit 64x64, round the size, floor half the padding)."""
    scale = min(64 / width, 64 / height)
    pad_x = (64 - round(width * scale)) // 2
    pad_y = (64 - round(height * scale)) // 2
    x1, y1, x2, y2 = cell_box(*cell)
    return (
        max(0.0, (x1 - pad_x) / scale),
        max(0.0, (y1 - pad_y) / scale),
        min(width, (x2 - pad_x) / scale),
        min(height, (y2 - pad_y) / scale),
    )


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """The detector, its labels and a dataset: upright, EXIF-rotated, odd-sized, corrupt,
    and an image with nothing in it."""
    root = Path(tmp_path_factory.mktemp("detect"))
    model = colour_detector(root)
    labels = labels_file(root)
    data = root / "images"
    data.mkdir()
    _red_128x96().save(data / "a_upright.png")
    # Stored turned a quarter left, tagged "rotate 90 CW to view" (EXIF 6): seen upright it
    # is the same 128x96 picture, and its boxes are in that picture's pixels.
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 6
    _red_128x96().transpose(Image.Transpose.ROTATE_90).save(data / "b_rotated.jpg", exif=exif)
    _green_101x77().save(data / "c_odd.png")
    (data / "d_corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n but not really")
    Image.new("RGB", (50, 70), (255, 255, 255)).save(data / "e_empty.png")
    return root, model, labels, data


def _config(kit, out: Path, backend: str = "onnx", **flat):
    _, model, labels, data = kit
    if backend == "sim":
        flat["sim"] = fast_sim()
    cfg = config(data, model, backend=backend, out=out, **flat)
    return dataclasses.replace(cfg, labels=labels)


@pytest.fixture(scope="module")
def onnx_run(kit, tmp_path_factory):
    """The module's detection run with the default settings (ONNX Runtime): one run that the
    tests reading it (rows, schema, scores, exports) share; none of them writes into it."""
    return run(_config(kit, tmp_path_factory.mktemp("onnx-run") / "o"))


def _rows(out: Path) -> dict[str, dict]:
    return {r["id"]: r for r in read_run(out).predictions().to_pylist()}


def _boxes(row: dict) -> list[tuple]:
    return [(b["class_id"], b["label"], b["x1"], b["y1"], b["x2"], b["y2"]) for b in row["boxes"]]


@pytest.mark.parametrize("backend", ["onnx", "sim"])
def test_boxes_land_in_the_original_images_pixels(kit, tmp_path, backend, request):
    if backend == "onnx":
        result = request.getfixturevalue("onnx_run")
    else:
        result = run(_config(kit, tmp_path / "o", backend))
    assert (result.succeeded, result.errors) == (4, 1)
    rows = _rows(result.out)

    want = _expected((2, 2), 128, 96)
    assert want == (24.0, 8.0, 56.0, 40.0)  # the red block's cell, in the 128x96 picture
    for name in ("a_upright.png", "b_rotated.jpg"):
        row = rows[name]
        assert (row["width"], row["height"], row["n_boxes"]) == (128, 96, 1), name
        [(cls, label, *box)] = _boxes(row)
        assert (cls, label) == (0, "red")
        assert box == pytest.approx(want, abs=1e-3)

    odd = rows["c_odd.png"]
    assert (odd["width"], odd["height"], odd["n_boxes"]) == (101, 77, 1)
    [(cls, label, *box)] = _boxes(odd)
    assert (cls, label) == (1, "green")
    assert box == pytest.approx(_expected((4, 4), 101, 77), abs=1e-3)

    empty = rows["e_empty.png"]  # white scores 0: no box, but a row like any other
    assert (empty["boxes"], empty["n_boxes"], empty["error"]) == ([], 0, None)
    assert (empty["width"], empty["height"]) == (50, 70)

    bad = rows["d_corrupt.png"]
    assert bad["error"] and "d_corrupt.png" in bad["error"]
    assert (bad["boxes"], bad["n_boxes"], bad["width"]) == (None, None, None)

    manifest = read_run(result.out).manifest.raw
    assert manifest["task"]["task"] == "detect"
    assert manifest["task"]["description"] == (
        "detect: YOLOv8 model-zoo head, 2 classes, strides 8/16/32"
    )
    assert manifest["task"]["settings"] == {
        "conf": 0.25,
        "iou": 0.45,
        "max_det": 300,
        "agnostic_nms": False,
        "classes": None,
        "anchors": None,
        "anchors_source": None,
    }
    assert manifest["task"]["names"] == list(CLASSES)
    assert manifest["detect"]["items_decoded"] == 4
    assert manifest["detect"]["boxes"] == 3
    assert manifest["detect"]["nonfinite_dropped"] == 0
    assert manifest["preprocess"]["resize"] == "letterbox"
    assert manifest["preprocess"]["pad"] == [114, 114, 114]


def test_the_detection_schema_and_the_box_reader(onnx_run):
    result = onnx_run
    part = sorted((result.out / "predictions").glob("part-*.parquet"))[0]
    schema = pq.read_schema(part)
    names = schema.names
    assert {"boxes", "n_boxes", "width", "height"} <= set(names)
    assert not {"pred", "topk_index", "topk_score"} & set(names)
    box = schema.field("boxes").type.value_type
    assert [(f.name, str(f.type)) for f in box] == [
        ("class_id", "int32"),
        ("label", "string"),
        ("score", "float"),
        ("x1", "float"),
        ("y1", "float"),
        ("x2", "float"),
        ("y2", "float"),
    ]
    assert str(schema.field("n_boxes").type) == "int32"
    boxes = read_boxes(result.out).to_pylist()
    assert [(b["id"], b["label"]) for b in boxes] == [
        ("a_upright.png", "red"),
        ("b_rotated.jpg", "red"),
        ("c_odd.png", "green"),
    ]
    assert all(0 < b["score"] <= 1 for b in boxes)


def test_scores_below_conf_are_dropped(kit, tmp_path, onnx_run):
    """--conf is applied in the workers: a threshold between the scores keeps the boxes at
    or above it, and only those."""
    first = read_boxes(onnx_run.out).to_pylist()
    scores = {b["id"]: b["score"] for b in first}
    assert len(set(scores.values())) > 1  # the blurred edges score a little lower
    conf = (min(scores.values()) + max(scores.values())) / 2
    result = run(_config(kit, tmp_path / "b", conf=conf))
    kept = {b["id"] for b in read_boxes(result.out).to_pylist()}
    assert kept == {i for i, s in scores.items() if s >= conf}
    assert 0 < len(kept) < len(scores)


def test_without_labels_80_classes_get_coco_names_and_others_none(kit, tmp_path):
    _, model, _, data = kit
    result = run(config(data, model, backend="onnx", out=tmp_path / "o"))
    rows = _rows(result.out)
    assert [b["label"] for b in rows["a_upright.png"]["boxes"]] == [None]
    assert read_run(result.out).manifest.raw["task"]["names_source"] == "none"


# Default tier: resume is exact for classification (test_reliability.py, test_output_safety.py).
@pytest.mark.slow
def test_resume_of_a_detection_run_is_exact(kit, tmp_path):
    once = run(_config(kit, tmp_path / "once"))
    out = tmp_path / "twice"
    first = run(_config(kit, out, limit=2))
    assert first.succeeded == 2
    again = run(_config(kit, out, resume=True))
    assert (again.skipped, again.succeeded, again.errors) == (2, 2, 1)
    a, b = _rows(once.out), _rows(out)
    assert a.keys() == b.keys()
    for key in a:
        for col in ("boxes", "n_boxes", "width", "height", "error"):
            assert a[key][col] == b[key][col], (key, col)
    manifest = read_run(out).manifest.raw
    assert manifest["detect"]["items_decoded"] == 4  # both invocations
    # Other detection settings would write other rows: a resume with them is refused.
    with pytest.raises(UsageError, match="task and detection settings"):
        run(_config(kit, out, resume=True, conf=0.5))


def test_export_coco_with_and_without_annotations(onnx_run, tmp_path):
    result = onnx_run
    plain = export_coco(result.out, tmp_path / "r.json")
    written = json.loads((tmp_path / "r.json").read_text())
    assert written == plain.results and len(written) == 3
    by_image = {r["image_id"]: r for r in written}
    assert by_image[0]["bbox"] == pytest.approx([24.0, 8.0, 32.0, 32.0], abs=1e-3)
    assert by_image[0]["category_id"] == 0  # no annotations, not COCO's names: class ids

    annotations = {
        "images": [
            {"id": 7, "file_name": "images/a_upright.png"},
            {"id": 8, "file_name": "b_rotated.jpg"},
            {"id": 9, "file_name": "c_odd.png"},
            {"id": 10, "file_name": "e_empty.png"},
        ],
        "categories": [{"id": 3, "name": "green"}, {"id": 5, "name": "red"}],
    }
    (tmp_path / "ann.json").write_text(json.dumps(annotations))
    matched = export_coco(result.out, None, tmp_path / "ann.json").results
    assert sorted((r["image_id"], r["category_id"]) for r in matched) == [(7, 5), (8, 5), (9, 3)]


def test_export_annotations_are_read_as_a_run_reads_a_coco_file(onnx_run, tmp_path):
    """export coco --annotations read its file whole with no check: a FIFO blocked it for
    ever, and JSON nested deep was a RecursionError traceback (issue 40, items 7 and 9)."""
    result = onnx_run
    fifo = tmp_path / "ann.json"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="FIFO"):
        export_coco(result.out, None, fifo)
    deep = tmp_path / "deep.json"
    deep.write_text('{"images": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(UsageError, match="nest JSON deeper"):
        export_coco(result.out, None, deep)


def test_export_refuses_a_classification_run(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    Image.new("L", (8, 8)).save(data / "x.png")
    model = M.nhwc_uint8_model(tmp_path)
    result = run(config(data, model, backend="onnx", out=tmp_path / "o"))
    with pytest.raises(UsageError, match="not a detection run"):
        export_coco(result.out, tmp_path / "r.json")


# ------------------------------------------------------------------------------- the CLI
def test_cli_run_and_export(kit, tmp_path):
    _, model, labels, data = kit
    out = tmp_path / "o"
    result = invoke("run", data, "--model", model, "--out", out, "--labels", labels, *FAST_SIM)
    assert result.exit_code == 1, result.output  # the corrupt image is an error row
    assert "complete: 4 succeeded, 1 error" in result.stdout
    exported = invoke("export", "coco", out, "--out", tmp_path / "r.json")
    assert exported.exit_code == 0, exported.output
    assert "wrote 3 boxes of 4 images" in exported.stdout


def test_task_detect_on_a_classifier_is_a_usage_error(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    Image.new("L", (8, 8)).save(data / "x.png")
    model = M.nhwc_uint8_model(tmp_path)
    result = invoke("run", data, "--model", model, "--out", tmp_path / "o", "--task", "detect")
    line = assert_error(result, 2, "--task detect", "(1, 10)", "--task classify or raw")
    assert "rknn_model_zoo YOLOv5/v7" in line  # the heads batchinfer knows
    assert not (tmp_path / "o").exists()


def test_a_labels_file_whose_count_differs_is_a_usage_error(kit, tmp_path):
    _, model, _, data = kit
    three = labels_file(tmp_path, ("red", "green", "blue"))
    result = invoke("run", data, "--model", model, "--out", tmp_path / "o", "--labels", three)
    assert_error(result, 2, "names 3 classes", "2 classes", "--labels")


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--conf", "1.5", "--conf must be at most 1, not 1.5"),
        ("--iou", "0", "--iou must be positive, not 0"),
        ("--max-det", "0", "--max-det must be at least 1"),
        ("--pad-colour", "300", "--pad-colour must be at most 255 (8-bit pixels), not 300"),
    ],
)
def test_detection_settings_out_of_range_are_usage_errors(kit, tmp_path, flag, value, needle):
    _, model, _, data = kit
    result = invoke("run", data, "--model", model, "--out", tmp_path / "o", flag, value)
    assert_error(result, 2, needle)


def test_info_says_which_task_and_head_and_why(kit, tmp_path):
    _, model, _, _ = kit
    result = invoke("info", model, "--backend", "onnx")
    assert result.exit_code == 0, result.output
    assert "task:    detect: YOLOv8 model-zoo head, 2 classes, strides 8/16/32" in result.stdout
    assert "fit that layout for a 64x64 input" in result.stdout
    classifier = invoke("info", M.nhwc_uint8_model(tmp_path), "--backend", "onnx")
    assert "task:    classify: one output of 10 scores" in classifier.stdout
    two = invoke("info", M.two_output_model(tmp_path), "--backend", "onnx")
    assert "task:    raw: outputs [1, 4], [1, 1] are neither" in two.stdout


def test_a_task_forced_to_classify_keeps_the_classification_schema(kit, tmp_path):
    """--task classify on the detector: stretched inputs, today's columns, no boxes."""
    result = run(_config(kit, tmp_path / "o", task="classify"))
    table = read_run(result.out).predictions()
    assert "pred" in table.column_names and "boxes" not in table.column_names
    assert read_run(result.out).manifest.raw["preprocess"]["resize"] == "stretch"


def test_a_raw_run_stores_the_outputs(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    np.save(data / "x.npy", np.arange(4, dtype=np.float32).reshape(1, 4))
    result = run(config(data, M.two_output_model(tmp_path), backend="onnx", out=tmp_path / "o"))
    table = read_run(result.out).predictions()
    assert table["out_output0"].to_pylist() == [[0.0, 2.0, 4.0, 6.0]]
    assert read_run(result.out).manifest.raw["task"]["task"] == "raw"
    # Outputs only: no top-1 or top-k of an output that is no score vector (before, the
    # collector ranked output 0 and the rows said pred 3).
    assert not {"pred", "topk_index", "topk_score"} & set(table.column_names)
    assert table.schema.metadata[b"batchinfer.task"] == b"raw"


# A bench; default tier: bench on a classifier (test_bench_cli.py), a detection run's
# post-processing record in its manifest (this file).
@pytest.mark.slow
def test_bench_on_a_detector_reports_the_post_processing_share(kit, tmp_path):
    _, model, _, _ = kit
    short = ["--duration", "0.75", "--warmup", "0.25", "--window", "0.25", "--max-duration", "1"]
    path = tmp_path / "b.json"
    result = invoke("bench", "--model", model, "--backend", "onnx", *short, "--json", path)
    assert result.exit_code in (0, 1), result.output  # valid or not: the figures exist
    data = json.loads(path.read_text())
    post = data["postprocess"]
    assert post["items"] > 0 and post["cpu_ms_per_item"] > 0
    assert 0 < post["share_of_worker_cpu"] <= 1
    assert "post-processing (box decoding and NMS in the core workers)" in result.stdout
    assert data["config"]["task"] == "detect: YOLOv8 model-zoo head, 2 classes, strides 8/16/32"


# Default tier: --save-outputs of a classifier (test_engine.py), a raw run's outputs (below).
@pytest.mark.slow
def test_save_outputs_keeps_the_raw_outputs_beside_the_boxes(kit, tmp_path):
    result = run(_config(kit, tmp_path / "o", save_outputs=True))
    rows = _rows(result.out)
    row = rows["a_upright.png"]
    assert row["n_boxes"] == 1
    scores = np.array(row["out_output1"]).reshape(2, 8, 8)  # stride 8's class scores
    assert scores[0, 2, 2] == pytest.approx(row["boxes"][0]["score"])
    assert rows["d_corrupt.png"]["out_output1"] is None


def test_an_empty_detection_run_reads_with_the_detection_columns(kit, tmp_path):
    """Before any part is written (a run just started), the reader gives the run's schema."""
    from batchinfer.results import read_predictions

    out = run(_config(kit, tmp_path / "o", limit=1)).out
    for part in (out / "predictions").glob("part-*.parquet"):
        part.unlink()
    table = read_predictions(out)
    assert table.num_rows == 0 and "boxes" in table.column_names
