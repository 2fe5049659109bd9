"""JPEG pixels through simplejpeg (libjpeg-turbo) when it is installed, else None (Pillow).

Pillow still opens the file (format, size, mode, EXIF, the pixel limit); only the decode of
the pixels moves here, at the scale Pillow's ``draft`` would pick (1/2, 1/4 or 1/8, never
below the model's size) and in the colour space it would produce, so the pixels are
Pillow's: both are libjpeg-turbo with the same settings (``tools/bench_jpeg_decoders.py``
measured a largest difference of 0 on 640x480 and 4000x3000 photos, and
tests/test_fast_jpeg.py holds it within 1 level of 255). What it saves is Pillow's
per-image overhead around libjpeg: 3-6 % of the CPU of reading a 640x480 JPEG into a
224x224 input, 2-3 % for a 12 MP photo (docs/performance.md).

Anything simplejpeg is not asked to or cannot do goes back to Pillow: not installed, CMYK
or YCCK files, more than one tile, and any file it refuses (truncated or damaged: Pillow
then decodes it again and says what is wrong in its own words).
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import BinaryIO

from PIL import Image, JpegImagePlugin


@functools.cache
def _simplejpeg() -> ModuleType | None:
    try:
        import simplejpeg
    except ImportError:  # the optional extra batchinfer[fast-jpeg] is not installed
        return None
    return simplejpeg


def draft_scale(full: tuple[int, int], size: tuple[int, int]) -> int:
    """The scale denominator Pillow's ``JpegImageFile.draft`` picks for ``size``: the
    largest of 8, 4, 2, 1 that keeps both sides at least ``size``'s."""
    fit = min(full[0] // size[0], full[1] // size[1])
    return next((s for s in (8, 4, 2) if fit >= s), 1)


def decode(
    img: JpegImagePlugin.JpegImageFile,
    f: BinaryIO | None,
    mode: str,
    size: tuple[int, int] | None,
) -> Image.Image | None:
    """``img``'s pixels as Pillow would load them after ``img.draft(mode, size)`` (no
    draft when ``size`` is None), or None when Pillow should decode it (also when there is
    no file ``f`` to read the JPEG's bytes from)."""
    sj = _simplejpeg()
    if sj is None or f is None or img.mode not in ("L", "RGB") or len(img.tile) != 1:
        return None
    w, h = img.size
    s = draft_scale(img.size, size) if size else 1
    # draft("L") makes libjpeg convert a colour file to gray (its Y); without a draft
    # Pillow decodes RGB and converts afterwards, as the caller then does.
    gray = img.mode == "L" or (size is not None and mode == "L")
    want = (-(-h // s), -(-w // s))
    try:
        f.seek(0)
        data = f.read()
        pixels = sj.decode_jpeg(
            data, "GRAY" if gray else "RGB", min_width=want[1], min_height=want[0]
        )
    except Exception:  # damaged, truncated, unseekable, ...: Pillow's decode says why
        return None
    if pixels.shape[:2] != want:  # a scale Pillow would not have picked: keep Pillow's pixels
        return None
    return Image.fromarray(pixels[:, :, 0] if gray else pixels)
