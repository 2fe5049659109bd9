"""What a video file holds, read by demuxing only (no frame is decoded).

:func:`probe` opens the file with PyAV, picks its first video stream and reads every packet
of that stream once: the packets' presentation timestamps, sorted, are the frames' times
(frame ``i`` is the ``i``-th frame the decoder puts out, 0-based), and the packets flagged
as keyframes are where a reader may start decoding. Reading packets costs I/O, not decode
time: a two-hour 1080p file is a few hundred thousand small reads.

Refused, each with one line (an :class:`~batchinfer.errors.InputError`, which becomes the
video's error row): a file PyAV cannot open, no video stream, a codec this FFmpeg cannot
decode, a frame larger than ``max_pixels``, more frames than ``max_frames``, and (when
``autorotate``) a display matrix that is not a quarter turn (below).

Rotation. A phone records portrait video as landscape pictures and a display matrix saying
how to turn them (every player, the ``ffmpeg`` program and OpenCV apply it). FFmpeg gives
the matrix only with a decoded frame, not in the stream's header, so the probe decodes the
file's first frame to read it (a second open and one frame's decode: the only decode a probe
does). With ``autorotate`` (the default), :attr:`VideoInfo.rotation` is the matrix's angle
and ``width``/``height`` are the displayed frame's, which is what the decoders
(decode.py, ffmpeg_pipe.py) put out; without it, 0 and the coded size. A matrix that
mirrors the picture, or turns it by anything other than a multiple of 90 degrees, is
refused rather than rounded: a player shows such a video mirrored or tilted, and frames
turned otherwise would give boxes in pixels nobody sees; these are rare (hand-made
metadata), and ``autorotate`` off reads them as stored.

A file that ends early is not refused: its frames up to the damage are listed and
``damaged_at`` says which frame is the first one missing, so the decode can give the frames
there are and one error for the rest. It is known from the container's own count (MP4:
the sample table lists more frames than the file holds), from a demux error, or, for a
file holding only the video stream, from the container's duration (Matroska's segment
duration) running past the last packet.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from batchinfer.data.dataset import VIDEO_EXTENSIONS as _VIDEO_EXTENSIONS
from batchinfer.errors import InputError
from batchinfer.messages import setting

#: The file extensions read as videos (defined with the other kinds' extensions).
VIDEO_EXTENSIONS = _VIDEO_EXTENSIONS


@dataclass(frozen=True)
class VideoInfo:
    """One video stream, as :func:`probe` found it."""

    path: str
    codec: str
    width: int
    height: int
    #: Frames per second as the container states it (average rate), 0 when unknown.
    fps: float
    #: Seconds from the first frame to the end of the last one.
    duration_s: float
    #: Presentation timestamps, one per frame, sorted: frame ``i`` is at ``pts[i]``.
    pts: np.ndarray
    #: The stream's time base: seconds per pts unit.
    time_base: Fraction
    #: Frame indices of the keyframes, sorted; frame 0 is always one.
    keyframes: np.ndarray
    #: The frame count the container declares (MP4), 0 when it does not say.
    declared_frames: int
    #: The first frame missing from a file that ends early, else None.
    damaged_at: int | None
    #: The file's size in bytes (for the resume fingerprint).
    size: int
    #: The container's start time in seconds (what ffmpeg's ``-ss`` counts from).
    container_start_s: float = 0.0
    #: Degrees the decoders turn each decoded frame counter-clockwise, as the stream's
    #: display matrix says (0, 90, 180 or 270; 0 when probed without ``autorotate``).
    #: ``width`` and ``height`` are the turned frame's.
    rotation: int = 0

    @property
    def coded_size(self) -> tuple[int, int]:
        """(width, height) of the frames as the decoder puts them out, before turning."""
        if self.rotation in (90, 270):
            return self.height, self.width
        return self.width, self.height

    @property
    def frames(self) -> int:
        """Frames the file holds (packets of the video stream)."""
        return len(self.pts)

    def time_s(self, frame: int | np.ndarray) -> float | np.ndarray:
        """Presentation time of ``frame`` in seconds, from the first frame (0.0)."""
        rel = self.pts[frame] - self.pts[0]
        return rel * float(self.time_base)

    def times_s(self) -> np.ndarray:
        """Every frame's presentation time in seconds (float64)."""
        return (self.pts - self.pts[0]).astype(np.float64) * float(self.time_base)


def probe(
    path: str | Path,
    max_pixels: int | None = None,
    max_frames: int | None = None,
    autorotate: bool = True,
) -> VideoInfo:
    """Read ``path``'s video stream by demuxing; raises InputError for a refused file.
    ``autorotate``: turn frames as the display matrix says (module docstring)."""
    import av

    label = os.fspath(path)
    try:
        container = av.open(label)
    except (av.FFmpegError, OSError) as exc:
        raise InputError(f"Cannot read {label}: {_reason(exc)}.") from exc
    with container:
        if not container.streams.video:
            raise InputError(f"Cannot read {label}: it holds no video stream.")
        stream = container.streams.video[0]
        ctx = stream.codec_context
        codec = ctx.name if ctx is not None else "unknown"
        if ctx is None or not _decodable(codec):
            raise InputError(
                f"Cannot read {label}: its codec {codec} is not one FFmpeg here decodes."
            )
        width, height = ctx.width, ctx.height
        if width <= 0 or height <= 0:
            raise InputError(f"Cannot read {label}: its video stream has no frame size.")
        if max_pixels is not None and width * height > max_pixels:
            raise InputError(
                f"Cannot read {label}: its frames are {width}x{height} = "
                f"{width * height:,} pixels, "
                f"more than max_pixels ({max_pixels:,})."
            )
        declared = int(stream.frames or 0)
        if max_frames is not None and declared > max_frames:
            raise _too_many(label, declared, max_frames)
        time_base = stream.time_base or Fraction(1, 1)
        fps = float(stream.average_rate or 0)
        # Packets without timestamps (a raw .h264 stream) are placed one frame apart.
        step = max(1, round(1 / (fps * time_base))) if fps > 0 else 1
        pts, keys, demux_failed = _packets(container, stream, label, max_frames, step)
        if not pts:
            raise InputError(f"Cannot read {label}: its video stream holds no frames.")
        only_stream = len(container.streams) == 1
        container_duration = (container.duration or 0) / 1_000_000
        container_start = (container.start_time or 0) / 1_000_000

    rotation = _rotation(label) if autorotate else 0
    if rotation in (90, 270):
        width, height = height, width
    order = np.array(sorted(pts), dtype=np.int64)
    keyframes = np.unique(np.searchsorted(order, np.array(keys, dtype=np.int64)))
    keyframes = np.union1d(keyframes, [0]).astype(np.int64)  # decoding starts somewhere
    step = _frame_step(order, fps, time_base)
    duration = float((order[-1] - order[0] + step) * time_base)
    frames = len(order)
    damaged_at = None
    if demux_failed or frames < declared:
        damaged_at = frames
    elif only_stream and fps > 0 and container_duration > duration + 1.5 / fps:
        damaged_at = frames  # the container says it runs longer than its packets do
    return VideoInfo(
        path=label,
        codec=codec,
        width=width,
        height=height,
        fps=fps,
        duration_s=duration,
        pts=order,
        time_base=Fraction(time_base),
        keyframes=keyframes,
        declared_frames=declared,
        damaged_at=damaged_at,
        size=os.stat(label).st_size,
        container_start_s=container_start,
        rotation=rotation,
    )


def _rotation(label: str) -> int:
    """The counter-clockwise angle of the display matrix of ``label``'s first frame (0 when
    it has none, or no frame decodes: the decode then fails as it would unturned)."""
    import av
    from av.sidedata.sidedata import Type

    try:
        with av.open(label) as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 1  # one frame: threads only add delay
            frame = next(iter(container.decode(stream)), None)
            data = None if frame is None else frame.side_data.get(Type.DISPLAYMATRIX)
            matrix = None if data is None else np.frombuffer(bytes(data), dtype="<i4")
    except (av.FFmpegError, OSError):
        return 0
    return 0 if matrix is None else quarter_turn(label, matrix)


def quarter_turn(label: str, matrix: np.ndarray) -> int:
    """The counter-clockwise turn (0, 90, 180, 270) of FFmpeg's 3x3 display matrix
    ``matrix`` (9 ints, 16.16 fixed point, row-major); InputError for a mirror or another
    angle (module docstring)."""
    a, b, c, d = (int(v) for v in (matrix[0], matrix[1], matrix[3], matrix[4]))
    # As av_display_rotation_get: the angle of the first column, counter-clockwise.
    angle = -math.degrees(math.atan2(b, a)) if (a or b) else 0.0
    turn = round(angle / 90) * 90 % 360
    if a * d - b * c < 0:
        raise InputError(
            f"Cannot read {label}: its display matrix mirrors the picture, which is not "
            "applied; read it as stored with " + setting("preprocess.autorotate") + " off."
        )
    if abs(angle - round(angle / 90) * 90) > 0.01:
        raise InputError(
            f"Cannot read {label}: its display matrix turns it {angle % 360:.4g} degrees, "
            "not a multiple of 90; read it as stored with "
            + setting("preprocess.autorotate")
            + " off."
        )
    return turn


def _packets(
    container, stream, label: str, max_frames: int | None, step: int
) -> tuple[list, list, bool]:
    """Every packet's pts, the keyframes' pts, and whether the demuxer failed part way."""
    import av

    pts: list[int] = []
    keys: list[int] = []
    try:
        for packet in container.demux(stream):
            if packet.size == 0:  # the demuxer's end-of-stream marker, not a frame
                continue
            stamp = packet.pts if packet.pts is not None else packet.dts
            if stamp is None:  # no timestamp at all (raw streams): the decode order
                stamp = pts[-1] + step if pts else 0
            pts.append(stamp)
            if packet.is_keyframe:
                keys.append(stamp)
            if max_frames is not None and len(pts) > max_frames:
                raise _too_many(label, len(pts), max_frames, at_least=True)
    except av.FFmpegError:
        return pts, keys, True
    return pts, keys, False


def _frame_step(order: np.ndarray, fps: float, time_base: Fraction) -> int:
    """One frame's length in pts units: the median gap, else from the frame rate."""
    if len(order) > 1:
        return int(np.median(np.diff(order)))
    return round(1 / (fps * time_base)) if fps > 0 else 0


def _decodable(codec: str) -> bool:
    import av

    try:
        av.Codec(codec, "r")
    except (av.FFmpegError, ValueError):
        return False
    return True


def _too_many(label: str, frames: int, cap: int, at_least: bool = False) -> InputError:
    count = f"more than {cap:,}" if at_least else f"{frames:,}"
    return InputError(
        f"Cannot read {label}: it holds {count} frames, more than max_frames ({cap:,})."
    )


def _reason(exc: BaseException) -> str:
    """FFmpeg's reason without the errno and the path PyAV appends."""
    import av

    if isinstance(exc, av.FFmpegError) and exc.strerror:
        return str(exc.strerror).rstrip(".").lower()
    return str(exc).splitlines()[0].rstrip(".") if str(exc) else type(exc).__name__
