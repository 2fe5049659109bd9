"""Item ids of video frames, and the record a resumed run checks a video against.

A frame's id is ``<video id>#<frame>``: the video id is what an image's id would be (the
path relative to the dataset folder, or the file name for a single video), the frame its
0-based index, e.g. ``clips/a.mp4#12``. A video id may itself hold ``#``: the frame is
what follows the last one.
"""

from __future__ import annotations

from batchinfer.data.video.probe import VideoInfo


def frame_id(video_id: str, frame: int) -> str:
    """The id of frame ``frame`` of the video ``video_id``."""
    if frame < 0:
        raise ValueError(f"frame indices start at 0, not {frame}")
    return f"{video_id}#{frame}"


def split_frame_id(item_id: str) -> tuple[str, int] | None:
    """``(video id, frame)`` of a frame id, or None when ``item_id`` is not one."""
    video, sep, frame = item_id.rpartition("#")
    if not sep or not video or not frame.isdigit() or not frame.isascii():
        return None
    return video, int(frame)


def fingerprint(info: VideoInfo) -> dict[str, int | float]:
    """What a resumed run compares to know the video is the one the first run read: its
    size in bytes, duration and frame count (a re-encoded or re-recorded file with the same
    name differs in at least one), and the rotation its frames are turned by."""
    record: dict[str, int | float] = {
        "size": info.size,
        "duration_s": round(info.duration_s, 6),
        "frames": info.frames,
    }
    if info.rotation:  # only then: an unturned video's record is the one older runs made
        record["rotation"] = info.rotation
    return record
