"""A reader's side of video items: the frame an item names, decoded once per range.

The items of one range come to one reader, in order (the scheduler keeps a range's items
together: VideoFrame.group), so :class:`VideoFiles` keeps a *cursor* per range: the
running decode of that range (PyAV's :func:`~.decode.decode_range`, or an ffmpeg child with
``--decoder ffmpeg``), which it advances to each item's frame. Frames it passes that no
item asks for (already written by the run being resumed) are dropped. An item behind its
range's cursor (a retry after a reader died) starts a new decode at the keyframe before
it. A few cursors stay open (:data:`KEEP`), the least recently used closed first (an
ffmpeg child is killed and reaped then).

Each reader probes a video again the first time it reads from it (demux only; cached for
the reader's life), and refuses it when the file is not the one the coordinator listed
(another frame count or size): the item's error row says it changed.

A decode failure (decode.py's DecodeFailure) is the error row of the first frame that
failed, naming the file and that frame; a later frame of the range asked for after it is
an error row pointing at that first failure.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import numpy as np

from batchinfer.data.video.dataset import VideoFrame, VideoSettings
from batchinfer.data.video.decode import DecodedFrame, DecodeFailure, decode_range
from batchinfer.data.video.plan import FrameRange, keyframe_before, wanted_frames
from batchinfer.data.video.probe import VideoInfo, probe
from batchinfer.errors import InputError

#: Open cursors per reader: a reader is given a few ranges at a time.
KEEP = 4
#: Probed videos kept per reader.
_INFOS = 8


class _Cursor:
    """The running decode of one range, from frame ``after + 1`` on."""

    def __init__(self, info: VideoInfo, member: VideoFrame, wanted: np.ndarray) -> None:
        mine = wanted[(wanted >= member.frame) & (wanted >= member.start) & (wanted < member.stop)]
        if len(mine):
            rng = FrameRange(
                member.start,
                member.stop,
                mine,
                keyframe_before(info, int(mine[0])),
                int(mine[-1]) + 1,
                member.settings.sampling.keyframes,
            )
        else:  # only the damage item is left: the decode reports it
            rng = FrameRange(member.start, member.stop, mine, member.start, member.start)
        self.frames: Iterator[DecodedFrame | DecodeFailure] = _decoder(info, rng, member.settings)
        self.after = member.frame - 1  # frames up to here have been passed
        self.failure: DecodeFailure | None = None

    def take(self, frame: int, label: str) -> np.ndarray:
        """The RGB pixels of ``frame``; InputError when it did not decode."""
        if self.failure is None:
            for got in self.frames:
                if isinstance(got, DecodeFailure):
                    self.failure = got
                    break
                self.after = got.index
                if got.index == frame:
                    return got.rgb
                if got.index > frame:
                    break
        failure = self.failure
        if failure is not None and frame >= failure.frame:
            if frame == failure.frame:
                raise InputError(failure.message)
            raise InputError(
                f"Cannot decode {label}: the decode of its range failed at frame "
                f"{failure.frame} (that frame's row says why)."
            )
        raise InputError(f"Cannot decode {label}: the decoder put out no picture for it.")

    def failed(self, frame: int) -> bool:
        """Whether ``frame`` is at or after the failure this decode ended in."""
        return self.failure is not None and frame >= self.failure.frame

    def close(self) -> None:
        close = getattr(self.frames, "close", None)
        if close is not None:
            close()  # an ffmpeg child is killed and reaped here


def _decoder(
    info: VideoInfo, rng: FrameRange, settings: VideoSettings
) -> Iterator[DecodedFrame | DecodeFailure]:
    if settings.decoder == "ffmpeg":
        from batchinfer.data.video.ffmpeg_pipe import decode_range_ffmpeg

        return decode_range_ffmpeg(info, rng, settings.ffmpeg_args)
    return decode_range(info, rng)


class VideoFiles:
    """One reader's probed videos and open range decodes (module docstring)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._infos: OrderedDict[str, tuple[VideoInfo, np.ndarray]] = OrderedDict()
        self._cursors: OrderedDict[tuple[str, int], _Cursor] = OrderedDict()

    def frame(self, path: str, member: VideoFrame, label: str) -> np.ndarray:
        """The RGB pixels (H, W, 3) of the frame ``member`` names; InputError if none."""
        if member.fault is not None:
            raise InputError(member.fault)
        info, wanted = self._info(path, member, label)
        key = (path, member.start)
        cursor = self._cursors.pop(key, None)
        if cursor is not None and cursor.after >= member.frame and not cursor.failed(member.frame):
            cursor.close()  # behind the cursor (a retry): decode again from a keyframe
            cursor = None
        if cursor is None:
            cursor = _Cursor(info, member, wanted)
        self._cursors[key] = cursor
        while len(self._cursors) > self.keep:
            self._cursors.popitem(last=False)[1].close()
        return cursor.take(member.frame, label)

    def _info(self, path: str, member: VideoFrame, label: str) -> tuple[VideoInfo, np.ndarray]:
        known = self._infos.get(path)
        if known is None:
            s = member.settings
            info = probe(path, s.max_pixels, s.max_frames, s.autorotate)
            if (info.frames, info.size) != (member.frames, member.size):
                raise InputError(
                    f"Cannot read {label}: the video changed since the run listed it "
                    f"({member.frames} frames, {member.size} bytes; now {info.frames} "
                    f"frames, {info.size} bytes); start a new run."
                )
            known = (info, wanted_frames(info, s.sampling))
            self._infos[path] = known
            while len(self._infos) > _INFOS:
                self._infos.popitem(last=False)
        self._infos.move_to_end(path)
        return known

    def close(self) -> None:
        """Stop every decode (ffmpeg children killed and reaped)."""
        while self._cursors:
            self._cursors.popitem()[1].close()
        self._infos.clear()


#: The videos this process reads when its caller keeps none (a Ray worker's read tasks).
SHARED = VideoFiles()
