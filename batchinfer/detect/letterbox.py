"""Letterbox geometry: an image placed on the model's canvas, and boxes mapped back.

The placement is the model zoo's ``COCO_test_helper.letter_box`` (and Ultralytics'
``LetterBox``): scale by r = min(dst_w / src_w, dst_h / src_h), resize to
round(src_w r) x round(src_h r), centre, the odd pixel of padding going right/bottom.
Mapping back subtracts the padding actually placed (whole pixels, as Ultralytics'
``scale_boxes`` does; the model zoo's ``get_real_box`` subtracts the half-pixel
dw = (dst_w - new_w) / 2 instead, half a pixel off when the padding is odd) and divides by r.

:func:`letterbox_array` resizes with Pillow's bilinear filter, as the readers' ``stretch``
resize does: on shrinking it averages over the scale factor (antialiased, close to
OpenCV's INTER_AREA that Ultralytics' validation loader uses when shrinking), where the
model zoo's ``cv2.resize(..., INTER_LINEAR)`` samples 2x2 pixels; pixel values differ by a
few levels at edges, the geometry not at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from batchinfer.errors import InputError


@dataclass(frozen=True)
class Letterbox:
    """How an original image was placed on the model's canvas."""

    src_w: int  # original size, after EXIF orientation
    src_h: int
    scale: float  # canvas pixels per original pixel
    pad_x: float  # left padding in canvas pixels
    pad_y: float  # top padding in canvas pixels

    @property
    def resized(self) -> tuple[int, int]:
        """(width, height) of the image on the canvas, padding excluded."""
        return _resized(self.src_w, self.src_h, self.scale)


def _resized(src_w: int, src_h: int, scale: float) -> tuple[int, int]:
    # Python's round (half to even), as the model zoo computes new_unpad.
    return max(1, round(src_w * scale)), max(1, round(src_h * scale))


def letterbox_geometry(src_w: int, src_h: int, dst_w: int, dst_h: int) -> Letterbox:
    """Where an image of src_w x src_h lands on a dst_w x dst_h canvas: aspect kept, centred."""
    if min(src_w, src_h, dst_w, dst_h) < 1:
        raise InputError(f"Cannot letterbox a {src_w}x{src_h} image onto {dst_w}x{dst_h}.")
    scale = min(dst_w / src_w, dst_h / src_h)
    new_w, new_h = _resized(src_w, src_h, scale)
    # The zoo's int(round(dw - 0.1)) with dw = (dst_w - new_w) / 2 is this floor.
    return Letterbox(int(src_w), int(src_h), scale, (dst_w - new_w) // 2, (dst_h - new_h) // 2)


def letterbox_array(
    rgb: np.ndarray, dst_w: int, dst_h: int, pad: tuple[int, int, int] = (114, 114, 114)
) -> tuple[np.ndarray, Letterbox]:
    """The (dst_h, dst_w, 3) uint8 canvas holding ``rgb`` letterboxed, and its geometry."""
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise InputError(f"letterbox_array takes (H, W, 3) uint8, not {rgb.shape} {rgb.dtype}.")
    src_h, src_w = rgb.shape[:2]
    lb = letterbox_geometry(src_w, src_h, dst_w, dst_h)
    new_w, new_h = lb.resized
    if (new_w, new_h) == (src_w, src_h):
        resized = rgb
    else:
        image = Image.fromarray(np.ascontiguousarray(rgb), "RGB")
        resized = np.asarray(image.resize((new_w, new_h), Image.Resampling.BILINEAR))
    canvas = np.empty((dst_h, dst_w, 3), np.uint8)
    canvas[...] = np.asarray(pad, np.uint8)
    x, y = int(lb.pad_x), int(lb.pad_y)
    canvas[y : y + new_h, x : x + new_w] = resized
    return canvas, lb


def boxes_to_original(boxes: np.ndarray, lb: Letterbox) -> np.ndarray:
    """Canvas boxes (n, 4) x1 y1 x2 y2 in the original image's pixels, clipped to it."""
    out = np.asarray(boxes, dtype=np.float32).reshape(-1, 4).copy()
    out[:, 0::2] -= np.float32(lb.pad_x)
    out[:, 1::2] -= np.float32(lb.pad_y)
    out /= np.float32(lb.scale)
    np.clip(out[:, 0::2], 0, lb.src_w, out=out[:, 0::2])
    np.clip(out[:, 1::2], 0, lb.src_h, out=out[:, 1::2])
    return out
