"""Drawing a prediction row's results on its image: the one drawing code of the eval report's
pictures and of ``batchinfer export draw``. numpy and Pillow only.

:func:`draw_result` draws whatever fields each element of a row's ``boxes`` holds, never
asking which task made it:

- ``x1, y1, x2, y2``: an axis-aligned box; with ``cx, cy, w, h, angle`` (radians,
  Ultralytics' xywhr: the width runs along (cos r, sin r), y down) the rotated box's polygon
  is drawn instead (the axis-aligned box is then only its enclosing box);
- ``mask``: a COCO compressed RLE struct ``{counts, height, width}`` in the original
  image's pixels, filled in the class colour (alpha-blended) with a solid outline;
- ``keypoints``: a list of ``{x, y, score}``; points at or above ``keypoint_conf`` are dots,
  joined by ``skeleton`` where both ends are shown (default: COCO's person skeleton for
  17 keypoints, no lines for other counts);
- ``label`` (else ``class_id``) and ``score``: written on a filled background that stays
  inside the image.

Coordinates are the original (upright) image's pixels; ``scale`` maps them onto an image
that was resized by that factor (the report's small panels). Each class has a stable
colour (:func:`class_color`) unless a layer's ``color`` is given (the report colours a whole
side: ground truth, device, reference).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from batchinfer.detect.rle import decode as decode_rle
from batchinfer.detect.rotated import corners

Color = tuple[int, int, int]

#: Ultralytics' 20-colour palette: class k gets ``PALETTE[k % 20]``.
PALETTE: tuple[Color, ...] = tuple(
    (int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16))
    for h in ("FF3838", "FF9D97", "FF701F", "FFB21D", "CFD231", "48F90A", "92CC17", "3DDB86",
              "1A9334", "00D4BB", "2C99A8", "00C2FF", "344593", "6473FF", "0018EC", "8438FF",
              "520085", "CB38FF", "FF95C8", "FF37C7")
)  # fmt: skip

#: COCO's person skeleton: pairs of 0-based keypoint indices (nose, eyes, ears, shoulders,
#: elbows, wrists, hips, knees, ankles), as pycocotools' ``skeleton`` less one.
COCO_SKELETON: tuple[tuple[int, int], ...] = (
    (15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7),
    (6, 8), (7, 9), (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6),
)  # fmt: skip

_ROTATED = ("cx", "cy", "w", "h", "angle")


def class_color(class_id: int | None) -> Color:
    """The colour of a class: the same for a class id in every picture."""
    return PALETTE[int(class_id or 0) % len(PALETTE)]


def as_image(image: Image.Image | np.ndarray) -> Image.Image:
    """An RGB copy of a PIL image or an (H, W, 3) / (H, W) uint8 array to draw on."""
    if isinstance(image, np.ndarray):
        array = np.asarray(image)
        if array.dtype != np.uint8 or array.ndim not in (2, 3):
            raise ValueError(f"Expected an HxWx3 uint8 array, got {array.dtype} {array.shape}.")
        return Image.fromarray(array).convert("RGB")
    return image.convert("RGB")  # a copy, even of an RGB image


def shown(
    boxes: Sequence[Mapping[str, Any]] | None, conf: float = 0.0, max_boxes: int | None = None
) -> list[Mapping[str, Any]]:
    """The boxes to draw: score >= ``conf`` (a box without a score, such as ground truth,
    always), best first, at most ``max_boxes``."""
    kept = [b for b in boxes or () if b.get("score") is None or b["score"] >= conf]
    kept.sort(key=lambda b: -np.inf if b.get("score") is None else -float(b["score"]))
    return kept if max_boxes is None else kept[:max_boxes]


def _ink(color: Color) -> Color:
    """Black or white, whichever reads better on ``color``."""
    return (0, 0, 0) if 0.299 * color[0] + 0.587 * color[1] + 0.114 * color[2] > 150 else (255,) * 3


def _mask(box: Mapping[str, Any], size: tuple[int, int]) -> np.ndarray | None:
    """The box's mask as an (H, W) bool array at the drawn image's size, or None."""
    rle = box.get("mask")
    if not rle or rle.get("counts") is None:
        return None
    try:
        dense = decode_rle(str(rle["counts"]), int(rle["height"]), int(rle["width"]))
    except (ValueError, KeyError, TypeError):
        return None  # a malformed mask is not drawn; the rest of the row is
    if dense.shape != (size[1], size[0]):
        scaled = Image.fromarray(dense).resize(size, Image.Resampling.NEAREST)
        dense = np.asarray(scaled, dtype=bool)
    return dense


def _fill(pixels: np.ndarray, mask: np.ndarray, color: Color, alpha: float) -> None:
    """Blend ``color`` into ``pixels`` inside ``mask``; its edge (mask pixels with a
    4-neighbour outside it) in solid colour."""
    pixels[mask] = (pixels[mask] * (1 - alpha) + np.array(color) * alpha).astype(np.uint8)
    inner = mask.copy()
    inner[1:, :] &= mask[:-1, :]
    inner[:-1, :] &= mask[1:, :]
    inner[:, 1:] &= mask[:, :-1]
    inner[:, :-1] &= mask[:, 1:]
    pixels[mask & ~inner] = color


def _outline(box: Mapping[str, Any], scale: float) -> list[tuple[float, float]] | None:
    """The box's outline as points in the drawn image: a rotated box's 4 corners, else the
    axis-aligned box's; None if it has neither."""
    if all(box.get(k) is not None for k in _ROTATED):
        quad = corners(np.array([[float(box[k]) for k in _ROTATED]])).reshape(4, 2) * scale
        return [(float(x), float(y)) for x, y in quad]
    if any(box.get(k) is None for k in ("x1", "y1", "x2", "y2")):
        return None
    x1, y1, x2, y2 = (float(box[k]) * scale for k in ("x1", "y1", "x2", "y2"))
    if x2 < x1 or y2 < y1:
        return None
    return [(x1, y1), (x2, y1), (x2, y2), (x1, y2)]


def _keypoints(
    draw: ImageDraw.ImageDraw,
    points: Sequence[Mapping[str, Any]],
    color: Color,
    scale: float,
    width: int,
    keypoint_conf: float,
    skeleton: Sequence[tuple[int, int]],
) -> None:
    def visible(p: Mapping[str, Any] | None) -> bool:
        if p is None or p.get("x") is None or p.get("y") is None:
            return False
        return p.get("score") is None or p["score"] >= keypoint_conf

    seen = [(float(p["x"]) * scale, float(p["y"]) * scale) if visible(p) else None for p in points]
    for a, b in skeleton:
        start, end = seen[a] if a < len(seen) else None, seen[b] if b < len(seen) else None
        if start is not None and end is not None:
            draw.line([start, end], fill=color, width=max(1, width))
    r = max(2, width + 1)
    for p in seen:
        if p is not None:
            draw.ellipse((p[0] - r, p[1] - r, p[0] + r, p[1] + r), fill=color, outline=_ink(color))


def _default_skeleton(count: int) -> Sequence[tuple[int, int]]:
    """COCO's person skeleton for its 17 keypoints; no lines for another count."""
    return COCO_SKELETON if count == 17 else ()


def _label(
    draw: ImageDraw.ImageDraw,
    text: str,
    anchor: tuple[float, float],
    color: Color,
    size: tuple[int, int],
    font: Any,
) -> None:
    """``text`` on a ``color`` background just above ``anchor`` (inside the box when there is
    no room above), moved left or down as needed to stay inside the image."""
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    tw, th = right - left + 4, bottom - top + 2
    x = min(max(0.0, anchor[0]), max(0.0, size[0] - tw))
    y = anchor[1] - th if anchor[1] - th >= 0 else anchor[1]
    y = min(max(0.0, y), max(0.0, size[1] - th))
    draw.rectangle((x, y, x + tw - 1, y + th - 1), fill=color)
    draw.text((x + 2 - left, y + 1 - top), text, fill=_ink(color), font=font)


def label_text(box: Mapping[str, Any]) -> str:
    """What a box's label says: its class name (else id) and score."""
    name = box.get("label")
    text = str(name if name is not None else box.get("class_id", ""))
    if box.get("score") is not None:
        text += f" {float(box['score']):.2f}"
    return text


def draw_result(
    image: Image.Image | np.ndarray, boxes: Sequence[Mapping[str, Any]] | None, **options: Any
) -> Image.Image:
    """A copy of ``image`` with the row's ``boxes`` drawn: :func:`draw_layer` (its options)
    on an RGB copy."""
    return draw_layer(as_image(image), boxes, **options)


def draw_layer(
    out: Image.Image,
    boxes: Sequence[Mapping[str, Any]] | None,
    *,
    conf: float = 0.0,
    max_boxes: int | None = 100,
    scale: float = 1.0,
    color: Color | None = None,
    width: int = 2,
    labels: bool = True,
    mask_alpha: float = 0.4,
    keypoint_conf: float = 0.5,
    skeleton: Sequence[tuple[int, int]] | None = None,
    caption: str | None = None,
) -> Image.Image:
    """``out`` (an RGB image, drawn on in place and returned) with the row's ``boxes`` drawn
    (see the module docstring): those scoring >= ``conf``, the best ``max_boxes``; ``color``
    for all of them instead of each class's; ``labels``: write their class and score;
    ``caption`` written in the top-left corner (a classification's top-1). Several layers
    (the report's sides) are drawn on one image by calling it once each."""
    kept = shown(boxes, conf, max_boxes)
    colors = [color or class_color(b.get("class_id")) for b in kept]
    masks = [(_mask(b, out.size), c) for b, c in zip(kept, colors, strict=True)]
    if any(m is not None for m, _ in masks):
        pixels = np.array(out)
        for m, c in reversed(masks):  # the best box's mask on top
            if m is not None:
                _fill(pixels, m, c, mask_alpha)
        out.paste(Image.fromarray(pixels))
    draw = ImageDraw.Draw(out)
    font = ImageFont.load_default()
    anchors: list[tuple[float, float] | None] = []
    for b, c in zip(kept, colors, strict=True):
        outline = _outline(b, scale)
        anchors.append(None if outline is None else min(outline, key=lambda p: (p[1], p[0])))
        if outline is not None:
            draw.polygon(outline, outline=c, width=width)
        if b.get("keypoints"):
            # COCO's person skeleton fits 17 keypoints only: others are dots unless given one
            joins = skeleton if skeleton is not None else _default_skeleton(len(b["keypoints"]))
            _keypoints(draw, b["keypoints"], c, scale, width, keypoint_conf, joins)
    if labels:  # last, so that no box hides a label
        for b, c, anchor in zip(kept, colors, anchors, strict=True):
            if anchor is not None:
                _label(draw, label_text(b), anchor, c, out.size, font)
    if caption:
        _label(draw, caption, (0.0, 0.0), color or (33, 33, 33), out.size, font)
    return out


__all__ = [
    "COCO_SKELETON",
    "PALETTE",
    "as_image",
    "class_color",
    "draw_layer",
    "draw_result",
    "label_text",
    "shown",
]
