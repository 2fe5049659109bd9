"""Detection figures (PR curves, AP per class) and the boxes drawn on the gallery's panels."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from detection_data import detector, ground_truth
from PIL import Image

from batchinfer.evaluate.groundtruth import Category, GroundTruth
from batchinfer.evaluate.plots import svg as figure_svg
from batchinfer.evaluate.scorers.coco import score_detections
from batchinfer.evaluate.scorers.instances_plots import (
    DEVICE_COLOR,
    REFERENCE_COLOR,
    ap_figure,
    draw_on,
    pr_figure,
)
from batchinfer.evaluate.thumbnails import PANEL_FIT, picture

#: Names that mathtext would misread or refuse: shown as written, never parsed.
ODD_NAMES = (r"$\frac$", "price_$5", "a_b")


def odd_ground_truth() -> GroundTruth:
    gt = ground_truth(2, images=40, classes=3)
    cats = tuple(Category(c.id, ODD_NAMES[k]) for k, c in enumerate(gt.categories))
    return GroundTruth(gt.source, cats, gt.image_ids, gt.images, gt.annotations, (), ())


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_pr_and_ap_figures_show_class_names_as_written():
    gt = odd_ground_truth()
    device = score_detections(gt, detector(gt, 1))
    reference = score_detections(gt, detector(gt, 2, jitter=0.02))
    for fig in (
        pr_figure(device.pr_curves(), reference.pr_curves()),
        ap_figure(device.per_class(), reference.per_class()),
    ):
        svg = figure_svg(fig)  # r"$\frac$" as mathtext would raise here
        assert svg.startswith("<svg")
        texts = [t for t in fig.findobj(lambda a: hasattr(a, "get_parse_math"))
                 if any(n in a.get_text() for n in ODD_NAMES for a in [t])]  # fmt: skip
        assert texts and not any(t.get_parse_math() for t in texts)
    labels = [t.get_text() for t in pr_figure(device.pr_curves()).axes[0].get_legend().texts]
    assert any(label.startswith(r"$\frac$ (AP ") for label in labels)
    assert labels[-1].startswith("all classes (AP ")


def test_pr_figure_limits_the_classes_it_draws():
    gt = ground_truth(3, images=30, classes=20)
    curves = score_detections(gt, detector(gt, 1)).pr_curves()
    fig = pr_figure(curves, max_classes=5)
    assert len(fig.axes[0].lines) == 6  # five classes and the average
    assert "5 weakest classes of" in fig.axes[0].get_title(loc="left")


def decode(uri: str) -> Image.Image:
    assert uri.startswith(("data:image/jpeg;base64,", "data:image/png;base64,"))
    return Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))


def box(x1: float, y1: float, x2: float, y2: float, class_id: int) -> dict:
    """A predictions row's box."""
    return {"class_id": class_id, "label": f"c{class_id}", "score": 0.9,
            "x1": x1, "y1": y1, "x2": x2, "y2": y2}  # fmt: skip


def panel(path, layers) -> Image.Image:
    """The report's panel of the image at ``path``: its picture as the picture child makes
    it (evaluate/thumbnails.py), the layers drawn on it as the report draws them."""
    uri, note, scale = picture(str(path), 360, None, fit=PANEL_FIT)
    assert uri is not None and scale is not None, note
    return decode(draw_on((decode(uri).convert("RGB"), scale), layers)).convert("RGB")


def test_a_panel_draws_the_boxes_on_the_upright_picture(tmp_path):
    # A 800x400 photo stored sideways (EXIF orientation 6): upright it is 400 wide, 800 high;
    # the readers' boxes are in the upright image's pixels.
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.new("RGB", (800, 400), (0, 0, 0)).save(tmp_path / "p.jpg", exif=exif.tobytes())
    Image.new("RGB", (50, 50), (0, 0, 0)).save(tmp_path / "q.png")
    img = panel(
        tmp_path / "p.jpg",
        [([box(40, 400, 360, 760, 1)], DEVICE_COLOR, 2),
         ([box(40, 40, 360, 360, 1)], REFERENCE_COLOR, 3)],
    )  # fmt: skip
    assert img.size == (180, 360)  # upright, shrunk to 360 on the long side
    small = panel(tmp_path / "q.png", [([box(5, 5, 20, 20, 0)], DEVICE_COLOR, 2)])
    assert small.size == (200, 200)  # a small one enlarged, at most 4x
    pixels = np.asarray(img).astype(int)

    def near(color, x, y):  # JPEG blurs colours a little
        return np.abs(pixels[y - 1 : y + 2, x - 1 : x + 2] - color).sum(axis=2).min() < 90

    s = 360 / 800
    assert near(REFERENCE_COLOR, int(200 * s), int(360 * s))  # the reference box's bottom edge
    assert near(DEVICE_COLOR, int(200 * s), int(760 * s))  # the device box's bottom edge
    assert not near(DEVICE_COLOR, int(200 * s), int(360 * s))
