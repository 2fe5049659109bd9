"""Letterbox geometry: an image placed on the model's canvas, and boxes mapped back."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Letterbox:
    """How an original image was placed on the model's canvas."""

    src_w: int  # original size, after EXIF orientation
    src_h: int
    scale: float  # canvas pixels per original pixel
    pad_x: float  # left padding in canvas pixels
    pad_y: float  # top padding in canvas pixels


def letterbox_geometry(src_w: int, src_h: int, dst_w: int, dst_h: int) -> Letterbox:
    """Where an image of src_w x src_h lands on a dst_w x dst_h canvas: aspect kept, centred."""
    raise NotImplementedError


def letterbox_array(
    rgb: np.ndarray, dst_w: int, dst_h: int, pad: tuple[int, int, int] = (114, 114, 114)
) -> tuple[np.ndarray, Letterbox]:
    """The (dst_h, dst_w, 3) uint8 canvas holding ``rgb`` letterboxed, and its geometry."""
    raise NotImplementedError


def boxes_to_original(boxes: np.ndarray, lb: Letterbox) -> np.ndarray:
    """Canvas boxes (n, 4) x1 y1 x2 y2 in the original image's pixels, clipped to it."""
    raise NotImplementedError
