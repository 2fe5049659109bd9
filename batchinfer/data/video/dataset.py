"""Videos as a dataset: every wanted frame of every video is one item (issue 42).

:func:`open_videos` takes the videos a DATASET names (one file, or the items of a folder,
list or glob whose kind is ``video``: batchinfer.data.sources) and probes each once
(demux only, :func:`~batchinfer.data.video.probe.probe`): its frames, times and keyframes,
refused for no video stream, a codec FFmpeg here cannot decode, frames over
``max_pixels`` or more than ``max_frames``. Then :class:`VideoDataset` is an ordinary
Dataset to the engine, resume and the fingerprint:

- Items. A video's items are its wanted frames (:class:`~.plan.Sampling`), ids
  ``<video id>#<frame>``, labels those of the video. A video the probe refused is one
  item, ``<video id>#0``, whose row is the refusal. A file that ends early has one more
  item, at its first missing frame, whose row is the damage (decode.py).
- Indexes are the dataset's stable order (videos in order, frames in order), so a resumed
  run keeps them; items *come* in another order (below), so indexes are not increasing.
- Ranges. Each video is cut into keyframe ranges (:func:`~.plan.plan_ranges`, ``parts``
  of them, default twice the CPUs this process may use), and the items of
  :data:`WINDOW` ranges at a time are handed out in turn, one frame of each: a long video
  keeps every reader decoding. Each item's :class:`VideoFrame` names its range; the
  scheduler sends the items of one range to one reader (:attr:`VideoFrame.group`), which
  decodes the range once, in order (batchinfer.data.video.frames). Ranges only decide
  who decodes what: ids and indexes do not depend on them.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from batchinfer.data.dataset import Dataset, Item, Skipped
from batchinfer.data.video.ids import fingerprint, frame_id
from batchinfer.data.video.plan import Sampling, plan_ranges, wanted_frames
from batchinfer.data.video.probe import VideoInfo, probe
from batchinfer.errors import InputError

#: The item path of a list's row that names no file (batchinfer.data.preprocess.BAD_ROW).
_BAD_ROW = "\0"


@dataclass(frozen=True)
class VideoSettings:
    """How videos become items (from the preprocess group: batchinfer.options_video)."""

    sampling: Sampling = field(default_factory=Sampling)
    max_frames: int | None = None
    max_pixels: int | None = None
    decoder: str = "pyav"
    ffmpeg_args: tuple[str, ...] = ()
    #: Turn frames as the stream's display matrix says (batchinfer.data.video.probe).
    autorotate: bool = True

    def to_json(self) -> dict[str, Any]:
        """What the manifest records and a resume checks (sink/fingerprint.py "video")."""
        s = self.sampling
        return {
            "every": s.every,
            "fps": s.fps,
            "keyframes": s.keyframes,
            "start_s": s.start_s,
            "end_s": s.end_s,
            "max_frames": self.max_frames,
            "decoder": self.decoder,
            "ffmpeg_args": list(self.ffmpeg_args),
            "autorotate": self.autorotate,
        }


@dataclass(frozen=True)
class VideoFrame:
    """Where an item is in its video (Item.member of a video frame): what a reader needs."""

    frame: int  # 0-based, in decode order
    time_s: float | None  # presentation time from the first frame; None: not known
    video: int  # the video's number in the dataset
    start: int  # the range holding the frame: frames start (a keyframe) .. stop
    stop: int
    settings: VideoSettings
    #: the probe's frame count and file size, which the reader's probe must find again
    frames: int = 0
    size: int = 0
    #: Why the video cannot be read (the probe's refusal): this item's row.
    fault: str | None = None

    @property
    def group(self) -> tuple[int, int]:
        """Items of one group go to one reader (engine/scheduler.py): one range."""
        return (self.video, self.start)


@dataclass(frozen=True, eq=False)
class _Video:
    item: Item  # the video file, as its folder, list or glob gives it
    info: VideoInfo | None
    fault: str | None
    wanted: np.ndarray  # frame indices that are items (the damage item not included)
    first: int  # index of its first item

    @property
    def count(self) -> int:
        if self.info is None:
            return 1
        return len(self.wanted) + (self.info.damaged_at is not None)


def default_parts() -> int:
    """Ranges per video: twice the CPUs here (readers are at most one per CPU by default)."""
    return 2 * max(1, len(os.sched_getaffinity(0)))


#: Ranges whose frames are handed out in turn (module docstring): a few per reader.
WINDOW = 2 * max(1, len(os.sched_getaffinity(0)))


class VideoDataset(Dataset):
    """The frames of videos as items (module docstring)."""

    form = "video"
    #: Items come in range order, not index order (DatasetSource's limit must not stop).
    in_order = False

    def __init__(self, videos: Dataset | None, single: str | None, settings: VideoSettings) -> None:
        self.inner = videos
        self.single = single
        self.settings = settings
        self.parts = default_parts()
        root = os.path.dirname(single) if single is not None else str(videos.root)  # type: ignore[union-attr]
        listing = hashlib.sha256(
            (
                videos.listing_sha256 if videos is not None else os.path.basename(single or "")
            ).encode()
        )
        self.videos: list[_Video] = []
        first = 0
        for item in self._video_items():
            video = _probe(item, settings, first)
            first += video.count
            listing.update(f"\0{item.id}\0{video.count}".encode())
            self.videos.append(video)
        super().__init__(
            root=Path(root),
            kind="images",  # frames are fed as images are
            class_map=videos.class_map if videos is not None else _no_classes(),
            count=first,
            skipped=videos.skipped if videos is not None else Skipped(),
            listing_sha256=listing.hexdigest(),
            leftovers=videos.leftovers if videos is not None else None,
        )
        self.meta_type = videos.meta_type if videos is not None else None

    def _video_items(self) -> Iterator[Item]:
        if self.inner is not None:
            yield from self.inner
        else:
            assert self.single is not None
            name = os.path.basename(self.single)
            yield Item(index=0, path=self.single, id=name, label=None, label_name=None)

    @property
    def location(self) -> str:
        return self.single if self.single is not None else self.inner.location  # type: ignore[union-attr]

    def notes(self) -> tuple[list[str], list[str]]:
        lines, warnings = self.inner.notes() if self.inner is not None else ([], [])
        refused = [v for v in self.videos if v.fault is not None]
        lines.insert(
            0,
            f"videos: {len(self.videos)} file(s), {len(self)} items (frames)"
            + (f", {len(refused)} refused (one error row each)" if refused else ""),
        )
        return lines, warnings

    def manifest_json(self) -> dict[str, object]:
        record = self.inner.manifest_json() if self.inner is not None else {}
        record.update(
            super().manifest_json() if self.inner is None else {},
            form="video",
            items=len(self),
            listing_sha256=self.listing_sha256,
            video=self.settings.to_json(),
            videos=len(self.videos),
            videos_refused=sum(v.fault is not None for v in self.videos),
        )
        return record

    def fingerprint_record(self) -> dict[str, Any]:
        """The sampling and decoder settings, for the run's fingerprint (sink/fingerprint.py)."""
        return self.settings.to_json()

    def paths_of(self, ids: Collection[str]) -> dict[str, str]:
        """Each frame id's video file (any number of frames of one video)."""
        videos = {v.item.id: v.item.path for v in self.videos}
        found = {}
        for ident in ids:
            video, _, _ = ident.rpartition("#")
            if video in videos:
                found[ident] = videos[video]
        return found

    def item_paths(self) -> Iterator[str]:
        for video in self.videos:
            yield video.item.path

    def files_sha256(self, check: str = "stat", limit: int | None = None) -> str:
        """sha256 over each video's id, size, duration and frame count (as probed), and its
        modification time (``stat``) or bytes (``content``); ``limit``: ignored (a video's
        frames are one file)."""
        digest = hashlib.sha256()
        for video in self.videos:
            digest.update(video.item.key + b"\0")
            if video.info is None:
                digest.update(f"refused\0{video.fault}\0".encode())
                continue
            digest.update(repr(sorted(fingerprint(video.info).items())).encode())
            try:
                if check == "content":
                    with open(video.item.path, "rb") as f:
                        content = hashlib.sha256()
                        while chunk := f.read(1 << 20):
                            content.update(chunk)
                        digest.update(content.digest())
                else:
                    digest.update(str(os.stat(video.item.path).st_mtime_ns).encode())
            except OSError:
                digest.update(b"\0missing\0")
        return digest.hexdigest()

    def item_files(self) -> Iterator[tuple[bytes, str | None]]:
        for video in self.videos:
            yield video.item.key, video.item.path

    def iter_from(self, skip: Callable[[bytes], bool] | None = None) -> Iterator[Item]:
        """Every item once, ranges handed out in turn (module docstring)."""
        active: deque[Iterator[Item]] = deque()
        ranges = self._ranges()
        while True:
            while len(active) < WINDOW:
                nxt = next(ranges, None)
                if nxt is None:
                    break
                active.append(nxt)
            if not active:
                return
            items = active.popleft()
            for item in items:
                if skip is None or not skip(item.key):
                    yield item
                    active.append(items)
                    break

    def _ranges(self) -> Iterator[Iterator[Item]]:
        """One iterator of items per range, in dataset order."""
        for number, video in enumerate(self.videos):
            if video.info is None:
                yield iter([self._item(video, number, 0, None, 0, 1, 0, fault=video.fault)])
                continue
            info = video.info
            for rng in plan_ranges(info, self.parts, self.settings.sampling):
                yield self._range_items(video, number, rng.start, rng.stop, rng.wanted)

    def _range_items(
        self, video: _Video, number: int, start: int, stop: int, frames: np.ndarray
    ) -> Iterator[Item]:
        info = video.info
        assert info is not None
        at = int(np.searchsorted(video.wanted, start))
        times = info.times_s()
        for k, frame in enumerate(frames.tolist()):
            yield self._item(video, number, frame, float(times[frame]), start, stop, at + k)
        if stop == info.frames and info.damaged_at is not None:
            yield self._item(video, number, info.damaged_at, None, start, stop, len(video.wanted))

    def _item(
        self,
        video: _Video,
        number: int,
        frame: int,
        time_s: float | None,
        start: int,
        stop: int,
        position: int,
        fault: str | None = None,
    ) -> Item:
        base = video.item
        info = video.info
        member = VideoFrame(
            frame=frame,
            time_s=time_s,
            video=number,
            start=start,
            stop=stop,
            settings=self.settings,
            frames=info.frames if info is not None else 0,
            size=info.size if info is not None else 0,
            fault=fault,
        )
        return Item(
            index=video.first + position,
            path=base.path,
            id=frame_id(base.id, frame),
            label=base.label,
            label_name=base.label_name,
            id_bytes=None if base.id_bytes is None else base.id_bytes + f"#{frame}".encode(),
            member=member,
            columns=base.columns,
        )


def _no_classes() -> Any:
    from batchinfer.data.classes import FROM_FOLDER_NAMES, ClassMap

    return ClassMap({}, FROM_FOLDER_NAMES)


def _probe(item: Item, settings: VideoSettings, first: int) -> _Video:
    """One video as listed: probed, or refused with the reason its one row gives."""
    empty = np.zeros(0, dtype=np.int64)
    if item.path.startswith(_BAD_ROW):  # a list's row that names no file
        return _Video(item, None, item.path[len(_BAD_ROW) :], empty, first)
    try:
        info = probe(item.path, settings.max_pixels, settings.max_frames, settings.autorotate)
    except InputError as exc:
        return _Video(item, None, exc.message, empty, first)
    return _Video(item, info, None, wanted_frames(info, settings.sampling), first)


def open_videos(
    videos: Dataset | None, settings: VideoSettings | None = None, single: str | None = None
) -> VideoDataset:
    """The frames of the videos ``videos`` lists (a Dataset of kind ``video``), or of the one
    file ``single``; every video is probed here (module docstring)."""
    return VideoDataset(videos, single, settings or VideoSettings())


def frame_columns(item: Item) -> tuple[int | None, float | None]:
    """(frame, time_s) of a video frame's item; (None, None) for any other item."""
    member = item.member
    if isinstance(member, VideoFrame):
        return member.frame, member.time_s
    return None, None


__all__ = [
    "VideoDataset",
    "VideoFrame",
    "VideoSettings",
    "frame_columns",
    "open_videos",
]
