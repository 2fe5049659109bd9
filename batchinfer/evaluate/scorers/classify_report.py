"""The classification sections of the evaluation report (evaluate/report.py holds the frame).

Sections: the confusion matrix; per class; per core accuracy, agreement, cosine and
throughput; the worst items and the items flipped since the baseline, with their pictures
(made in a child process: the scorer's ``shown_items`` says which). Plot ids: ``confusion``,
``cores-accuracy``, ``cores-cosine``, ``cores-throughput``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.ticker import FuncFormatter

from batchinfer.evaluate.gates import fmt
from batchinfer.evaluate.plots import figure, plain_text, svg
from batchinfer.evaluate.report import emulated_note, esc, no_baseline_html
from batchinfer.evaluate.summary import labels_outside
from batchinfer.evaluate.thumbnails import FLIPPED_PICTURED, Source, Thumbnail, picture_source
from batchinfer.sink.stats import place_name

_FLIPPED_SHOWN = FLIPPED_PICTURED  # items shown of each of lost and gained


# --------------------------------------------------------------------------- plots
@plain_text
def confusion_plot(record: dict[str, Any]) -> str:
    matrix = np.array(record["confusion"], dtype=float)
    n = len(matrix)
    size = min(9.0, 2.5 + 0.45 * n)
    fig = figure(size, size * 0.85)
    ax = fig.add_subplot()
    ax.set_gid("confusion")
    shown = np.log1p(matrix)  # the diagonal would otherwise wash every mistake out
    image = ax.imshow(shown, cmap="Blues")
    colorbar = fig.colorbar(image, ax=ax, shrink=0.8)
    colorbar.set_label("items (log scale)", fontsize=8)
    colorbar.set_ticks([])
    if n <= 30:
        names = record["classes"]
        ax.set_xticks(range(n), names, rotation=90 if n > 12 else 0, fontsize=8)
        ax.set_yticks(range(n), names, fontsize=8)
    if n <= 20:
        top = shown.max() or 1
        for (i, j), count in np.ndenumerate(matrix):
            if count:
                color = "white" if shown[i, j] > 0.6 * top else "#263238"
                ax.text(j, i, f"{int(count)}", ha="center", va="center", fontsize=7, color=color)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    return svg(fig)


@plain_text
def cores_plot(record: dict[str, Any]) -> str:
    """Per core: top-1 and agreement, 1 - mean cosine (log), throughput."""
    cores = record["per_core"]
    labels = [f"core {c['place']}" for c in cores]
    x = np.arange(len(cores))
    fig = figure(10, 3.0)
    emulated = " (emulated NPU)" if record["device"]["backend"] == "sim" else ""

    ax = fig.add_subplot(1, 3, 1)
    ax.set_gid("cores-accuracy")
    series = [("top1", "top-1 accuracy", "#1565c0"), ("agreement", "agreement", "#00897b")]
    present = [s for s in series if any(c[s[0]] is not None for c in cores)]
    width = 0.8 / max(1, len(present))
    values_all = []
    for k, (key, label, color) in enumerate(present):
        values = [np.nan if c[key] is None else c[key] for c in cores]
        values_all += [v for v in values if not np.isnan(v)]
        ax.bar(x + (k - (len(present) - 1) / 2) * width, values, width, label=label, color=color)
    if values_all:
        low = min(values_all)
        ax.set_ylim(max(0.0, low - max(0.02, (1 - low) * 0.5)), 1.0)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_title("accuracy per core", fontsize=10, loc="left")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.6g}"))
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)

    ax = fig.add_subplot(1, 3, 2)
    ax.set_gid("cores-cosine")
    deficit = [
        np.nan if c["cosine_mean"] is None else max(1 - c["cosine_mean"], 1e-9) for c in cores
    ]
    if not all(np.isnan(deficit)):
        ax.bar(x, deficit, 0.6, color="#6a1b9a")
        ax.set_yscale("log")
        # Bars on a log scale start at an arbitrary floor: make it an order of magnitude
        # below the best core, so equal cores look equal and an odd one stands out.
        ax.set_ylim(np.nanmin(deficit) / 10, np.nanmax(deficit) * 3)
    else:
        ax.text(0.5, 0.5, "no reference", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_title("1 - mean cosine vs reference (lower: closer)", fontsize=10, loc="left")

    ax = fig.add_subplot(1, 3, 3)
    ax.set_gid("cores-throughput")
    rates = [np.nan if c["items_per_s"] is None else c["items_per_s"] for c in cores]
    ax.bar(x, rates, 0.6, color="#546e7a")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_title(f"items/s{emulated}", fontsize=10, loc="left")
    return svg(fig)


# --------------------------------------------------------------------------- images
def _flipped_items(record: dict[str, Any], kind: str, limit: int) -> list[dict[str, Any]]:
    """The flipped items shown, with where their pictures are (the record's ``pictured``;
    a record written before it had them: root/id, as for a folder)."""
    root = Path(record["dataset"]["path"])
    places = record["flipped"].get("pictured") or {}
    return [
        {"id": i, **places.get(i, {"path": str(root / i)})} for i in record["flipped"][kind][:limit]
    ]


def shown_items(record: dict[str, Any]) -> list[Source]:
    """Where the pictures of the items the page shows are (worst, then flipped)."""
    items = list(record["worst"])
    if record["flipped"] is not None:
        for kind in ("lost", "gained"):
            items += _flipped_items(record, kind, _FLIPPED_SHOWN)
    return list(dict.fromkeys(picture_source(item) for item in items))


# --------------------------------------------------------------------------- tables
def _class_name(record: dict[str, Any], index: int | None) -> str:
    if index is None or index < 0:
        return "-"
    names = record["classes"]
    return names[index] if index < len(names) else str(index)


def _item_cards(
    record: dict[str, Any], items: list[dict[str, Any]], pictures: Mapping[Source, Thumbnail]
) -> str:
    cards = []
    for item in items:
        thumbnail = pictures.get(picture_source(item))
        uri = thumbnail.uri if thumbnail else None
        picture = f"<img alt='{esc(item['id'])}' src='{esc(uri)}'>" if uri else ""
        lines = [f"<code>{esc(item['id'])}</code>"]
        if thumbnail is not None and thumbnail.note:
            lines.append(f"<span class=muted>no picture: {esc(thumbnail.note)}</span>")
        lines.append(f"label {esc(_class_name(record, item.get('label')))}")
        if "pred" in item:
            lines.append(f"device {esc(_class_name(record, item['pred']))}")
        if item.get("ref_pred") is not None:
            lines.append(f"reference {esc(_class_name(record, item['ref_pred']))}")
        if item.get("cosine") is not None:
            lines.append(f"cosine {item['cosine']:.5f}")
        if item.get("core") is not None and item["core"] >= 0:
            lines.append(f"core {esc(place_name(item.get('node'), item['core']))}")
        cards.append(f"<div class=item>{picture}{'<br>'.join(lines)}</div>")
    return f"<div class=items>{''.join(cards)}</div>" if cards else "<p class=muted>none</p>"


def _flipped(record: dict[str, Any], pictures: Mapping[Source, Thumbnail]) -> str:
    flipped = record["flipped"]
    if flipped is None:
        return no_baseline_html(record)
    test = flipped["mcnemar"]
    base = record["baseline"] or {}
    parts = [
        f"<p>Against the baseline {esc(base.get('eval_id'))} (accepted by "
        f"{esc(base.get('accepted_by'))} at {esc(base.get('accepted_at'))}): "
        f"{len(flipped['lost'])} items lost, {len(flipped['gained'])} gained, of "
        f"{flipped['compared']} compared; McNemar p = {test['p_value']:.3g} "
        f"({esc(test['method'])}).</p>"
    ]
    for kind in ("lost", "gained"):
        ids = flipped[kind]
        if ids:
            more = f" (first {_FLIPPED_SHOWN} of {len(ids)})" if len(ids) > _FLIPPED_SHOWN else ""
            items = _flipped_items(record, kind, _FLIPPED_SHOWN)
            parts.append(f"<h3>{kind}{more}</h3>{_item_cards(record, items, pictures)}")
    return "".join(parts)


def _cores_table(record: dict[str, Any]) -> str:
    head = (
        "<tr><th>core</th><th>items</th><th>errors</th><th>top-1</th><th>agreement</th>"
        "<th>mean cosine</th><th>items/s</th><th>p50 ms</th><th>p99 ms</th></tr>"
    )
    rows = []
    for c in record["per_core"]:
        cells = [c["place"], c["items"], c["errors"]]
        cells += [fmt(c[k]) for k in ("top1", "agreement", "cosine_mean", "items_per_s")]
        cells += [fmt(c[k]) for k in ("p50_ms", "p99_ms")]
        rows.append("<tr>" + "".join(f"<td class=num>{esc(v)}</td>" for v in cells) + "</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _classes_table(record: dict[str, Any], limit: int = 40) -> str:
    """Per-class accuracy, worst first (all of them up to ``limit`` classes)."""
    classes = [c for c in record["per_class"] if c["items"]]
    classes.sort(key=lambda c: (c["top1"], c["class"]))
    outside = labels_outside(record)
    note = f"<p class=FAIL id=labels-outside>{esc(outside)}</p>" if outside else ""
    if len(classes) > limit:
        note += f"<p class=muted>The {limit} worst of {len(classes)} classes.</p>"
        classes = classes[:limit]
    head = "<tr><th>class</th><th>items</th><th>correct</th><th>errors</th><th>top-1</th></tr>"
    rows = "".join(
        f"<tr><td>{esc(c['name'])}</td><td class=num>{c['items']}</td>"
        f"<td class=num>{c['correct']}</td><td class=num>{c['errors']}</td>"
        f"<td class=num>{esc(fmt(c['top1']))}</td></tr>"
        for c in classes
    )
    return f"{note}<table id=class-table>{head}{rows}</table>"


def sections(
    record: dict[str, Any], pictures: Mapping[Source, Thumbnail]
) -> list[tuple[str, str, str]]:
    """The classification sections, between the trend and the metric table."""
    worst_note = (
        "Disagreements with the reference first, then the lowest output cosine."
        if record["reference"]
        else "The most confident mistakes."
    )
    return [
        ("confusion", "Confusion matrix", confusion_plot(record)),
        ("classes", "Per class", _classes_table(record)),
        ("cores", "Per core", emulated_note(record) + cores_plot(record) + _cores_table(record)),
        (
            "worst",
            "Worst items",
            f"<p class=muted>{worst_note}</p>" + _item_cards(record, record["worst"], pictures),
        ),
        ("flipped", "Flipped since the baseline", _flipped(record, pictures)),
    ]


__all__ = ["confusion_plot", "cores_plot", "sections", "shown_items"]
