"""The detection lines of the Markdown summary (``summary.md``; evaluate/summary.py holds the
frame): the ground truth's matching, per core, the comparisons with the reference and the
baseline. Apart from instances_report.py, which draws the HTML page, so that an
environment without matplotlib (the ``toolkit`` one) still gets its summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batchinfer.evaluate.markdown import code, text
from batchinfer.evaluate.summary import ACCEPT_ONE, core_table, no_baseline

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


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def bootstrap_line(result: Mapping[str, Any], a: str, b: str) -> str:
    return (
        f"{result['metric']}: {a} {result['a']:.4f}, {b} {result['b']:.4f}, difference "
        f"{result['difference']:+.4f} ({100 * result['level']:g} % interval "
        f"{result['low']:+.4f} to {result['high']:+.4f}; p = {result['p_value']:.3g}; "
        f"{result['resamples']} resamples of {result['images']} images, seed {result['seed']})"
    )


def items_phrase(record: Mapping[str, Any]) -> str:
    gt = record["ground_truth"]
    return (
        f"{record['dataset']['evaluated']} items, {gt['images']} scored against "
        f"{gt['annotations']} boxes"
    )


def intro(record: Mapping[str, Any]) -> list[str]:
    """How the ground truth matched the dataset, when not every image did."""
    gt = record["ground_truth"]
    if not (gt["unmatched_items"] or gt["unknown_images"]):
        return []
    return [
        f"Ground truth: {gt['unmatched_items']} dataset images have no entry (not scored), "
        f"{gt['unknown_images']} ground-truth images are not in the dataset.",
        "",
    ]


def body(record: Mapping[str, Any]) -> list[str]:
    """Per core, then the comparisons with the reference and the baseline."""
    lines = core_table(
        record["per_core"],
        (
            ("mAP50:95", lambda c: pct(c["map50_95"])),
            ("reference", lambda c: pct(c["reference_map50_95"])),
            ("disagreement", lambda c: pct(c["disagreement_mean"])),
        ),
    )
    lines.append("")
    if record["vs_reference"]:
        line = bootstrap_line(record["vs_reference"]["map50_95"], "device", "reference")
        lines.append(f"Against the reference: {line}.")
    base = record["vs_baseline"]
    if base is None:
        lines.append(no_baseline(record, code, ACCEPT_ONE))
    else:
        info = record["baseline"] or {}
        lines.append(
            f"Since the baseline ({text(info.get('eval_id'))}, accepted by "
            f"{text(info.get('accepted_by'))}), on {base['compared']} images: "
            + bootstrap_line(base["map50_95"], "now", "baseline")
            + "."
        )
    return lines


__all__ = ["KEY_METRICS", "body", "bootstrap_line", "intro", "items_phrase", "pct"]
