"""The HTML report: one self-contained page (plots inline as SVG, images as data: URIs).

The frame, the same for every task: the verdict and every gate; metric trends over this
job's past evaluations with the gates' current limits drawn in; then the task's sections
(its scorer's, evaluate/scoring.py: classification's confusion matrix, per class, per core,
worst and flipped items; detection's AP per class, precision-recall, per core, images,
comparisons, ground truth); every metric; the run's facts and warnings. The page loads
nothing: its Content-Security-Policy allows only inline styles and data: images, so a stray
link would show as a console error in the browser test. Plots are made with matplotlib
(the ``report`` extra) without pyplot, so no global state or display is touched.

Names are data: every one is HTML-escaped, and plots draw text without mathtext. The page
never opens a dataset item: its pictures come in ready-made (the scorer's ``shown_items``
says which; batchinfer.evaluate.thumbnails makes them under the decode timeout).

Plots carry ids for tests and for anyone scripting the page: ``trend-<metric>`` (one
marker per evaluation in ``trend-<metric>-values``), and the task's own (scorers/).
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from importlib import import_module
from pathlib import Path
from typing import Any

import matplotlib  # noqa: F401 - the report needs it: an ImportError here means no report
import numpy as np
from matplotlib.ticker import FuncFormatter

from batchinfer.evaluate.files import REPORT_MARK
from batchinfer.evaluate.gates import CHECK_WORDS, fmt
from batchinfer.evaluate.plots import FAIL_COLOR, PASS_COLOR, dom_id, figure, plain_text, svg
from batchinfer.evaluate.summary import no_baseline, on_cluster
from batchinfer.evaluate.thumbnails import Source, Thumbnail

_GATE_STYLE = {
    "min": ("#c62828", "--", "floor"),
    "max": ("#c62828", "--", "ceiling"),
    "max_drop": ("#ef6c00", ":", "baseline - max drop"),
    "min_ratio_to_reference": ("#6a1b9a", "-.", "ratio x reference"),
}


# --------------------------------------------------------------------------- plots
def trend_metrics(record: dict[str, Any], main: tuple[str, ...] = ()) -> list[str]:
    """The metrics the trend shows: every gated one, then the ``main`` ones, once each."""
    wanted = [g["metric"] for g in record["gates"]]
    wanted += main
    return [m for m in dict.fromkeys(wanted) if m in record["metrics"]][:8]


@plain_text
def trend_plot(
    record: dict[str, Any], history: list[dict[str, Any]], main: tuple[str, ...] = ()
) -> str:
    """One small panel per metric: its value at each evaluation, the gates drawn in."""
    names = trend_metrics(record, main)
    cols = 2 if len(names) > 1 else 1
    rows = max(1, -(-len(names) // cols))
    fig = figure(9.5, 2.6 * rows)
    labels = [r["date"].strftime("%m-%d %H:%M") for r in history]
    colors = [PASS_COLOR if r.get("verdict") == "pass" else FAIL_COLOR for r in history]
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
    return svg(fig)


# --------------------------------------------------------------------------- the page
CSS = """
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


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def gates_table(record: dict[str, Any]) -> str:
    rows = []
    for g in record["gates"]:
        status = {True: "pass", False: "FAIL", None: "not checked"}[g["passed"]]
        op = "<=" if g["check"] == "max" else ">="
        limit = "-" if g["limit"] is None else f"{op} {fmt(g['limit'])}"
        rows.append(
            f"<tr><td>{esc(g['metric'])}</td><td>{esc(CHECK_WORDS[g['check']])}</td>"
            f"<td class=num>{esc(fmt(g['value']))}</td><td class=num>{esc(limit)}</td>"
            f"<td class='{status}'>{esc(status)}</td><td class=muted>{esc(g['note'])}</td></tr>"
        )
    head = "<tr><th>metric</th><th>check</th><th>value</th><th>limit</th><th></th><th></th></tr>"
    return f"<table id=gate-table>{head}{''.join(rows)}</table>"


def no_baseline_html(record: dict[str, Any]) -> str:
    """The paragraph for an evaluation without a baseline (summary.no_baseline's words)."""
    advice = (
        "No baseline yet: accept an evaluation with "
        "<code>batchinfer eval JOB --update-baseline</code>."
    )
    words = no_baseline(record, lambda flag: f"<code>{esc(flag)}</code>", advice)
    return f"<p class=muted>{words}</p>"


def metrics_table(record: dict[str, Any]) -> str:
    metrics = record["metrics"]
    names = [n for n in metrics if not n.startswith("reference.")]
    rows = "".join(
        f"<tr><td>{esc(n)}</td><td class=num>{esc(fmt(metrics[n]))}</td>"
        f"<td class=num>{esc(fmt(metrics.get('reference.' + n)))}</td></tr>"
        for n in names
    )
    return f"<table><tr><th>metric</th><th>device</th><th>reference</th></tr>{rows}</table>"


def facts_table(record: dict[str, Any]) -> str:
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
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    warnings = "".join(f"<li>{esc(w)}</li>" for w in device["warnings"])
    errors = "".join(
        f"<li><code>{esc(e['id'])}</code>: {esc(e['error'])}</li>" for e in record["errors"][:20]
    )
    out = f"<table>{body}</table>"
    if warnings:
        out += f"<h3>warnings</h3><ul>{warnings}</ul>"
    if errors:
        out += f"<h3>item errors ({len(record['errors'])} listed)</h3><ul>{errors}</ul>"
    return out


def emulated_note(record: dict[str, Any]) -> str:
    """The paragraph saying that throughput comes from the emulator ('' on a board)."""
    if record["device"]["backend"] != "sim":
        return ""
    return "<p>Throughput figures come from the emulated NPU (sim): they are not a board's.</p>"


def html_report(
    record: dict[str, Any],
    history: list[dict[str, Any]],
    pictures: Mapping[Source, Thumbnail] | None,
    scorer: Any,
) -> str:
    """The report page for ``record`` (an evaluation's result.json) and the job's history.

    ``scorer``: the record's :class:`~batchinfer.evaluate.scoring.Scorer` (its class will
    do; typed Any: the scorers import this module): its ``report`` module gives the task's
    sections.
    ``pictures``: the items' pictures by where they are (its ``shown_items``; made by
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
    trend = trend_plot(record, history, scorer.report_trend())
    sections = [
        ("gates", "Gates", f"<p>{esc(headline)}</p>{gates_table(record)}"),
        (
            "trend",
            f"Trend over {len(history)} evaluation(s)",
            "<p class=muted>Points: green passed, red failed. Lines: the gates' current "
            f"limits.</p>{trend}",
        ),
        *import_module(scorer.report).sections(record, pictures),
        ("metrics", "Every metric", metrics_table(record)),
        ("facts", "Run", facts_table(record)),
    ]
    body = "".join(
        f"<section id={sid}><h2>{esc(title)}</h2>{content}</section>"
        for sid, title, content in sections
    )
    title = f"{record['job']}: {verdict.upper()}"
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8>{REPORT_MARK}"
        "<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; "
        "img-src data:; style-src 'unsafe-inline'\">"
        "<meta name=viewport content='width=device-width,initial-scale=1'>"
        f"<title>{esc(title)} · batchinfer eval {esc(record['eval_id'])}</title>"
        f"<style>{CSS}{scorer.report_css()}</style></head><body>"
        f"<header class=verdict-{verdict}><h1>{esc(title)}</h1>"
        f"<p>{esc(Path(device['model']).name)} on {esc(device['backend'])} · "
        f"{scorer.report_items(record)} · evaluation {esc(record['eval_id'])}"
        f"</p><p>{esc(headline)}</p></header>"
        f"<main>{body}</main></body></html>\n"
    )


__all__ = [
    "CSS",
    "emulated_note",
    "esc",
    "facts_table",
    "gates_table",
    "html_report",
    "metrics_table",
    "no_baseline_html",
    "trend_metrics",
    "trend_plot",
]
