"""Videos with a display rotation (portrait phone videos): frames turned as players and the
``ffmpeg`` program show them, by both decoders; ``autorotate`` off reads them as stored;
a mirror or a tilt is refused; resume checks the setting; the demo detector finds on a
turned clip the boxes of the upright one, and export draw writes the video upright."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from models import nhwc_uint8_model
from runs import config, fast_sim
from test_cli import invoke
from video_files import clip_frame, need_ffmpeg, rotated, write_clip

from batchinfer import run
from batchinfer.data.sources import open_source
from batchinfer.data.video.clip import encode_frames
from batchinfer.data.video.dataset import VideoSettings
from batchinfer.data.video.decode import DecodedFrame, decode_frame, decode_range
from batchinfer.data.video.ffmpeg_pipe import decode_range_ffmpeg, ffmpeg_command
from batchinfer.data.video.ids import fingerprint
from batchinfer.data.video.plan import FrameRange
from batchinfer.data.video.probe import probe
from batchinfer.demo.clip import FPS, GOP, HEIGHT, WIDTH, clip_scenes, write_demo_clip
from batchinfer.errors import InputError, UsageError
from batchinfer.evaluate.video_pictures import FrameSource, open_frame
from batchinfer.results import read_predictions, read_run

W, H, FRAMES = 64, 48, 6
DETECTOR = ("--mean", "0,0,0", "--std", "255,255,255")


@pytest.fixture(scope="module")
def lossless(tmp_path_factory) -> Path:
    """FFV1 (lossless: the two decoders' pixels can be compared exactly), keyframes 0, 3."""
    return write_clip(tmp_path_factory.mktemp("rot") / "clip.mkv", "lossless", FRAMES, W, H, gop=3)


#: Frames 3..5, from the keyframe at 3 (a seek, as a reader's range).
SECOND = FrameRange(3, FRAMES, np.arange(3, FRAMES), 3, FRAMES)


def _frames(got) -> list[np.ndarray]:
    out = list(got)
    assert all(isinstance(f, DecodedFrame) for f in out), out
    return [f.rgb for f in out]


def _ffmpeg_frames(path: Path, width: int, height: int) -> np.ndarray:
    """Every frame as the ffmpeg program shows it (its default autorotate), RGB."""
    raw = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(path), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        capture_output=True,
        check=True,
    ).stdout
    return np.frombuffer(raw, np.uint8).reshape(-1, height, width, 3)


@pytest.mark.parametrize("degrees", [90, 180, 270])
def test_both_decoders_give_the_frames_ffmpeg_shows(lossless, tmp_path, degrees):
    need_ffmpeg()
    turned = rotated(lossless, tmp_path / f"r{degrees}.mkv", degrees)
    info = probe(turned)
    size = (H, W) if degrees in (90, 270) else (W, H)
    assert info.rotation == degrees and (info.width, info.height) == size
    truth = _ffmpeg_frames(turned, info.width, info.height)
    assert len(truth) == FRAMES
    assert not np.array_equal(truth[3], np.asarray(clip_frame(3, W, H)).reshape(truth[3].shape))
    pyav = _frames(decode_range(info, SECOND))
    piped = _frames(decode_range_ffmpeg(info, SECOND))
    for k, frame in enumerate(range(3, FRAMES)):
        assert np.array_equal(pyav[k], truth[frame]), (degrees, frame)
        assert np.array_equal(piped[k], truth[frame]), (degrees, frame)
    # the eval report's picture of a frame: the same decode
    one = decode_frame(info, 4)
    assert isinstance(one, DecodedFrame) and np.array_equal(one.rgb, truth[4])


def test_without_autorotate_frames_are_as_stored(lossless, tmp_path):
    turned = rotated(lossless, tmp_path / "r90.mkv", 90)
    info = probe(turned, autorotate=False)
    assert info.rotation == 0 and (info.width, info.height) == (W, H)
    got = _frames(decode_range(info, SECOND))
    stored = [clip_frame(f, W, H) for f in range(3, FRAMES)]
    assert all(np.array_equal(a, b) for a, b in zip(got, stored, strict=True))
    # the ffmpeg program turns a frame only when the probe did
    assert "-noautorotate" in ffmpeg_command(info, SECOND)
    assert "-noautorotate" not in ffmpeg_command(probe(turned), SECOND)


def test_the_ffmpeg_pipe_reads_as_stored_without_autorotate(lossless, tmp_path):
    need_ffmpeg()
    info = probe(rotated(lossless, tmp_path / "r270.mkv", 270), autorotate=False)
    got = _frames(decode_range_ffmpeg(info, SECOND))
    stored = [clip_frame(f, W, H) for f in range(3, FRAMES)]
    assert all(np.array_equal(a, b) for a, b in zip(got, stored, strict=True))


def test_a_mirror_or_a_tilt_is_refused_unless_read_as_stored(lossless, tmp_path):
    mirrored = rotated(lossless, tmp_path / "flip.mkv", 90, hflip=True)
    tilted = rotated(lossless, tmp_path / "tilt.mkv", 45)
    with pytest.raises(InputError, match=r"display matrix mirrors the picture.*autorotate"):
        probe(mirrored)
    with pytest.raises(InputError, match=r"turns it 45 degrees, not a multiple of 90"):
        probe(tilted)
    for path in (mirrored, tilted):
        assert probe(path, autorotate=False).rotation == 0
    # in a dataset, the refusal is the video's one error row
    dataset = open_source(tilted, video=VideoSettings())
    (video,) = dataset.videos
    assert video.info is None and "not a multiple of 90" in str(video.fault)
    kept = open_source(tilted, video=VideoSettings(autorotate=False))
    assert kept.videos[0].info is not None


def test_the_fingerprint_holds_the_rotation_and_an_upright_video_s_is_as_before(lossless, tmp_path):
    upright = fingerprint(probe(lossless))
    assert set(upright) == {"size", "duration_s", "frames"}  # what runs before recorded
    turned = rotated(lossless, tmp_path / "r90.mkv", 90)
    assert fingerprint(probe(turned))["rotation"] == 90
    assert "rotation" not in fingerprint(probe(turned, autorotate=False))


def test_the_eval_picture_is_turned_as_the_run_read_it(lossless, tmp_path):
    turned = rotated(lossless, tmp_path / "r90.mkv", 90)
    st = turned.stat()
    image, note = open_frame(FrameSource(str(turned), 2), st, None)
    assert note is None and image.size == (H, W)
    image, note = open_frame(FrameSource(str(turned), 2, autorotate=False), st, None)
    assert note is None and image.size == (W, H)


def test_rows_are_in_the_displayed_frame_and_resume_refuses_another_setting(tmp_path):
    model = nhwc_uint8_model(tmp_path / "model")
    clip = write_clip(tmp_path / "c.mp4", "h264", 20, W, H, gop=10)
    turned = rotated(clip, tmp_path / "turned.mp4", 90)
    out = tmp_path / "o"
    flat = dict(backend="sim", sim=fast_sim(), cores=(0,), readers=1, out=out)
    run(config(turned, model, limit=8, **flat))
    with pytest.raises(UsageError, match=r"video settings.*autorotate True → False"):
        run(config(turned, model, resume=True, autorotate=False, **flat))
    result = run(config(turned, model, resume=True, **flat))
    assert result.skipped == 8 and result.succeeded == 12
    manifest = read_run(out).manifest.raw
    assert manifest["config"]["preprocess"]["autorotate"] is True
    assert len(read_predictions(out)) == 20


@pytest.fixture(scope="module")
def demo_runs(demo_kit, tmp_path_factory):
    """The demo detector over the demo clip's first frames, and over the same frames as a
    phone stores a portrait video: pictures turned a quarter clockwise (240x320) and a
    display matrix of 90 degrees turning them back. (upright rows, turned rows, the
    turned run's folder, the upright clip)."""
    root = Path(tmp_path_factory.mktemp("demo-rot"))
    clip = write_demo_clip(root / "clip", frames=4).video
    sideways = (np.rot90(s.image, -1) for s in clip_scenes(4))
    stored = encode_frames(root / "stored.mp4", sideways, "h264", HEIGHT, WIDTH, FPS, GOP)
    turned = rotated(stored, root / "turned.mp4", 90)
    rows = []
    for name, video in (("upright", clip), ("turned", turned)):
        out = root / name
        result = invoke(
            "run", video, "--model", demo_kit.models["digits-det"], *DETECTOR, "--out", out,
            "--cores", "0", "--readers", "1", "--no-progress",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        rows.append({r["frame"]: r for r in read_predictions(out).to_pylist()})
    return rows[0], rows[1], root / "turned", clip


def _boxes(row, conf: float) -> list[tuple[int, list[float]]]:
    return [(b["class_id"], [b["x1"], b["y1"], b["x2"], b["y2"]]) for b in row["boxes"]
            if b["score"] >= conf]  # fmt: skip


def _found_in(boxes, other) -> bool:
    """Every box of ``boxes`` has one of its class in ``other`` within 2 pixels (the two
    clips are encoded apart: H.264 loses differently)."""
    return all(
        any(c == k and np.abs(np.subtract(box, b)).max() <= 2.0 for k, b in other)
        for c, box in boxes
    )


def test_the_detector_finds_on_the_turned_clip_the_boxes_of_the_upright_one(demo_runs):
    upright, turned, _, _ = demo_runs
    assert sorted(upright) == sorted(turned) == [0, 1, 2, 3]
    confident = 0
    for frame, row in upright.items():
        assert (turned[frame]["width"], turned[frame]["height"]) == (WIDTH, HEIGHT)
        # a sure box (0.8) of either is a box (0.5) of the other: the detector's ambiguous
        # guesses (a second class for one digit, about 0.7) may fall either side of a line
        assert _found_in(_boxes(row, 0.8), _boxes(turned[frame], 0.5)), frame
        assert _found_in(_boxes(turned[frame], 0.8), _boxes(row, 0.5)), frame
        confident += len(_boxes(row, 0.8))
    assert confident >= 14  # of the 16 digits in 4 frames (read as stored, sideways: 3)


def test_export_draw_writes_the_turned_run_upright(demo_runs, tmp_path):
    _, _, run_dir, clip = demo_runs
    result = invoke("export", "draw", run_dir, "--out", tmp_path / "drawn")
    assert result.exit_code == 0, result.output
    written = probe(tmp_path / "drawn" / "turned.mp4")
    assert written.rotation == 0 and (written.width, written.height) == (WIDTH, HEIGHT)
    first = FrameRange(0, 1, np.array([0]), 0, 1)
    (drawn,) = _frames(decode_range(written, first))
    (source,) = _frames(decode_range(probe(clip), first))
    # the drawing adds boxes; the picture under them is the upright frame (codec loss aside)
    diff = np.abs(drawn.astype(int) - source.astype(int)).sum(axis=2)
    assert np.median(diff) < 10
