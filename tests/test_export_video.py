"""``export draw`` of a run over a video: one video file, every frame at the source's rate,
boxes drawn (the same drawing as images) on the frames the run inferred, the others as
decoded; recorded so that ``--overwrite`` deletes it."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from test_cli import invoke

av = pytest.importorskip("av")

from batchinfer.data.video.decode import decode_range  # noqa: E402
from batchinfer.data.video.plan import FrameRange  # noqa: E402
from batchinfer.data.video.probe import probe  # noqa: E402
from batchinfer.demo.clip import write_demo_clip  # noqa: E402
from batchinfer.export_draw import RECORD, _drawn, export_draw  # noqa: E402
from batchinfer.export_video import _even, _rate  # noqa: E402
from batchinfer.results import read_run  # noqa: E402
from batchinfer.tasks import task_from_record  # noqa: E402

DETECTOR = ("--mean", "0,0,0", "--std", "255,255,255")
FRAMES = 45


@pytest.fixture(scope="module")
def clip_run(demo_kit, tmp_path_factory):
    """The demo detector over a 45-frame demo clip, every 3rd frame: (run, clip)."""
    root = Path(tmp_path_factory.mktemp("video-draw"))
    clip = write_demo_clip(root / "clip", frames=FRAMES).video
    out = root / "run"
    result = invoke(
        "run", clip, "--model", demo_kit.models["digits-det"], *DETECTOR, "--every", "3",
        "--out", out, "--cores", "0", "--readers", "1", "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out, clip


def frames_of(path: Path) -> list[np.ndarray]:
    info = probe(str(path))
    whole = FrameRange(0, info.frames, np.arange(info.frames), 0, info.frames)
    return [f.rgb for f in decode_range(info, whole)]  # type: ignore[union-attr]


def test_the_run_is_drawn_into_one_video_of_every_frame_at_the_source_rate(clip_run, tmp_path):
    run, clip = clip_run
    result = invoke("export", "draw", run, "--out", tmp_path / "drawn")
    assert result.exit_code == 0, result.output
    assert f"drew 15 of {FRAMES} frames into 1 video" in result.output
    out = tmp_path / "drawn" / "digits.mp4"
    info = probe(str(out))
    assert info.frames == FRAMES and info.fps == pytest.approx(30)
    assert (info.width, info.height) == (320, 240)
    assert info.codec == ("h264" if "libx264" in av.codecs_available else "mpeg4")
    assert (tmp_path / "drawn" / RECORD).read_text().endswith(" digits.mp4\n")
    assert not list((tmp_path / "drawn").glob(".*.part"))

    source, drawn = frames_of(clip), frames_of(out)
    task = task_from_record(read_run(run).manifest.raw["task"])  # the run's, as export draw
    rows = {r["frame"]: r for r in read_run(run).predictions().to_pylist()}
    assert sorted(rows) == list(range(0, FRAMES, 3))
    for frame in (0, 1, 2, 30, 31):
        diff = np.abs(drawn[frame].astype(int) - source[frame].astype(int)).sum(axis=2)
        boxes = [b for b in rows[frame]["boxes"] if b["score"] >= 0.25] if frame in rows else []
        if not boxes:  # a frame the run skipped: as decoded (but for re-encoding)
            assert frame % 3 and diff.mean() < 6, (frame, diff.mean())
            continue
        # the frame as export draw draws an image: the same drawing code
        want = np.asarray(_drawn(source[frame], rows[frame], task, [], 0.25, 100)).astype(int)
        lines = np.abs(want - source[frame].astype(int)).sum(axis=2) > 60  # boxes, labels
        assert lines.sum() > 200 * len(boxes)
        got = drawn[frame].astype(int)
        off_want = np.abs(got - want).sum(axis=2)[lines].mean()
        off_source = diff[lines].mean()
        # the boxes are where they are in the image, up to the codec's loss (yuv420p halves
        # the colour resolution of 2-pixel lines: about 20 levels a channel), not the source
        assert off_want < 100 and off_source > 3 * off_want, (frame, off_want, off_source)


def test_ids_draw_only_their_frames_and_overwrite_replaces_the_video(clip_run, tmp_path):
    run, _ = clip_run
    done = export_draw(run, tmp_path, ids=["digits.mp4#3"])
    assert done.written == ["digits.mp4"] and done.videos[0].drawn == 1
    assert done.videos[0].frames == FRAMES
    again = export_draw(run, tmp_path, overwrite=True, limit=2)
    assert again.deleted == 1 and again.videos[0].drawn == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORD, "digits.mp4"]


def test_odd_sides_are_padded_and_rates_kept_as_fractions():
    assert _even(np.ones((5, 7, 3), np.uint8)).shape == (6, 8, 3)
    assert _even(np.ones((4, 6, 3), np.uint8)).shape == (4, 6, 3)
    assert _rate(29.97002997) == Fraction(30000, 1001) and _rate(0.0) == 30


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_a_video_cut_short_is_drawn_up_to_its_last_good_frame(demo_kit, tmp_path):
    from video_files import faststart_h264, truncated

    cut = truncated(faststart_h264(tmp_path / "whole.mp4"), tmp_path / "cut.mp4", 0.6)
    run = tmp_path / "run"
    result = invoke(
        "run", cut, "--model", demo_kit.models["digits-det"], *DETECTOR, "--out", run,
        "--cores", "0", "--readers", "1", "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 1, result.output  # the frames that do not decode: error rows
    rows = read_run(run).predictions(["frame", "error"]).to_pylist()
    good = sorted(r["frame"] for r in rows if r["error"] is None)
    result = invoke("export", "draw", run, "--out", tmp_path / "drawn")
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert "cut.mp4: Cannot decode" in result.output and "error row" in result.output
    written = probe(str(tmp_path / "drawn" / "cut.mp4"))
    assert written.frames == len(good) == max(good) + 1  # every frame up to the damage
