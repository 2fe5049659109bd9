"""Letterbox geometry (the model zoo's placement), the canvas, and boxes back to the image."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from batchinfer.detect import Letterbox, boxes_to_original, letterbox_array, letterbox_geometry
from batchinfer.errors import InputError


def zoo_letter_box(src_w: int, src_h: int, dst_w: int, dst_h: int) -> tuple:
    """rknn_model_zoo's COCO_test_helper.letter_box, its arithmetic only, written as the zoo
    writes it: (ratio, new_unpad (w, h), left, top, right, bottom)."""
    shape, new_shape = (src_h, src_w), (dst_h, dst_w)
    r = min(new_shape[0] / shape[0], new_shape[1] / shape[1])
    new_unpad = int(round(shape[1] * r)), int(round(shape[0] * r))  # noqa: RUF046
    dw, dh = (new_shape[1] - new_unpad[0]) / 2, (new_shape[0] - new_unpad[1]) / 2
    top, bottom = int(round(dh - 0.1)), int(round(dh + 0.1))  # noqa: RUF046
    left, right = int(round(dw - 0.1)), int(round(dw + 0.1))  # noqa: RUF046
    return r, new_unpad, left, top, right, bottom


SIZES = [
    (333, 517, 640, 640),
    (517, 333, 640, 640),
    (640, 480, 640, 640),
    (1920, 1080, 640, 384),
    (333, 517, 320, 256),
    (101, 99, 64, 64),
    (640, 640, 640, 640),
    (50, 30, 640, 640),  # enlarged
    (1, 1000, 640, 640),  # a sliver: at least one pixel wide
]


@pytest.mark.parametrize(("src_w", "src_h", "dst_w", "dst_h"), SIZES)
def test_geometry_is_the_model_zoos(src_w, src_h, dst_w, dst_h) -> None:
    r, (new_w, new_h), left, top, right, bottom = zoo_letter_box(src_w, src_h, dst_w, dst_h)
    lb = letterbox_geometry(src_w, src_h, dst_w, dst_h)
    assert lb == Letterbox(src_w, src_h, r, left, top)
    assert isinstance(lb.pad_x, float) and isinstance(lb.pad_y, float)
    assert lb.resized == (max(new_w, 1), max(new_h, 1))
    if new_w >= 1 and new_h >= 1:
        assert left + new_w + right == dst_w and top + new_h + bottom == dst_h


@pytest.mark.parametrize(("src_w", "src_h", "dst_w", "dst_h"), SIZES)
def test_canvas_holds_the_resized_image_centred_on_the_pad_colour(
    src_w, src_h, dst_w, dst_h
) -> None:
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (src_h, src_w, 3), dtype=np.uint8)
    canvas, lb = letterbox_array(rgb, dst_w, dst_h, pad=(1, 2, 3))
    assert canvas.shape == (dst_h, dst_w, 3) and canvas.dtype == np.uint8
    assert lb == letterbox_geometry(src_w, src_h, dst_w, dst_h)
    new_w, new_h = lb.resized
    x, y = int(lb.pad_x), int(lb.pad_y)
    expected = np.asarray(Image.fromarray(rgb).resize((new_w, new_h), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(canvas[y : y + new_h, x : x + new_w], expected)
    pad = np.ones(canvas.shape[:2], bool)
    pad[y : y + new_h, x : x + new_w] = False
    assert (canvas[pad] == [1, 2, 3]).all()


def test_default_pad_is_114_grey_and_same_size_is_a_copy() -> None:
    rgb = np.zeros((10, 20, 3), np.uint8)
    canvas, lb = letterbox_array(rgb, 20, 20)
    assert (lb.pad_x, lb.pad_y, lb.scale) == (0, 5, 1.0)
    assert (canvas[:5] == 114).all() and (canvas[15:] == 114).all()
    assert (canvas[5:15] == 0).all()
    same, _ = letterbox_array(rgb, 20, 10)
    np.testing.assert_array_equal(same, rgb)
    assert not np.shares_memory(same, rgb)


def test_a_rectangle_comes_back_to_where_it_was_in_an_odd_sized_image() -> None:
    # A white rectangle in a 333x517 image, found on the 640x640 canvas, mapped back.
    rgb = np.zeros((517, 333, 3), np.uint8)
    x1, y1, x2, y2 = 41, 97, 250, 400  # pixels [x1, x2) x [y1, y2)
    rgb[y1:y2, x1:x2] = 255
    canvas, lb = letterbox_array(rgb, 640, 640)
    ys, xs = np.nonzero(canvas[..., 0] > 127)
    found = np.array([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], np.float32)
    back = boxes_to_original(found, lb)
    np.testing.assert_allclose(back[0], [x1, y1, x2, y2], atol=1.0)


@pytest.mark.parametrize(("src_w", "src_h", "dst_w", "dst_h"), SIZES)
def test_boxes_round_trip_through_the_canvas(src_w, src_h, dst_w, dst_h) -> None:
    lb = letterbox_geometry(src_w, src_h, dst_w, dst_h)
    rng = np.random.default_rng(1)
    a = rng.random((50, 2)) * [src_w, src_h]
    b = rng.random((50, 2)) * [src_w, src_h]
    boxes = np.concatenate([np.minimum(a, b), np.maximum(a, b)], axis=1).astype(np.float32)
    on_canvas = boxes * np.float32(lb.scale) + np.float32([lb.pad_x, lb.pad_y] * 2)
    back = boxes_to_original(on_canvas, lb)
    assert back.dtype == np.float32 and back.shape == (50, 4)
    np.testing.assert_allclose(back, boxes, rtol=1e-5, atol=1e-3 * max(src_w, src_h) / 640)


def test_boxes_in_the_padding_are_clipped_to_the_image() -> None:
    lb = letterbox_geometry(333, 517, 640, 640)  # scale 640/517, pad_x 114
    boxes = np.array([[0, -10, 700, 650], [100, 100, 110, 110]], np.float32)
    back = boxes_to_original(boxes, lb)
    np.testing.assert_allclose(back[0], [0, 0, 333, 517])
    assert back[1, 0] == 0 and back[1, 2] == 0  # both x left of the image: clipped to 0
    np.testing.assert_allclose(back[1, [1, 3]], np.array([100, 110]) / lb.scale, rtol=1e-6)
    assert boxes_to_original(np.zeros((0, 4), np.float32), lb).shape == (0, 4)


def test_bad_images_are_input_errors() -> None:
    with pytest.raises(InputError):
        letterbox_array(np.zeros((10, 10), np.uint8), 64, 64)
    with pytest.raises(InputError):
        letterbox_array(np.zeros((10, 10, 3), np.float32), 64, 64)
    with pytest.raises(InputError):
        letterbox_geometry(0, 10, 64, 64)
