"""Masks from prototypes (batchinfer.detect.masks): the run boundaries solved per column
equal the definition evaluated at every pixel, on noisy prototypes (many crossings)."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pycocotools.mask as mask_api
import pytest

from batchinfer.detect import masks, rle
from batchinfer.detect.letterbox import letterbox_geometry
from batchinfer.detect.masks import mask_rles, pixel_ranges, proto_map
from batchinfer.errors import InferenceError

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

ROOT = str(Path(__file__).resolve().parents[1])


def dense(proto, coefs, box, pmap):
    """The definition, pixel by pixel: bilinear logits (edges clamped) at each original
    pixel's place on the prototype grid, > 0, centre inside the box."""
    _, ph, pw = proto.shape
    logits = np.tensordot(coefs, proto.astype(np.float64), axes=1)
    sx = np.clip(pmap.ax * np.arange(pmap.width) + pmap.bx, 0, pw - 1)
    sy = np.clip(pmap.ay * np.arange(pmap.height) + pmap.by, 0, ph - 1)
    x0, y0 = np.floor(sx).astype(int), np.floor(sy).astype(int)
    x1, y1 = np.minimum(x0 + 1, pw - 1), np.minimum(y0 + 1, ph - 1)
    fx, fy = (sx - x0)[None, :], (sy - y0)[:, None]
    along_x = logits[:, x0] * (1 - fx) + logits[:, x1] * fx
    value = along_x[y0] * (1 - fy) + along_x[y1] * fy
    cx, cy = np.arange(pmap.width) + 0.5, np.arange(pmap.height) + 0.5
    inside = ((cx >= box[0]) & (cx < box[2]))[None, :] & ((cy >= box[1]) & (cy < box[3]))[:, None]
    return (value > 0) & inside


def _decoded(counts, pmap):
    size = [pmap.height, pmap.width]
    return mask_api.decode({"size": size, "counts": counts.encode()}).astype(bool)


@pytest.mark.parametrize(
    ("src", "input_hw", "proto_hw"),
    [
        ((640, 640), (640, 640), (160, 160)),  # the canvas itself
        ((1280, 720), (640, 640), (160, 160)),  # shrunk: 8 original pixels per sample
        ((101, 57), (320, 320), (80, 80)),  # enlarged: samples closer than pixels
        ((333, 517), (256, 320), (64, 80)),  # a non-square input, portrait image
    ],
)
def test_masks_equal_the_definition_at_every_pixel(src, input_hw, proto_hw):
    rng = np.random.default_rng(sum(src))
    proto = rng.normal(0, 1, (32, *proto_hw)).astype(np.float32)
    coefs = rng.normal(0, 1, (6, 32)).astype(np.float32)
    w, h = src
    boxes = np.array(
        [
            [0.2 * w, 0.1 * h, 0.7 * w, 0.6 * h],
            [0, 0, w, h],  # the whole image: runs continue from column to column
            [0.5 * w, 0.5 * h, 0.5 * w + 1.2, h],  # one column wide
            [0.6 * w, 0.2 * h, 0.3 * w, 0.9 * h],  # x2 < x1: empty
            [-50, -50, 0.3 * w, 0.4 * h],  # past the image: clipped
            [0.9 * w, 0.95 * h, 2 * w, 2 * h],
        ],
        np.float32,
    )
    pmap = proto_map(letterbox_geometry(w, h, input_hw[1], input_hw[0]), input_hw, proto_hw)
    masks = mask_rles(proto, coefs, boxes, pmap)
    assert len(masks) == len(boxes)
    for i, counts in enumerate(masks):
        want = dense(proto, coefs[i], boxes[i], pmap)
        got = _decoded(counts, pmap)
        assert np.array_equal(got, want), (i, int((got != want).sum()), int(want.sum()))
    assert not _decoded(masks[3], pmap).any()


def test_quantised_prototype_windows_are_dequantised():
    rng = np.random.default_rng(1)
    real = rng.normal(0, 1, (32, 80, 80)).astype(np.float32)
    scale, zero = 0.02, 5
    q = np.clip(np.round(real / scale) + zero, -128, 127).astype(np.int8)
    coefs = rng.normal(0, 1, (3, 32)).astype(np.float32)
    boxes = np.array([[10, 10, 200, 150], [0, 0, 320, 320], [100, 50, 300, 310]], np.float32)
    pmap = proto_map(None, (320, 320), (80, 80))
    got = mask_rles(q[None], coefs, boxes, pmap, (scale, zero))
    want = mask_rles((q.astype(np.float32) - zero) * scale, coefs, boxes, pmap)
    assert got == want


def test_no_instances_and_empty_boxes():
    pmap = proto_map(None, (64, 64), (16, 16))
    proto = np.ones((32, 16, 16), np.float32)
    assert mask_rles(proto, np.zeros((0, 32)), np.zeros((0, 4)), pmap) == []
    empty = mask_rles(proto, np.ones((2, 32)), np.array([[5, 5, 5, 9], [70, 0, 80, 9]]), pmap)
    assert [mask_api.area({"size": [64, 64], "counts": c.encode()}) for c in empty] == [0, 0]


def test_pixel_ranges_take_the_pixels_whose_centres_lie_in_the_box():
    ranges = pixel_ranges(np.array([[0.4, 0.6, 2.5, 3.49], [-3, np.nan, 99, 4]]), 10, 20)
    assert ranges.tolist() == [[0, 1, 2, 3], [0, 0, 20, 4]]


def test_boxes_in_groups_give_the_same_masks(monkeypatch):
    """Boxes are handled in groups bounded by _MAX_BUFFER values; a small bound (a group
    per box or two) changes nothing."""
    rng = np.random.default_rng(4)
    proto = rng.normal(0, 1, (32, 80, 80)).astype(np.float32)
    coefs = rng.normal(0, 1, (7, 32)).astype(np.float32)
    corners = rng.uniform(0, 500, (7, 2))
    boxes = np.concatenate([corners, corners + rng.uniform(1, 300, (7, 2))], axis=1)
    boxes[3] = [10, 10, 5, 5]  # empty, among the others
    pmap = proto_map(letterbox_geometry(600, 500, 320, 320), (320, 320), (80, 80))
    whole = mask_rles(proto, coefs, boxes, pmap)
    monkeypatch.setattr(masks, "_MAX_BUFFER", 3000)
    assert mask_rles(proto, coefs, boxes, pmap) == whole


@pytest.mark.slow
def test_300_whole_image_boxes_on_a_large_photo_stay_within_memory():
    """max_det boxes each covering an 8000 x 6000 photo: the column buffers of all at once
    would take 300 x 8000 x 122 x 4 bytes (1.2 GB); in groups the process stays small."""
    code = (
        "import numpy as np, resource\n"
        "from batchinfer.detect.letterbox import letterbox_geometry\n"
        "from batchinfer.detect.masks import mask_rles, proto_map\n"
        "rng = np.random.default_rng(0)\n"
        "y, x = np.mgrid[0:160, 0:160] / 160\n"  # smooth: a disc per channel
        "proto = np.stack([0.1 - (x - a) ** 2 - (y - b) ** 2 for a, b in rng.random((32, 2))])\n"
        "boxes = np.tile(np.array([[0, 0, 8000, 6000]], np.float32), (300, 1))\n"
        "pmap = proto_map(letterbox_geometry(8000, 6000, 640, 640), (640, 640), (160, 160))\n"
        "out = mask_rles(proto.astype(np.float32), np.eye(32)[np.arange(300) % 32], boxes, pmap)\n"
        "assert len(out) == 300\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    limit = 1_500_000_000  # address space: the 1.2 GB of one buffer would not fit beside numpy
    result = subprocess.run(
        ["prlimit", f"--as={limit}", "--", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout.split()[-1]) < 600_000  # KiB of peak RSS (410 MB measured)


def test_masks_of_noise_are_refused_before_they_fill_memory(monkeypatch):
    rng = np.random.default_rng(5)
    proto = rng.normal(0, 1, (32, 80, 80)).astype(np.float32)
    boxes = np.tile(np.array([[0, 0, 320, 320]], np.float32), (10, 1))
    pmap = proto_map(None, (320, 320), (80, 80))
    monkeypatch.setattr(masks, "_MAX_FLIPS", 20_000)
    with pytest.raises(InferenceError, match="look like noise"):
        mask_rles(proto, rng.normal(0, 1, (10, 32)), boxes, pmap)


def _dense_in(proto, coefs, box, pmap, crop):
    """The definition on the pixels of ``crop`` (x0, y0, x1, y1) only: a large original's
    masks are checked where they can be, without a dense image of the whole photo."""
    _, ph, pw = proto.shape
    x0, y0, x1, y1 = crop
    logits = np.tensordot(coefs, proto.astype(np.float64), axes=1)
    sx = np.clip(pmap.ax * np.arange(x0, x1) + pmap.bx, 0, pw - 1)
    sy = np.clip(pmap.ay * np.arange(y0, y1) + pmap.by, 0, ph - 1)
    k0, j0 = np.floor(sx).astype(int), np.floor(sy).astype(int)
    k1, j1 = np.minimum(k0 + 1, pw - 1), np.minimum(j0 + 1, ph - 1)
    fx, fy = (sx - k0)[None, :], (sy - j0)[:, None]
    along_x = logits[:, k0] * (1 - fx) + logits[:, k1] * fx
    value = along_x[j0] * (1 - fy) + along_x[j1] * fy
    cx, cy = np.arange(x0, x1) + 0.5, np.arange(y0, y1) + 0.5
    inside = ((cx >= box[0]) & (cx < box[2]))[None, :] & ((cy >= box[1]) & (cy < box[3]))[:, None]
    return (value > 0) & inside


def test_a_large_photo_at_its_edges_and_tiny_boxes_equal_the_definition():
    """A 4000 x 3000 original (25 pixels a prototype sample), noisy logits: boxes on each
    edge of the image (the prototype's clamped rows and columns), one the image's full
    height (runs continue across columns), one pixel, under a pixel (empty)."""
    rng = np.random.default_rng(7)
    proto = rng.normal(0, 1, (32, 160, 160)).astype(np.float32)
    w, h = 4000, 3000
    boxes = np.array(
        [
            [0, 0, 180, 140],  # the top left corner
            [3850, 2900, 4000, 3000],  # the bottom right corner
            [3990, 1000, 4100, 1300],  # 10 columns at the right edge, past it
            [1200, -40, 1290, 3000.4],  # the whole height
            [2000.2, 1500.1, 2000.8, 1500.9],  # one pixel (its centre inside)
            [2500.6, 700, 2501.4, 900],  # no pixel centre inside: empty
        ],
        np.float32,
    )
    coefs = rng.normal(0, 1, (len(boxes), 32)).astype(np.float32)
    pmap = proto_map(letterbox_geometry(w, h, 640, 640), (640, 640), (160, 160))
    masks = mask_rles(proto, coefs, boxes, pmap)
    for i, counts in enumerate(masks):
        xa, ya, xb, yb = pixel_ranges(boxes[i : i + 1], h, w)[0]
        crop = (max(xa - 2, 0), max(ya - 2, 0), min(max(xb, xa) + 2, w), min(max(yb, ya) + 2, h))
        want = _dense_in(proto, coefs[i], boxes[i], pmap, crop)
        got = _crop_of(counts, h, crop)
        assert np.array_equal(got, want), (i, int((got != want).sum()))
        assert rle.area(counts) == want.sum()  # nothing outside the crop
    assert rle.area(masks[4]) <= 1 and rle.area(masks[5]) == 0


def _crop_of(counts, height, crop):
    """The pixels of ``crop`` (x0, y0, x1, y1) in a ``counts`` string, read from its runs
    (a dense 4000 x 3000 mask per instance would be slow to make)."""
    bounds = np.cumsum(rle.counts_from_string(counts))
    x0, y0, x1, y1 = crop
    at = np.arange(x0, x1)[None, :] * height + np.arange(y0, y1)[:, None]  # column-major
    return np.searchsorted(bounds, at, side="right") % 2 == 1


def test_the_cost_follows_the_boxes_not_the_image():
    """A small box in a 30000 x 20000 image: no buffer of the image's size (600 M pixels)
    is made, only the box's columns and the prototype window under it."""
    rng = np.random.default_rng(8)
    proto = rng.normal(0, 1, (32, 160, 160)).astype(np.float32)
    pmap = proto_map(letterbox_geometry(30000, 20000, 640, 640), (640, 640), (160, 160))
    boxes = np.array([[15000, 9000, 15400, 9300], [0, 0, 300, 200]], np.float32)
    coefs = rng.normal(0, 1, (2, 32)).astype(np.float32)
    tracemalloc.start()
    try:
        masks = mask_rles(proto, coefs, boxes, pmap)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000, peak  # bytes
    for counts, box in zip(masks, boxes, strict=True):
        rle = {"size": [20000, 30000], "counts": counts.encode()}
        x, y, bw, bh = mask_api.toBbox(rle)
        assert mask_api.area(rle) > 0
        assert box[0] <= x and x + bw <= box[2] and box[1] <= y and y + bh <= box[3]


def test_flips_made_out_of_order_are_sorted_before_pairs_cancel():
    """Crossings come out in column-major order by construction; should rounding in
    extreme logits ever misorder two, they are sorted, and equal ones still cancel."""
    keys = np.array([9, 4, 4, 2, 4, 12])
    kept = masks._odd_runs(keys)
    assert keys[kept].tolist() == [2, 4, 9, 12]
    assert masks._odd_runs(np.array([1, 3, 3, 3, 3, 7])).tolist() == [0, 5]
