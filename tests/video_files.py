"""Video files for the video tests: generated clips, cut short, or without a video."""

from __future__ import annotations

import os
import wave
from pathlib import Path

import pytest

av = pytest.importorskip("av", reason="PyAV is the video extra: pip install -e '.[video]'")

from batchinfer.data.video.clip import clip_frame, h264_codec, write_clip  # noqa: E402

__all__ = [
    "clip_frame",
    "faststart_h264",
    "need_ffmpeg",
    "no_video",
    "packet_ends",
    "raw_h264",
    "rotated",
    "truncated",
    "write_clip",
]


def faststart_h264(
    path: Path, frames: int = 90, gop: int = 30, b_frames: int | None = None
) -> Path:
    """An H.264 MP4 with its index (moov) first, as cameras that stream write it: cut
    short, it still opens and lists every frame. ``b_frames``: the encoder's at most
    (None: its default)."""
    with av.open(str(path), "w", options={"movflags": "+faststart"}) as out:
        stream = out.add_stream(h264_codec(), rate=30)
        stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        stream.codec_context.gop_size = gop
        if b_frames is not None:
            stream.codec_context.max_b_frames = b_frames
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(clip_frame(i, 160, 120), format="rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path


def truncated(src: Path, dst: Path, fraction: float) -> Path:
    """The first ``fraction`` of ``src``'s bytes, as a crash mid-write leaves a file."""
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * fraction)])
    return dst


def packet_ends(path: Path) -> list[int]:
    """The byte offset just past each video packet of ``path``, in file order."""
    with av.open(str(path)) as container:
        packets = container.demux(container.streams.video[0])
        return sorted(p.pos + p.size for p in packets if p.size)


def no_video(path: Path) -> Path:
    """A valid media file with sound and no picture (a WAV)."""
    with wave.open(os.fspath(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\0\0" * 800)
    return path


def need_ffmpeg() -> None:
    """Skip when there is no ffmpeg program, except in CI (.ci/run installs it)."""
    import shutil

    if shutil.which("ffmpeg") is None:
        if os.environ.get("CI"):
            pytest.fail("ffmpeg is missing in CI: .ci/run must install it")
        pytest.skip("no ffmpeg program here (apt-get install ffmpeg); CI runs this")


def raw_h264(path: Path, sizes: list[tuple[int, int]], frames: int = 20) -> Path:
    """A raw H.264 stream (no container: no timestamps, no index to seek with), one part of
    ``frames`` frames per size, one after the other, as cameras' .h264 dumps are."""
    parts = []
    for width, height in sizes:
        part = path.with_suffix(f".{width}x{height}.h264")
        with av.open(str(part), "w", format="h264") as out:
            stream = out.add_stream(h264_codec(), rate=30)
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            stream.codec_context.gop_size = 10
            for i in range(frames):
                frame = av.VideoFrame.from_ndarray(clip_frame(i, width, height), format="rgb24")
                out.mux(stream.encode(frame))
            out.mux(stream.encode(None))
        parts.append(part.read_bytes())
    path.write_bytes(b"".join(parts))
    return path


def rotated(src: Path, dst: Path, degrees: int, hflip: bool = False) -> Path:
    """``src``'s video stream remuxed (the same packets) with a display matrix turning it
    ``degrees`` counter-clockwise (and mirroring it with ``hflip``), as a phone records
    portrait video: landscape pictures and the matrix saying how to show them."""
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        stream = inp.streams.video[0]
        copy = out.add_stream_from_template(stream)
        copy.set_display_rotation(degrees, hflip=hflip)
        for packet in inp.demux(stream):
            if packet.size:  # not the demuxer's end-of-stream marker
                packet.stream = copy
                out.mux(packet)
    return dst
