"""The Markdown summary of a detection evaluation (``summary.md``, printed by ``eval``).

Apart from detection_report.py, which draws the HTML page, so that an environment without
matplotlib (the ``toolkit`` one) still gets its summary, as a classification job does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchinfer.evaluate.gates import CHECK_WORDS, fmt
from batchinfer.evaluate.markdown import code, name, text
from batchinfer.evaluate.summary import ACCEPT_ONE, no_baseline, on_cluster


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _bootstrap_line(result: dict[str, Any], a: str, b: str) -> str:
    return (
        f"{result['metric']}: {a} {result['a']:.4f}, {b} {result['b']:.4f}, difference "
        f"{result['difference']:+.4f} ({100 * result['level']:g} % interval "
        f"{result['low']:+.4f} to {result['high']:+.4f}; p = {result['p_value']:.3g}; "
        f"{result['resamples']} resamples of {result['images']} images, seed {result['seed']})"
    )


# --------------------------------------------------------------------------- the summary
#: Metrics the summary shows when computed (every gated metric is shown too).
KEY_METRICS = (
    "map50_95",
    "map50",
    "map75",
    "errors",
    "map_drop",
    "map_drop_p",
    "box_disagreement_mean",
    "core_map_min",
    "map_bootstrap_p",
    "unmatched_items",
    "unknown_images",
    "items_per_s",
)


def detection_summary(record: dict[str, Any], report: Path | None) -> str:
    """A few lines of Markdown: verdict, gates, key metrics, per core, comparisons."""
    device, reference = record["device"], record["reference"]
    metrics = record["metrics"]
    gt = record["ground_truth"]
    # Names (job, files, items, messages) are data: markdown.py keeps them from opening a
    # span, a tag or a cell, as in the classification summary.
    lines = [f"### batchinfer eval {code(record['job'])} (detection): {record['verdict'].upper()}"]
    lines.append("")
    facts = (
        f"{code(Path(device['model']).name)} (sha256 `{device['model_sha256'][:12]}`) on "
        f"{text(device['backend'])}, cores {','.join(map(str, device['cores']))}"
        f"{text(on_cluster(device))}; "
        f"{record['dataset']['evaluated']} items, {gt['images']} scored against "
        f"{gt['annotations']} boxes, {fmt(metrics.get('errors', 0))} errors"
    )
    if reference:
        cached = ", cached" if reference["cached"] else ""
        ref_model = code(Path(reference["model"]).name)
        facts += f"; reference {ref_model} on {text(reference['backend'])}{cached}"
    if device["backend"] == "sim":
        facts += " (emulated NPU: throughput is the emulator's, not a board's)"
    lines += [facts + f"; evaluation {record['eval_id']}.", ""]
    if gt["unmatched_items"] or gt["unknown_images"]:
        lines += [
            f"Ground truth: {gt['unmatched_items']} dataset images have no entry (not scored), "
            f"{gt['unknown_images']} ground-truth images are not in the dataset.",
            "",
        ]
    lines += ["| gate | value | limit | result |", "|---|---|---|---|"]
    for g in record["gates"]:
        op = "<=" if g["check"] == "max" else ">="
        limit = "-" if g["limit"] is None else f"{op} {fmt(g['limit'])}"
        note = f": {text(g['note'])}" if g["note"] else ""
        result = {True: "pass", False: "**FAIL**", None: "not checked"}[g["passed"]]
        lines.append(
            f"| {name(g['metric'], cell=True)} {CHECK_WORDS[g['check']]} | {fmt(g['value'])} | "
            f"{limit} | "
            f"{result}{note} |"
        )
    gated = [g["metric"] for g in record["gates"]]
    shown = [m for m in dict.fromkeys([*KEY_METRICS, *gated]) if m in metrics]
    lines += ["", "| metric | value | reference |", "|---|---|---|"]
    for metric in shown:
        ref = fmt(metrics.get("reference." + metric))
        lines.append(f"| {name(metric, cell=True)} | {fmt(metrics[metric])} | {ref} |")
    if record["per_core"]:
        lines += ["", "| core | items | errors | mAP50:95 | reference | disagreement | items/s |"]
        lines.append("|---|---|---|---|---|---|---|")
        for c in record["per_core"]:
            lines.append(
                f"| {text(c['place'])} | {c['items']} | {c['errors']} | {_pct(c['map50_95'])} | "
                f"{_pct(c['reference_map50_95'])} | {_pct(c['disagreement_mean'])} | "
                f"{fmt(c['items_per_s'])} |"
            )
    lines.append("")
    if record["vs_reference"]:
        lines.append(
            "Against the reference: " + _bootstrap_line(
                record["vs_reference"]["map50_95"], "device", "reference") + "."
        )  # fmt: skip
    base = record["vs_baseline"]
    if base is None:
        lines.append(no_baseline(record, code, ACCEPT_ONE))
    else:
        info = record["baseline"] or {}
        lines.append(
            f"Since the baseline ({text(info.get('eval_id'))}, accepted by "
            f"{text(info.get('accepted_by'))}), "
            f"on {base['compared']} images: "
            + _bootstrap_line(base["map50_95"], "now", "baseline") + "."
        )  # fmt: skip
    for warning in device["warnings"]:
        lines.append(f"Warning: {text(warning)}")
    if record["errors"]:
        first = record["errors"][0]
        lines.append(f"Item errors, first: {code(first['id'])}: {text(first['error'])}")
    if report is not None:
        lines.append(f"Report: {code(report)}")
    return "\n".join(lines) + "\n"


__all__ = ["KEY_METRICS", "detection_summary"]
