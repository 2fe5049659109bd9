"""A short generated clip of moving digits, for tests, benchmarks and the demo kit.

Each frame shows its own index as large digits that drift across a coloured gradient, so
a frame can be told from its neighbours by eye and every pixel changes between frames
(an encoder cannot make a frame a copy of the previous one). Two kinds:

- ``lossless``: FFV1 in Matroska, stored as 8-bit RGB (``bgr0``): decoding gives back
  exactly the RGB arrays :func:`clip_frame` makes, the reference for decode tests.
- ``h264``: H.264 (libx264 when PyAV's bundled FFmpeg has it, else MPEG-4 Part 2) in MP4,
  yuv420p, a keyframe every ``gop`` frames: what cameras and phones write.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path
from typing import Literal

import numpy as np

# 3x5 bitmaps of the digits 0-9, one string of 15 cells per digit, row by row.
_DIGITS = (
    "111101101101111",
    "010110010010111",
    "111001111100111",
    "111001111001111",
    "101101111001001",
    "111100111001111",
    "111100111101111",
    "111001001001001",
    "111101111101111",
    "111101111001111",
)
_GLYPHS = np.array([[c == "1" for c in d] for d in _DIGITS], dtype=bool).reshape(10, 5, 3)

ClipKind = Literal["lossless", "h264"]


def clip_frame(index: int, width: int = 320, height: int = 240) -> np.ndarray:
    """Frame ``index`` of the clip: (height, width, 3) uint8 RGB."""
    ys = np.arange(height, dtype=np.int32)[:, None]
    xs = np.arange(width, dtype=np.int32)[None, :]
    frame = np.empty((height, width, 3), dtype=np.uint8)
    frame[..., 0] = (xs * 255 // max(width - 1, 1) + index * 3) % 256
    frame[..., 1] = (ys * 255 // max(height - 1, 1) + index * 5) % 256
    frame[..., 2] = (index * 7) % 256
    scale = max(2, height // 12)
    text = str(index)
    glyph_w, glyph_h = 4 * scale, 5 * scale  # a 3-cell glyph and one cell of spacing
    span = max(width - glyph_w * len(text), 1)
    x0 = (index * 4) % span
    y0 = (height - glyph_h) // 2 + int((height // 4) * np.sin(index / 15.0))
    y0 = min(max(y0, 0), height - glyph_h)
    for k, ch in enumerate(text):
        mask = np.kron(_GLYPHS[int(ch)], np.ones((scale, scale), dtype=bool))
        x = x0 + k * glyph_w
        region = frame[y0 : y0 + mask.shape[0], x : x + mask.shape[1]]
        region[mask[: region.shape[0], : region.shape[1]]] = 255
    return frame


def h264_codec() -> str:
    """The H.264 encoder PyAV has here (libx264), else MPEG-4 Part 2 (mpeg4)."""
    import av

    return "libx264" if "libx264" in av.codecs_available else "mpeg4"


def write_clip(
    path: str | Path,
    kind: ClipKind = "lossless",
    frames: int = 300,
    width: int = 320,
    height: int = 240,
    fps: int = 30,
    gop: int = 30,
) -> Path:
    """Write the clip to ``path`` (``.mkv`` for lossless, ``.mp4`` for h264) and return it.

    ``gop``: frames between keyframes (each range a reader decodes starts at one).
    """
    pictures = (clip_frame(i, width, height) for i in range(frames))
    return encode_frames(path, pictures, kind, width, height, fps, gop)


def encode_frames(
    path: str | Path,
    pictures: Iterable[np.ndarray],
    kind: ClipKind = "h264",
    width: int = 320,
    height: int = 240,
    fps: int | Fraction = 30,
    gop: int = 30,
) -> Path:
    """Encode ``pictures`` ((height, width, 3) uint8 RGB each) as a ``kind`` video at ``fps``
    frames per second (module docstring: the codecs) to ``path``, and return it."""
    import av

    path = Path(path)
    with av.open(str(path), "w") as out:
        if kind == "lossless":
            stream = out.add_stream("ffv1", rate=fps)
            stream.pix_fmt = "bgr0"
        else:
            codec = h264_codec()
            options = {"bf": "0"} if codec == "mpeg4" else {"preset": "veryfast", "crf": "20"}
            stream = out.add_stream(codec, rate=fps, options=options)
            stream.pix_fmt = "yuv420p"
            if codec == "mpeg4":  # its default 200 kb/s smears the digits
                stream.bit_rate = int(width * height * fps) // 2
        stream.width, stream.height = width, height
        stream.codec_context.gop_size = gop
        if kind == "h264" and stream.codec_context.name == "libx264":
            # Keyframes exactly every `gop` frames (no scene-cut keyframes), closed GOPs.
            stream.codec_context.options = {
                **stream.codec_context.options,
                "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0",
            }
        for picture in pictures:
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path
