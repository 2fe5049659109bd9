"""Decoding one image file into pixels at the model's size, as an image viewer shows it.

Steps, in order (see :class:`~batchinfer.data.input_spec.Preprocess` for the switches):

1. **Pixel limit**, from the header before any pixel is decoded: an image over
   ``max_pixels`` (a decompression bomb, or a scan too big for a reader's memory) is an
   InputError, i.e. an error row.
2. **EXIF orientation** (``exif_orientation``): the Orientation tag is applied as image
   viewers do, so a phone photo tagged "rotate 90°" is seen upright.
3. **Reduced-size JPEG decoding** (``jpeg_draft``): when the model input is at most half
   the photo's size, libjpeg decodes at 1/2, 1/4 or 1/8 scale (Pillow's ``draft``), never
   below the size needed, so the resize still works from enough pixels. JPEG pixels come
   from simplejpeg when it is installed (:mod:`batchinfer.data.fast_jpeg`: the same
   libjpeg-turbo pixels with less overhead), else from Pillow.
4. **Transparency** (``background``): images with an alpha channel or a transparent
   colour are composited over the background colour (default white, as browsers and
   viewers show them on a light page); ``None`` drops alpha as ``Image.convert`` does.
5. **High bit depth**: 16-bit (``I;16*``, and ``I`` as Pillow opens 16-bit PNM) and float
   (``F``, taken as 0..1) images are scaled to 0..255, not clipped. For float model inputs
   the fractions are kept (no rounding to 8 bits); integer inputs get them rounded.
6. **Resize** to the model's height and width (bilinear, stretching), then the
   orientation's transpose (cheaper at the model's size than at the photo's).
   Letterboxing (``resize="letterbox"``, for detectors) resizes to the size that keeps the
   upright image's aspect (:func:`batchinfer.detect.letterbox_geometry`), transposes, and
   pads the rest of the input with the pad colour; the geometry is returned with the pixels,
   so boxes can be mapped back to the original image's pixels.
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
from PIL import Image, ImageFile, JpegImagePlugin

from batchinfer.data import fast_jpeg
from batchinfer.errors import InputError

if TYPE_CHECKING:
    from batchinfer.data.input_spec import Preprocess
    from batchinfer.detect import Letterbox


_ORIENTATION_TAG = 0x0112
#: EXIF orientation -> the transpose that shows the image upright (EXIF 2.32, 4.6.4).
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_SWAPS_AXES = frozenset({5, 6, 7, 8})

_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
#: Modes with more than 8 bits per sample -> the factor that maps their range to 0..255.
_DEEP_SCALE = {
    "I;16": 255 / 65535,
    "I;16L": 255 / 65535,
    "I;16B": 255 / 65535,
    "I;16N": 255 / 65535,
    "I": 255 / 65535,  # Pillow's mode for 16-bit PNM (and some 16-bit PNG/TIFF readers)
    "F": 255.0,  # float images are 0..1 by convention (scikit-image, OpenCV, TIFF tools)
}

# Pillow's decompression-bomb check reads the module global MAX_IMAGE_PIXELS and warns
# (or raises, past twice the limit) from Image.open and from some plugins' load(). While
# an image is decoded the global is our limit and that warning an error, so an image
# over the limit fails from its header, before any pixel is decoded, and no raw warning
# reaches stderr. Both settings are process-wide, hence the lock: decodes in one process
# take turns (readers are single-threaded processes, so nothing waits there).
_PILLOW_SETTINGS = threading.Lock()


def decode_image(f: BinaryIO, spec: Preprocess, label: str) -> tuple[np.ndarray, Letterbox | None]:
    """Return the image in ``f`` at spec.size, upright, as (H, W) or (H, W, 3) pixels, and
    where it was placed when letterboxed (None when stretched).

    The array is uint8, or float32 in 0..255 for a high-bit-depth image fed to a float
    input. Gray images come back (H, W) even for rgb/bgr specs (the writer broadcasts).
    Raises InputError for anything wrong with the file.
    """
    # A truncated file must fail, not come back padded with grey.
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set; batchinfer needs it off")
    with _pillow_limit(spec.max_pixels):
        try:
            img = Image.open(f)
        except Image.UnidentifiedImageError as exc:
            raise InputError(f"Cannot read {label}: it is not an image Pillow can decode.") from exc
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise _too_big(label, exc, spec.max_pixels) from exc
        except Exception as exc:  # Pillow raises many types for a damaged header
            raise InputError(f"Cannot read {label}: {pil_reason(exc)}.") from exc
        with img:
            try:
                return _pixels(img, spec, f)
            except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
                raise _too_big(label, exc, spec.max_pixels) from exc
            except Exception as exc:  # truncated data, bad chunks, unsupported modes
                raise InputError(f"Cannot read {label}: {pil_reason(exc)}.") from exc


def decode_array(rgb: np.ndarray, spec: Preprocess) -> tuple[np.ndarray, Letterbox | None]:
    """:func:`decode_image` for pixels already decoded (a video frame, (H, W, 3) uint8
    RGB): the same resize or letterbox, colour conversion and canvas, so a frame gives the
    input its lossless PNG would. Its size was checked against ``max_pixels`` by the
    video's probe."""
    return _pixels(Image.fromarray(rgb, "RGB"), spec, None)


@contextmanager
def _pillow_limit(max_pixels: int | None) -> Iterator[None]:
    with _PILLOW_SETTINGS, warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        saved = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = max_pixels
        try:
            yield
        finally:
            Image.MAX_IMAGE_PIXELS = saved


def _pixels(
    img: Image.Image, spec: Preprocess, f: BinaryIO | None
) -> tuple[np.ndarray, Letterbox | None]:
    height, width = spec.size
    mode = "L" if spec.color == "gray" else "RGB"
    orientation = _orientation(img) if spec.exif_orientation else 1
    placed = None
    inner_w, inner_h = width, height
    if spec.resize == "letterbox":
        # The geometry of the upright image at its full size (before any draft decoding).
        w, h = img.size
        upright = (h, w) if orientation in _SWAPS_AXES else (w, h)
        placed, inner_w, inner_h = _letterbox(upright, width, height)
    # Everything up to the transpose happens in the file's own orientation.
    size = (inner_h, inner_w) if orientation in _SWAPS_AXES else (inner_w, inner_h)
    if isinstance(img, JpegImagePlugin.JpegImageFile):
        # Phones' JPEGs often open as MPO, a JpegImageFile subclass: same decoder.
        draft = size if spec.jpeg_draft and img.size != size else None
        # simplejpeg when installed (the same libjpeg-turbo pixels, less overhead), else Pillow.
        fast = fast_jpeg.decode(img, f, mode, draft)
        if fast is not None:
            img = fast
        elif draft is not None:
            img.draft(mode, size)
    img.load()
    if img.mode in _DEEP_SCALE:
        out = _deep_pixels(img, size, orientation, spec.is_float)
    else:
        img = _flatten(img, spec.background)
        if img.mode != mode:
            img = img.convert(mode)
        if img.size != size:
            img = img.resize(size, Image.Resampling.BILINEAR)
        if orientation in _TRANSPOSE:
            img = img.transpose(_TRANSPOSE[orientation])
        out = np.asarray(img)
    if placed is not None:
        out = _on_canvas(out, placed, width, height, spec.pad)
    return out, placed


def _letterbox(upright: tuple[int, int], width: int, height: int) -> tuple[Letterbox, int, int]:
    """Where an upright image of ``upright`` (w, h) goes on a width x height input: the
    geometry, and the size it is resized to (at least 1 pixel, at most the input)."""
    from batchinfer.detect import letterbox_geometry

    placed = letterbox_geometry(upright[0], upright[1], width, height)
    inner_w, inner_h = placed.resized
    return placed, min(width, inner_w), min(height, inner_h)


def _on_canvas(
    pixels: np.ndarray, placed: Letterbox, width: int, height: int, pad: tuple[int, int, int]
) -> np.ndarray:
    """``pixels`` (resized, upright) placed on a width x height canvas of the pad colour,
    where the geometry says (as batchinfer.detect.letterbox_array places it)."""
    inner_h, inner_w = pixels.shape[:2]
    left = min(width - inner_w, max(0, int(placed.pad_x)))
    top = min(height - inner_h, max(0, int(placed.pad_y)))
    shape = (height, width, *pixels.shape[2:])
    fill = pad if pixels.ndim == 3 else round(sum(pad) / 3)
    canvas = np.empty(shape, pixels.dtype)
    canvas[...] = np.asarray(fill, dtype=pixels.dtype)
    canvas[top : top + inner_h, left : left + inner_w] = pixels
    return canvas


def _orientation(img: Image.Image) -> int:
    try:
        value = img.getexif().get(_ORIENTATION_TAG, 1)
    except Exception:  # a damaged EXIF block: show the image as stored, as viewers do
        return 1
    return value if isinstance(value, int) and value in _TRANSPOSE else 1


def _flatten(img: Image.Image, background: tuple[int, int, int] | None) -> Image.Image:
    """The image without transparency: composited over ``background``, or alpha dropped."""
    if img.mode not in _ALPHA_MODES and "transparency" not in img.info:
        return img
    if background is None:
        # Converting drops alpha. A palette with transparency goes through RGBA first,
        # or Pillow warns.
        return img.convert("RGBA") if img.mode == "P" else img
    rgba = img.convert("RGBA")
    canvas = Image.new("RGBA", rgba.size, (*background, 255))
    canvas.alpha_composite(rgba)
    return canvas.convert("RGB")


def _deep_pixels(
    img: Image.Image, size: tuple[int, int], orientation: int, keep_fraction: bool
) -> np.ndarray:
    """A 16-bit or float gray image scaled to 0..255, resized and made upright."""
    scaled = np.asarray(img, dtype=np.float32) * np.float32(_DEEP_SCALE[img.mode])
    np.clip(scaled, 0, 255, out=scaled)
    plane = Image.fromarray(scaled)  # 2-D float32: mode F
    if plane.size != size:
        plane = plane.resize(size, Image.Resampling.BILINEAR)
    if orientation in _TRANSPOSE:
        plane = plane.transpose(_TRANSPOSE[orientation])
    out = np.asarray(plane)
    if keep_fraction:
        return out
    return np.rint(out).astype(np.uint8)


def _too_big(label: str, exc: Exception, limit: int | None) -> InputError:
    found = re.search(r"\((\d+) pixels\)", str(exc))
    limit_text = "no limit" if limit is None else f"{limit:,}"
    size = f"{int(found.group(1)):,} pixels" if found else "more pixels than that"
    return InputError(
        f"Cannot read {label}: it has {size}, over the limit of {limit_text} (a huge image or "
        "a decompression bomb); shrink it or raise the pixel limit (--max-pixels, or "
        "max_pixels in a job file)."
    )


def pil_reason(exc: Exception) -> str:
    """Why Pillow failed, as the end of a 'Cannot read X: ...' sentence."""
    text = str(exc).strip().rstrip(".") or type(exc).__name__
    if "truncated" in text.lower():
        return f"the file is truncated (PIL: {text})"
    return f"it is not a valid image (PIL: {text})"
