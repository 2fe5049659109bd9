"""The demo segmenter (tools/build_demo_segmenter.py): its layout, masks, ground truth, mAP."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from batchinfer import demo
from batchinfer.demo import detection

TOOL = Path(__file__).resolve().parents[1] / "tools" / "build_demo_segmenter.py"
# pycocotools' decode warns under numpy 2 (its __array__ takes no copy keyword)
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("build_demo_segmenter", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]
        sys.modules.pop("build_demo_detector", None)


def _measured() -> dict:
    return json.loads((demo.ASSETS / "measured.json").read_text())["segmenter"]


# --------------------------------------------------------------------------- ground truth

mask_api = pytest.importorskip("pycocotools.mask")


def _rle(segmentation: dict) -> dict:
    return {"size": segmentation["size"], "counts": segmentation["counts"].encode()}


def test_ground_truth_masks_are_the_digits_ink():
    scenes = list(detection.scenes("val", 12))
    coco = detection.coco_instances([(f"{i:05d}.png", s) for i, s in enumerate(scenes)], masks=True)
    by_image: dict[int, list[dict]] = {}
    for a in coco["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a)
    partial = 0
    for image_id, scene in enumerate(scenes, start=1):
        h, w = scene.image.shape[:2]
        anns = by_image.get(image_id, [])
        assert len(anns) == len(scene.boxes) > 0
        masks = scene.masks()
        assert masks.sum(0).max() <= 1  # digits never share a pixel
        for a, mask, (x, y, ink) in zip(anns, masks, scene.ink, strict=True):
            got = mask_api.decode(_rle(a["segmentation"])).astype(bool)
            assert got.shape == (h, w)
            assert np.array_equal(got, mask)
            # the mask is exactly the glyph's ink pixels, in its patch, nowhere else
            assert np.array_equal(got[y : y + ink.shape[0], x : x + ink.shape[1]], ink)
            assert got.sum() == ink.sum() == a["area"]
            # the box is the tight box of the mask
            ys, xs = np.nonzero(got)
            bx, by, bw, bh = a["bbox"]
            assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (bx, by, bx + bw, by + bh)
            partial += int(got.sum() < bw * bh)
    assert partial == len(coco["annotations"])  # glyph shapes, never whole boxes


def test_write_detection_writes_boxes_and_masks(tmp_path):
    written = detection.write_detection(tmp_path / "det", n=3)
    boxes = json.loads(written.instances.read_text())
    assert written.instances_seg == tmp_path / "det" / "instances-seg.json"
    masks = json.loads(written.instances_seg.read_text())
    assert masks["images"] == boxes["images"]
    assert len(masks["annotations"]) == len(boxes["annotations"]) == written.boxes
    for m, b in zip(masks["annotations"], boxes["annotations"], strict=True):
        assert "segmentation" not in b
        assert {k: v for k, v in m.items() if k not in ("segmentation", "area")} == {
            k: v for k, v in b.items() if k != "area"
        }
        assert m["area"] == mask_api.decode(_rle(m["segmentation"])).sum()


def test_mask_targets_are_the_ink_at_prototype_resolution(tool):
    _, targets, scenes, placed = tool.det.placed_batch(0, 2)
    for target, boxes, scene, (scale, _, _) in zip(
        tool.mask_targets(scenes, placed), targets, scenes, placed, strict=True
    ):
        assert target.shape == (len(scene.boxes), tool.PROTO, tool.PROTO)
        assert target.min() >= 0 and target.max() <= 1
        for t, box, mask in zip(target, boxes[:, 1:], scene.masks(), strict=True):
            # the ink's area, scaled to the canvas, in 4 x 4 blocks
            assert t.sum() * 16 == pytest.approx(mask.sum() * scale**2, rel=0.15)
            ys, xs = np.nonzero(t)
            assert xs.min() * 4 >= box[0] - 4 and (xs.max() + 1) * 4 <= box[2] + 4
            assert ys.min() * 4 >= box[1] - 4 and (ys.max() + 1) * 4 <= box[3] + 4


# --------------------------------------------------------------------------- the model

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def session():
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(
        str(demo.model_path("digits-seg")), opts, providers=["CPUExecutionProvider"]
    )


def _outputs(session, canvas: np.ndarray) -> list[np.ndarray]:
    x = (canvas.transpose(2, 0, 1)[None] / np.float32(255.0)).astype(np.float32)
    return session.run(None, {"images": x})


def test_segmenter_is_the_model_zoo_yolov8_seg_layout(tool, session):
    from batchinfer.detect import recognise
    from batchinfer.detect.seg_heads import recognise_segment

    assert [i.shape for i in session.get_inputs()] == [[1, 3, 256, 256]]
    assert [o.name for o in session.get_outputs()] == tool.output_names()
    shapes = [tuple(o.shape) for o in session.get_outputs()]
    per_stride = [(1, c, 256 // s, 256 // s) for s in (8, 16, 32) for c in (64, 10, 1, 32)]
    assert shapes == [*per_stride, (1, 32, 64, 64)]
    head = recognise_segment((256, 256), shapes)
    assert head is not None and head.family == "yolov8-seg-zoo"
    assert (head.num_classes, head.num_masks, head.proto_hw, head.proto_index) == (
        10,
        32,
        (64, 64),
        12,
    )
    assert recognise((256, 256), shapes) is None  # not mistaken for a detector
    assert (demo.ASSETS / "digits-seg.onnx").stat().st_size <= 2_100_000


def test_segmenter_boxes_are_the_detectors(session):
    """The detector part is digits-det.onnx's weights, frozen: the same nine outputs."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    detector = ort.InferenceSession(str(demo.model_path("digits-det")), opts)
    for scene in detection.scenes("val", 2):
        canvas = detection.letterbox(scene.image, 256)[0]
        seg = _outputs(session, canvas)
        want = _outputs(detector, canvas)
        got = [o for i, o in enumerate(seg[:12]) if i % 4 != 3]  # all but the coefficients
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-5)


def test_first_val_images_decode_to_masks_and_the_recorded_map(session):
    """SegmentDecoder on the demo's first val images: every mask is RLE pycocotools
    decodes, inside its box; bbox and segm mAP (pycocotools) as measured.json records."""
    pytest.importorskip("pycocotools.cocoeval")
    from batchinfer.detect.decode import DetectSettings
    from batchinfer.detect.letterbox import Letterbox
    from batchinfer.detect.seg_decode import SegmentDecoder
    from batchinfer.detect.seg_heads import recognise_segment

    measured = _measured()["score"]
    n = measured["first_images"]
    shapes = [tuple(o.shape) for o in session.get_outputs()]
    decoder = SegmentDecoder(
        recognise_segment((256, 256), shapes), (256, 256), DetectSettings(**measured["decode"])
    )
    results = []
    for image_id, scene in enumerate(detection.scenes("val", n), start=1):
        h, w = scene.image.shape[:2]
        canvas, scale, px, py = detection.letterbox(scene.image, 256)
        found = decoder.decode(_outputs(session, canvas), Letterbox(w, h, scale, px, py))
        assert len(found) > 0
        for box, score, c, m in zip(
            found.boxes, found.scores, found.class_ids, found.mask_structs(), strict=True
        ):
            segmentation = {"size": [m["height"], m["width"]], "counts": m["counts"]}
            mask = mask_api.decode(_rle(segmentation))
            assert mask.shape == (h, w)
            x1, y1, x2, y2 = (float(v) for v in box)
            ys, xs = np.nonzero(mask)
            if len(xs):  # pixel centres inside the box
                assert xs.min() + 0.5 >= x1 and xs.max() + 0.5 < x2
                assert ys.min() + 0.5 >= y1 and ys.max() + 0.5 < y2
            results.append(
                {
                    "image_id": image_id,
                    "category_id": int(c),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "score": float(score),
                    "segmentation": segmentation,
                }
            )
    recorded = measured["maps"]["digits-seg.onnx"]["first"]
    for kind, stats in _coco_eval(results, n).items():
        assert stats[1] == pytest.approx(recorded[kind]["map50"], abs=1e-6), kind
        assert stats[0] == pytest.approx(recorded[kind]["map50_95"], abs=1e-6), kind


def _coco_eval(results: list[dict], n: int) -> dict[str, np.ndarray]:
    """pycocotools' bbox and segm stats of ``results`` on the first ``n`` val scenes."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    scenes = detection.scenes("val", n)
    gt = COCO()
    gt.dataset = detection.coco_instances(
        [(f"{i:05d}.png", s) for i, s in enumerate(scenes)], masks=True
    )
    stats = {}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        dt = gt.loadRes(results)
        for kind in ("bbox", "segm"):
            ev = COCOeval(gt, dt, kind)
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
            stats[kind] = ev.stats
    return stats


def test_model_card_gives_the_recorded_map():
    score = _measured()["score"]["maps"]["digits-seg.onnx"]["all"]
    card = (demo.ASSETS / "SEGMENTER.md").read_text()
    for kind in ("bbox", "segm"):
        assert f"{score[kind]['map50']:.3f}" in card
    assert score["segm"]["map50"] >= 0.5 and score["bbox"]["map50"] >= 0.8


# --------------------------------------------------------------------------- .rknn files


@pytest.mark.parametrize("stem", sorted(demo.rknn_stems(segmenter=True)))
def test_segmenter_rknn_files_name_their_chip_and_the_13_outputs(tool, stem):
    from batchinfer.runtime.rknn_file import read_rknn_metadata

    recipe, platform = demo.rknn_recipe(stem)
    assert recipe is demo.SEGMENTER_RECIPE and recipe.calibration == "digits-det"
    meta = read_rknn_metadata(demo.ASSETS / f"{stem}.rknn")
    assert meta is not None and meta.platforms == (platform,)
    assert [t.name for t in meta.inputs] == ["images"]
    assert meta.inputs[0].shape == (1, 3, 256, 256)
    assert [t.name for t in meta.outputs] == tool.output_names()
    settings = json.loads((demo.ASSETS / f"{stem}.config.json").read_text())
    assert settings == tool.det.detector_settings(platform)


def test_int8_segmenter_scores_close_to_the_float_one():
    maps = _measured()["score"]["maps"]
    int8 = maps[f"digits-seg-{demo.RKNN_PLATFORMS[0]}.rknn"]["all"]
    float_ = maps["digits-seg.onnx"]["all"]
    for kind in ("bbox", "segm"):
        assert int8[kind]["map50"] == pytest.approx(float_[kind]["map50"], abs=0.02)
    card = (demo.ASSETS / "SEGMENTER.md").read_text()
    assert f"segm **mAP@0.5 {int8['segm']['map50']:.3f}**" in card
