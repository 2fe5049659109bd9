"""The synthetic detection set: deterministic, honest boxes, disjoint splits, COCO JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from batchinfer import demo
from batchinfer.demo import detection
from batchinfer.errors import UsageError


def _same(a: detection.Scene, b: detection.Scene) -> bool:
    return (
        np.array_equal(a.image, b.image)
        and np.array_equal(a.boxes, b.boxes)
        and np.array_equal(a.labels, b.labels)
        and np.array_equal(a.digits, b.digits)
    )


@pytest.fixture(scope="module")
def val() -> list[detection.Scene]:
    return list(detection.scenes("val", detection.VAL_IMAGES))


def test_scenes_are_deterministic_and_image_i_does_not_depend_on_the_count():
    first = list(detection.scenes("val", 6))
    again = list(detection.scenes("val", 6))
    assert all(_same(a, b) for a, b in zip(first, again, strict=True))
    later = list(detection.scenes("val", 2, start=4))
    assert _same(later[0], first[4]) and _same(later[1], first[5])
    other_seed = list(detection.scenes("val", 6, seed=1))
    assert not any(_same(a, b) for a, b in zip(first, other_seed, strict=True))
    train = list(detection.scenes("train", 6))
    assert not any(_same(a, b) for a, b in zip(first, train, strict=True))


def test_boxes_lie_inside_their_image_and_have_the_digits_labels(val):
    _, labels = demo.load_digits()
    sizes = []
    for scene in val:
        h, w, channels = scene.image.shape
        assert channels == 3 and scene.image.dtype == np.uint8
        assert min(h, w) >= detection.CANVAS_MIN // 2 and max(h, w) <= detection.CANVAS_MAX
        assert 1 <= len(scene.boxes) <= detection.MAX_DIGITS
        x1, y1, x2, y2 = scene.boxes.T
        assert np.all((x1 >= 0) & (y1 >= 0) & (x2 <= w) & (y2 <= h))
        assert np.all((x2 > x1) & (y2 > y1))
        assert np.array_equal(scene.labels, labels[scene.digits])
        sizes.extend(np.maximum(x2 - x1, y2 - y1))
    # The ink box is at most the patch (16..64 px on its longer side), and small digits exist.
    assert max(sizes) <= detection.DIGIT_MAX and min(sizes) < 24
    # Every class appears, and not one class dominates.
    counts = np.bincount(np.concatenate([s.labels for s in val]), minlength=10)
    assert counts.min() > 0.5 * counts.mean()


def test_digits_of_a_scene_do_not_overlap(val):
    for scene in val:
        b = scene.boxes
        for i in range(len(b)):
            for j in range(i + 1, len(b)):
                iw = min(b[i, 2], b[j, 2]) - max(b[i, 0], b[j, 0])
                ih = min(b[i, 3], b[j, 3]) - max(b[i, 1], b[j, 1])
                assert iw <= 0 or ih <= 0


def test_a_box_is_the_tight_box_of_visible_ink(val):
    # On flat, noise-free scenes with one digit: a pixel's change from the background is
    # its ink alpha times one contrast, so every edge row/column of the box holds a pixel
    # changed more (alpha >= INK_ALPHA) than any pixel outside the box (faint ink only).
    # The first 600 val scenes: the module's (made once, same seed) and the next ones.
    assert detection.SEED == 0
    more = detection.scenes("val", 600 - len(val), start=len(val))
    checked = 0
    for scene in [*val, *more]:
        img = scene.image.astype(np.int64)
        bg = img[0, 0]
        if len(scene.boxes) != 1:
            continue
        x1, y1, x2, y2 = scene.boxes[0].astype(int)
        change = np.abs(img - bg).max(axis=2)
        # Faint ink reaches at most one glyph pixel (DIGIT_MAX / 8) beyond the box.
        m = detection.DIGIT_MAX // 8 + 1
        far = change.copy()
        far[max(y1 - m, 0) : y2 + m, max(x1 - m, 0) : x2 + m] = 0
        if far.max():
            continue  # not a flat, noise-free background
        outside = change.copy()
        outside[y1:y2, x1:x2] = 0
        edges = (change[y1, x1:x2], change[y2 - 1, x1:x2], change[y1:y2, x1], change[y1:y2, x2 - 1])
        assert outside.max() <= min(e.max() for e in edges) + 1  # +1: rounding to uint8
        peak = change[y1:y2, x1:x2].max()
        assert peak > 40  # the ink is visible
        assert min(e.max() for e in edges) >= detection.INK_ALPHA * peak - 1  # edges are ink
        checked += 1
    assert checked >= 5


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_val_uses_only_held_out_digits_and_train_never_does(val):
    held_out = set(demo.test_split().tolist())
    val_digits = {d for s in val for d in s.digits.tolist()}
    train_digits = {d for s in detection.scenes("train", 300) for d in s.digits.tolist()}
    assert val_digits <= held_out and len(val_digits) > 200
    assert not train_digits & held_out and len(train_digits) > 500


def test_some_images_are_strips_for_the_letterbox(val):
    ratios = [max(s.image.shape[:2]) / min(s.image.shape[:2]) for s in val]
    strips = sum(r >= 2 for r in ratios)
    assert 20 <= strips <= len(val) // 4


def test_write_detection_writes_pngs_and_coco_instances(demo_kit, val):
    written = demo_kit.detection  # write_detection's, as write_demo made the session's kit
    assert written.count == detection.VAL_IMAGES >= 500
    coco = json.loads(written.instances.read_text())
    assert [c["name"] for c in coco["categories"]] == [str(d) for d in range(10)]
    assert [c["id"] for c in coco["categories"]] == list(range(10))
    assert len(coco["images"]) == written.count == len(list(written.images.iterdir()))
    assert len(coco["annotations"]) == written.boxes == sum(len(s.boxes) for s in val)
    assert len({a["id"] for a in coco["annotations"]}) == written.boxes
    by_image: dict[int, list] = {}
    for a in coco["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a)
    for entry, scene in list(zip(coco["images"], val, strict=True))[:50]:
        with Image.open(written.images / entry["file_name"]) as im:
            assert im.mode == "RGB" and im.size == (entry["width"], entry["height"])
            assert np.array_equal(np.asarray(im), scene.image)
        anns = by_image[entry["id"]]
        xywh = np.array([a["bbox"] for a in anns])
        assert np.allclose(xywh[:, :2], scene.boxes[:, :2])
        assert np.allclose(xywh[:, :2] + xywh[:, 2:], scene.boxes[:, 2:])
        assert [a["category_id"] for a in anns] == scene.labels.tolist()


def test_bad_requests_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="train or val"):
        next(detection.scenes("test", 1))
    with pytest.raises(UsageError, match="at least 1"):
        detection.write_detection(tmp_path / "x", n=0)
