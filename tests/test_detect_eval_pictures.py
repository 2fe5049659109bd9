"""The detection report's gallery pictures are made in the report's picture child, under the
decode timeout, as the classification report's are (evaluate/thumbnails.py): an item that
blocks whoever opens it costs its picture only, and an ordinary image's picture is the one
the report drew before (upright by its EXIF orientation, RGB, shrunk bilinear, enlarged at
most 4x with sharp pixels)."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

pytest.importorskip("faster_coco_eval")
pytest.importorskip("matplotlib")
from detect_models import colour_detector, labels_file
from test_detect_eval_end_to_end import make_dataset

from batchinfer.evaluate.thumbnails import make_thumbnails

#: The side of the gallery's panels (instances_examples.PANEL_SIDE), written out.
SIDE = 240


def todays_picture(path: Path) -> tuple[Image.Image, float]:
    """The gallery's picture of an image file as the report made it before its pictures
    moved to the picture child (instances_plots.open_picture, written out)."""
    with Image.open(path) as img:
        rgb = ImageOps.exif_transpose(img).convert("RGB")
    scale = min(4.0, SIDE / max(rgb.size))
    if scale != 1.0:
        size = (max(1, round(rgb.width * scale)), max(1, round(rgb.height * scale)))
        sharp = Image.Resampling.NEAREST if scale > 1 else Image.Resampling.BILINEAR
        rgb = rgb.resize(size, sharp)
    return rgb, scale


def png_pixels(uri: str) -> np.ndarray:
    with Image.open(io.BytesIO(base64.b64decode(uri.partition(",")[2]))) as image:
        return np.asarray(image.convert("RGB"))


def odd_images(folder: Path) -> list[Path]:
    """Images whose picture takes each of today's branches: turned by EXIF, grey, a
    palette with transparency, RGBA, tiny (the 4x cap), large, exactly the side."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    noise = rng.integers(0, 256, (90, 150, 3), dtype=np.uint8)
    turned = Image.fromarray(noise)
    exif = turned.getexif()
    exif[0x0112] = 6  # Orientation: turned 90 degrees
    turned.save(folder / "turned.jpg", exif=exif)
    Image.fromarray(noise[..., 0]).save(folder / "grey.png")
    Image.fromarray(noise).quantize(16).save(folder / "palette.png", transparency=0)
    Image.fromarray(np.dstack([noise, noise[..., :1]])).save(folder / "rgba.png")
    Image.fromarray(noise[:7, :10]).save(folder / "tiny.png")
    Image.fromarray(np.tile(noise, (4, 7, 1))).save(folder / "large.png")
    Image.fromarray(noise).resize((SIDE, 100)).save(folder / "side.png")
    return sorted(folder.iterdir())


def test_panel_pictures_are_todays_pictures_of_ordinary_files(tmp_path):
    from batchinfer.evaluate.thumbnails import PANEL_FIT

    paths = [str(p) for p in odd_images(tmp_path / "odd")]
    made = make_thumbnails(
        paths, decode_timeout_s=60, startup_timeout_s=60, max_pixels=None, size=SIDE,
        fit=PANEL_FIT,
    )  # fmt: skip
    for path in paths:
        picture = made[path]
        assert picture.uri is not None, (path, picture.note)
        expected, scale = todays_picture(Path(path))
        assert picture.scale == scale, path
        assert np.array_equal(png_pixels(picture.uri), np.asarray(expected)), path


# --------------------------------------------------------------------------- a whole eval
JOB = """
name = "pictures"
task = "detect"
[device]
model = "detector.onnx"
[device.runtime]
backend = "sim"
cores = [0]
[device.runtime.sim]
npu_ms = 0.2
host_ms = 0.0
[device.detect]
conf = 0.005
[device.reliability]
decode_timeout_s = 2
[dataset]
path = "data"
ground_truth = "instances.json"
labels = "labels.txt"
[metrics]
worst = 20
"""

#: ``batchinfer eval`` of argv[1] after item argv[2] becomes a symlink to the FIFO argv[3]
#: between the run and the report (a file on a dead mount is the same: open() never returns).
BECOMES_A_FIFO = """
import os, sys
from batchinfer.cli import main
from batchinfer.evaluate import thumbnails

job, item, fifo = sys.argv[1:]
make = thumbnails.make_thumbnails

def after_the_item_became_a_fifo(*args, **kwargs):
    os.replace(item, item + ".was")
    os.symlink(fifo, item)
    return make(*args, **kwargs)

thumbnails.make_thumbnails = after_the_item_became_a_fifo
main(["eval", job, "--no-progress"])
"""


def _cards(page: str) -> dict[str, tuple[list[tuple[str, str]], str]]:
    """Item id -> ([(panel title, image data: URI)], facts) of each gallery card."""
    cards = {}
    for panels, facts in re.findall(
        r"<div class=shot><div class=panels>(.*?)</div>(.*?)</div>", page
    ):
        (ident,) = re.findall(r"<code>([^<]*)</code>", facts)
        images = re.findall(r"<img alt='([^']*)' src='(data:image/jpeg;base64,[^']*)'>", panels)
        cards[ident] = (images, facts)
    return cards


@pytest.mark.slow  # a whole eval in a subprocess (default tier: the test above, thumbnails')
def test_a_fifo_in_a_detection_dataset_costs_its_picture_only(tmp_path):
    from batchinfer.evaluate.scorers.instances_plots import (
        DEVICE_COLOR,
        GROUND_TRUTH_COLOR,
        draw_on,
    )

    colour_detector(tmp_path)
    labels_file(tmp_path)
    data, _ = make_dataset(tmp_path, n=6)
    for odd in odd_images(tmp_path / "odd"):  # not in the ground truth: device boxes only
        shutil.copy(odd, data / odd.name)
    (tmp_path / "job.toml").write_text(JOB)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    item = data / "img000.png"

    # A subprocess, so that a hang fails this test instead of holding the session for ever.
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BECOMES_A_FIFO), "job.toml", str(item), str(fifo)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )

    assert done.returncode == 0, done.stdout + done.stderr
    (result,) = (tmp_path / "eval" / "pictures" / "evals").glob("*/result.json")
    worst = {w["id"]: w for w in json.loads(result.read_text())["worst"]}
    cards = _cards((tmp_path / "eval" / "pictures" / "report.html").read_text())
    assert cards.keys() == worst.keys() and len(cards) == 6 + 1 + 7  # extra.png, the odd ones
    images, facts = cards.pop("img000.png")
    assert images == [] and "no picture: not a regular file" in facts
    for ident, (images, facts) in cards.items():
        # Each panel is today's picture of its file with the report's drawing on it.
        assert "no picture" not in facts, facts
        title, uri = images[0]
        box = worst[ident]
        if title.startswith("ground truth"):
            layer = (box["truth_boxes"], GROUND_TRUTH_COLOR, 2)
        else:
            layer = (box["device_boxes"], DEVICE_COLOR, 2)
        assert uri == draw_on(todays_picture(data / ident), [layer]), ident


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_a_job_that_does_not_turn_images_gets_pictures_as_its_readers_saw_them(tmp_path):
    # The panels were turned by EXIF whatever the job said; with exif_orientation = false
    # the readers' boxes are in the stored image's coordinates, and were drawn on a turned
    # picture.
    from test_detect_eval_end_to_end import invoke

    colour_detector(tmp_path)
    labels_file(tmp_path)
    data, _ = make_dataset(tmp_path, n=2)
    odd = {p.name: p for p in odd_images(tmp_path / "odd")}
    shutil.copy(odd["turned.jpg"], data / "turned.jpg")  # 150 x 90 stored, 90 x 150 upright
    job = tmp_path / "job.toml"
    job.write_text(
        JOB.replace("[dataset]", "[device.preprocess]\nexif_orientation = false\n[dataset]")
    )

    result = invoke("eval", job, "--no-progress")

    assert result.exit_code == 0, result.output + result.stderr
    cards = _cards((tmp_path / "eval" / "pictures" / "report.html").read_text())
    images, facts = cards["turned.jpg"]
    assert "no picture" not in facts, facts
    with Image.open(io.BytesIO(base64.b64decode(images[0][1].partition(",")[2]))) as panel:
        assert panel.size == (SIDE, 144)  # as stored, shrunk to the side: not turned
