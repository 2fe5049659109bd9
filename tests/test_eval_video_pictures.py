"""The eval report pictures video frames: a frame item's picture is decoded in the report's
picture child from (video, frame index) by the data layer's decode, and is that frame; a
video damaged since the run gives cards that say why they have no picture
(evaluate/thumbnails.py, video_pictures.py; scorers/instances_report.py's gallery)."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("av")
pytest.importorskip("matplotlib")

from video_files import faststart_h264, truncated

from batchinfer.data.video import DecodedFrame, FrameRange, decode_range, probe
from batchinfer.demo.clip import write_demo_clip
from batchinfer.evaluate.video_pictures import FrameSource

FRAMES = 30


@pytest.fixture
def quick_sim(monkeypatch):
    monkeypatch.setenv("BATCHINFER_SIM_NPU_MS", "0.2")
    monkeypatch.setenv("BATCHINFER_SIM_HOST_MS", "0")


def decoded_frames(video: Path) -> dict[int, np.ndarray]:
    """Every frame of ``video`` as the engine's readers decode it (data/video/decode.py)."""
    info = probe(video)
    every = np.arange(info.frames, dtype=np.int64)
    frames = decode_range(info, FrameRange(0, info.frames, every, 0, info.frames))
    return {f.index: f.rgb for f in frames if isinstance(f, DecodedFrame)}


def downscaled(
    rgb: np.ndarray, side: int, shrink: Image.Resampling = Image.Resampling.LANCZOS
) -> tuple[Image.Image, float]:
    """The report's picture of a frame: ``side`` pixels on its long side (shrunk with
    Lanczos for a classification card, bilinear for a detection panel, as its images)."""
    image = Image.fromarray(rgb)
    scale = side / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(size, shrink), scale


def png_pixels(uri: str) -> np.ndarray:
    with Image.open(io.BytesIO(base64.b64decode(uri.partition(",")[2]))) as image:
        return np.asarray(image.convert("RGB"))


def test_frames_of_a_video_are_pictured_from_the_data_layers_decode(tmp_path):
    from batchinfer.evaluate.thumbnails import make_thumbnails

    clip = write_demo_clip(tmp_path / "clip", frames=FRAMES)
    frames = decoded_frames(clip.video)
    wanted = [0, 7, 29, 13]  # across keyframes, and back: each from its own keyframe
    sources = [FrameSource(str(clip.video), f) for f in wanted]
    sources.append(FrameSource(str(clip.video), FRAMES))  # past the end: no such frame
    made = make_thumbnails(sources, decode_timeout_s=60, startup_timeout_s=60, max_pixels=None)
    for frame in wanted:
        thumbnail = made[FrameSource(str(clip.video), frame)]
        assert thumbnail.uri is not None, thumbnail.note
        expected, scale = downscaled(frames[frame], 96)
        assert np.array_equal(png_pixels(thumbnail.uri), np.asarray(expected))
        assert thumbnail.scale == scale
    assert made[sources[-1]].note == f"frame {FRAMES} does not decode: the video holds 30 frames"
    bounded = make_thumbnails(
        sources[:1], decode_timeout_s=60, startup_timeout_s=60, max_pixels=100 * 100
    )
    assert bounded[sources[0]].uri is None
    assert "more than max_pixels (10,000)" in (bounded[sources[0]].note or "")


def _detect_job(root: Path, demo_kit, video: Path, mot: Path) -> Path:
    """A detection job over ``video``, every 3rd frame, MOT ground truth, no gates."""
    job = root / "job.toml"
    job.write_text(
        f'name = "clip-pictures"\ntask = "detect"\n[device]\n'
        f'model = "{demo_kit.models["digits-det"]}"\n[device.runtime]\nbackend = "sim"\n'
        f"[device.preprocess]\nmean = [0, 0, 0]\nstd = [255, 255, 255]\nevery = 3\n"
        f'[dataset]\npath = "{video}"\nground_truth = "{mot}"\n'
        f'[output]\ndir = "{root / "out"}"\n'
    )
    return job


def _shots(page: str) -> list[tuple[str, list[tuple[str, str]], str]]:
    """(item id, [(panel title, image data: URI)], facts) of each gallery card."""
    shots = []
    for panels, facts in re.findall(
        r"<div class=shot><div class=panels>(.*?)</div>(.*?)</div>", page
    ):
        (ident,) = re.findall(r"<code>([^<]*)</code>", facts)
        images = re.findall(r"<img alt='([^']*)' src='(data:image/jpeg;base64,[^']*)'>", panels)
        shots.append((ident, images, facts))
    return shots


@pytest.mark.slow
def test_a_detection_reports_gallery_shows_each_frame_it_names(demo_kit, tmp_path, quick_sim):
    from batchinfer.evaluate import evaluate, load_job
    from batchinfer.evaluate.scorers.instances_plots import GROUND_TRUTH_COLOR, draw_on

    clip = write_demo_clip(tmp_path / "clip", frames=FRAMES)
    done = evaluate(load_job(_detect_job(tmp_path, demo_kit, clip.video, clip.mot)))
    shots = _shots((done.record_dir / "report.html").read_text())
    worst = {item["id"]: item for item in done.record["worst"]}
    assert len(shots) == len(worst) > 0
    frames = decoded_frames(clip.video)
    for ident, images, facts in shots:
        assert [title.split(":")[0] for title, _ in images] == ["ground truth", "device"], facts
        assert "no picture" not in facts
        # The ground truth's panel is that frame, as the readers decoded it, scaled to the
        # panel and drawn on by the report's drawing code: the same JPEG, byte for byte.
        item = worst[ident]
        frame = int(ident.rpartition("#")[2])
        assert item["frame"] == frame and item["path"] == str(clip.video)
        picture = downscaled(frames[frame], 240, Image.Resampling.BILINEAR)
        assert images[0][1] == draw_on(picture, [(item["truth_boxes"], GROUND_TRUTH_COLOR, 2)])


@pytest.mark.slow
def test_a_video_damaged_since_the_run_gives_cards_saying_why_no_picture(
    demo_kit, tmp_path, quick_sim, monkeypatch
):
    from batchinfer.evaluate import evaluate, load_job, thumbnails

    clip = write_demo_clip(tmp_path / "clip", frames=FRAMES)
    make = thumbnails.make_thumbnails

    def after_the_video_is_cut(*args, **kwargs):
        # the file is cut short between the run and the report's pictures
        truncated(clip.video, clip.video, 0.5)
        return make(*args, **kwargs)

    monkeypatch.setattr(thumbnails, "make_thumbnails", after_the_video_is_cut)
    done = evaluate(load_job(_detect_job(tmp_path, demo_kit, clip.video, clip.mot)))
    page = (done.record_dir / "report.html").read_text()
    notes = re.findall(r"<span class=muted>no picture: ([^<]*)</span>", page)
    assert len(notes) == len(_shots(page)) > 0
    for note in notes:
        assert "\n" not in note and re.fullmatch(
            r"the video changed since the run \([\d,]+ bytes, now [\d,]+\)", note
        ), note


def test_frames_past_the_damage_of_a_cut_video_say_why_they_have_no_picture(tmp_path):
    """A camera's MP4 (its index first) cut short: it still lists every frame; the frames
    before the cut are pictured, those after it each say why not, in one line."""
    from batchinfer.evaluate.thumbnails import make_thumbnails

    video = truncated(faststart_h264(tmp_path / "cam.mp4"), tmp_path / "cut.mp4", 0.5)
    sources = [FrameSource(str(video), f) for f in (5, 80)]
    made = make_thumbnails(sources, decode_timeout_s=60, startup_timeout_s=60, max_pixels=None)
    assert made[sources[0]].uri is not None
    assert made[sources[1]].uri is None
    assert re.fullmatch(
        r"frame 80 does not decode: the file ends early, after \d+ of the 90 frames it lists",
        made[sources[1]].note or "",
    )


def test_the_frames_of_one_video_share_one_probe_until_the_file_changes(tmp_path, monkeypatch):
    from batchinfer.evaluate import video_pictures
    from batchinfer.evaluate.thumbnails import picture

    clip = write_demo_clip(tmp_path / "clip", frames=FRAMES)
    probes: list[str] = []

    def counted(path, *args):
        probes.append(path)
        return probe(path, *args)

    monkeypatch.setattr(video_pictures, "probe", counted)
    monkeypatch.setattr(video_pictures, "_probes", type(video_pictures._probes)())
    for frame in (0, 13, 29):
        assert picture(FrameSource(str(clip.video), frame), 32, None)[0] is not None
    assert len(probes) == 1
    with open(clip.video, "ab") as f:  # another file now: probed again
        f.write(b"\0")
    picture(FrameSource(str(clip.video), 0), 32, None)
    assert len(probes) == 2
