"""The report's pictures of items, made in a child process under the decode timeout.

The report shows the worst and the flipped items with a small picture of each. Opening an
item can block for ever: a FIFO (a symlink to one is a dataset item), a file on a dead
network mount. Opened in the coordinator, such an item would hang the evaluation with its
output folders locked, deaf to Ctrl-C (signals reach the main thread between bytecodes,
never inside a blocked ``open``). So, as the engine's readers do, the pictures are made by a
child process of the run's fork server (engine/plumbing/children.py) and the coordinator only
waits on its pipe, one item at a time, for at most ``reliability.decode_timeout_s``:

- an item that is not a regular file is not opened (``not a regular file``);
- an item that takes longer gets no picture (its card says why), the child is killed and a
  new one goes on with the next item; after :data:`MAX_HUNG` such items the rest are
  skipped (each would cost a whole timeout) and their cards say so;
- a child that dies (a decoder crash) costs the item it was reading its picture only.

Images are decoded under the job's ``preprocess.max_pixels`` (Pillow's decompression-bomb
check as an error, as readers do); a ``.npy`` larger than that is not drawn either. An item
larger than ``preprocess.max_item_bytes`` (an image file by its size, a tar member by the
size its header declares) is not read at all, as readers refuse it: a forged header must
not make the child read gigabytes.

An item is a file (its path) or a member of a tar shard (a :data:`Source` tuple: the
shard's path, the member's offset and size in bytes, its name): the member's bytes are read
with one ``pread`` and decoded from memory, as the engine's readers do (data/shards.py).
A video frame is a :class:`~batchinfer.evaluate.video_pictures.FrameSource` (the video's
path and the frame's index), decoded by the data layer's video decode
(evaluate/video_pictures.py says how, and what it costs).

How a picture is fitted to its side is the scorer's (:class:`Fit`): the classification
cards' thumbnails as they come, Lanczos-shrunk (:data:`THUMBNAIL_FIT`); the detection
gallery's panels, images and video frames alike, which the coordinator draws boxes on
(scorers/instances_plots.draw_on): upright by EXIF as the readers saw them, in RGB, shrunk
bilinear and enlarged at most 4x (:data:`PANEL_FIT`; not turned when the job's readers do
not turn images, ``preprocess.exif_orientation = false``: evaluation._write_report).

Protocol: coordinator -> child ``("make", [source, ...])``, ``Stop()`` (the pool's, from
engine/protocol.py); child -> coordinator ``("ready",)`` once imported, then
``("made", uri or None, note or None, scale or None)`` for each source, in order (``scale``:
the picture's pixels per pixel of the item, for drawing boxes on it).
"""

from __future__ import annotations

import base64
import io
import os
import stat
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any, Literal

import numpy as np

from batchinfer.data.input_spec import item_bytes_for
from batchinfer.engine.plumbing.child import send_or_exit, setup_child
from batchinfer.engine.plumbing.children import ChildPool, Exited, Message
from batchinfer.engine.protocol import Stop, until_stop
from batchinfer.evaluate.video_pictures import FrameSource, open_frame

#: Items allowed to hang before the remaining ones are skipped.
MAX_HUNG = 2
#: Items pictured of each of the lost and the gained since the baseline.
FLIPPED_PICTURED = 24

#: Where an item's picture is read from: its file, (shard, offset, size, member name), or
#: a video's frame.
Source = str | tuple[str, int, int, str] | FrameSource
#: The longest side of the report's item pictures (a scorer may ask for others: Scorer).
THUMBNAIL_SIDE = 96
_SLICE_S = 0.25  # longest wait between two looks at the clock (and at a pending Ctrl-C)
_REAP_S = 1.0


@dataclass(frozen=True)
class Thumbnail:
    """An item's picture as a ``data:`` URI, or None and why not; ``scale``: the picture's
    pixels per pixel of the item."""

    uri: str | None
    note: str | None = None
    scale: float | None = None


@dataclass(frozen=True)
class Fit:
    """How an item's picture is fitted to its side (picklable: the child is given it). A
    picture is always enlarged with sharp pixels (nearest)."""

    #: The most a small picture is enlarged (None: to the side, however small).
    max_zoom: float | None = None
    #: The filter a large picture is shrunk with.
    shrink: Literal["lanczos", "bilinear"] = "lanczos"
    #: Turned by its EXIF orientation, as readers do for detection (boxes are drawn on it).
    upright: bool = False
    #: Made RGB (a grey image too), for boxes in colour; else L or RGB as it comes.
    rgb: bool = False


#: The classification cards' thumbnails.
THUMBNAIL_FIT = Fit()
#: The detection gallery's panels (scorers/instances_report.py draws the boxes on them).
PANEL_FIT = Fit(max_zoom=4.0, shrink="bilinear", upright=True, rgb=True)


@dataclass(frozen=True)
class ThumbnailSpec:
    """What the child needs (picklable)."""

    parent_pid: int
    size: int
    max_pixels: int | None
    max_item_bytes: int | None = None
    fit: Fit = THUMBNAIL_FIT


def picture_source(item: Mapping[str, Any]) -> Source:
    """Where an item's picture is read from, given its place (``{"path"}``, ``{"path",
    "member": {"offset", "size", "name"}}`` or ``{"path", "frame", "size", "autorotate"}``:
    evaluate.evaluation.item_places)."""
    if item.get("frame") is not None:
        turn = bool(item.get("autorotate", True))
        return FrameSource(item["path"], int(item["frame"]), item.get("size"), turn)
    member = item.get("member")
    if member is None:
        return item["path"]
    return (item["path"], member["offset"], member["size"], member["name"])


# --------------------------------------------------------------------------- the child
def thumbnail_main(spec: ThumbnailSpec, tasks: Connection, results: Connection) -> None:
    """Entry point of the thumbnail process."""
    setup_child(spec.parent_pid, None)
    import PIL.Image  # noqa: F401 - imported before "ready", so the first item's wait is a decode

    send_or_exit(results, ("ready",))
    for msg in until_stop(tasks):
        for path in msg[1]:
            made = picture(path, spec.size, spec.max_pixels, spec.max_item_bytes, spec.fit)
            send_or_exit(results, ("made", *made))


def picture(
    source: Source,
    size: int,
    max_pixels: int | None,
    max_item_bytes: int | None = None,
    fit: Fit = THUMBNAIL_FIT,
) -> tuple[str | None, str | None, float | None]:
    """(PNG data: URI of at most ``size`` pixels a side, None, its scale) or (None, why not,
    None)."""
    image, note = open_item(source, max_pixels, max_item_bytes, fit.upright)
    if image is None:
        return None, note, None
    image, scale = fitted(image.convert("RGB") if fit.rgb else image, size, fit)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode(), None, scale


def fitted(image, side: int, fit: Fit):  # (PIL.Image.Image, ...) -> (PIL.Image.Image, float)
    """``image`` scaled to ``side`` pixels on its long side as ``fit`` says, and that scale
    (the picture's pixels per pixel of the image)."""
    from PIL import Image

    scale = side / max(image.size)
    if fit.max_zoom is not None:
        scale = min(fit.max_zoom, scale)
    if scale == 1.0:
        return image, scale
    shrink = {"lanczos": Image.Resampling.LANCZOS, "bilinear": Image.Resampling.BILINEAR}
    resample = Image.Resampling.NEAREST if scale > 1 else shrink[fit.shrink]
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(size, resample), scale


def open_item(
    source: Source,
    max_pixels: int | None,
    max_item_bytes: int | None = None,
    upright: bool = False,
):  # -> tuple[PIL.Image.Image, None] | tuple[None, str]
    """An item's image (L or RGB; ``upright``: turned by its EXIF orientation, as readers do
    for detection) read within the bounds (module docstring), or (None, why not). Used by
    the report's pictures and by ``export draw``."""
    from PIL import Image, ImageOps

    if isinstance(source, FrameSource):
        path, name = source.path, source.path
    else:
        path, name = (source, source) if isinstance(source, str) else (source[0], source[3])
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        if isinstance(source, FrameSource):  # seeked and decoded, never read whole
            return open_frame(source, st, max_pixels)
        nbytes = st.st_size if isinstance(source, str) else source[2]
        # As readers: a .npy file is mapped, never read whole; a member always is.
        mapped = isinstance(source, str) and name.lower().endswith(".npy")
        if max_item_bytes is not None and nbytes > max_item_bytes and not mapped:
            return None, f"not read: {nbytes:,} bytes, more than the {max_item_bytes:,} allowed"
        where: str | io.BytesIO = path
        if not isinstance(source, str):
            where = io.BytesIO(_member_bytes(*source[:3]))
        if name.lower().endswith(".npy"):
            image = _npy_image(where, max_pixels)
            if image is None:
                return None, "not an image-shaped array"
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                Image.MAX_IMAGE_PIXELS = max_pixels
                with Image.open(where) as opened:
                    turned = ImageOps.exif_transpose(opened) if upright else opened
                    mode = turned.mode if turned.mode in ("L", "RGB") else "RGB"
                    image = turned.convert(mode)
    except Exception as exc:  # an unreadable item has no picture; its row says why
        return None, f"cannot be drawn ({type(exc).__name__})"
    return image, None


def _member_bytes(shard: str, offset: int, size: int) -> bytes:
    """A tar member's bytes (all of them, or OSError); its size was checked against the
    item bound by :func:`picture` before this reads a byte."""
    fd = os.open(shard, os.O_RDONLY)
    try:
        data = os.pread(fd, size, offset)
    finally:
        os.close(fd)
    if len(data) != size:
        raise OSError(f"the shard ends {size - len(data)} bytes into the member")
    return data


def _npy_image(where: str | io.BytesIO, max_pixels: int | None):  # -> PIL.Image.Image | None
    from PIL import Image

    mmap: Literal["r"] | None = "r" if isinstance(where, str) else None
    array = np.load(where, mmap_mode=mmap, allow_pickle=False)
    if max_pixels is not None and array.size > 3 * max_pixels:
        raise ValueError("too many values")
    array = np.squeeze(array)
    if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
        array = np.moveaxis(array, 0, -1)
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in (1, 3)):
        return None
    array = np.squeeze(array).astype(np.float64)
    span = float(array.max() - array.min()) or 1.0
    return Image.fromarray(((array - array.min()) / span * 255).astype(np.uint8))


# --------------------------------------------------------------------------- the coordinator
def _give_up(todo: list[Source], out: dict[Source, Thumbnail], why: str) -> None:
    for path in todo:
        out[path] = Thumbnail(None, why)
    todo.clear()


def make_thumbnails(
    paths: Sequence[Source],
    *,
    decode_timeout_s: float,
    startup_timeout_s: float,
    max_pixels: int | None,
    max_item_bytes: int | str | None = "auto",
    size: int = THUMBNAIL_SIDE,
    clock: Callable[[], float] = time.monotonic,
    maker: Callable[[ThumbnailSpec, Connection, Connection], None] | None = None,
    fit: Fit = THUMBNAIL_FIT,
) -> dict[Source, Thumbnail]:
    """A Thumbnail for each of ``paths`` (files or shard members: :data:`Source`; see the
    module docstring), fitted to ``size`` as ``fit`` says; never blocks longer than the
    timeouts, and leaves no process behind. ``max_item_bytes``: the most bytes an item may
    hold, "auto" for what ``max_pixels`` gives (as readers: Preprocess.max_item_bytes),
    None for no limit. ``maker``: the child's entry point (default :func:`thumbnail_main`;
    the tests give one that hangs)."""
    maker = maker or thumbnail_main
    limit = item_bytes_for(max_pixels) if max_item_bytes == "auto" else max_item_bytes
    # Its parent_pid is each child pool's (_run_child).
    spec = ThumbnailSpec(0, size, max_pixels, limit if isinstance(limit, int) else None, fit)
    todo = list(dict.fromkeys(paths))
    out: dict[Source, Thumbnail] = {}
    hung = 0
    while todo and hung < MAX_HUNG:
        hung += _run_child(maker, spec, todo, out, decode_timeout_s, startup_timeout_s, clock)
    for path in todo:
        out[path] = Thumbnail(None, f"not read: {hung} items before it took too long to read")
    return out


def _run_child(
    maker: Callable[[ThumbnailSpec, Connection, Connection], None],
    spec: ThumbnailSpec,
    todo: list[Source],
    out: dict[Source, Thumbnail],
    decode_timeout_s: float,
    startup_timeout_s: float,
    clock: Callable[[], float],
) -> int:
    """One child making pictures of ``todo`` (taken off it as they come, into ``out``)
    until done, or until an item hangs (returns 1) or kills it (returns 0)."""
    pool = ChildPool(clock)
    try:
        spec = replace(spec, parent_pid=pool.parent_pid)
        child = pool.start("thumbnails", 0, maker, spec, startup_timeout_s, "starting")
        pool.send(child, ("make", list(todo)))
        deadline, ready = clock() + startup_timeout_s, False
        while todo:
            for event in pool.poll(min(max(0.0, deadline - clock()), _SLICE_S)):
                if isinstance(event, Message) and event.body[0] == "ready":
                    deadline, ready = clock() + decode_timeout_s, True
                elif isinstance(event, Message):
                    _, uri, note, scale = event.body
                    out[todo.pop(0)] = Thumbnail(uri, note, scale)
                    deadline = clock() + decode_timeout_s
                elif isinstance(event, Exited) and todo and ready:
                    out[todo.pop(0)] = Thumbnail(None, "the picture maker died reading it")
                    return 0
                elif isinstance(event, Exited) and todo:
                    _give_up(todo, out, "the picture maker could not start")
            if todo and clock() >= deadline:
                if not ready:
                    limit = f"{startup_timeout_s:g} s (the start-up timeout)"
                    _give_up(todo, out, f"the picture maker was not ready within {limit}")
                    return 0
                limit = f"{decode_timeout_s:g} s (the decode timeout)"
                out[todo.pop(0)] = Thumbnail(None, f"reading it took longer than {limit}")
                return 1
        pool.send(child, Stop())
        return 0
    finally:
        pool.close(hard=bool(todo), join_timeout_s=_REAP_S)
