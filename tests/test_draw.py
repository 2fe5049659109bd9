"""batchinfer.draw: each field of a row's boxes changes the pixels it should, and only those."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from batchinfer.detect.rle import encode
from batchinfer.detect.rotated import corners
from batchinfer.draw import (
    COCO_SKELETON,
    class_color,
    draw_result,
    label_text,
    shown,
)

GREY = 100
W, H = 200, 120


def canvas() -> np.ndarray:
    return np.full((H, W, 3), GREY, np.uint8)


def changed(before: np.ndarray, after: Image.Image) -> np.ndarray:
    """(H, W) bool: the pixels drawing changed."""
    return np.any(np.asarray(after) != before, axis=2)


def near(diff: np.ndarray, x: float, y: float) -> bool:
    """Whether a pixel within one of (x, y) was drawn."""
    col, row = round(x), round(y)
    return bool(diff[row - 1 : row + 2, col - 1 : col + 2].any())


def box(**fields):
    return {"class_id": 3, "label": "cat", "score": 0.9, **fields}


def test_a_box_outline_lands_on_its_edges_and_nowhere_else():
    before = canvas()
    b = box(x1=40, y1=30, x2=120, y2=90)
    after = draw_result(before, [b], labels=False, width=2)
    diff = changed(before, after)
    pixels = np.asarray(after)
    assert tuple(pixels[60, 40]) == class_color(3)  # left edge, top edge, right edge, bottom
    assert tuple(pixels[30, 80]) == class_color(3)
    assert tuple(pixels[60, 120]) == tuple(pixels[90, 80]) == class_color(3)
    assert not diff[35:86, 45:116].any()  # the inside is untouched
    ys, xs = np.nonzero(diff)
    assert (xs.min(), ys.min(), xs.max(), ys.max()) == (40, 30, 120, 90)
    # the input array itself is never drawn on
    assert (before == GREY).all()


def test_a_label_has_a_background_and_stays_inside_the_image():
    before = canvas()
    # A box at the top-right corner: no room above it nor to its right for its label.
    b = box(x1=W - 20, y1=0, x2=W - 1, y2=20, label="a long class name")
    after = draw_result(before, [b])
    diff = changed(before, after)
    assert label_text(b) == "a long class name 0.90"
    ys, xs = np.nonzero(diff)
    # the label reaches far left of the box (moved inside the image), not past its edge
    assert xs.min() < W - 80 and xs.max() <= W - 1 and ys.min() >= 0
    # its background is the class colour, its text dark or light on it
    strip = np.asarray(after)[0:8, xs.min() : W - 20]
    colours = {tuple(p) for p in strip.reshape(-1, 3)}
    assert class_color(3) in colours and len(colours) >= 2


def test_a_mask_fills_inside_and_outlines_its_edge_and_leaves_the_outside():
    before = canvas()
    dense = np.zeros((H, W), bool)
    yy, xx = np.mgrid[:H, :W]
    dense[(yy - 60) ** 2 + (xx - 100) ** 2 <= 30**2] = True  # a disc
    rle = {"counts": encode(dense), "height": H, "width": W}
    after = draw_result(before, [box(mask=rle)], labels=False, mask_alpha=0.5)
    diff = changed(before, after)
    assert np.array_equal(diff, dense)  # no box fields: the mask is all that is drawn
    pixels = np.asarray(after).astype(int)
    colour = np.array(class_color(3))
    blended = np.round(GREY * 0.5 + colour * 0.5)
    assert np.abs(pixels[60, 100] - blended).max() <= 1  # the centre: blended
    assert tuple(pixels[60, 70]) == class_color(3)  # the edge: solid


def test_a_mask_is_scaled_to_a_smaller_picture():
    dense = np.zeros((H, W), bool)
    dense[20:60, 100:180] = True
    rle = {"counts": encode(dense), "height": H, "width": W}
    small = np.full((H // 2, W // 2, 3), GREY, np.uint8)
    diff = changed(small, draw_result(small, [box(mask=rle)], labels=False, scale=0.5))
    ys, xs = np.nonzero(diff)
    assert (xs.min(), ys.min(), xs.max(), ys.max()) == (50, 10, 89, 29)


def test_a_rotated_box_is_drawn_as_its_polygon_at_the_computed_corners():
    before = canvas()
    xywhr = (100.0, 60.0, 80.0, 30.0, math.pi / 6)
    b = box(cx=xywhr[0], cy=xywhr[1], w=xywhr[2], h=xywhr[3], angle=xywhr[4],
            x1=0, y1=0, x2=W - 1, y2=H - 1)  # fmt: skip  # enclosing box: not drawn
    after = draw_result(before, [b], labels=False, width=1)
    diff = changed(before, after)
    quad = corners(np.array([xywhr]))[0]
    for x, y in quad:  # a drawn pixel within a pixel of every corner
        assert near(diff, x, y)
    # an edge's midpoint is drawn, the centre and the (unused) enclosing box's corners not
    assert near(diff, *((quad[0] + quad[1]) / 2))
    assert not diff[55:66, 95:106].any()
    assert not diff[0:3, 0:3].any() and not diff[H - 3 :, W - 3 :].any()
    ys, xs = np.nonzero(diff)
    assert xs.min() >= quad[:, 0].min() - 1 and xs.max() <= quad[:, 0].max() + 1
    assert ys.min() >= quad[:, 1].min() - 1 and ys.max() <= quad[:, 1].max() + 1


def test_keypoints_and_their_skeleton_are_drawn_where_visible():
    before = canvas()
    points = [{"x": 20.0 + 8 * k, "y": 60.0, "score": 0.9} for k in range(17)]
    points[16] = {"x": 180.0, "y": 10.0, "score": 0.1}  # below keypoint_conf: not drawn
    after = draw_result(before, [box(keypoints=points)], labels=False, keypoint_conf=0.5)
    diff = changed(before, after)
    assert tuple(np.asarray(after)[60, 20]) == class_color(3)  # a dot on keypoint 0
    assert not diff[5:16, 175:186].any()  # the hidden one, and its bone (14, 16), are not
    # the bone (5, 6) joins keypoints 5 and 6: the pixels between them are drawn
    assert (5, 6) in COCO_SKELETON and diff[60, 60:68].all()
    ys, _ = np.nonzero(diff)
    assert ys.min() >= 55 and ys.max() <= 65  # nothing off the row of points
    # another skeleton for other keypoints: pairs past the points given are ignored
    other = draw_result(
        before, [box(keypoints=points[:3])], labels=False, skeleton=[(0, 2), (2, 9)]
    )
    assert changed(before, other)[60, 20:36].all()
    # by default only 17 keypoints get COCO's person skeleton: 4 keypoints (the demo's ink
    # ends) are dots, not joined by the bones (0, 1), (1, 2) of a nose, eyes and ears
    four = draw_result(before, [box(keypoints=points[:4])], labels=False)
    assert (0, 1) in COCO_SKELETON and not changed(before, four)[60, 24]


def test_threshold_and_cap():
    rows = [box(x1=10 * k, y1=5, x2=10 * k + 5, y2=15, score=s, class_id=k)
            for k, s in enumerate([0.2, 0.9, 0.5, 0.3, 0.8])]  # fmt: skip
    assert [b["score"] for b in shown(rows, conf=0.3)] == [0.9, 0.8, 0.5, 0.3]
    assert [b["score"] for b in shown(rows, conf=0.3, max_boxes=2)] == [0.9, 0.8]
    truth = [{"class_id": 0, "x1": 0, "y1": 0, "x2": 1, "y2": 1}]  # no score: always shown
    assert shown(truth, conf=0.99) == truth
    before = canvas()
    diff = changed(before, draw_result(before, rows, conf=0.3, max_boxes=2, labels=False))
    drawn = {k for k in range(5) if diff[10, 10 * k]}
    assert drawn == {1, 4}  # the two best at or above 0.3


def test_a_caption_and_an_error_row():
    before = np.full((40, 100), GREY, np.uint8)  # a grey (H, W) array is accepted
    after = draw_result(before, None, caption="seven 0.98")
    diff = changed(np.stack([before] * 3, axis=2), after)
    assert diff[:12, :5].any() and not diff[20:, :].any()
    with pytest.raises(ValueError, match="uint8"):
        draw_result(np.zeros((4, 4, 3), np.float32), [])


def test_colours_are_stable_per_class():
    assert class_color(7) == class_color(27) != class_color(8)
    assert class_color(None) == class_color(0)
