"""The eval report's pictures of video frames, made in its picture child (thumbnails.py).

A frame item's picture is read from ``(video file, frame index)`` (:class:`FrameSource`):
the data layer probes the file (data/video/probe.py: its frames' timestamps and
keyframes) and decodes the one frame from the keyframe at or before it
(data/video/decode.py :func:`~batchinfer.data.video.decode.decode_frame`, the readers'
decode). The probe refuses a frame larger than ``max_pixels`` as readers do; a video file
is never read whole, so the item byte bound does not apply to it (as to a mapped ``.npy``).
A video whose size is not what the run read gets no picture (it would show another file).
The frame is turned by the video's display rotation when the run's readers turned it
(:attr:`FrameSource.autorotate`, the run's ``preprocess.autorotate``): the boxes drawn on
it are in the readers' pixels.

The probe reads every packet of the file (its cost grows with the video's length), so the
child keeps the probes of the last :data:`KEEP` videos it pictured: the pictured frames of
one video cost one probe between them, then a decode each from the keyframe at or before
it. A kept probe is used only while the file's size and modification time are unchanged.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from batchinfer.data.video.decode import DecodeFailure, decode_frame
from batchinfer.data.video.probe import VideoInfo, probe
from batchinfer.errors import InputError

#: Probed videos the picture child keeps.
KEEP = 4

_probes: OrderedDict[tuple[str, int, int, int | None, bool], VideoInfo] = OrderedDict()


@dataclass(frozen=True)
class FrameSource:
    """Where a video frame's picture is read from: the video file and the frame's index;
    ``size``: the file's bytes when the run read it (None: not known); ``autorotate``:
    whether the run turned its frames by the display rotation."""

    path: str
    frame: int
    size: int | None = None
    autorotate: bool = True


def open_frame(source: FrameSource, st: os.stat_result, max_pixels: int | None) -> tuple[Any, Any]:
    """(the frame as an RGB PIL image, None) or (None, why not), ``st`` the file's stat."""
    from PIL import Image

    if source.size is not None and st.st_size != source.size:  # readers refuse it too
        return None, f"the video changed since the run ({source.size:,} bytes, now {st.st_size:,})"
    try:
        info = _probe(source.path, st, max_pixels, source.autorotate)
    except InputError as exc:
        return None, exc.message.rstrip(".")
    got = decode_frame(info, source.frame)
    if isinstance(got, DecodeFailure):
        return None, f"frame {got.frame} does not decode: {got.reason}"
    return Image.fromarray(got.rgb), None


def _probe(path: str, st: os.stat_result, max_pixels: int | None, autorotate: bool) -> VideoInfo:
    key = (path, st.st_size, st.st_mtime_ns, max_pixels, autorotate)
    info = _probes.get(key)
    if info is None:
        info = _probes[key] = probe(path, max_pixels, None, autorotate)
        while len(_probes) > KEEP:
            _probes.popitem(last=False)
    _probes.move_to_end(key)
    return info


__all__ = ["KEEP", "FrameSource", "open_frame"]
