"""Detection figures (PR curves, AP per class) and the disagreement gallery."""

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
    Boxes,
    ap_figure,
    disagreements,
    draw_boxes,
    gallery,
    pr_figure,
)

#: Names that mathtext would misread or refuse: shown as written, never parsed.
ODD_NAMES = (r"$\frac$", "price_$5", "a_b")


def odd_ground_truth() -> GroundTruth:
    gt = ground_truth(2, images=40, classes=3)
    cats = tuple(Category(c.id, ODD_NAMES[k]) for k, c in enumerate(gt.categories))
    return GroundTruth(gt.source, cats, gt.image_ids, gt.images, gt.annotations, (), ())


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
    assert uri.startswith("data:image/jpeg;base64,")
    return Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))


def boxes(rows: list[tuple[float, float, float, float, int]]) -> Boxes:
    a = np.array(rows, dtype=float).reshape(-1, 5)
    return Boxes(a[:, :4], a[:, 4].astype(int), tuple(f"c{int(c)}" for c in a[:, 4]),
                 np.full(len(a), 0.9))  # fmt: skip


def test_disagreements_rank_items_and_leave_error_rows_out():
    same = boxes([(0, 0, 10, 10, 0)])
    device = {"a": same, "b": boxes([(0, 0, 10, 12, 0)]), "c": boxes([]), "d": None}
    reference = {"a": same, "b": same, "c": same, "d": same}
    ranked = disagreements(device, reference)
    assert [i for i, _ in ranked] == ["c", "b", "a"]
    assert ranked[0][1] == 1.0 and ranked[2][1] == 0.0


def test_gallery_draws_both_box_sets_on_the_upright_image(tmp_path):
    # A 800x400 photo stored sideways (EXIF orientation 6): upright it is 400 wide, 800 high.
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.new("RGB", (800, 400), (0, 0, 0)).save(tmp_path / "p.jpg", exif=exif.tobytes())
    Image.new("RGB", (50, 50), (0, 0, 0)).save(tmp_path / "q.png")
    device = {"p.jpg": boxes([(40, 400, 360, 760, 1)]), "q.png": boxes([(5, 5, 20, 20, 0)])}
    reference = {"p.jpg": boxes([(40, 40, 360, 360, 1)]), "q.png": boxes([(5, 5, 20, 21, 0)])}
    shown = gallery(device, reference, lambda item: tmp_path / item, n=5)
    assert [s["id"] for s in shown] == ["p.jpg", "q.png"]
    assert shown[0]["disagreement"] == 1.0 and shown[0]["device_boxes"] == 1
    img = decode(shown[0]["image"]).convert("RGB")
    assert img.size == (180, 360)  # upright, shrunk to 360 on the long side
    assert decode(shown[1]["image"]).size == (200, 200)  # a small one enlarged, at most 4x
    pixels = np.asarray(img).astype(int)

    def near(color, x, y):  # JPEG blurs colours a little
        return np.abs(pixels[y - 1 : y + 2, x - 1 : x + 2] - color).sum(axis=2).min() < 90

    s = 360 / 800
    assert near(REFERENCE_COLOR, int(200 * s), int(360 * s))  # the reference box's bottom edge
    assert near(DEVICE_COLOR, int(200 * s), int(760 * s))  # the device box's bottom edge
    assert not near(DEVICE_COLOR, int(200 * s), int(360 * s))
    # Agreeing items are not shown; n limits the rest.
    assert gallery(device, device, lambda item: tmp_path / item) == []
    assert len(gallery(device, reference, lambda item: tmp_path / item, n=1)) == 1


def test_draw_boxes_on_an_unreadable_file_gives_none(tmp_path):
    (tmp_path / "x.jpg").write_bytes(b"nope")
    assert draw_boxes(tmp_path / "x.jpg", [(boxes([]), DEVICE_COLOR, 2)]) is None
