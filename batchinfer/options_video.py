"""The video settings of the ``preprocess`` group (issue 42): which frames of each video
become items, the bound on frames per video, which decoder runs, and whether frames are
turned by the stream's display rotation.

They are fields of :class:`batchinfer.options.PreprocessOptions` (it inherits them), so
the CLI flags (``--every 7``, ``--fps 2``, ``--keyframes``, ``--start``/``--end``,
``--max-frames``, ``--decoder ffmpeg``, ``--ffmpeg-args``, ``--no-autorotate``), the
library's keywords and a job file's ``[preprocess]`` keys come from one place; they apply
to video datasets only. Kept apart from options.py only for its size. :func:`video_settings`
turns them into what the data layer takes (batchinfer.data.video.dataset.VideoSettings).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from batchinfer.bounds import DAY_S, Bounds

#: The decoders ``--decoder`` may name.
DECODERS = ("pyav", "ffmpeg")
#: Default frame cap per video: a day of 60 fps. A file declaring more is a forged or
#: broken header more often than a real recording; the cap bounds the probe's memory
#: (8 bytes of timestamp a frame: 41 MiB at the cap).
DEFAULT_MAX_FRAMES = 5_184_000


def _video_option(default: Any, help: str, **meta: Any) -> Any:
    return field(default=default, metadata={"help": help, **meta})


def _seconds(text: str) -> float:
    """Seconds, as 90, 90.5, 1:30 or 0:01:30."""
    try:
        total = 0.0
        for part in text.strip().split(":"):
            total = total * 60 + float(part)
    except ValueError:
        raise ValueError(f"{text!r} is not a time; give seconds (90.5) or m:ss (1:30.5)") from None
    return total


@dataclass(frozen=True)
class VideoOptionFields:
    """The video fields of the preprocess group (the module docstring)."""

    every: int | None = _video_option(
        None,
        "Videos: keep frames 0, N, 2N, ... of each video.",
        bounds=Bounds(1, 2**31 - 1),
    )
    fps: float | None = _video_option(
        None,
        "Videos: keep the frames nearest a grid of F per second (by timestamp).",
        bounds=Bounds(0, 1000, above=True, why="no camera records more per second"),
    )
    keyframes: bool = _video_option(
        False, "Videos: keep keyframes only (the other frames are not decoded)."
    )
    start_s: float | None = _video_option(
        None,
        "Videos: keep frames from this time on (seconds or m:ss from the first frame).",
        flag="--start",
        parse=_seconds,
        bounds=Bounds(0, 366 * DAY_S, why="a year"),
    )
    end_s: float | None = _video_option(
        None,
        "Videos: keep frames before this time (seconds or m:ss from the first frame).",
        flag="--end",
        parse=_seconds,
        bounds=Bounds(0, 366 * DAY_S, above=True, why="a year"),
    )
    max_frames: int = _video_option(
        DEFAULT_MAX_FRAMES,
        "Videos: a video holding more frames is one error row (a day at 60 fps by default).",
        bounds=Bounds(1, 2**40),
    )
    decoder: str = _video_option(
        "pyav",
        "Videos: pyav (FFmpeg in-process) or ffmpeg (an ffmpeg program over a pipe; on a "
        "Rockchip board ffmpeg-rockchip with --ffmpeg-args '-hwaccel rkmpp').",
        choices=DECODERS,
    )
    ffmpeg_args: str = _video_option(
        "",
        "Videos, --decoder ffmpeg: extra input arguments, e.g. '-hwaccel rkmpp'.",
    )
    autorotate: bool = _video_option(
        True,
        "Videos: turn frames by the stream's display rotation (portrait phone videos), as "
        "players do; off: read them as stored.",
        flag="--autorotate/--no-autorotate",
    )


def video_settings(pre: Any) -> Any:
    """The data layer's VideoSettings from a PreprocessOptions (ConfigError when the
    sampling settings contradict each other)."""
    from batchinfer.data.video.dataset import VideoSettings
    from batchinfer.data.video.plan import Sampling

    limit = pre.max_pixels if isinstance(pre.max_pixels, int) else None
    return VideoSettings(
        sampling=Sampling(
            every=pre.every,
            fps=pre.fps,
            keyframes=pre.keyframes,
            start_s=pre.start_s,
            end_s=pre.end_s,
        ),
        max_frames=pre.max_frames,
        max_pixels=limit,
        decoder=pre.decoder,
        ffmpeg_args=tuple(shlex.split(pre.ffmpeg_args)),
        autorotate=pre.autorotate,
    )
