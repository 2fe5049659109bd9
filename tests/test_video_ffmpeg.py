"""The `--decoder ffmpeg` path: frames over a pipe from an ffmpeg child, same as PyAV's."""

from __future__ import annotations

import numpy as np
import psutil
import pytest
from video_files import clip_frame, faststart_h264, need_ffmpeg, truncated, write_clip

from batchinfer.data.video import DecodedFrame, DecodeFailure, Sampling, decode_range, plan_ranges
from batchinfer.data.video import probe as probe_video
from batchinfer.data.video.ffmpeg_pipe import decode_range_ffmpeg, ffmpeg_command
from batchinfer.errors import RuntimeUnavailableError

W, H = 160, 120


@pytest.fixture(scope="module")
def lossless(tmp_path_factory):
    return write_clip(tmp_path_factory.mktemp("video") / "clip.mkv", "lossless", 60, W, H, gop=10)


def ffmpeg_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "ffmpeg" in p.name()]


@pytest.mark.parametrize(
    "sampling", [None, Sampling(every=7), Sampling(keyframes=True)], ids=["all", "every7", "keys"]
)
def test_the_ffmpeg_pipe_gives_pyav_s_frames(lossless, sampling):
    need_ffmpeg()
    info = probe_video(lossless)
    for rng in plan_ranges(info, 3, sampling):
        piped = list(decode_range_ffmpeg(info, rng))
        direct = list(decode_range(info, rng))
        assert [f.index for f in piped] == [f.index for f in direct] == list(rng.wanted)
        for a, b in zip(piped, direct, strict=True):
            assert a.time_s == b.time_s
            assert np.array_equal(a.rgb, b.rgb)
            assert np.array_equal(a.rgb, clip_frame(a.index, W, H))
    assert ffmpeg_children() == []


def test_closing_early_kills_and_reaps_the_child(lossless):
    need_ffmpeg()
    info = probe_video(lossless)
    frames = decode_range_ffmpeg(info, plan_ranges(info, 1)[0])
    first = next(frames)
    assert first.index == 0
    running = ffmpeg_children()
    assert len(running) == 1  # ffmpeg is still writing the other 59 frames
    frames.close()
    assert not running[0].is_running()  # killed and reaped, not a zombie
    assert ffmpeg_children() == []


def test_a_truncated_file_through_ffmpeg_ends_in_one_failure(tmp_path):
    need_ffmpeg()
    cut = truncated(faststart_h264(tmp_path / "whole.mp4"), tmp_path / "cut.mp4", 0.6)
    info = probe_video(cut)
    got = [g for rng in plan_ranges(info, 2) for g in decode_range_ffmpeg(info, rng)]
    frames = [g for g in got if isinstance(g, DecodedFrame)]
    assert [f.index for f in frames] == list(range(len(frames))) and len(frames) > 30
    assert isinstance(got[-1], DecodeFailure) and len(got) == len(frames) + 1
    assert got[-1].frame == len(frames) and "\n" not in got[-1].message
    assert "@ 0x" not in got[-1].message  # FFmpeg's log prefix is not the user's business
    assert ffmpeg_children() == []


def test_the_command_puts_extra_arguments_before_the_input(lossless):
    info = probe_video(lossless)
    rng = plan_ranges(info, 3, Sampling(keyframes=True))[1]
    cmd = ffmpeg_command(info, rng, ["-hwaccel", "rkmpp"])
    assert cmd.index("-hwaccel") < cmd.index("-i")
    assert cmd[cmd.index("-skip_frame") + 1] == "nokey"
    # A quarter frame before the keyframe: ffmpeg's accurate seek keeps the keyframe.
    keyframe_s = float(info.pts[rng.seek] * info.time_base)
    assert float(cmd[cmd.index("-ss") + 1]) == pytest.approx(keyframe_s - 1 / 120, abs=1e-6)
    assert cmd[cmd.index("-frames:v") + 1] == "2"  # keyframes 20 and 30 of this range
    assert cmd[cmd.index("-vf") + 1] == "select=key"
    assert cmd[-5:] == ["-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"]


def test_no_ffmpeg_program_is_one_clear_error(lossless):
    info = probe_video(lossless)
    with pytest.raises(RuntimeUnavailableError, match="needs an no-such-ffmpeg program on PATH"):
        next(decode_range_ffmpeg(info, plan_ranges(info, 1)[0], binary="no-such-ffmpeg"))


@pytest.mark.slow
def test_a_longer_h264_clip_split_over_readers_decodes_each_frame_once(tmp_path):
    """640x480 H.264, 300 frames: for 1-4 ranges, both decoders give every frame once,
    at the same times, with the same pixels give or take the YUV to RGB rounding of two
    FFmpeg versions (PyAV's bundled one and the ffmpeg program)."""
    need_ffmpeg()
    info = probe_video(write_clip(tmp_path / "long.mp4", "h264", 300, 640, 480, gop=30))
    assert info.frames == 300 and len(info.keyframes) == 10
    for parts in (1, 2, 3, 4):
        seen: list[int] = []
        for rng in plan_ranges(info, parts):
            for a, b in zip(decode_range(info, rng), decode_range_ffmpeg(info, rng), strict=True):
                assert isinstance(a, DecodedFrame) and isinstance(b, DecodedFrame)
                assert (a.index, a.time_s) == (b.index, b.time_s)
                diff = np.abs(a.rgb.astype(np.int16) - b.rgb.astype(np.int16))
                assert diff.max() <= 2, (a.index, diff.max())
                seen.append(a.index)
        assert seen == list(range(300)), parts
    assert ffmpeg_children() == []
