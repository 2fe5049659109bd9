"""A synthetic detection set: the demo's handwritten digits pasted onto larger canvases.

Every image is made from a seed by numpy alone (no image library, so the pixels are the
same with any Pillow), from the digits of ``digits.npz``: the ``train`` split uses only the
digits the demo models are trained on, the ``val`` split only the held-out ones
(:func:`batchinfer.demo.digits.test_split`). Image ``i`` of a split depends only on the seed, the
split and ``i``, never on how many images are asked for.

A canvas is 160-320 pixels a side (about one in eight is a strip, 2:1 to 3:1 either way, so
that letterboxing to a square model input matters), with a flat, gradient or blocky
background and sometimes sensor noise. It holds 1-6 digits, each scaled (bilinear) to
16-64 pixels on its longer side, in a colour contrasting with what lies under it, placed
so that no two digits' patches overlap. A digit's box is the tight box of its visible ink
(alpha >= :data:`INK_ALPHA`), in pixel edges: x2 = last inked column + 1.

:func:`write_detection` writes a split as PNG images (lossless: what a model sees is
exactly what was generated, on every platform) and a COCO instances JSON whose category
ids are the digits themselves (id 0 is "0", ..., id 9 is "9"), so a detector's class id is
its category id.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchinfer.demo.digits import load_digits, test_split
from batchinfer.errors import UsageError

#: The seed of the bundled sets; image i of a split is the same for every count asked for.
SEED = 0
#: The demo detector's input side (digits-det.onnx: float NCHW [1, 3, 256, 256]).
DETECTOR_INPUT = 256
#: Images in the val split ``batchinfer demo`` writes.
VAL_IMAGES = 500
CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))
SPLITS = ("train", "val")

CANVAS_MIN, CANVAS_MAX = 160, 320
DIGIT_MIN, DIGIT_MAX = 16, 64
MAX_DIGITS = 6
#: A pixel is ink when the digit covers at least this fraction of it (4/16 of full ink).
INK_ALPHA = 0.25
STRIP_FRACTION = 0.125  # images with an odd aspect ratio (2:1 to 3:1)
#: Images with sensor noise (sigma 2-5 levels); few, because noise is what makes PNGs big.
NOISY_FRACTION = 0.25
_PLACEMENT_TRIES = 40
_GAP = 2  # pixels between two digits' patches
_SPLIT_CODE = {"train": 1, "val": 2}
#: A digit's keypoints (the demo pose model's): the extreme points of its ink, where its
#: strokes end at the top, right, bottom and left. Each is the centre of the ink pixels
#: in the glyph's first (or last) inked row (or column), in pixel coordinates (a pixel's
#: centre is +0.5): the top one is x = mean of the top row's inked columns + 0.5,
#: y = that row + 0.5. Always visible (COCO v = 2).
KEYPOINTS: tuple[str, ...] = ("top", "right", "bottom", "left")
#: COCO's 1-based skeleton of those keypoints: the diamond around the digit.
SKELETON: tuple[tuple[int, int], ...] = ((1, 2), (2, 3), (3, 4), (4, 1))

__all__ = [
    "CLASSES",
    "DETECTOR_INPUT",
    "KEYPOINTS",
    "SEED",
    "SKELETON",
    "SPLITS",
    "VAL_IMAGES",
    "DetectionSet",
    "Scene",
    "letterbox",
    "make_scene",
    "scenes",
    "split_digits",
    "write_detection",
]


@dataclass(frozen=True)
class Scene:
    """One generated image and what is in it."""

    image: np.ndarray  # (H, W, 3) uint8 RGB
    boxes: np.ndarray  # (n, 4) float32 x1 y1 x2 y2, pixel edges
    labels: np.ndarray  # (n,) int64 digit = class id = COCO category id
    digits: np.ndarray  # (n,) int64 index of each digit in digits.npz
    #: Per digit (x, y, ink): its patch's top-left corner and which of the patch's pixels
    #: are ink (alpha >= INK_ALPHA), the pixels its box is tight around: its mask.
    ink: tuple[tuple[int, int, np.ndarray], ...] = ()

    def masks(self) -> np.ndarray:
        """(n, H, W) bool: each digit's ink pixels (patches never overlap), its COCO mask."""
        h, w = self.image.shape[:2]
        out = np.zeros((len(self.ink), h, w), bool)
        for i, (x, y, ink) in enumerate(self.ink):
            out[i, y : y + ink.shape[0], x : x + ink.shape[1]] = ink
        return out

    def keypoints(self) -> np.ndarray:
        """(n, 4, 2) float32: each digit's KEYPOINTS (x, y) in the image's pixels."""
        out = np.zeros((len(self.ink), len(KEYPOINTS), 2), np.float32)
        for i, (x, y, ink) in enumerate(self.ink):
            out[i] = ink_keypoints(ink) + np.array([x, y], np.float32)
        return out


def ink_keypoints(ink: np.ndarray) -> np.ndarray:
    """(4, 2) float32 x, y of KEYPOINTS in the patch ``ink`` (bool, at least one pixel)."""
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    top, bottom, left, right = rows[0], rows[-1], cols[0], cols[-1]
    return np.array(
        [
            (np.flatnonzero(ink[top]).mean(), top),
            (right, np.flatnonzero(ink[:, right]).mean()),
            (np.flatnonzero(ink[bottom]).mean(), bottom),
            (left, np.flatnonzero(ink[:, left]).mean()),
        ],
        np.float32,
    ) + np.float32(0.5)


@dataclass(frozen=True)
class DetectionSet:
    """Where write_detection put a split."""

    root: Path
    images: Path  # images/<nnnnn>.png
    instances: Path  # instances.json (COCO)
    count: int  # images
    boxes: int  # annotations
    instances_seg: Path | None = None  # instances-seg.json: the same with the digits' masks
    instances_pose: Path | None = None  # instances-pose.json: the same with their keypoints


def split_digits(split: str) -> tuple[np.ndarray, np.ndarray]:
    """Return (images float32 (n, 8, 8) as ink 0..1, indices into digits.npz) of a split."""

    if split not in SPLITS:
        raise UsageError(f"There is no detection split {split!r}; use train or val.")
    raw, _ = load_digits(raw=True)
    held_out = test_split()
    index = held_out if split == "val" else np.setdiff1d(np.arange(len(raw)), held_out)
    return raw[index].astype(np.float32) / 16.0, index


def scenes(split: str, n: int, seed: int = SEED, start: int = 0) -> Iterator[Scene]:
    """Yield images ``start`` .. ``start + n - 1`` of ``split``."""

    glyphs, index = split_digits(split)
    labels = load_digits(raw=True)[1].astype(np.int64)
    for i in range(start, start + n):
        yield make_scene(_rng(seed, split, i), glyphs, index, labels)


def _rng(seed: int, split: str, i: int) -> np.random.Generator:
    return np.random.default_rng([seed, _SPLIT_CODE[split], i])


def make_scene(
    rng: np.random.Generator, glyphs: np.ndarray, index: np.ndarray, labels: np.ndarray
) -> Scene:
    """One image drawn with ``rng`` from ``glyphs`` (ink 0..1), ``index`` into digits.npz."""
    width, height = _canvas_size(rng)
    canvas = _background(rng, height, width)
    boxes, picked, inks = [], [], []
    occupied: list[tuple[int, int, int, int]] = []
    for _ in range(int(rng.integers(1, MAX_DIGITS + 1))):
        k = int(rng.integers(len(glyphs)))
        size = int(rng.integers(DIGIT_MIN, DIGIT_MAX + 1))
        aspect = float(rng.uniform(0.8, 1.25))  # height / width of the patch
        ph, pw = (
            (size, max(8, round(size / aspect)))
            if aspect >= 1
            else (
                max(8, round(size * aspect)),
                size,
            )
        )
        spot = _place(rng, occupied, width, height, pw, ph)
        if spot is None:
            continue
        x, y = spot
        alpha = _resize_bilinear(glyphs[k], ph, pw) * float(rng.uniform(0.85, 1.0))
        ink = alpha >= INK_ALPHA
        if not ink.any():
            continue
        region = canvas[y : y + ph, x : x + pw]
        colour = _ink_colour(rng, region.mean(axis=(0, 1)))
        region += alpha[..., None] * (colour - region)
        rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
        boxes.append((x + cols[0], y + rows[0], x + cols[-1] + 1, y + rows[-1] + 1))
        picked.append(k)
        inks.append((x, y, ink))
        occupied.append((x, y, x + pw, y + ph))
    if rng.random() < NOISY_FRACTION:
        canvas += rng.normal(0.0, rng.uniform(2.0, 5.0), canvas.shape).astype(np.float32)
    image = np.clip(np.rint(canvas), 0, 255).astype(np.uint8)
    digits = index[np.asarray(picked, dtype=np.int64)]
    return Scene(
        image=image,
        boxes=np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
        labels=labels[digits],
        digits=digits,
        ink=tuple(inks),
    )


def _canvas_size(rng: np.random.Generator) -> tuple[int, int]:
    if rng.random() < STRIP_FRACTION:
        long = int(rng.integers(280, CANVAS_MAX + 1))
        short = max(100, round(long / rng.uniform(2.0, 3.0)))
        return (long, short) if rng.random() < 0.5 else (short, long)
    return int(rng.integers(CANVAS_MIN, CANVAS_MAX + 1)), int(
        rng.integers(CANVAS_MIN, CANVAS_MAX + 1)
    )


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """(H, W, 3) float32: flat, a linear gradient, or flat with a few coloured blocks."""
    base = rng.uniform(0, 255, 3).astype(np.float32)
    canvas = np.empty((height, width, 3), np.float32)
    canvas[:] = base
    kind = rng.integers(3)
    if kind == 1:
        other = rng.uniform(0, 255, 3).astype(np.float32)
        angle = rng.uniform(0, 2 * np.pi)
        ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
        t = xs * np.cos(angle) + ys * np.sin(angle)
        t = (t - t.min()) / max(float(t.max() - t.min()), 1.0)
        canvas += t[..., None] * (other - base)
    elif kind == 2:
        for _ in range(int(rng.integers(1, 5))):
            x0, x1 = np.sort(rng.integers(0, width, 2))
            y0, y1 = np.sort(rng.integers(0, height, 2))
            canvas[y0 : y1 + 1, x0 : x1 + 1] = rng.uniform(0, 255, 3)
    return canvas


def _place(
    rng: np.random.Generator,
    occupied: list[tuple[int, int, int, int]],
    width: int,
    height: int,
    pw: int,
    ph: int,
) -> tuple[int, int] | None:
    """A top-left corner where a pw x ph patch fits without touching another, or None."""
    if pw > width or ph > height:
        return None
    for _ in range(_PLACEMENT_TRIES):
        x = int(rng.integers(0, width - pw + 1))
        y = int(rng.integers(0, height - ph + 1))
        if all(
            x + pw + _GAP <= ox0 or ox1 + _GAP <= x or y + ph + _GAP <= oy0 or oy1 + _GAP <= y
            for ox0, oy0, ox1, oy1 in occupied
        ):
            return x, y
    return None


def _ink_colour(rng: np.random.Generator, under: np.ndarray) -> np.ndarray:
    """A colour whose brightness differs from ``under``'s by at least about 90 levels."""
    luma = float(under @ np.array([0.299, 0.587, 0.114], np.float32))
    if luma >= 128:
        return rng.uniform(0, max(luma - 110, 0) + 30, 3).astype(np.float32)
    return rng.uniform(min(luma + 110, 255) - 30, 255, 3).astype(np.float32)


def _resize_bilinear(glyph: np.ndarray, height: int, width: int) -> np.ndarray:
    """``glyph`` (8, 8) resized to (height, width), pixel centres aligned (half-pixel)."""

    def axis(n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pos = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, (pos - lo).astype(np.float32)

    y0, y1, wy = axis(height, glyph.shape[0])
    x0, x1, wx = axis(width, glyph.shape[1])
    top = glyph[y0][:, x0] * (1 - wx) + glyph[y0][:, x1] * wx
    bottom = glyph[y1][:, x0] * (1 - wx) + glyph[y1][:, x1] * wx
    return top * (1 - wy[:, None]) + bottom * wy[:, None]


def letterbox(image: np.ndarray, side: int, pad: int = 114) -> tuple[np.ndarray, float, int, int]:
    """Return (``image`` on a side x side canvas, scale, pad_x, pad_y), as the model zoo does.

    Aspect kept, resized bilinearly (Pillow), centred, the rest ``pad`` grey: a box maps
    to the canvas as ``box * scale + (pad_x, pad_y)``.
    """
    from PIL import Image

    h, w = image.shape[:2]
    scale = min(side / w, side / h)
    nw, nh = round(w * scale), round(h * scale)
    px, py = (side - nw) // 2, (side - nh) // 2
    canvas = np.full((side, side, 3), pad, np.uint8)
    resized = Image.fromarray(image).resize((nw, nh), Image.Resampling.BILINEAR)
    canvas[py : py + nh, px : px + nw] = np.asarray(resized)
    return canvas, scale, px, py


def coco_instances(
    items: list[tuple[str, Scene]], *, masks: bool = False, keypoints: bool = False
) -> dict:
    """The COCO instances dict of (file name, scene) pairs; image ids count from 1.

    With ``masks``, each annotation also has its digit's ink as ``segmentation`` (COCO
    compressed RLE: ``{"size": [height, width], "counts": str}``) and its ``area`` is the
    mask's pixel count, as COCO's instance annotations have; without, ``area`` is the box's.
    With ``keypoints``, each annotation has COCO's ``keypoints`` (x, y, v = 2 per KEYPOINTS
    name) and ``num_keypoints``, each category the ``keypoints`` names and ``skeleton``;
    ``area`` is the ink's pixel count (OKS's scale, as COCO's person keypoints use the
    segment's area).
    """
    from batchinfer.detect.rle import encode_region

    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for image_id, (name, scene) in enumerate(items, start=1):
        h, w = scene.image.shape[:2]
        images.append({"id": image_id, "file_name": name, "width": w, "height": h})
        for i, (box, label) in enumerate(
            zip(scene.boxes.tolist(), scene.labels.tolist(), strict=True)
        ):
            x1, y1, x2, y2 = box
            annotation = {
                "id": len(annotations) + 1,
                "image_id": image_id,
                "category_id": int(label),
                "bbox": [x1, y1, x2 - x1, y2 - y1],
                "area": (x2 - x1) * (y2 - y1),
                "iscrowd": 0,
            }
            if masks:
                x, y, ink = scene.ink[i]
                counts = encode_region(ink, x, y, h, w)
                annotation["segmentation"] = {"size": [h, w], "counts": counts}
                annotation["area"] = int(ink.sum())
            if keypoints:
                points = scene.keypoints()[i].tolist()
                annotation["keypoints"] = [
                    v for px, py in points for v in (round(px, 3), round(py, 3), 2)
                ]
                annotation["num_keypoints"] = len(KEYPOINTS)
                annotation["area"] = int(scene.ink[i][2].sum())
            annotations.append(annotation)
    categories: list[dict] = [
        {"id": d, "name": name, "supercategory": "digit"} for d, name in enumerate(CLASSES)
    ]
    if keypoints:
        for c in categories:
            c["keypoints"] = list(KEYPOINTS)
            c["skeleton"] = [list(pair) for pair in SKELETON]
    return {
        "info": {
            "description": "batchinfer synthetic digit detection (see batchinfer.demo.detection)"
        },
        "images": images,
        "annotations": annotations,
        "categories": categories,
    }


def write_detection(
    target: Path, split: str = "val", n: int = VAL_IMAGES, seed: int = SEED
) -> DetectionSet:
    """Write ``n`` images of ``split`` as ``target/images/<nnnnn>.png`` + ``instances.json``
    (boxes) + ``instances-seg.json`` (boxes and the digits' masks as RLE) +
    ``instances-pose.json`` (boxes and the digits' keypoints).

    ``target`` must not exist or be an empty folder (the demo kit claims it first).
    """
    from PIL import Image  # only writing needs Pillow

    if n < 1:
        raise UsageError(f"Asked for {n} detection images; ask for at least 1.")
    target = Path(target)
    images = target / "images"
    images.mkdir(parents=True)
    items = []
    for i, scene in enumerate(scenes(split, n, seed)):
        name = f"{i:05d}.png"
        Image.fromarray(scene.image).save(images / name, compress_level=1)
        items.append((name, scene))
    instances = target / "instances.json"
    coco = coco_instances(items)
    instances.write_text(json.dumps(coco, separators=(",", ":")) + "\n")
    instances_seg = target / "instances-seg.json"
    coco_seg = coco_instances(items, masks=True)
    instances_seg.write_text(json.dumps(coco_seg, separators=(",", ":")) + "\n")
    instances_pose = target / "instances-pose.json"
    coco_pose = coco_instances(items, keypoints=True)
    instances_pose.write_text(json.dumps(coco_pose, separators=(",", ":")) + "\n")
    return DetectionSet(
        root=target,
        images=images,
        instances=instances,
        count=len(items),
        boxes=len(coco["annotations"]),
        instances_seg=instances_seg,
        instances_pose=instances_pose,
    )
