"""Detection figures for the evaluation report: precision-recall curves, AP per class, and
a gallery of the images where the device and the reference disagree most.

Figures are matplotlib ``Figure`` objects made without pyplot (no global state, no
display); :func:`batchinfer.evaluate.plots.svg` turns one into inline SVG for the
self-contained HTML page.
Class names are user data: every text that shows one is drawn with ``parse_math=False``,
so a name with ``$`` or ``_`` is shown as written, never as mathtext (nor an error).

Images are small JPEGs as ``data:`` URIs with boxes drawn by Pillow: the report shows an
image (:func:`open_picture`, decoded once) in panels side by side (:func:`draw_on`), the
ground truth in blue, the device's boxes in magenta, the reference's in green.
:func:`gallery` draws both box sets on one image instead: the device's in magenta, the
reference's over them in thicker green (where the two agree, green shows), ground truth
(when given) in thin white underneath. The disagreement of an image is
:func:`~batchinfer.evaluate.scorers.coco.disagreement` (1 - soft F1 of the two box sets).
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from PIL import Image, ImageOps

from batchinfer.draw import draw_layer
from batchinfer.evaluate.plots import figure as _figure
from batchinfer.evaluate.plots import plain_legend as _plain_legend
from batchinfer.evaluate.scorers.coco import disagreement
from batchinfer.evaluate.thumbnails import PANEL_FIT, fitted

REFERENCE_COLOR = (46, 160, 67)
DEVICE_COLOR = (216, 27, 196)
TRUTH_COLOR = (255, 255, 255)  # under both box sets (gallery)
#: The ground truth in a panel of its own (the report's images).
GROUND_TRUTH_COLOR = (25, 118, 210)
#: Boxes of one set that get their class and score written beside them in the gallery.
LABELLED_BOXES = 10


# --------------------------------------------------------------------------- PR curves
def pr_figure(
    curves: Mapping[str, Any],
    reference: Mapping[str, Any] | None = None,
    max_classes: int = 12,
) -> Figure:
    """Precision against recall: "all classes" (COCO's average) bold, and one thin line per
    class (the ``max_classes`` lowest-AP ones when there are more); with ``reference``
    (its curves, same IoU) its average is drawn dashed. ``curves`` is
    :meth:`DetectionScore.pr_curves`."""
    fig = _figure(6.4, 4.2)
    ax = fig.add_subplot()
    ax.set_gid("detect-pr")
    recall = np.asarray(curves["recall"])
    classes = sorted(curves["per_class"], key=lambda c: float(np.mean(c["precision"])))
    shown = classes[:max_classes]
    colors = matplotlib.colormaps["tab20"]
    for k, c in enumerate(shown):
        ap = float(np.mean(c["precision"]))
        ax.plot(recall, c["precision"], linewidth=0.9, alpha=0.8, color=colors(k % 20),
                label=f"{c['name']} (AP {ap:.3f})")  # fmt: skip
    overall = np.array([np.nan if v is None else v for v in curves["overall"]], dtype=float)
    line = ax.plot(recall, overall, color="#263238", linewidth=2.4,
                   label=f"all classes (AP {np.nanmean(overall):.3f})")[0]  # fmt: skip
    line.set_gid("detect-pr-overall")
    if reference is not None:
        ref = np.array([np.nan if v is None else v for v in reference["overall"]], dtype=float)
        ax.plot(recall, ref, color="#263238", linewidth=1.6, linestyle="--",
                label=f"reference, all classes (AP {np.nanmean(ref):.3f})")  # fmt: skip
    more = len(classes) - len(shown)
    title = f"precision-recall at IoU {curves['iou']:g}"
    if more > 0:
        title += f" (the {len(shown)} weakest classes of {len(classes)})"
    ax.set_title(title, fontsize=10, loc="left")
    ax.set_xlabel("recall")
    ax.set_ylabel("precision (interpolated)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    _plain_legend(ax, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def ap_figure(
    per_class: Sequence[Mapping[str, Any]],
    reference: Sequence[Mapping[str, Any]] | None = None,
    key: str = "ap50_95",
    max_classes: int = 40,
) -> Figure:
    """AP per class as bars (device, and the reference beside it), worst first."""
    ref_by_id = {r["category_id"]: r.get(key) for r in reference or ()}
    rows = [r for r in per_class if r.get(key) is not None]
    rows.sort(key=lambda r: r[key])
    rows = rows[:max_classes]
    fig = _figure(max(4.0, 1.2 + 0.32 * len(rows)), 3.4)
    ax = fig.add_subplot()
    ax.set_gid("detect-ap")
    x = np.arange(len(rows))
    width = 0.4 if reference is not None else 0.7
    ax.bar(x - (width / 2 if reference is not None else 0), [r[key] for r in rows], width,
           color="#d81b60", label="device")  # fmt: skip
    if reference is not None:
        ref = [np.nan if (v := ref_by_id.get(r["category_id"])) is None else v
               for r in rows]  # fmt: skip
        ax.bar(x + width / 2, ref, width, color="#2e7d32", label="reference")
        _plain_legend(ax, fontsize=7, loc="upper left")
    ax.set_xticks(x, [])
    for i, r in enumerate(rows):  # tick labels as Text objects of their own: parse_math off
        ax.text(i, -0.02, str(r["name"]), rotation=60, ha="right", va="top", fontsize=7,
                transform=ax.get_xaxis_transform(), parse_math=False)  # fmt: skip
    ax.set_ylim(0, 1)
    ax.set_ylabel(key.replace("ap", "AP ").replace("50_95", "50:95"), fontsize=8)
    ax.set_title("AP per class (worst first)", fontsize=10, loc="left")
    ax.grid(axis="y", alpha=0.3)
    return fig


# --------------------------------------------------------------------------- gallery
@dataclass(frozen=True)
class Boxes:
    """One image's boxes, in the upright image's pixels: (n, 4) x1 y1 x2 y2."""

    xyxy: np.ndarray
    class_ids: np.ndarray
    labels: tuple[str, ...] = ()
    scores: np.ndarray | None = None

    @classmethod
    def from_row(cls, boxes: Sequence[Mapping[str, Any]] | None) -> Boxes | None:
        """From a predictions row's ``boxes`` list (None for an error row)."""
        if boxes is None:
            return None
        xyxy = np.array([[b["x1"], b["y1"], b["x2"], b["y2"]] for b in boxes], dtype=np.float64)
        return cls(
            xyxy.reshape(-1, 4),
            np.array([b["class_id"] for b in boxes], dtype=np.int64),
            tuple(str(b.get("label") or b["class_id"]) for b in boxes),
            np.array([b["score"] for b in boxes], dtype=np.float64),
        )

    def __len__(self) -> int:
        return len(self.xyxy)

    def rows(self) -> list[dict[str, Any]]:
        """The boxes as a predictions row's ``boxes`` list (what batchinfer.draw draws)."""
        out = []
        for k, (x1, y1, x2, y2) in enumerate(self.xyxy.tolist()):
            box: dict[str, Any] = {"class_id": int(self.class_ids[k]), "x1": x1, "y1": y1,
                                   "x2": x2, "y2": y2}  # fmt: skip
            box["label"] = self.labels[k] if self.labels else None
            box["score"] = None if self.scores is None else float(self.scores[k])
            out.append(box)
        return out


def disagreements(
    device: Mapping[str, Boxes | None], reference: Mapping[str, Boxes | None]
) -> list[tuple[str, float]]:
    """(item id, disagreement) for items both sides have boxes for, most different first
    (ties in item order). Error rows (None) are left out: the errors table lists them."""
    scored = []
    for item, d in device.items():
        r = reference.get(item)
        if d is None or r is None:
            continue
        scored.append((item, disagreement(d.xyxy, d.class_ids, r.xyxy, r.class_ids)))
    return sorted(scored, key=lambda s: -s[1])


def open_picture(
    path: str | os.PathLike[str], max_side: int = 360, exif_orientation: bool = True
) -> tuple[Image.Image, float] | None:
    """The image at ``path``, made upright and scaled to ``max_side`` on its long side
    as the report's panels are (evaluate/thumbnails.py :data:`PANEL_FIT`: small images
    enlarged at most 4x, pixels kept sharp), and that scale; None if unreadable. Decoded
    once for every panel drawn on it (:func:`draw_on`). Opened by the caller's process: the
    report's gallery has its pictures made in a child instead (a FIFO item would block)."""
    try:
        with Image.open(path) as img:
            upright = ImageOps.exif_transpose(img) if exif_orientation else img
            rgb = upright.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError):
        return None
    return fitted(rgb, max_side, PANEL_FIT)


#: One layer of a picture: its boxes (a :class:`Boxes` or a predictions row's ``boxes``
#: list, masks, keypoints and rotated boxes included), their colour and line width.
Layer = tuple[Boxes | Sequence[Mapping[str, Any]], tuple[int, int, int], int]


def draw_on(picture: tuple[Image.Image, float], layers: Sequence[Layer]) -> str:
    """A copy of an :func:`open_picture` picture with each layer drawn by batchinfer.draw
    (boxes, masks, keypoints, polygons, in the layer's colour), as a JPEG data: URI. A layer
    of at most ``LABELLED_BOXES`` boxes has their class (and score) written on them (more
    would hide the image)."""
    base, scale = picture
    rgb = base.copy()
    for boxes, color, width in layers:
        rows = boxes.rows() if isinstance(boxes, Boxes) else boxes
        named = not isinstance(boxes, Boxes) or bool(boxes.labels)  # the gallery's truth: not
        labelled = named and len(rows) <= LABELLED_BOXES
        draw_layer(rgb, rows, max_boxes=None, scale=scale, color=color, width=width,
                   labels=labelled)  # fmt: skip
    buf = io.BytesIO()
    # 4:4:4 chroma: with 4:2:0 a two-pixel coloured line fades into its background.
    rgb.save(buf, format="JPEG", quality=85, subsampling=0)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def draw_boxes(
    path: str | os.PathLike[str],
    layers: Sequence[Layer],
    max_side: int = 360,
    exif_orientation: bool = True,
) -> str | None:
    """The image at ``path`` (:func:`open_picture`) with each layer's boxes drawn
    (:func:`draw_on`), as a JPEG data: URI; None if unreadable."""
    picture = open_picture(path, max_side, exif_orientation)
    return None if picture is None else draw_on(picture, layers)


def gallery(
    device: Mapping[str, Boxes | None],
    reference: Mapping[str, Boxes | None],
    path_of: Callable[[str], str | os.PathLike[str]],
    n: int = 12,
    truth: Mapping[str, Boxes] | None = None,
    exif_orientation: bool = True,
) -> list[dict[str, Any]]:
    """The ``n`` items where device and reference disagree most (a disagreement above 0),
    each with its score, box counts and its image with both box sets drawn."""
    out: list[dict[str, Any]] = []
    for item, score in disagreements(device, reference):
        if len(out) >= n or score <= 0:
            break
        d, r = device[item], reference[item]
        assert d is not None and r is not None
        layers = []
        if truth is not None and item in truth:
            layers.append((Boxes(truth[item].xyxy, truth[item].class_ids), TRUTH_COLOR, 1))
        layers += [(d, DEVICE_COLOR, 2), (r, REFERENCE_COLOR, 3)]  # the reference on top
        out.append(
            {
                "id": item,
                "disagreement": score,
                "device_boxes": len(d),
                "reference_boxes": len(r),
                "image": draw_boxes(path_of(item), layers, exif_orientation=exif_orientation),
            }
        )
    return out


__all__ = [
    "DEVICE_COLOR",
    "GROUND_TRUTH_COLOR",
    "REFERENCE_COLOR",
    "TRUTH_COLOR",
    "Boxes",
    "ap_figure",
    "disagreements",
    "draw_boxes",
    "draw_on",
    "gallery",
    "open_picture",
    "pr_figure",
]
