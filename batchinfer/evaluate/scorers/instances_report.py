"""The detection sections of the evaluation report (evaluate/report.py holds the frame).

Between the frame's trend and its metric table: AP per class
(table and bars, the reference beside the device), precision-recall curves at IoU 0.5,
per core, images with the ground truth beside the device's (and the reference's) boxes
from ``metrics.display_conf`` up (chosen by instances_examples.py: in every report, not
only where device and reference disagree), the comparisons with the reference and the
baseline (paired image bootstrap), and how the ground truth matched the dataset. Plot
ids: ``detect-ap``, ``detect-pr``, ``detect-pr-overall``; the images are ``data:`` JPEGs.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from typing import Any

from PIL import Image

from batchinfer.evaluate.gates import fmt
from batchinfer.evaluate.plots import svg
from batchinfer.evaluate.report import emulated_note, esc, no_baseline_html
from batchinfer.evaluate.scorers.instances_examples import PANEL_SIDE, WHY
from batchinfer.evaluate.scorers.instances_plots import (
    DEVICE_COLOR,
    GROUND_TRUTH_COLOR,
    REFERENCE_COLOR,
    ap_figure,
    draw_on,
    pr_figure,
)
from batchinfer.evaluate.scorers.instances_summary import bootstrap_line, pct
from batchinfer.evaluate.thumbnails import Source, Thumbnail, picture_source
from batchinfer.sink.stats import place_name

GALLERY_CSS = """
.gallery{display:flex;flex-wrap:wrap;gap:12px}
.shot{border:1px solid #e0e0e0;border-radius:4px;padding:6px;font-size:12px}
.panels{display:flex;flex-wrap:wrap;gap:6px;margin-bottom:4px}
.panels figure{margin:0}
.panels img{display:block;max-width:240px;max-height:240px;background:#eceff1}
.shot code{word-break:break-all}
.key{display:inline-block;width:12px;height:12px;vertical-align:middle;margin:0 4px 0 10px}
"""


def _rgb(color: tuple[int, int, int]) -> str:
    return "#" + "".join(f"{c:02x}" for c in color)


# --------------------------------------------------------------------------- sections
def _classes_table(record: dict[str, Any], limit: int = 80) -> str:
    rows = [c for c in record["per_class"] if c["gt_boxes"] or c["detections"]]
    rows.sort(key=lambda c: (c["ap50_95"] is None, c["ap50_95"] or 0.0, c["name"]))
    note = ""
    if len(rows) > limit:
        note = f"<p class=muted>The {limit} worst of {len(rows)} classes.</p>"
        rows = rows[:limit]
    ref = record["reference"] is not None
    head = (
        "<tr><th>class</th><th>boxes</th><th>detections</th><th>AP50:95</th><th>AP50</th>"
        "<th>recall@0.5</th>" + ("<th>reference AP50:95</th><th>reference AP50</th>" if ref else "")
        + "</tr>"
    )  # fmt: skip
    body = []
    for c in rows:
        cells = [c["gt_boxes"], c["detections"], pct(c["ap50_95"]), pct(c["ap50"])]
        cells.append(pct(c["recall50"]))
        if ref:
            cells += [pct(c.get("reference_ap50_95")), pct(c.get("reference_ap50"))]
        body.append(
            f"<tr><td>{esc(c['name'])}</td>"
            + "".join(f"<td class=num>{esc(v)}</td>" for v in cells)
            + "</tr>"
        )
    chart = ""
    reference = record["per_class"] if ref else None
    if any(c["ap50_95"] is not None for c in record["per_class"]):
        ref_rows = None
        if reference is not None:
            ref_rows = [{**c, "ap50_95": c.get("reference_ap50_95")} for c in record["per_class"]]
        chart = svg(ap_figure(record["per_class"], ref_rows))
    return f"{note}<table id=ap-table>{head}{''.join(body)}</table>{chart}"


def _pr_section(record: dict[str, Any]) -> str:
    curves = record["pr_curves"]
    if not curves["device"]["per_class"]:
        return "<p class=muted>No class has ground truth among the scored images.</p>"
    return (
        "<p class=muted>COCO's interpolated precision at 101 recall points, IoU 0.5; the "
        "bold line is the average over the classes (the AP50 of every class averaged)."
        "</p>" + svg(pr_figure(curves["device"], curves["reference"]))
    )


def _cores_table(record: dict[str, Any]) -> str:
    head = (
        "<tr><th>core</th><th>items</th><th>errors</th><th>mAP50:95</th><th>mAP50</th>"
        "<th>reference mAP50:95</th><th>disagreement</th><th>items/s</th><th>p50 ms</th>"
        "<th>p99 ms</th></tr>"
    )
    rows = []
    for c in record["per_core"]:
        cells = [c["place"], c["items"], c["errors"]]
        cells += [pct(c[k]) for k in ("map50_95", "map50", "reference_map50_95")]
        cells += [pct(c["disagreement_mean"])]
        cells += [fmt(c[k]) for k in ("items_per_s", "p50_ms", "p99_ms")]
        rows.append("<tr>" + "".join(f"<td class=num>{esc(v)}</td>" for v in cells) + "</tr>")
    note = (
        "<p class=muted>Each core's mAP is on the images it ran: a core that computes "
        "differently scores apart from the others.</p>"
    )
    return f"{emulated_note(record)}{note}<table id=core-table>{head}{''.join(rows)}</table>"


def _count(n: int) -> str:
    return "1 box" if n == 1 else f"{n} boxes"


def _panel(picture: Any, title: str, rows: list[dict[str, Any]], color: tuple) -> str:
    uri = draw_on(picture, [(rows, color, 2)]) if picture is not None else None
    img = f"<img alt='{esc(title)}' src='{uri}'>" if uri else ""
    key = f"<span class=key style='background:{_rgb(color)}'></span>"
    return f"<figure>{img}<figcaption>{key}{esc(title)}</figcaption></figure>"


def _picture(item: dict[str, Any], pictures: Mapping[Source, Thumbnail]) -> tuple[Any, str]:
    """An item's picture to draw on (:func:`draw_on`'s pair: the picture and its scale), or
    None and why not. Made by the picture child (evaluate/thumbnails.py, under the decode
    timeout, for the instances scorer's ``shown_items``): an item that blocks whoever opens
    it must not block the coordinator, so it never opens one."""
    made = pictures.get(picture_source(item))
    if made is None or made.uri is None or made.scale is None:
        return None, (made.note if made is not None else None) or "it was not made"
    with Image.open(io.BytesIO(base64.b64decode(made.uri.partition(",")[2]))) as png:
        return (png.convert("RGB"), made.scale), ""


def _shot(item: dict[str, Any], conf: float, pictures: Mapping[Source, Thumbnail]) -> str:
    """One image: the ground truth, the device's and the reference's boxes side by side."""
    picture, why_not = _picture(item, pictures)
    panels = []
    truth = item.get("truth_boxes")
    if truth is not None:
        panels.append(
            _panel(picture, f"ground truth: {_count(len(truth))}", truth, GROUND_TRUTH_COLOR)
        )
    for side, color in (("device", DEVICE_COLOR), ("reference", REFERENCE_COLOR)):
        rows = item.get(f"{side}_boxes")
        if rows is not None:
            of = item.get(f"{side}_all", len(rows))
            title = f"{side}: {_count(len(rows))} >= {conf:g} (of {of})"
            panels.append(_panel(picture, title, rows, color))
    facts = [f"<code>{esc(item['id'])}</code>", esc(WHY.get(item.get("why", ""), "an example"))]
    if picture is None:
        facts.append(f"<span class=muted>no picture: {esc(why_not)}</span>")
    if truth is None:
        facts.append("no ground truth")
    elif item.get("truth_disagreement") is not None:
        facts.append(f"against the ground truth {item['truth_disagreement']:.3f}")
    if item.get("disagreement") is not None:
        facts.append(f"against the reference {item['disagreement']:.3f}")
    core = place_name(item.get("node"), item["core"]) if item["core"] >= 0 else "-"
    facts.append(f"core {esc(core)}")
    return f"<div class=shot><div class=panels>{''.join(panels)}</div>{' · '.join(facts)}</div>"


def _gallery(record: dict[str, Any], pictures: Mapping[Source, Thumbnail]) -> str:
    conf = record.get("display_conf", 0.25)
    shots = [_shot(item, conf, pictures) for item in record["worst"]]
    if not shots:
        return "<p class=muted>No image has a result to show.</p>"
    reference = (
        "where device and reference disagree most, then " if record["reference"] is not None else ""
    )
    intro = (
        f"<p class=muted>{len(shots)} images: {reference}those whose boxes differ most from "
        "the ground truth, then others. Boxes scoring at least "
        f"{esc(f'{conf:g}')} are drawn (<code>metrics.display_conf</code>; mAP counts every "
        "box the job's <code>detect.conf</code> keeps). The numbers are 1 - soft F1 of two "
        "box sets (boxes of the same class paired by IoU >= 0.5, each pair counting its "
        "IoU): 0 the same boxes, 1 none in common.</p>"
    )
    return intro + f"<div class=gallery>{''.join(shots)}</div>"


def _comparisons(record: dict[str, Any]) -> str:
    parts = [
        "<p class=muted>Paired bootstrap over images: each resample draws the images with "
        "replacement and scores both sides on the same draw.</p>"
    ]
    ref = record["vs_reference"]
    if ref is not None:
        lines = "".join(
            f"<li>{esc(bootstrap_line(ref[k], 'device', 'reference'))}</li>" for k in ref
        )
        parts.append(f"<h3>device against the reference</h3><ul>{lines}</ul>")
    base = record["vs_baseline"]
    if base is None:
        parts.append(no_baseline_html(record))
    else:
        info = record["baseline"] or {}
        lines = "".join(
            f"<li>{esc(bootstrap_line(base[k], 'now', 'baseline'))}</li>"
            for k in ("map50_95", "map50")
        )
        parts.append(
            f"<h3>against the baseline {esc(info.get('eval_id'))} (accepted by "
            f"{esc(info.get('accepted_by'))}), on the {base['compared']} images both have</h3>"
            f"<ul>{lines}</ul>"
        )
    return "".join(parts)


def _matching(record: dict[str, Any]) -> str:
    gt = record["ground_truth"]
    rows = [
        ("ground truth", f"{gt['format']}: {gt['path']}"),
        ("images scored", gt["images"]),
        ("boxes", gt["annotations"]),
        ("categories", gt["categories"]),
        ("dataset images without ground truth (not scored)", gt["unmatched_items"]),
        ("ground-truth images not in the dataset", gt["unknown_images"]),
        ("their boxes (dropped)", gt["dropped_annotations"]),
    ]
    body = "".join(f"<tr><th>{esc(k)}</th><td class=num>{esc(v)}</td></tr>" for k, v in rows)
    out = f"<table id=gt-table>{body}</table>"
    for key, title in (
        ("unmatched_items_first", "first dataset images without ground truth"),
        ("unknown_images_first", "first ground-truth images not in the dataset"),
    ):
        if gt[key]:
            out += f"<h3>{title}</h3><p>" + ", ".join(f"<code>{esc(n)}</code>" for n in gt[key])
            out += "</p>"
    return out


# --------------------------------------------------------------------------- the sections
def sections(
    record: dict[str, Any], pictures: Mapping[Source, Thumbnail]
) -> list[tuple[str, str, str]]:
    """The detection sections, between the trend and the metric table."""
    return [
        ("classes", "AP per class", _classes_table(record)),
        ("pr", "Precision-recall", _pr_section(record)),
        ("cores", "Per core", _cores_table(record)),
        ("gallery", "Images: the ground truth beside the predictions", _gallery(record, pictures)),
        ("compare", "Compared with the reference and the baseline", _comparisons(record)),
        ("matching", "Ground truth", _matching(record)),
    ]


__all__ = ["GALLERY_CSS", "PANEL_SIDE", "sections"]
