"""Video frames decoded with PyAV: exact pixels, ranges, sampling, damaged files."""

from __future__ import annotations

import importlib
import time

import numpy as np
import pytest
from video_files import (
    clip_frame,
    faststart_h264,
    no_video,
    packet_ends,
    raw_h264,
    truncated,
    write_clip,
)

from batchinfer.data.video import (
    DecodedFrame,
    DecodeFailure,
    Sampling,
    decode_range,
    plan_ranges,
    probe,
    wanted_frames,
)
from batchinfer.errors import ConfigError, InputError

W, H = 160, 120


@pytest.fixture(scope="module")
def lossless(tmp_path_factory):
    return write_clip(tmp_path_factory.mktemp("video") / "clip.mkv", "lossless", 60, W, H, gop=10)


@pytest.fixture(scope="module")
def h264(tmp_path_factory):
    return write_clip(tmp_path_factory.mktemp("video") / "clip.mp4", "h264", 90, W, H, gop=10)


def decode_all(info, parts=1, sampling=None):
    out = []
    for rng in plan_ranges(info, parts, sampling):
        out.extend(decode_range(info, rng))
    return out


def test_lossless_clip_decodes_to_the_frames_written(lossless):
    info = probe(lossless)
    assert (info.codec, info.width, info.height, info.frames) == ("ffv1", W, H, 60)
    assert info.fps == 30 and info.duration_s == pytest.approx(2.0, abs=0.002)
    got = decode_all(info, parts=3)
    assert [f.index for f in got] == list(range(60))
    for f in got:
        assert f.rgb.dtype == np.uint8 and f.rgb.shape == (H, W, 3)
        assert np.array_equal(f.rgb, clip_frame(f.index, W, H)), f.index
    assert [f.time_s for f in got] == pytest.approx([i / 30 for i in range(60)], abs=0.001)


@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_ranges_cover_every_frame_exactly_once(h264, parts):
    info = probe(h264)
    assert list(info.keyframes) == list(range(0, 90, 10))
    ranges = plan_ranges(info, parts)
    assert len(ranges) == parts
    assert all(r.start in info.keyframes and r.seek == r.start for r in ranges)
    covered = np.concatenate([np.arange(r.start, r.stop) for r in ranges])
    assert list(covered) == list(range(90))  # in order, no gap, no overlap
    # Roughly equal: no range more than a GOP off an equal share.
    assert max(r.stop - r.start for r in ranges) <= 90 / parts + 10
    got = decode_all(info, parts)
    assert [f.index for f in got] == list(range(90))
    assert all(isinstance(f, DecodedFrame) for f in got)


def test_every_7_gives_frames_0_7_14(h264):
    info = probe(h264)
    got = decode_all(info, 3, Sampling(every=7))
    assert [f.index for f in got] == list(range(0, 90, 7))


def test_fps_sampling_picks_the_frames_nearest_the_grid(h264):
    info = probe(h264)
    times = info.times_s()
    grid = np.arange(0, times[-1] + 1e-9, 1 / 7)  # 7 per second
    nearest = sorted({int(np.argmin(np.abs(times - t))) for t in grid})
    assert nearest[:4] == [0, 4, 9, 13]  # 0, 0.143 s, 0.286 s, 0.429 s at 30 fps
    assert list(wanted_frames(info, Sampling(fps=7))) == nearest
    got = decode_all(info, 2, Sampling(fps=7))
    assert [f.index for f in got] == nearest


def test_start_and_end_time_keep_the_frames_between(h264):
    info = probe(h264)
    got = decode_all(info, 4, Sampling(start_s=1.0, end_s=1.5))
    assert [f.index for f in got] == list(range(30, 45))
    # The ranges before 1 s are not decoded at all.
    assert [r.start for r in plan_ranges(info, 4, Sampling(start_s=1.0, end_s=1.5))] == [20, 40]


def test_keyframes_only_gives_the_keyframes_decoded_alone(lossless):
    info = probe(lossless)
    assert list(info.keyframes) == [0, 10, 20, 30, 40, 50]
    got = decode_all(info, 2, Sampling(keyframes=True))
    assert [f.index for f in got] == list(info.keyframes)
    assert all(np.array_equal(f.rgb, clip_frame(f.index, W, H)) for f in got)


def test_truncated_h264_gives_the_frames_that_decode_then_one_failure(tmp_path):
    whole = faststart_h264(tmp_path / "whole.mp4")
    cut = truncated(whole, tmp_path / "cut.mp4", 0.6)
    info = probe(cut)  # it opens: the index at the front lists all 90 frames
    assert info.declared_frames == 90 and info.damaged_at == info.frames < 90
    got = decode_all(info, 2)  # nothing may raise
    frames = [g for g in got if isinstance(g, DecodedFrame)]
    failures = [g for g in got if isinstance(g, DecodeFailure)]
    assert len(failures) == 1 and got[-1] is failures[0]
    assert [f.index for f in frames] == list(range(len(frames))) and len(frames) > 30
    failure = failures[0]
    assert failure.frame == len(frames)  # the first frame that did not decode
    # The listed frames that did not decode; when all did (where the cut falls decides:
    # a packet cut in half, or a B-frame's reference lost), the first frame not there.
    not_decoded = list(range(len(frames), info.frames)) or [info.damaged_at]
    assert list(failure.missing) == not_decoded
    message = failure.message
    assert "\n" not in message and str(cut) in message and f"frame {failure.frame}" in message
    assert "90 frames it lists" in message


def test_an_mp4_cut_between_packets_decodes_every_listed_frame_then_one_failure(tmp_path):
    # Cut just past a packet, without B-frames: every frame the cut file holds decodes, and
    # the one error row is the first frame the index lists but the file lacks.
    whole = faststart_h264(tmp_path / "whole.mp4", b_frames=0)
    ends = packet_ends(whole)
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(whole.read_bytes()[: ends[50]])
    info = probe(cut)
    assert (info.frames, info.damaged_at, info.declared_frames) == (51, 51, 90)
    got = decode_all(info, 2)
    assert [g.index for g in got[:-1] if isinstance(g, DecodedFrame)] == list(range(51))
    failure = got[-1]
    assert isinstance(failure, DecodeFailure) and len(got) == 52
    assert (failure.frame, list(failure.missing)) == (51, [51])
    assert "after 51 of the 90 frames it lists" in failure.message


def test_truncated_matroska_reports_the_frame_after_its_last(tmp_path):
    whole = write_clip(tmp_path / "whole.mkv", "h264", 90, W, H, gop=10)
    info = probe(truncated(whole, tmp_path / "cut.mkv", 0.5))
    got = decode_all(info, 3)
    assert [type(g) for g in got[:-1]] == [DecodedFrame] * info.frames
    assert isinstance(got[-1], DecodeFailure) and got[-1].frame == info.frames
    assert "ends early" in got[-1].message


def test_a_file_without_a_video_stream_is_refused_in_one_line(tmp_path):
    with pytest.raises(InputError, match=r"holds no video stream\.$") as caught:
        probe(no_video(tmp_path / "sound.wav"))
    assert "\n" not in str(caught.value)
    with pytest.raises(InputError, match="invalid data") as caught:
        probe(truncated(tmp_path / "sound.wav", tmp_path / "junk.mp4", 0.01))
    assert "\n" not in str(caught.value)


def test_frames_over_max_pixels_are_refused(lossless):
    too_big = r"160x120 = 19,200 pixels, more than max_pixels \(19,199\)"
    with pytest.raises(InputError, match=too_big):
        probe(lossless, max_pixels=W * H - 1)
    assert probe(lossless, max_pixels=W * H).frames == 60


def test_more_frames_than_the_cap_are_refused(lossless, h264):
    with pytest.raises(InputError, match=r"more than 59 frames, more than max_frames \(59\)"):
        probe(lossless, max_frames=59)  # counted by demuxing (Matroska does not say)
    with pytest.raises(InputError, match=r"holds 90 frames, more than max_frames \(89\)"):
        probe(h264, max_frames=89)  # the MP4's own count, refused before demuxing
    assert probe(lossless, max_frames=60).frames == 60


def test_sampling_settings_are_checked():
    with pytest.raises(ConfigError, match="not every and fps"):
        Sampling(every=2, fps=3.0)
    for bad in ({"every": 0}, {"fps": float("nan")}, {"start_s": -1.0}, {"start_s": 2, "end_s": 1}):
        with pytest.raises(ConfigError):
            Sampling(**bad)


def test_keyframes_only_does_not_decode_the_other_frames(h264):
    """One keyframe in 10: with the decoder told to skip the rest, decoding costs far
    less CPU than decoding every frame and keeping the keyframes."""
    info = probe(h264)
    keys = plan_ranges(info, 1, Sampling(keyframes=True))[0]
    every = plan_ranges(info, 1, Sampling())[0]

    def cpu(rng, keep):
        start = time.process_time()
        got = [f.index for f in decode_range(info, rng) if f.index in keep]
        return time.process_time() - start, got

    keep = set(info.keyframes.tolist())
    full = min(cpu(every, keep)[0] for _ in range(3))
    skipped, got = min(cpu(keys, keep) for _ in range(3))
    assert got == list(info.keyframes)
    assert skipped < full / 3, (skipped, full)


def test_a_codec_ffmpeg_cannot_decode_is_refused_in_one_line(lossless, monkeypatch):
    # No sample file holds a codec PyAV's FFmpeg lacks: make it lack FFV1's decoder.
    probe_module = importlib.import_module("batchinfer.data.video.probe")

    monkeypatch.setattr(probe_module, "_decodable", lambda codec: codec != "ffv1")
    with pytest.raises(InputError, match=r"its codec ffv1 is not one FFmpeg here decodes\.$"):
        probe(lossless)


def test_without_libx264_the_clip_is_mpeg4(tmp_path, monkeypatch):
    clip_module = importlib.import_module("batchinfer.data.video.clip")

    monkeypatch.setattr(clip_module, "h264_codec", lambda: "mpeg4")
    info = probe(write_clip(tmp_path / "clip.mp4", "h264", 40, W, H, gop=10))
    assert (info.codec, info.frames, list(info.keyframes)) == ("mpeg4", 40, [0, 10, 20, 30])
    got = decode_all(info, 2)
    assert [f.index for f in got] == list(range(40))
    # Lossy, but the picture is the clip's: the mean error is small.
    assert np.abs(got[17].rgb.astype(int) - clip_frame(17, W, H)).mean() < 8


def test_a_stream_without_timestamps_or_index_and_a_size_change(tmp_path):
    """A raw H.264 dump: frames placed one frame apart at its stated rate, a range past
    the start decoded by reading from the beginning (it cannot seek), and the frame where
    the picture size changes (past the probe's max_pixels check) is where it fails."""
    info = probe(raw_h264(tmp_path / "cam.h264", [(W, H), (2 * W, 2 * H)]))
    assert (info.frames, info.width, info.height) == (40, W, H)
    assert np.allclose(np.diff(info.times_s()), 1 / info.fps)
    for parts in (1, 2):
        got = decode_all(info, parts)
        assert [f.index for f in got[:-1]] == list(range(20)), parts
        assert isinstance(got[-1], DecodeFailure) and got[-1].frame == 20
        assert "frame size changes from 160x120 to 320x240" in got[-1].message
