"""``export draw`` of a run over videos: each video rendered back into a video file.

    batchinfer export draw runs/clip --out drawn     # drawn/digits.mp4, ...

:func:`draw_videos` is what :func:`batchinfer.export_draw.export_draw` calls when the run's
dataset is videos (its manifest's ``dataset.form`` is ``video``). Each video with at least
one item to draw is decoded again, whole, from where the run read it (the same decoder
code and frame numbering as the run's readers: :func:`~batchinfer.data.video.decode.
decode_range`), and every frame is encoded into ``<video id made safe>.mp4`` in the
folder, at the source's frame rate (its average rate as the container states it, 30 when
it states none), so the result plays as long as the source. Frames are turned as the run's
readers turned them (the stream's display rotation, the run's ``preprocess.autorotate``;
a run from before that setting read them as stored): the boxes fall where the model saw
them, and the written video, which has no display matrix, plays at the displayed size.
Of the frames:

- a frame with a row to draw is given to the caller's ``draw`` (the same drawing as an
  image's: :mod:`batchinfer.draw`, boxes with class and score);
- a frame the run did not infer (``--every``, ``--fps``, ``--keyframes``, a time window,
  ``--limit``, ``--ids``) or whose row is an error is written **undrawn**, as decoded:
  the video keeps every frame, so its time is the source's and a box is on screen only in
  the frames the model saw.

The encoder is H.264 (libx264, CRF 18, yuv420p) when PyAV's bundled FFmpeg has it, as the
PyPI wheels do, else MPEG-4 Part 2 (mpeg4) at a bit rate that keeps thin lines; both in
MP4, which browsers and players open. A frame side that is odd is padded by one black
pixel (yuv420p needs even sides). A file that ends early, or stops decoding, gives a
video up to its last good frame, and the video is counted as cut short.

Files go through the export's record as images do (written as ``.<name>.part``, hashed,
recorded, then renamed into place), so ``--overwrite`` deletes them and nothing else.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import IO, Any

import numpy as np

from batchinfer.errors import DatasetError, UsageError

#: Makes one frame's picture (a PIL image): (the row to draw, or None for a frame written
#: undrawn; its RGB pixels) -> the picture to write. Every frame goes through it, so that
#: an enlargement applies to all of them.
DrawFrame = Callable[[Mapping[str, Any] | None, np.ndarray], Any]
SUFFIX = ".mp4"
_CRF = "18"
_DEFAULT_FPS = Fraction(30)


@dataclass(frozen=True)
class VideoWritten:
    """One video file :func:`draw_videos` wrote."""

    name: str  # file name in the folder
    video_id: str
    frames: int  # frames written
    drawn: int  # of which drawn (the rest as decoded)
    fps: Fraction
    codec: str
    cut_short: str | None = None  # why the video ends before the source's last frame


def is_video_run(manifest: Mapping[str, Any]) -> bool:
    """Whether the run's dataset was videos (frames as items)."""
    return (manifest.get("dataset") or {}).get("form") == "video"


def video_codec() -> str:
    """The encoder used: libx264 when PyAV has it, else mpeg4."""
    from batchinfer.data.video.clip import h264_codec

    return h264_codec()


def open_run_videos(manifest: Mapping[str, Any]) -> Any:
    """The run's videos reopened as it read them (every frame; its ``max_pixels``, frame
    cap and display rotation): a VideoDataset."""
    from batchinfer.data.sources import open_source
    from batchinfer.data.video.dataset import VideoDataset, VideoSettings

    recorded = manifest.get("dataset") or {}
    config = manifest.get("config") or {}
    preprocess = config.get("preprocess") or {}
    spec = recorded.get("source") or _single_video(recorded, config) or recorded.get("root")
    if not spec:
        raise UsageError("The run's manifest records no dataset; its videos cannot be found.")
    pixels = preprocess.get("max_pixels")
    frames = preprocess.get("max_frames")
    settings = VideoSettings(
        max_pixels=pixels if isinstance(pixels, int) else None,
        max_frames=frames if isinstance(frames, int) else None,
        # A run made before the setting existed read frames as stored: its boxes are there.
        autorotate=bool(preprocess.get("autorotate", False)),
    )
    root = recorded.get("root") if config.get("image_root") else None
    try:
        dataset = open_source(spec, image_root=root, video=settings)
    except DatasetError as exc:
        raise DatasetError(f"The run's videos cannot be opened now: {exc}") from None
    if not isinstance(dataset, VideoDataset):
        raise DatasetError(f"The run's dataset {spec} holds no videos now.")
    return dataset


def _single_video(recorded: Mapping[str, Any], config: Mapping[str, Any]) -> str | None:
    """The video file the run was given, when it was one file (its manifest records the
    file's folder as the root, and the command line's name of it)."""
    root, named = recorded.get("root"), config.get("dataset")
    if not root or not named:
        return None
    path = os.path.join(str(root), os.path.basename(str(named)))
    return path if os.path.isfile(path) else None


def draw_videos(
    folder: Path,
    rows: Sequence[Mapping[str, Any]],
    manifest: Mapping[str, Any],
    draw: DrawFrame,
    record: IO[str],
    name_for: Callable[[str, int], str],
) -> tuple[list[VideoWritten], list[tuple[str, str]]]:
    """Render every video holding one of ``rows`` (the rows to draw, in dataset order) into
    ``folder`` (module docstring). ``name_for(video id, index)``: the file name to use;
    ``record``: the export's record file. Returns (videos written, (id, why) of videos that
    could not be read now)."""
    from batchinfer.data.video.ids import split_frame_id

    by_video: dict[str, dict[int, Mapping[str, Any]]] = {}
    for row in rows:
        found = split_frame_id(str(row["id"]))
        if found is not None:
            by_video.setdefault(found[0], {})[found[1]] = row
    dataset = open_run_videos(manifest) if by_video else None
    written: list[VideoWritten] = []
    unreadable: list[tuple[str, str]] = []
    for number, video in enumerate(dataset.videos if dataset is not None else ()):
        wanted = by_video.pop(video.item.id, None)
        if wanted is None:
            continue
        if video.info is None:
            unreadable.append((video.item.id, video.fault or "unreadable"))
            continue
        name = name_for(video.item.id, number)
        written.append(_render(folder, name, video.item.id, video.info, wanted, draw, record))
    unreadable += [(v, "not in the dataset now") for v in by_video]
    return written, unreadable


def _render(
    folder: Path,
    name: str,
    video_id: str,
    info: Any,
    rows: Mapping[int, Mapping[str, Any]],
    draw: DrawFrame,
    record: IO[str],
) -> VideoWritten:
    """One video decoded, drawn where ``rows`` say, encoded to ``folder / name``."""
    import av

    from batchinfer.data.video.decode import DecodeFailure, decode_range
    from batchinfer.data.video.plan import FrameRange

    fps = _rate(info.fps)
    codec = video_codec()
    part = folder / f".{name}.part"
    whole = FrameRange(0, info.frames, np.arange(info.frames), 0, info.frames)
    frames = drawn = 0
    cut_short: str | None = None
    try:
        with av.open(str(part), "w", format="mp4") as out:
            stream = None
            for got in decode_range(info, whole):
                if isinstance(got, DecodeFailure):
                    cut_short = got.message
                    break
                row = rows.get(got.index)
                row = row if row is not None and row.get("error") is None else None
                picture = _even(np.asarray(draw(row, got.rgb).convert("RGB")))
                drawn += row is not None
                if stream is None:
                    stream = _stream(out, codec, fps, picture.shape[1], picture.shape[0])
                frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
                out.mux(stream.encode(frame))
                frames += 1
            if stream is not None:
                out.mux(stream.encode(None))
        data_hash = _sha256(part)
        # recorded before the file has its name: a crash leaves at most a name with no
        # file, never a file of ours that a later --overwrite would not know to delete
        record.write(f"{data_hash} {name}\n")
        record.flush()
        os.replace(part, folder / name)
    finally:
        part.unlink(missing_ok=True)
    return VideoWritten(name, video_id, frames, drawn, fps, codec, cut_short)


def _rate(fps: float) -> Fraction:
    """The source's frame rate as a fraction (29.97 -> 30000/1001), 30 when unknown."""
    if not fps or not np.isfinite(fps) or fps <= 0:
        return _DEFAULT_FPS
    return Fraction(fps).limit_denominator(1001)


def _even(picture: np.ndarray) -> np.ndarray:
    """``picture`` padded by one black row or column where a side is odd (yuv420p)."""
    h, w = picture.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return picture
    return np.pad(picture, ((0, h % 2), (0, w % 2), (0, 0)))


def _stream(out: Any, codec: str, fps: Fraction, width: int, height: int) -> Any:
    """The output's video stream: H.264 at CRF 18, or mpeg4 at a bit rate for sharp lines."""
    options = {"crf": _CRF, "preset": "medium"} if codec == "libx264" else {}
    stream = out.add_stream(codec, rate=fps, options=options)
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    if codec != "libx264":  # mpeg4's default 200 kb/s smears thin boxes and labels
        stream.bit_rate = int(width * height * float(fps))
    return stream


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


__all__ = ["SUFFIX", "DrawFrame", "VideoWritten", "draw_videos", "is_video_run", "video_codec"]
