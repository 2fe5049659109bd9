"""The demo kit's clip: handwritten digits moving across a shifting background, and where
each one is in every frame (its ground truth, as COCO and as MOT).

:data:`TRACKS` held-out digits (the detection val split's, which the demo detector was not
trained on) each keep to their own horizontal lane of the frame, so they never overlap:
a digit crosses the frame at a constant speed, bouncing off its sides, and bobs up and
down in its lane. The background is a dark gradient that drifts from frame to frame (so
no frame is a copy of the last) and the ink is light, as contrasted as the detection
set's. Everything is made from :data:`SEED` by numpy alone, so frame ``i`` is the same on
every platform before encoding; the encoded file (H.264 in MP4, else MPEG-4 Part 2: what
:func:`batchinfer.data.video.clip.h264_codec` finds) is lossy, and its bytes depend on
the encoder's version.

A digit's box is the tight box of its ink in the generated frame (alpha >=
:data:`~batchinfer.demo.detection.INK_ALPHA`, pixel edges), as in the detection set.
:func:`write_demo_clip` writes the clip, ``instances.json`` (COCO, ``file_name``
``<clip>#<frame>``, one image per frame, category id = the digit) and ``gt/gt.txt`` with
``gt/labels.txt`` (MOT: ``frame,id,x,y,w,h,1,class,1`` with 1-based frames and 1-based
classes, the line of ``labels.txt`` naming them, as CVAT's MOT export writes).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batchinfer.demo.detection import (
    INK_ALPHA,
    Scene,
    _resize_bilinear,
    coco_instances,
    split_digits,
)
from batchinfer.demo.digits import load_digits

SEED = 0
#: The clip's size, length and rate: 10 seconds at 30 frames per second.
WIDTH, HEIGHT = 320, 240
FRAMES = 300
FPS = 30
GOP = 30  # a keyframe a second: readers split the clip into ranges there
TRACKS = 4
CLIP_NAME = "digits.mp4"
_DIGIT_SIDE = (36, 48)  # a digit's patch, pixels on its longer side
_BOB = 5  # pixels up and down within its lane
_INK = np.array([235.0, 228.0, 190.0], np.float32)


@dataclass(frozen=True)
class Track:
    """One digit's path through the clip."""

    digit: int  # index in digits.npz
    label: int  # the digit, its class id
    alpha: np.ndarray  # (ph, pw) float32 ink 0..1
    x0: float
    speed: float  # pixels per frame, signed
    lane_y: int  # the top of its patch at rest
    phase: float

    def position(self, frame: int) -> tuple[int, int]:
        """The patch's top-left corner in ``frame``: bouncing across, bobbing up and down."""
        span = WIDTH - self.alpha.shape[1]
        x = (self.x0 + self.speed * frame) % (2 * span)
        x = 2 * span - x if x > span else x  # a triangle wave: the bounce off either side
        y = self.lane_y + round(_BOB * np.sin(2 * np.pi * frame / 90 + self.phase))
        return round(x), int(y)


def tracks(seed: int = SEED) -> list[Track]:
    """The clip's digits and their paths, made from ``seed``."""
    rng = np.random.default_rng([seed, 3])
    glyphs, index = split_digits("val")
    labels = load_digits(raw=True)[1].astype(np.int64)
    lane = HEIGHT // TRACKS
    out: list[Track] = []
    for t in range(TRACKS):
        k = int(rng.integers(len(glyphs)))
        while int(labels[index[k]]) in {p.label for p in out}:  # four different digits
            k = int(rng.integers(len(glyphs)))
        side = int(rng.integers(_DIGIT_SIDE[0], _DIGIT_SIDE[1] + 1))
        width = max(8, round(side * rng.uniform(0.8, 1.0)))
        alpha = _resize_bilinear(glyphs[k], side, width).astype(np.float32)
        speed = float(rng.uniform(1.5, 4.0)) * (1 if rng.random() < 0.5 else -1)
        out.append(
            Track(
                digit=int(index[k]),
                label=int(labels[index[k]]),
                alpha=alpha,
                x0=float(rng.uniform(0, WIDTH - width)),
                speed=speed,
                lane_y=t * lane + (lane - side) // 2,
                phase=float(rng.uniform(0, 2 * np.pi)),
            )
        )
    return out


def clip_scene(frame: int, paths: list[Track] | None = None) -> Scene:
    """Frame ``frame`` of the clip, generated (before encoding), with its digits' boxes."""
    paths = tracks() if paths is None else paths
    xs = np.arange(WIDTH, dtype=np.float32)[None, :]
    ys = np.arange(HEIGHT, dtype=np.float32)[:, None]
    drift = frame / FRAMES
    canvas = np.empty((HEIGHT, WIDTH, 3), np.float32)
    canvas[..., 0] = 20 + 50 * ((xs / WIDTH + drift) % 1.0)
    canvas[..., 1] = 25 + 35 * (ys / HEIGHT)
    canvas[..., 2] = 60 + 40 * ((1 - xs / WIDTH + 2 * drift) % 1.0)
    boxes, inks = [], []
    for track in paths:
        x, y = track.position(frame)
        ph, pw = track.alpha.shape
        region = canvas[y : y + ph, x : x + pw]
        region += track.alpha[..., None] * (_INK - region)
        ink = track.alpha >= INK_ALPHA
        rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
        boxes.append((x + cols[0], y + rows[0], x + cols[-1] + 1, y + rows[-1] + 1))
        inks.append((x, y, ink))
    return Scene(
        image=np.clip(np.rint(canvas), 0, 255).astype(np.uint8),
        boxes=np.asarray(boxes, np.float32).reshape(-1, 4),
        labels=np.array([t.label for t in paths], np.int64),
        digits=np.array([t.digit for t in paths], np.int64),
        ink=tuple(inks),
    )


def clip_scenes(frames: int = FRAMES) -> Iterator[Scene]:
    """Frames 0 .. ``frames - 1`` of the clip."""
    paths = tracks()
    for i in range(frames):
        yield clip_scene(i, paths)


@dataclass(frozen=True)
class DemoClip:
    """Where :func:`write_demo_clip` put the clip and its ground truth."""

    video: Path  # digits.mp4
    instances: Path  # instances.json: COCO, file_name "digits.mp4#<frame>"
    mot: Path  # gt/gt.txt (and gt/labels.txt beside it)
    frames: int
    boxes: int
    codec: str


def mot_lines(scenes: list[Scene]) -> list[str]:
    """MOT ground truth lines: ``frame,id,x,y,w,h,1,class,1`` (frame and class 1-based,
    the track id the digit's lane + 1)."""
    lines = []
    for frame, scene in enumerate(scenes, start=1):
        pairs = zip(scene.boxes.tolist(), scene.labels.tolist(), strict=True)
        for track, (box, label) in enumerate(pairs, start=1):
            x1, y1, x2, y2 = (int(v) for v in box)
            lines.append(f"{frame},{track},{x1},{y1},{x2 - x1},{y2 - y1},1,{label + 1},1")
    return lines


def write_demo_clip(target: Path, frames: int = FRAMES) -> DemoClip:
    """Write the clip into the folder ``target`` (made; it must not hold these files):
    ``digits.mp4``, ``instances.json``, ``gt/gt.txt``, ``gt/labels.txt``."""
    from batchinfer.data.video.clip import encode_frames, h264_codec

    target = Path(target)
    (target / "gt").mkdir(parents=True, exist_ok=True)
    scenes = list(clip_scenes(frames))
    video = encode_frames(
        target / CLIP_NAME, (s.image for s in scenes), "h264", WIDTH, HEIGHT, FPS, GOP
    )
    items = [(f"{CLIP_NAME}#{i}", s) for i, s in enumerate(scenes)]
    coco = coco_instances(items)
    coco["info"] = {"description": "batchinfer demo clip (see batchinfer.demo.clip)"}
    instances = target / "instances.json"
    instances.write_text(json.dumps(coco, separators=(",", ":")) + "\n")
    mot = target / "gt" / "gt.txt"
    mot.write_text("\n".join(mot_lines(scenes)) + "\n")
    (target / "gt" / "labels.txt").write_text("".join(f"{d}\n" for d in range(10)))
    return DemoClip(video, instances, mot, frames, len(coco["annotations"]), h264_codec())


def write_demo_clip_if_possible(target: Path) -> DemoClip | None:
    """:func:`write_demo_clip`, or None when PyAV (the ``video`` extra) is not installed."""
    try:
        import av  # noqa: F401
    except ImportError:
        return None
    return write_demo_clip(target)


__all__ = [
    "CLIP_NAME",
    "FPS",
    "FRAMES",
    "HEIGHT",
    "TRACKS",
    "WIDTH",
    "DemoClip",
    "Track",
    "clip_scene",
    "clip_scenes",
    "mot_lines",
    "tracks",
    "write_demo_clip",
    "write_demo_clip_if_possible",
]
