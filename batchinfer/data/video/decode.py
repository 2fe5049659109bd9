"""Decoding one :class:`~batchinfer.data.video.plan.FrameRange` with PyAV.

:func:`decode_range` seeks to the range's keyframe, decodes, and yields a
:class:`DecodedFrame` (frame index, presentation time, RGB pixels) for each wanted frame up
to the range's end. A frame's index comes from its timestamp, looked up in the probe's
table; a frame without one is the one after the previous frame. Frames are turned as the
probe's :attr:`~.probe.VideoInfo.rotation` says (the stream's display matrix, unless
probed without ``autorotate``), by FFmpeg's own filters before the conversion to RGB
(:class:`_Turn`), so the pixels are the ``ffmpeg`` program's.

A damaged file never raises: decoding stops at the first error (FFmpeg's, or a wanted
frame the decoder never put out, or the probe's ``damaged_at``), and one
:class:`DecodeFailure` names the file and the first frame that failed and lists every
wanted frame of the range that was not delivered, so the caller can give each frame its
one row (the first an error row naming the damage; how the rest are recorded is the
caller's choice).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchinfer.data.video.plan import FrameRange, keyframe_before
from batchinfer.data.video.probe import VideoInfo


@dataclass(frozen=True, eq=False)
class DecodedFrame:
    """One decoded frame: its 0-based index in the video, time in seconds, RGB pixels."""

    index: int
    time_s: float
    #: (height, width, 3) uint8 in the displayed orientation (VideoInfo.width, .height).
    rgb: np.ndarray = field(repr=False)


@dataclass(frozen=True, eq=False)
class DecodeFailure:
    """The frames of a range that could not be decoded, from ``frame`` (the first) on."""

    path: str
    frame: int
    reason: str
    #: Every wanted frame of the range not delivered, ``frame`` first.
    missing: np.ndarray = field(repr=False)

    @property
    def message(self) -> str:
        """One line for the error row."""
        more = (
            f" ({len(self.missing)} frames from there not decoded)" if len(self.missing) > 1 else ""
        )
        return f"Cannot decode {self.path} from frame {self.frame}: {self.reason}{more}."


def frame_index(info: VideoInfo, pts: int | None, previous: int) -> int:
    """The index of the frame with timestamp ``pts``; without a known one, ``previous + 1``."""
    if pts is not None:
        at = int(np.searchsorted(info.pts, pts))
        if at < info.frames and info.pts[at] == pts:
            return at
    return previous + 1


def decode_range(
    info: VideoInfo, rng: FrameRange, threads: int = 1
) -> Generator[DecodedFrame | DecodeFailure, None, None]:
    """Yield the wanted frames of ``rng`` in order, then at most one DecodeFailure.

    ``threads``: FFmpeg's decoding threads (1: a reader is one of several processes, each
    on its own CPU, and frame threading adds latency and memory per reader).
    """
    import av

    wanted = rng.wanted
    delivered = 0  # wanted[:delivered] have been yielded
    reason = ""
    turn: _Turn | None = None
    try:
        with _opened(info, rng, threads) as (container, stream, index):
            for frame in container.decode(stream):
                index = frame_index(info, frame.pts, index)
                if index < rng.seek:
                    continue  # the seek landed before our keyframe: the previous range's
                if index >= rng.until:
                    break
                if delivered < len(wanted) and wanted[delivered] < index:
                    reason = "the decoder put out no picture for it"
                    break
                coded = info.coded_size
                if (frame.width, frame.height) != coded:
                    # A new size mid-stream would slip past max_pixels and the slots sized
                    # from the probe.
                    reason = (
                        f"its frame size changes from {coded[0]}x{coded[1]} "
                        f"to {frame.width}x{frame.height}"
                    )
                    break
                if delivered < len(wanted) and wanted[delivered] == index:
                    time_s = float(info.time_s(index)) if index < info.frames else float("nan")
                    if info.rotation:
                        turn = turn or _Turn(info.rotation, frame, stream.time_base)
                        frame = turn(frame)
                    yield DecodedFrame(index, time_s, frame.to_ndarray(format="rgb24"))
                    delivered += 1
                    if delivered == len(wanted):
                        break
    except av.FFmpegError as exc:
        reason = _ffmpeg_reason(exc)
    except OSError as exc:
        reason = exc.strerror or str(exc)
    if rng.stop == info.frames and info.damaged_at is not None:
        reason = (reason + "; " if reason else "") + _short_file(info)
    if delivered < len(wanted):
        yield DecodeFailure(
            info.path, int(wanted[delivered]), reason or "no picture", wanted[delivered:]
        )
    elif rng.stop == info.frames and info.damaged_at is not None:
        # Every listed frame decoded, but the file should have held more: the error row is
        # the first frame that is not there.
        yield DecodeFailure(info.path, info.damaged_at, reason, np.array([info.damaged_at]))


def decode_frame(info: VideoInfo, frame: int) -> DecodedFrame | DecodeFailure:
    """Frame ``frame`` alone (the eval report's picture of it): :func:`decode_range` over
    that one frame, from the keyframe at or before it, or the DecodeFailure saying why not."""
    if not 0 <= frame < info.frames:
        there = f"the video holds {info.frames} frames"
        reason = _short_file(info) if info.damaged_at is not None else there
        return DecodeFailure(info.path, frame, reason, np.array([frame]))
    seek = keyframe_before(info, frame)
    one = np.array([frame], dtype=np.int64)
    decoded = decode_range(info, FrameRange(seek, frame + 1, one, seek, frame + 1))
    try:
        return next(decoded)  # the frame, or the failure (decode_range yields one or other)
    finally:
        decoded.close()  # the container is closed now, not when the generator is collected


def _short_file(info: VideoInfo) -> str:
    if info.declared_frames > info.frames:
        listed = info.declared_frames
        return f"the file ends early, after {info.frames} of the {listed} frames it lists"
    return f"the file ends early, after {info.frames} frames"


@contextmanager
def _opened(info: VideoInfo, rng: FrameRange, threads: int) -> Iterator[tuple[Any, Any, int]]:
    """The open container at the range's keyframe, its video stream, and the index of the
    frame before the next one out (-1 when the file could not seek: it is read from the
    start, slowly but right)."""
    import av

    container = av.open(info.path)
    try:
        index = rng.seek - 1
        if rng.seek > 0:
            stream = container.streams.video[0]
            try:
                container.seek(int(info.pts[rng.seek]), stream=stream, backward=True)
            except av.FFmpegError:
                # A stream without an index: a failed seek leaves the demuxer at its end.
                container.close()
                container = av.open(info.path)
                index = -1
        stream = container.streams.video[0]
        stream.codec_context.thread_count = threads
        if rng.keyframes_only:
            stream.codec_context.skip_frame = "NONKEY"
        yield container, stream, index
    finally:
        container.close()


#: The filters that turn a frame counter-clockwise by each angle, as the ffmpeg program's.
_TURNS: dict[int, tuple[tuple[str, str], ...]] = {
    90: (("transpose", "cclock"),),
    180: (("hflip", ""), ("vflip", "")),
    270: (("transpose", "clock"),),
}


class _Turn:
    """Decoded frames turned ``rotation`` degrees counter-clockwise by an FFmpeg filter
    graph: the filters the ``ffmpeg`` program's autorotate inserts (transpose, or hflip and
    vflip), run on the decoder's planes (YUV 4:2:0: half the bytes of RGB) before the RGB
    conversion. Turning the RGB array instead (np.rot90, then the copy the preprocessing
    makes) costs several times more per frame, and its chroma would differ from what the
    ffmpeg program shows (tools/bench_video_decode.py --rotation 90 measures both paths'
    decode)."""

    def __init__(self, rotation: int, first: Any, time_base: Any) -> None:
        import av

        self.graph = av.filter.Graph()
        node = self.graph.add_buffer(template=first, time_base=time_base)
        for name, args in _TURNS[rotation]:
            turned = self.graph.add(name, args)
            node.link_to(turned)
            node = turned
        node.link_to(self.graph.add("buffersink"))
        self.graph.configure()

    def __call__(self, frame: Any) -> Any:
        self.graph.vpush(frame)
        return self.graph.vpull()


def _ffmpeg_reason(exc: BaseException) -> str:
    strerror = getattr(exc, "strerror", None)
    return str(strerror).rstrip(".").lower() if strerror else str(exc).splitlines()[0]
