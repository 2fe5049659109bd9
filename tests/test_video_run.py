"""Videos as datasets, end to end (issue 42): one row per frame, sampling, broken files,
the same predictions as the frames' lossless PNGs, resume, the reader a range goes to."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from models import nhwc_uint8_model
from PIL import Image
from runs import config, fast_sim
from video_files import clip_frame, faststart_h264, no_video, truncated, write_clip

from batchinfer import run
from batchinfer.data.dataset import Item, Member
from batchinfer.data.input_spec import Preprocess
from batchinfer.data.preprocess import load_into
from batchinfer.data.sources import open_source
from batchinfer.data.video.dataset import VideoFrame, VideoSettings
from batchinfer.engine.scheduler import Scheduler
from batchinfer.errors import DatasetError, UsageError
from batchinfer.results import read_predictions

W, H = 64, 48


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return nhwc_uint8_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def h264(tmp_path_factory):
    return write_clip(tmp_path_factory.mktemp("video") / "clip.mp4", "h264", 60, W, H, gop=10)


def _run(dataset, model, out, **flat):
    flat.setdefault("readers", 2)
    result = run(
        config(dataset, model, backend="sim", sim=fast_sim(), cores=(0, 1), out=out, **flat)
    )
    return result, read_predictions(out).sort_by("index").to_pylist()


def test_every_frame_of_a_video_is_one_row_in_order_of_frames(h264, model, tmp_path):
    result, rows = _run(h264, model, tmp_path / "o")
    assert (result.succeeded, result.errors) == (60, 0)
    assert [r["frame"] for r in rows] == list(range(60))  # each frame exactly once
    assert [r["id"] for r in rows] == [f"clip.mp4#{i}" for i in range(60)]
    assert [r["index"] for r in rows] == list(range(60))
    assert [r["time_s"] for r in rows] == pytest.approx([i / 30 for i in range(60)], abs=1e-3)
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["dataset"]["form"] == "video" and manifest["dataset"]["items"] == 60
    assert manifest["fingerprint"]["video"]["every"] is None


def test_every_7_gives_exactly_frames_0_7_14(h264, model, tmp_path):
    _, rows = _run(h264, model, tmp_path / "o", every=7)
    assert [r["frame"] for r in rows] == list(range(0, 60, 7))
    assert [r["id"] for r in rows] == [f"clip.mp4#{i}" for i in range(0, 60, 7)]


def test_keyframes_and_a_time_window(h264, model, tmp_path):
    _, rows = _run(h264, model, tmp_path / "k", keyframes=True, start_s=0.5)
    assert [r["frame"] for r in rows] == [20, 30, 40, 50]
    _, rows = _run(h264, model, tmp_path / "f", fps=5.0, end_s=1.0)
    assert [r["frame"] for r in rows] == [0, 6, 12, 18, 24]


def test_frames_give_the_predictions_of_their_lossless_pngs(model, tmp_path):
    clip = write_clip(tmp_path / "clip.mkv", "lossless", 24, W, H, gop=5)
    pngs = tmp_path / "pngs"
    pngs.mkdir()
    for i in range(24):
        Image.fromarray(clip_frame(i, W, H)).save(pngs / f"{i:03d}.png")
    _, video = _run(clip, model, tmp_path / "v", readers=3)
    _, images = _run(pngs, model, tmp_path / "i")
    assert [r["frame"] for r in video] == list(range(24))
    assert [(r["pred"], r["topk_index"], r["topk_score"]) for r in video] == [
        (r["pred"], r["topk_index"], r["topk_score"]) for r in images
    ]
    assert len({r["pred"] for r in video} | {tuple(r["topk_score"]) for r in video}) > 2


def test_a_truncated_h264_file_gives_its_frames_and_error_rows(model, tmp_path):
    whole = faststart_h264(tmp_path / "whole.mp4", frames=60, gop=10)
    folder = tmp_path / "videos"
    folder.mkdir()
    truncated(whole, folder / "cut.mp4", 0.6)
    write_clip(folder / "fine.mp4", "h264", 12, W, H, gop=6)
    result, rows = _run(folder, model, tmp_path / "o")
    cut = [r for r in rows if r["id"].startswith("cut.mp4#")]
    good = [r for r in cut if r["error"] is None]
    bad = [r for r in cut if r["error"] is not None]
    assert len(good) > 20 and [r["frame"] for r in good] == list(range(len(good)))
    first = bad[0]
    assert first["frame"] == len(good)
    assert "cut.mp4" in first["error"] and f"from frame {len(good)}" in first["error"]
    assert all(f"failed at frame {len(good)}" in r["error"] for r in bad[1:])
    assert [r["frame"] for r in bad] == list(range(len(good), len(good) + len(bad)))
    fine = [r for r in rows if r["id"].startswith("fine.mp4#")]
    assert [r["frame"] for r in fine] == list(range(12)) and all(r["error"] is None for r in fine)
    assert result.errors == len(bad)


def test_a_file_without_video_is_one_error_row(model, tmp_path):
    folder = tmp_path / "videos"
    folder.mkdir()
    no_video(folder / "sound.mp4")
    write_clip(folder / "clip.mp4", "h264", 6, W, H, gop=3)
    result, rows = _run(folder, model, tmp_path / "o")
    errors = [(r["id"], r["error"]) for r in rows if r["error"] is not None]
    assert len(errors) == 1 and errors[0][0] == "sound.mp4#0"
    assert "no video stream" in errors[0][1] and "\n" not in errors[0][1]
    assert result.succeeded == 6


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_a_cli_run_of_a_broken_video_says_one_line_and_no_traceback(model, tmp_path):
    cut = truncated(faststart_h264(tmp_path / "w.mp4", frames=30, gop=10), tmp_path / "c.mp4", 0.5)
    done = subprocess.run(
        [sys.executable, "-m", "batchinfer", "run", str(cut), "--model", str(model),
         "--backend", "sim", "--sim-npu-ms", "0.2", "--sim-host-ms", "0", "--cores", "0",
         "--readers", "1", "--out", str(tmp_path / "o"), "--no-progress"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "c.mp4#" in done.stdout and "Cannot decode" in done.stdout


def test_a_folder_mixing_videos_and_images_is_refused(tmp_path):
    write_clip(tmp_path / "a.mp4", "h264", 3, W, H)
    Image.fromarray(clip_frame(0, W, H)).save(tmp_path / "b.png")
    with pytest.raises(DatasetError, match="mixes 1 images and 1 videos"):
        open_source(tmp_path)


def test_a_list_and_a_glob_of_videos_give_their_frames(h264, tmp_path):
    (tmp_path / "list.txt").write_text(f"{h264}\n")
    listed = open_source(tmp_path / "list.txt", video=VideoSettings())
    globbed = open_source(str(h264.parent / "*.mp4"))
    for dataset in (listed, globbed):
        ids = sorted((i.index, i.id) for i in dataset)
        assert len(dataset) == 60 and ids[7][0] == 7 and ids[7][1].endswith("clip.mp4#7")


def test_a_long_video_is_handed_out_range_by_range(h264):
    dataset = open_source(h264)
    dataset.parts = 3
    first = [item.member.start for item in list(dataset)[:6]]
    assert sorted(set(first)) == [0, 20, 40]  # three ranges in turn: every reader decodes


def test_the_items_of_one_range_go_to_one_reader():
    s = Scheduler(slots=12, cores=[0], instances_per_core=1, readers=3, max_attempts=2)
    settings = VideoSettings()
    readers: dict[int, set[int]] = {}
    for i in range(12):
        start = (i % 3) * 10
        frame = VideoFrame(i, 0.0, 0, start, start + 10, settings)
        item = Item(i, "v.mp4", f"v.mp4#{i}", None, None, member=frame)
        slot = s.admit(item, 0.0, True)
        readers.setdefault(start, set()).add(s.flight(slot).reader)  # type: ignore[arg-type]
    assert all(len(r) == 1 for r in readers.values())
    assert len(set().union(*readers.values())) == 3  # and the ranges spread over the readers


def test_an_item_says_its_group_by_its_locator_and_a_loader_refuses_one_it_does_not_know():
    """The scheduler asks Item.group (typed), never a tar or video type by name; a locator
    no loader knows is refused, not read as a file of its own."""
    frame = VideoFrame(7, 0.0, 2, 5, 15, VideoSettings())
    assert Item(7, "v.mp4", "v.mp4#7", None, None, member=frame).group == (2, 5)
    member = Member(512, 10, "a.png")
    assert Item(0, "s.tar", "s.tar:a.png", None, None, member=member).group is None
    assert Item(0, "a.png", "a.png", None, None).group is None

    class Elsewhere:
        group = None

    spec = Preprocess((1, 8, 8, 3), "uint8")
    out = np.zeros(spec.shape, np.uint8)
    with pytest.raises(TypeError, match="no loader reads an item by Elsewhere"):
        load_into("a.png", spec, out, "images", member=Elsewhere())


def test_sampling_settings_that_contradict_are_a_usage_error(h264, model, tmp_path):
    with pytest.raises(UsageError, match="one of every, fps and keyframes"):
        _run(h264, model, tmp_path / "o", every=2, fps=3.0)


def test_a_limit_then_resume_gives_each_frame_once(h264, model, tmp_path):
    out = tmp_path / "o"
    _run(h264, model, out, limit=25)
    assert len(read_predictions(out)) == 25
    result, rows = _run(h264, model, out, resume=True)
    assert result.skipped == 25 and result.succeeded == 35
    assert sorted(r["frame"] for r in rows) == list(range(60))
    with pytest.raises(UsageError, match="video settings"):
        _run(h264, model, out, resume=True, every=2)


def test_a_reader_decodes_a_range_once_through_ffmpeg_and_kills_it_when_done(h264):
    from video_files import need_ffmpeg

    from batchinfer.data.video.frames import VideoFiles

    need_ffmpeg()
    dataset = open_source(h264, video=VideoSettings(decoder="ffmpeg"))
    dataset.parts = 2
    videos, pyav = VideoFiles(keep=1), VideoFiles()
    try:
        for item in sorted(dataset, key=lambda i: i.index):
            rgb = videos.frame(item.path, item.member, item.id)  # type: ignore[arg-type]
            member = dataclasses.replace(item.member, settings=VideoSettings())  # type: ignore[type-var]
            same = pyav.frame(item.path, member, item.id)
            assert rgb.shape == (H, W, 3) and np.abs(rgb.astype(int) - same).mean() < 2
    finally:
        videos.close()  # the last ffmpeg child is killed and reaped (conftest checks)
        pyav.close()


@pytest.mark.slow
def test_the_ffmpeg_decoder_gives_pyav_s_predictions(h264, model, tmp_path):
    from video_files import need_ffmpeg

    need_ffmpeg()
    _, pyav = _run(h264, model, tmp_path / "a", every=3)
    _, piped = _run(h264, model, tmp_path / "b", every=3, decoder="ffmpeg")
    assert [r["frame"] for r in piped] == list(range(0, 60, 3))
    assert [r["pred"] for r in piped] == [r["pred"] for r in pyav]
    scores = [np.array(r["topk_score"]) for r in piped]
    assert all(
        np.allclose(a, np.array(b["topk_score"]), atol=0.05)
        for a, b in zip(scores, pyav, strict=True)
    )


def test_a_video_path_given_to_infer_is_its_frames(h264, model):
    from batchinfer import infer

    table = infer(model, [Path(h264)], runtime=None).sort_by("index")
    assert table["frame"].to_pylist() == list(range(60))


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_gives_each_frame_exactly_once(model, tmp_path):
    import os
    import time

    import psutil

    clip = write_clip(tmp_path / "long.mp4", "h264", 600, W, H, gop=30)
    out = tmp_path / "o"
    base = [sys.executable, "-m", "batchinfer", "run", str(clip), "--model", str(model),
            "--backend", "sim", "--sim-host-ms", "0", "--out", str(out), "--no-progress",
            "--readers", "2", "--every", "2"]  # fmt: skip
    proc = subprocess.Popen(
        [*base, "--sim-npu-ms", "5", "--cores", "0", "--part-rows", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while len(list((out / "predictions").glob("part-*.parquet"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.02)
    children = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, 9)
    proc.communicate(timeout=30)
    psutil.wait_procs(children, timeout=30)
    written = len(read_predictions(out))
    assert 0 < written < 300
    done = subprocess.run(
        [*base, "--sim-npu-ms", "0.2", "--resume"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert f"{written} already done (resumed)" in done.stdout
    table = read_predictions(out)
    assert sorted(table["frame"].to_pylist()) == list(range(0, 600, 2))
    assert len(set(table["id"].to_pylist())) == 300 and table["error"].null_count == 300
    assert sorted(table["index"].to_pylist()) == list(range(300))
