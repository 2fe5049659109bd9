"""The Markdown summary of a detection evaluation (``summary.md``, printed by ``eval``).

Apart from detection_report.py, which draws the HTML page, so that an environment without
matplotlib (the ``toolkit`` one) still gets its summary, as a classification job does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchinfer.evaluate.gates import CHECK_WORDS, fmt
from batchinfer.evaluate.summary import on_cluster


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
    lines = [f"### batchinfer eval `{record['job']}` (detection): {record['verdict'].upper()}", ""]
    facts = (
        f"`{Path(device['model']).name}` (sha256 `{device['model_sha256'][:12]}`) on "
        f"{device['backend']}, cores {','.join(map(str, device['cores']))}{on_cluster(device)}; "
        f"{record['dataset']['evaluated']} items, {gt['images']} scored against "
        f"{gt['annotations']} boxes, {fmt(metrics.get('errors', 0))} errors"
    )
    if reference:
        cached = ", cached" if reference["cached"] else ""
        facts += f"; reference `{Path(reference['model']).name}` on {reference['backend']}{cached}"
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
        note = f": {g['note']}" if g["note"] else ""
        result = {True: "pass", False: "**FAIL**", None: "not checked"}[g["passed"]]
        lines.append(
            f"| {g['metric']} {CHECK_WORDS[g['check']]} | {fmt(g['value'])} | {limit} | "
            f"{result}{note} |"
        )
    gated = [g["metric"] for g in record["gates"]]
    shown = [m for m in dict.fromkeys([*KEY_METRICS, *gated]) if m in metrics]
    lines += ["", "| metric | value | reference |", "|---|---|---|"]
    for name in shown:
        lines.append(f"| {name} | {fmt(metrics[name])} | {fmt(metrics.get('reference.' + name))} |")
    if record["per_core"]:
        lines += ["", "| core | items | errors | mAP50:95 | reference | disagreement | items/s |"]
        lines.append("|---|---|---|---|---|---|---|")
        for c in record["per_core"]:
            lines.append(
                f"| {c['place']} | {c['items']} | {c['errors']} | {_pct(c['map50_95'])} | "
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
        lines.append("No baseline yet: accept this evaluation with `--update-baseline`.")
    else:
        info = record["baseline"] or {}
        lines.append(
            f"Since the baseline ({info.get('eval_id')}, accepted by {info.get('accepted_by')}), "
            f"on {base['compared']} images: "
            + _bootstrap_line(base["map50_95"], "now", "baseline") + "."
        )  # fmt: skip
    for warning in device["warnings"]:
        lines.append(f"Warning: {warning}")
    if record["errors"]:
        first = record["errors"][0]
        lines.append(f"Item errors, first: `{first['id']}`: {first['error']}")
    if report is not None:
        lines.append(f"Report: {report}")
    return "\n".join(lines) + "\n"


__all__ = ["KEY_METRICS", "detection_summary"]
