"""Preprocessing: decode one dataset item straight into a model input buffer.

Readers call :func:`load_into` with an ndarray view over a shared-memory slot; the
tensor is written there, with as few full-size copies as the format allows:

- images are decoded by :func:`batchinfer.data.images.decode_image` (pixel limit, EXIF
  orientation, reduced-size JPEG decoding, transparency, 16-bit scaling, resize);
- uint8 NHWC rgb/gray images: Pillow's pixels are copied once into the slot;
- other layouts, colours and integer dtypes: the same single copy, through a strided view;
- float dtypes with mean/std: ``(x - mean) / std`` computed into the slot
  (float16 goes through one float32 temporary to keep its precision);
- ``.npy`` tensors: the header is parsed and the data read with ``readinto`` into the
  slot's memory, with no temporary array (Fortran-ordered files need one).

Every problem with an item raises :class:`~batchinfer.errors.InputError` naming the file;
the engine turns it into an error row. A spec that cannot work at all raises UsageError
before any item is read.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from batchinfer.data.dataset import Locator, Member
from batchinfer.data.images import decode_array, decode_image
from batchinfer.data.input_spec import (
    COLORS,
    DEFAULT_MAX_PIXELS,
    LAYOUTS,
    RESIZE_MODES,
    Preprocess,
    parse_background,
)
from batchinfer.data.model_input import preprocess_for, raw_pixels_warning
from batchinfer.data.npy import fill_npy, read_npy
from batchinfer.data.pixels import write_pixels
from batchinfer.data.shard_reading import ShardFiles, check_item_size, member_label
from batchinfer.data.video.dataset import VideoFrame
from batchinfer.data.whole_file import open_item
from batchinfer.errors import InputError

if TYPE_CHECKING:
    from batchinfer.data.video.frames import VideoFiles
    from batchinfer.detect import Letterbox

# The spec, its derivation from a model and the .npy reader live in their own modules
# (input_spec, model_input, npy, pixels); their names are importable from here as they always were.
__all__ = [
    "BAD_ROW",
    "COLORS",
    "DEFAULT_MAX_PIXELS",
    "LAYOUTS",
    "RESIZE_MODES",
    "Preprocess",
    "load_into",
    "parse_background",
    "preprocess_for",
    "raw_pixels_warning",
    "read_npy",
]


#: How :attr:`~batchinfer.data.dataset.Item.path` starts for a list's row that cannot name
#: a file (a malformed CSV line, a JSON line without a path): NUL, which no file path can
#: hold, then the row's error. Readers make it that item's error row, wherever they run.
BAD_ROW = "\0"


def load_into(
    path: str,
    spec: Preprocess,
    out: np.ndarray,
    kind: str,
    *,
    name: str | None = None,
    member: Locator | None = None,
    shards: ShardFiles | None = None,
    videos: VideoFiles | None = None,
) -> Letterbox | None:
    """Decode the item at ``path`` and write its input tensor into ``out``.

    ``out`` must have ``spec.shape`` and ``spec.dtype`` and be C-contiguous (a view over a
    shared-memory slot); ``kind`` is the dataset's ('images' or 'npy'). ``name`` is how
    messages call the file (the item's id; default ``path``). ``member`` (Item.member, a
    Locator): where the item is inside the file at ``path``. A tar shard's Member is read
    from ``shards`` (the reader's open shards; without it the shard is opened for this item
    alone); a video frame's (batchinfer.data.video.dataset.VideoFrame) is decoded by
    ``videos`` (the reader's open decodes; default: this process's,
    batchinfer.data.video.frames.SHARED). Returns where a letterboxed image went on the
    input (``spec.resize == "letterbox"``), else None. Raises InputError for anything wrong
    with the file.
    """
    if out.shape != spec.shape or out.dtype != np.dtype(spec.dtype) or not out.flags.c_contiguous:
        raise ValueError(
            f"out is {out.shape} {out.dtype} (contiguous={out.flags.c_contiguous}), "
            f"expected C-contiguous {spec.shape} {spec.dtype}"
        )
    if path.startswith(BAD_ROW):  # a list's row that names no file: its error, as it was
        raise InputError(path[len(BAD_ROW) :])
    spec.validate_for(kind)
    if isinstance(member, VideoFrame):
        return _load_frame(path, member, spec, out, name or path, videos)
    if isinstance(member, Member):
        return _load_member(path, member, spec, out, kind, name, shards)
    if member is not None:
        raise TypeError(f"no loader reads an item by {type(member).__name__}")
    label = name or path
    if kind == "images":
        with _open(path, label, spec.item_limit) as f:
            pixels, placed = decode_image(f, spec, label)
        write_pixels(pixels, spec, out)
        return placed
    if kind == "npy":
        read_npy(path, spec, out, label)
        return None
    raise ValueError(f"unknown dataset kind {kind!r}")


def _load_member(
    path: str,
    member: Member,
    spec: Preprocess,
    out: np.ndarray,
    kind: str,
    name: str | None,
    shards: ShardFiles | None,
) -> Letterbox | None:
    """load_into for a member of a tar shard: its bytes in one read, decoded from memory."""
    label = member_label(path, member, name)
    files = shards if shards is not None else ShardFiles(keep=1)
    try:
        data = files.read(path, member, label, spec.item_limit)
    finally:
        if shards is None:
            files.close()
    if kind == "images":
        pixels, placed = decode_image(io.BytesIO(data), spec, label)
        write_pixels(pixels, spec, out)
        return placed
    if kind == "npy":
        fill_npy(None, data, spec, out, label)
        return None
    raise ValueError(f"unknown dataset kind {kind!r}")


def _load_frame(
    path: str,
    member: VideoFrame,
    spec: Preprocess,
    out: np.ndarray,
    label: str,
    videos: VideoFiles | None,
) -> Letterbox | None:
    """load_into for a video frame: decoded by the range's running decode, then fed as an
    image's pixels are (resize or letterbox, channels, mean/std)."""
    from batchinfer.data.video.frames import SHARED

    rgb = (videos if videos is not None else SHARED).frame(path, member, label)
    pixels, placed = decode_array(rgb, spec)
    write_pixels(pixels, spec, out)
    return placed


def _open(path: str, label: str, limit: int | None) -> BinaryIO:
    """The image file at ``path``, open; InputError when it is not a regular file, empty or
    larger than ``limit`` bytes (Preprocess.max_item_bytes, as a tar member is refused)."""
    fd, st = open_item(path, label)
    try:
        if st.st_size == 0:
            raise InputError(f"Cannot read {label}: the file is empty.")
        check_item_size(st.st_size, limit, label, "the file")
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")  # closed by the caller's with-block
