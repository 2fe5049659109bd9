"""Detection figures for the evaluation report: precision-recall curves and AP per class,
and the boxes drawn on the gallery's pictures.

Figures are matplotlib ``Figure`` objects made without pyplot (no global state, no
display); :func:`batchinfer.evaluate.plots.svg` turns one into inline SVG for the
self-contained HTML page.
Class names are user data: every text that shows one is drawn with ``parse_math=False``,
so a name with ``$`` or ``_`` is shown as written, never as mathtext (nor an error).

Images are small JPEGs as ``data:`` URIs with boxes drawn by Pillow: the report shows an
image (its picture made by the report's picture child, evaluate/thumbnails.py
:data:`~batchinfer.evaluate.thumbnails.PANEL_FIT`, decoded once) in panels side by side
(:func:`draw_on`), the ground truth in blue, the device's boxes in magenta, the reference's
in green.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from batchinfer.draw import draw_layer
from batchinfer.evaluate.plots import figure as _figure
from batchinfer.evaluate.plots import plain_legend as _plain_legend

REFERENCE_COLOR = (46, 160, 67)
DEVICE_COLOR = (216, 27, 196)
#: The ground truth in a panel of its own (the report's images).
GROUND_TRUTH_COLOR = (25, 118, 210)
#: Boxes of one set that get their class and score written beside them in a panel.
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


# --------------------------------------------------------------------------- panels
#: One layer of a picture: its boxes (a predictions row's ``boxes`` list, masks, keypoints
#: and rotated boxes included), their colour and line width.
Layer = tuple[Sequence[Mapping[str, Any]], tuple[int, int, int], int]


def draw_on(picture: tuple[Image.Image, float], layers: Sequence[Layer]) -> str:
    """A copy of a panel's picture (the picture child's image and its scale:
    evaluate/thumbnails.py) with each layer drawn by batchinfer.draw
    (boxes, masks, keypoints, polygons, in the layer's colour), as a JPEG data: URI. A layer
    of at most ``LABELLED_BOXES`` boxes has their class (and score) written on them (more
    would hide the image)."""
    base, scale = picture
    rgb = base.copy()
    for rows, color, width in layers:
        draw_layer(rgb, rows, max_boxes=None, scale=scale, color=color, width=width,
                   labels=len(rows) <= LABELLED_BOXES)  # fmt: skip
    buf = io.BytesIO()
    # 4:4:4 chroma: with 4:2:0 a two-pixel coloured line fades into its background.
    rgb.save(buf, format="JPEG", quality=85, subsampling=0)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


__all__ = [
    "DEVICE_COLOR",
    "GROUND_TRUTH_COLOR",
    "REFERENCE_COLOR",
    "ap_figure",
    "draw_on",
    "pr_figure",
]
