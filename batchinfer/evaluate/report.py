"""The HTML report: one self-contained page (plots inline as SVG, images as data: URIs).

Sections: the verdict and every gate; metric trends over this job's past evaluations with
the gates' current limits drawn in; the confusion matrix; per-core accuracy, agreement,
cosine and throughput; the worst items and the items flipped since the baseline, with
their images; every metric; the run's facts and warnings. The page loads nothing: its
Content-Security-Policy allows only inline styles and data: images, so a stray link
would show as a console error in the browser test. Plots are made with matplotlib
(the ``report`` extra) without pyplot, so no global state or display is touched.

Names are data: every one is HTML-escaped, and plots draw text without mathtext. The page
never opens a dataset item: its pictures come in ready-made (:func:`shown_items` says
which; batchinfer.evaluate.thumbnails makes them under the decode timeout).

Plots carry ids for tests and for anyone scripting the page: ``trend-<metric>`` (one
marker per evaluation in ``trend-<metric>-values``), ``confusion``, ``cores-accuracy``,
``cores-cosine``, ``cores-throughput``.
"""

from __future__ import annotations

import functools
import html
import io
import itertools
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ParamSpec

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from batchinfer.evaluate.files import REPORT_MARK
from batchinfer.evaluate.gates import CHECK_WORDS, fmt
from batchinfer.evaluate.summary import labels_outside, no_baseline, on_cluster
from batchinfer.evaluate.thumbnails import FLIPPED_PICTURED, Source, Thumbnail, picture_source
from batchinfer.sink.stats import place_name

_GATE_STYLE = {
    "min": ("#c62828", "--", "floor"),
    "max": ("#c62828", "--", "ceiling"),
    "max_drop": ("#ef6c00", ":", "baseline - max drop"),
    "min_ratio_to_reference": ("#6a1b9a", "-.", "ratio x reference"),
}
_PASS, _FAIL = "#2e7d32", "#c62828"
_FLIPPED_SHOWN = FLIPPED_PICTURED  # items shown of each of lost and gained
_salt = itertools.count()
P = ParamSpec("P")


def dom_id(text: str) -> str:
    """An id usable in HTML and CSS selectors (``reference.top1`` -> ``reference-top1``)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", text)


def _svg(fig: Figure) -> str:
    """The figure as inline SVG (ids salted per figure, so two plots never share one)."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": f"batchinfer-{next(_salt)}"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _plain_text(plot: Callable[P, str]) -> Callable[P, str]:
    """Make ``plot`` draw every label as written: no mathtext.

    A class folder or metric named ``$\\notacommand{$`` would otherwise be parsed as
    LaTeX math, and fail the whole report (usetex=False does not turn mathtext off). The
    setting is read when a Text is made and when it is drawn: both happen inside ``plot``.
    """

    @functools.wraps(plot)
    def plain(*args: P.args, **kwargs: P.kwargs) -> str:
        with matplotlib.rc_context({"text.parse_math": False}):
            return plot(*args, **kwargs)

    return plain


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100)
    fig.set_layout_engine("constrained")
    return fig


# --------------------------------------------------------------------------- plots
def trend_metrics(record: dict[str, Any]) -> list[str]:
    """The metrics the trend shows: every gated one, then the main ones, once each."""
    wanted = [g["metric"] for g in record["gates"]]
    wanted += ["top1", "top1_agreement", "cosine_mean"]
    return [m for m in dict.fromkeys(wanted) if m in record["metrics"]][:8]


@_plain_text
def trend_plot(record: dict[str, Any], history: list[dict[str, Any]]) -> str:
    """One small panel per metric: its value at each evaluation, the gates drawn in."""
    names = trend_metrics(record)
    cols = 2 if len(names) > 1 else 1
    rows = max(1, -(-len(names) // cols))
    fig = _figure(9.5, 2.6 * rows)
    labels = [r["date"].strftime("%m-%d %H:%M") for r in history]
    colors = [_PASS if r.get("verdict") == "pass" else _FAIL for r in history]
    limits = [g for g in record["gates"] if g["limit"] is not None]
    for k, name in enumerate(names):
        ax = fig.add_subplot(rows, cols, k + 1)
        ax.set_gid(f"trend-{dom_id(name)}")
        x = np.arange(len(history))
        y = np.array([np.nan if r.get(name) is None else r[name] for r in history], float)
        ax.plot(x, y, color="#90a4ae", linewidth=1, zorder=1)
        line = ax.plot(x, y, linestyle="none", marker="o", markersize=5, color="#1565c0")[0]
        line.set_gid(f"trend-{dom_id(name)}-values")
        ax.scatter(x, y, c=colors, s=14, zorder=3)
        for g in limits:
            if g["metric"] != name:
                continue
            color, style, label = _GATE_STYLE[g["check"]]
            ax.axhline(g["limit"], color=color, linestyle=style, linewidth=1.2, label=label)
        ax.set_title(name, fontsize=10, loc="left")
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=7)
        ax.tick_params(axis="y", labelsize=8)
        # Plain values (0.99998), never an offset ("1e-5 + 9.999e-1") nobody can read.
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.6g}"))
        ax.grid(axis="y", alpha=0.3)
        if len(history) == 1:
            ax.set_xlim(-1, 1)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    return _svg(fig)


@_plain_text
def confusion_plot(record: dict[str, Any]) -> str:
    matrix = np.array(record["confusion"], dtype=float)
    n = len(matrix)
    size = min(9.0, 2.5 + 0.45 * n)
    fig = _figure(size, size * 0.85)
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
    return _svg(fig)


@_plain_text
def cores_plot(record: dict[str, Any]) -> str:
    """Per core: top-1 and agreement, 1 - mean cosine (log), throughput."""
    cores = record["per_core"]
    labels = [f"core {c['place']}" for c in cores]
    x = np.arange(len(cores))
    fig = _figure(10, 3.0)
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
    return _svg(fig)


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


# --------------------------------------------------------------------------- the page
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#263238;
background:#fafafa}
header{padding:18px 28px;color:#fff}
header.verdict-pass{background:#2e7d32} header.verdict-fail{background:#c62828}
header h1{margin:0 0 4px;font-size:24px} header p{margin:2px 0;opacity:.92}
main{padding:8px 28px 40px;max-width:1100px}
section{background:#fff;border:1px solid #e0e0e0;border-radius:6px;padding:10px 18px;margin:16px 0}
h2{font-size:17px;margin:6px 0 10px}
table{border-collapse:collapse;font-size:13px}
td,th{border-bottom:1px solid #eceff1;padding:3px 10px;text-align:left;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.FAIL{color:#c62828;font-weight:600} .pass{color:#2e7d32} .muted{color:#78909c}
svg{max-width:100%;height:auto}
.items{display:flex;flex-wrap:wrap;gap:10px}
.item{border:1px solid #e0e0e0;border-radius:4px;padding:6px;width:150px;font-size:12px}
.item img{display:block;width:96px;height:96px;object-fit:contain;image-rendering:pixelated;
background:#eceff1;margin-bottom:4px}
.item code{word-break:break-all}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _class_name(record: dict[str, Any], index: int | None) -> str:
    if index is None or index < 0:
        return "-"
    names = record["classes"]
    return names[index] if index < len(names) else str(index)


def _gates_table(record: dict[str, Any]) -> str:
    rows = []
    for g in record["gates"]:
        status = {True: "pass", False: "FAIL", None: "not checked"}[g["passed"]]
        op = "<=" if g["check"] == "max" else ">="
        limit = "-" if g["limit"] is None else f"{op} {fmt(g['limit'])}"
        rows.append(
            f"<tr><td>{_e(g['metric'])}</td><td>{_e(CHECK_WORDS[g['check']])}</td>"
            f"<td class=num>{_e(fmt(g['value']))}</td><td class=num>{_e(limit)}</td>"
            f"<td class='{status}'>{_e(status)}</td><td class=muted>{_e(g['note'])}</td></tr>"
        )
    head = "<tr><th>metric</th><th>check</th><th>value</th><th>limit</th><th></th><th></th></tr>"
    return f"<table id=gate-table>{head}{''.join(rows)}</table>"


def _item_cards(
    record: dict[str, Any], items: list[dict[str, Any]], pictures: Mapping[Source, Thumbnail]
) -> str:
    cards = []
    for item in items:
        thumbnail = pictures.get(picture_source(item))
        uri = thumbnail.uri if thumbnail else None
        picture = f"<img alt='{_e(item['id'])}' src='{_e(uri)}'>" if uri else ""
        lines = [f"<code>{_e(item['id'])}</code>"]
        if thumbnail is not None and thumbnail.note:
            lines.append(f"<span class=muted>no picture: {_e(thumbnail.note)}</span>")
        lines.append(f"label {_e(_class_name(record, item.get('label')))}")
        if "pred" in item:
            lines.append(f"device {_e(_class_name(record, item['pred']))}")
        if item.get("ref_pred") is not None:
            lines.append(f"reference {_e(_class_name(record, item['ref_pred']))}")
        if item.get("cosine") is not None:
            lines.append(f"cosine {item['cosine']:.5f}")
        if item.get("core") is not None and item["core"] >= 0:
            lines.append(f"core {_e(place_name(item.get('node'), item['core']))}")
        cards.append(f"<div class=item>{picture}{'<br>'.join(lines)}</div>")
    return f"<div class=items>{''.join(cards)}</div>" if cards else "<p class=muted>none</p>"


def no_baseline_html(record: dict[str, Any]) -> str:
    """The paragraph for an evaluation without a baseline (summary.no_baseline's words)."""
    advice = (
        "No baseline yet: accept an evaluation with "
        "<code>batchinfer eval JOB --update-baseline</code>."
    )
    words = no_baseline(record, lambda flag: f"<code>{_e(flag)}</code>", advice)
    return f"<p class=muted>{words}</p>"


def _flipped(record: dict[str, Any], pictures: Mapping[Source, Thumbnail]) -> str:
    flipped = record["flipped"]
    if flipped is None:
        return no_baseline_html(record)
    test = flipped["mcnemar"]
    base = record["baseline"] or {}
    parts = [
        f"<p>Against the baseline {_e(base.get('eval_id'))} (accepted by "
        f"{_e(base.get('accepted_by'))} at {_e(base.get('accepted_at'))}): "
        f"{len(flipped['lost'])} items lost, {len(flipped['gained'])} gained, of "
        f"{flipped['compared']} compared; McNemar p = {test['p_value']:.3g} "
        f"({_e(test['method'])}).</p>"
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
        rows.append("<tr>" + "".join(f"<td class=num>{_e(v)}</td>" for v in cells) + "</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _classes_table(record: dict[str, Any], limit: int = 40) -> str:
    """Per-class accuracy, worst first (all of them up to ``limit`` classes)."""
    classes = [c for c in record["per_class"] if c["items"]]
    classes.sort(key=lambda c: (c["top1"], c["class"]))
    outside = labels_outside(record)
    note = f"<p class=FAIL id=labels-outside>{_e(outside)}</p>" if outside else ""
    if len(classes) > limit:
        note += f"<p class=muted>The {limit} worst of {len(classes)} classes.</p>"
        classes = classes[:limit]
    head = "<tr><th>class</th><th>items</th><th>correct</th><th>errors</th><th>top-1</th></tr>"
    rows = "".join(
        f"<tr><td>{_e(c['name'])}</td><td class=num>{c['items']}</td>"
        f"<td class=num>{c['correct']}</td><td class=num>{c['errors']}</td>"
        f"<td class=num>{_e(fmt(c['top1']))}</td></tr>"
        for c in classes
    )
    return f"{note}<table id=class-table>{head}{rows}</table>"


def _metrics_table(record: dict[str, Any]) -> str:
    metrics = record["metrics"]
    names = [n for n in metrics if not n.startswith("reference.")]
    rows = "".join(
        f"<tr><td>{_e(n)}</td><td class=num>{_e(fmt(metrics[n]))}</td>"
        f"<td class=num>{_e(fmt(metrics.get('reference.' + n)))}</td></tr>"
        for n in names
    )
    return f"<table><tr><th>metric</th><th>device</th><th>reference</th></tr>{rows}</table>"


def _facts(record: dict[str, Any]) -> str:
    device, reference = record["device"], record["reference"]
    rows = [
        ("job file", f"{record['job_file']} (sha256 {record['job_sha256'][:12]})"),
        ("device model", f"{device['model']} (sha256 {device['model_sha256']})"),
        (
            "backend",
            f"{device['backend']}, cores {device['cores']}{on_cluster(device)}, "
            f"{device['instances_per_core']} instance(s) per core",
        ),
        ("runtime / driver", f"{device['runtime_version']} / {device['driver_version']}"),
        (
            "dataset",
            f"{record['dataset']['path']}: {record['dataset']['evaluated']} items "
            f"({record['dataset']['labelled']} labelled); classes from "
            f"{record['class_map']['source']}",
        ),
        ("per-item results", record["items_file"]),
    ]
    if reference:
        cached = " (from the cache)" if reference["cached"] else ""
        rows.insert(2, ("reference", f"{reference['model']} on {reference['backend']}{cached}"))
    rows.append(("host", record["host"].get("node", "-")))
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    warnings = "".join(f"<li>{_e(w)}</li>" for w in device["warnings"])
    errors = "".join(
        f"<li><code>{_e(e['id'])}</code>: {_e(e['error'])}</li>" for e in record["errors"][:20]
    )
    out = f"<table>{body}</table>"
    if warnings:
        out += f"<h3>warnings</h3><ul>{warnings}</ul>"
    if errors:
        out += f"<h3>item errors ({len(record['errors'])} listed)</h3><ul>{errors}</ul>"
    return out


def html_report(
    record: dict[str, Any],
    history: list[dict[str, Any]],
    pictures: Mapping[Source, Thumbnail] | None = None,
) -> str:
    """The report page for ``record`` (an evaluation's result.json) and the job's history.

    ``pictures``: the items' pictures by where they are (:func:`shown_items`; made by
    :func:`~batchinfer.evaluate.thumbnails.make_thumbnails`: the page never opens an item).
    """
    pictures = pictures or {}
    verdict = record["verdict"]
    device = record["device"]
    failed = [g for g in record["gates"] if g["passed"] is False]
    headline = (
        "every gate passed"
        if not failed
        else f"{len(failed)} gate(s) failed: "
        + "; ".join(f"{g['metric']} {CHECK_WORDS[g['check']]}" for g in failed)
    )
    emulated = (
        "<p>Throughput figures come from the emulated NPU (sim): they are not a board's.</p>"
        if device["backend"] == "sim"
        else ""
    )
    sections = [
        ("gates", "Gates", f"<p>{_e(headline)}</p>{_gates_table(record)}"),
        (
            "trend",
            f"Trend over {len(history)} evaluation(s)",
            "<p class=muted>Points: green passed, red failed. Lines: the gates' current "
            f"limits.</p>{trend_plot(record, history)}",
        ),
        ("confusion", "Confusion matrix", confusion_plot(record)),
        ("classes", "Per class", _classes_table(record)),
        ("cores", "Per core", emulated + cores_plot(record) + _cores_table(record)),
        (
            "worst",
            "Worst items",
            "<p class=muted>"
            + (
                "Disagreements with the reference first, then the lowest output cosine."
                if record["reference"]
                else "The most confident mistakes."
            )
            + "</p>"
            + _item_cards(record, record["worst"], pictures),
        ),
        ("flipped", "Flipped since the baseline", _flipped(record, pictures)),
        ("metrics", "Every metric", _metrics_table(record)),
        ("facts", "Run", _facts(record)),
    ]
    body = "".join(
        f"<section id={sid}><h2>{_e(title)}</h2>{content}</section>"
        for sid, title, content in sections
    )
    title = f"{record['job']}: {verdict.upper()}"
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8>{REPORT_MARK}"
        "<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; "
        "img-src data:; style-src 'unsafe-inline'\">"
        "<meta name=viewport content='width=device-width,initial-scale=1'>"
        f"<title>{_e(title)} · batchinfer eval {_e(record['eval_id'])}</title>"
        f"<style>{_CSS}</style></head><body>"
        f"<header class=verdict-{verdict}><h1>{_e(title)}</h1>"
        f"<p>{_e(Path(device['model']).name)} on {_e(device['backend'])} · "
        f"{record['dataset']['evaluated']} items · evaluation {_e(record['eval_id'])}"
        f"</p><p>{_e(headline)}</p></header>"
        f"<main>{body}</main></body></html>\n"
    )
