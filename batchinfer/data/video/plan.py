"""Which frames of a video to decode, in ranges that readers decode in parallel.

A range starts at a keyframe (where a decoder can start) and runs to the next range's
start; the ranges of one video cover every frame exactly once, so a long file is split over
every reader and each frame has one owner (the exactly-once unit of a resumed run).

Sampling is applied here, before anything is decoded, so frames nobody wants cost as little
as they can: a range whose frames are all unwanted is dropped, and within a range decoding
starts at the last keyframe before its first wanted frame and stops after its last one.
``keyframes`` asks the decoder to skip every other frame (``skip_frame = NONKEY``), so the
frames in between are not decoded at all.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from batchinfer.data.video.probe import VideoInfo
from batchinfer.errors import ConfigError


@dataclass(frozen=True)
class Sampling:
    """Which frames of each video become items.

    ``every``: frames 0, N, 2N, ... (by index). ``fps``: the frame nearest each point of a
    grid of F per second from ``start_s`` (by timestamp). ``keyframes``: keyframes only. At
    most one of the three; ``start_s``/``end_s`` (seconds from the first frame, the end
    excluded) combine with any of them.
    """

    every: int | None = None
    fps: float | None = None
    keyframes: bool = False
    start_s: float | None = None
    end_s: float | None = None

    def __post_init__(self) -> None:
        chosen = [
            n
            for n, on in (("every", self.every), ("fps", self.fps), ("keyframes", self.keyframes))
            if on
        ]
        if len(chosen) > 1:
            raise ConfigError(
                f"Video sampling takes one of every, fps and keyframes, not {' and '.join(chosen)}."
            )
        if self.every is not None and self.every < 1:
            raise ConfigError(f"Video sampling: every must be at least 1, not {self.every}.")
        if self.fps is not None and not (math.isfinite(self.fps) and self.fps > 0):
            raise ConfigError(f"Video sampling: fps must be a positive number, not {self.fps}.")
        for name in ("start_s", "end_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"Video sampling: {name} must be 0 or more seconds, not {value}.")
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise ConfigError(
                f"Video sampling: end_s ({self.end_s}) must come after start_s ({self.start_s})."
            )


@dataclass(frozen=True, eq=False)
class FrameRange:
    """One reader's share of one video: frames ``start`` (a keyframe) to ``stop`` (excluded).

    ``wanted``: the frames in it to deliver (sorted frame indices); decoding begins at the
    keyframe ``seek`` (the last one at or before the first wanted frame) and ends after
    frame ``until - 1`` (the last wanted one).
    """

    start: int
    stop: int
    wanted: np.ndarray = field(repr=False)
    seek: int
    until: int
    keyframes_only: bool = False

    def __len__(self) -> int:
        return len(self.wanted)


def wanted_frames(info: VideoInfo, sampling: Sampling) -> np.ndarray:
    """The frame indices ``sampling`` keeps, sorted (int64)."""
    times = info.times_s()
    n = info.frames
    window = np.ones(n, dtype=bool)
    if sampling.start_s is not None:
        window &= times >= sampling.start_s
    if sampling.end_s is not None:
        window &= times < sampling.end_s
    if sampling.every is not None:
        chosen = np.arange(0, n, sampling.every, dtype=np.int64)
    elif sampling.fps is not None:
        chosen = _nearest_to_grid(times, sampling.fps, sampling.start_s or 0.0, sampling.end_s)
    elif sampling.keyframes:
        chosen = info.keyframes
    else:
        chosen = np.arange(n, dtype=np.int64)
    return chosen[window[chosen]].astype(np.int64)


def _nearest_to_grid(times: np.ndarray, fps: float, start: float, end: float | None) -> np.ndarray:
    """For each grid time start, start + 1/fps, ... the frame nearest it (the earlier one
    on a tie), each frame once."""
    last = times[-1] if end is None else min(end, times[-1] + 1e-9)
    count = math.floor((last - start) * fps + 1e-9) + 1
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    grid = start + np.arange(count, dtype=np.float64) / fps
    right = np.clip(np.searchsorted(times, grid), 0, len(times) - 1)
    left = np.clip(right - 1, 0, len(times) - 1)
    nearer_left = np.abs(times[left] - grid) <= np.abs(times[right] - grid)
    return np.unique(np.where(nearer_left, left, right)).astype(np.int64)


def plan_ranges(info: VideoInfo, parts: int, sampling: Sampling | None = None) -> list[FrameRange]:
    """Split ``info``'s frames into at most ``parts`` keyframe ranges of about equal decode
    work, each holding the frames ``sampling`` keeps; ranges with none are left out (but
    never the last range of a damaged file: its decode reports the damage)."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1, not {parts}")
    sampling = sampling or Sampling()
    wanted = wanted_frames(info, sampling)
    bounds = _boundaries(info, parts, sampling.keyframes)
    ranges = []
    for start, stop in itertools.pairwise(bounds):
        lo, hi = np.searchsorted(wanted, [start, stop])
        mine = wanted[lo:hi]
        if not len(mine):
            if stop == info.frames and info.damaged_at is not None:
                ranges.append(FrameRange(start, stop, mine, start, start, sampling.keyframes))
            continue
        seek = keyframe_before(info, int(mine[0]))
        ranges.append(FrameRange(start, stop, mine, seek, int(mine[-1]) + 1, sampling.keyframes))
    return ranges


def keyframe_before(info: VideoInfo, frame: int) -> int:
    """The last keyframe at or before ``frame``: where decoding it starts."""
    keys = info.keyframes
    return int(keys[np.searchsorted(keys, frame, side="right") - 1])


def _boundaries(info: VideoInfo, parts: int, keyframes_only: bool) -> list[int]:
    """Range starts (keyframes, 0 first) and the frame count last.

    The work of a range is its frame count, or its keyframe count when only keyframes are
    decoded; each cut is the keyframe nearest an equal share of it.
    """
    keys = info.keyframes
    n = info.frames
    if keyframes_only:
        shares = [keys[min(len(keys) - 1, round(i * len(keys) / parts))] for i in range(1, parts)]
        cuts = shares
    else:
        cuts = []
        for i in range(1, parts):
            target = i * n / parts
            at = np.searchsorted(keys, target)
            near = [keys[j] for j in (at - 1, at) if 0 <= j < len(keys)]
            cuts.append(min(near, key=lambda k: (abs(k - target), k)))
    return [*sorted({0, *(int(c) for c in cuts if 0 < c < n)}), n]
