"""The short Markdown summary of an evaluation, for CI logs and chat (``summary.md``).

Every name (job, model, item, metric) and message is data: code spans and escapes from
:mod:`batchinfer.evaluate.markdown`, so none can break out into markup or a table.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchinfer.evaluate.baseline import ACCEPTED
from batchinfer.evaluate.gates import CHECK_WORDS, fmt
from batchinfer.evaluate.markdown import code, name, text
from batchinfer.evaluate.outside import Outside

#: Metrics the summary shows when computed (every gated metric is shown too).
KEY_METRICS = (
    "top1",
    "top5",
    "class_top1_min",
    "errors",
    "top1_agreement",
    "cosine_mean",
    "cosine_min",
    "core_cosine_min",
    "mcnemar_p",
    "items_per_s",
)
_SHOW_IDS = 10
ACCEPT_ONE = "No baseline yet: accept this evaluation with `--update-baseline`."


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def _ids(ids: list[str]) -> str:
    shown = ", ".join(code(i) for i in ids[:_SHOW_IDS])
    return shown + (f" and {len(ids) - _SHOW_IDS} more" if len(ids) > _SHOW_IDS else "")


def on_cluster(device: dict[str, Any]) -> str:
    """`` of 3 Ray nodes (node0, node1, node2)`` for a device side run on a cluster, else ''."""
    cluster = device.get("cluster")
    if not cluster:
        return ""
    names = [n["name"] for n in cluster["nodes"]]
    return f" of {len(names)} Ray nodes ({', '.join(names)})"


def labels_outside(record: dict[str, Any]) -> str:
    """The sentence on labels outside the model's classes ('' when none; records written
    before it was kept have none)."""
    outside = record.get("labels_outside")
    return Outside(**outside).sentence() if outside else ""


def no_baseline(record: dict[str, Any], command: Callable[[str], str], advice: str) -> str:
    """The sentence for an evaluation with no baseline to compare with: on the night
    ``--update-baseline`` accepted it, that it is the baseline now; else ``advice`` (how to
    accept one). ``command`` marks a flag up (a Markdown code span, an HTML ``<code>``)."""
    if record.get(ACCEPTED):
        return (
            f"No baseline before this evaluation: {command('--update-baseline')} accepted it "
            "as the baseline, so the next evaluation is compared with it."
        )
    return advice


def markdown_summary(record: dict[str, Any], report: Path | None) -> str:
    """A few lines of Markdown: verdict, every gate, key metrics, per core, flips, warnings."""
    device, reference = record["device"], record["reference"]
    metrics = record["metrics"]
    lines = [f"### batchinfer eval {code(record['job'])}: {record['verdict'].upper()}", ""]
    facts = (
        f"{code(Path(device['model']).name)} (sha256 `{device['model_sha256'][:12]}`) on "
        f"{text(device['backend'])}, cores {','.join(map(str, device['cores']))}"
        f"{text(on_cluster(device))}; "
        f"{record['dataset']['evaluated']} items, {fmt(metrics.get('errors', 0))} errors"
    )
    if reference:
        cached = ", cached" if reference["cached"] else ""
        ref_model = code(Path(reference["model"]).name)
        facts += f"; reference {ref_model} on {text(reference['backend'])}{cached}"
    if device["backend"] == "sim":
        facts += " (emulated NPU: throughput is the emulator's, not a board's)"
    lines += [facts + f"; evaluation {record['eval_id']}.", ""]

    lines += ["| gate | value | limit | result |", "|---|---|---|---|"]
    for g in record["gates"]:
        op = "<=" if g["check"] == "max" else ">="
        limit = "-" if g["limit"] is None else f"{op} {fmt(g['limit'])}"
        check = CHECK_WORDS[g["check"]]
        note = f": {text(g['note'])}" if g["note"] else ""
        result = {True: "pass", False: "**FAIL**", None: "not checked"}[g["passed"]]
        metric = name(g["metric"], cell=True)
        lines.append(f"| {metric} {check} | {fmt(g['value'])} | {limit} | {result}{note} |")
    gated = [g["metric"] for g in record["gates"]]
    shown = [m for m in dict.fromkeys([*KEY_METRICS, *gated]) if m in metrics]
    lines += ["", "| metric | value | reference |", "|---|---|---|"]
    for metric in shown:
        value, ref = fmt(metrics[metric]), fmt(metrics.get("reference." + metric))
        lines.append(f"| {name(metric, cell=True)} | {value} | {ref} |")

    if record["per_core"]:
        lines += ["", "| core | items | errors | top-1 | agreement | cosine | items/s |"]
        lines.append("|---|---|---|---|---|---|---|")
        for c in record["per_core"]:
            cos = "-" if c["cosine_mean"] is None else f"{c['cosine_mean']:.6f}"
            lines.append(
                f"| {text(c['place'])} | {c['items']} | {c['errors']} | {_pct(c['top1'])} | "
                f"{_pct(c['agreement'])} | {cos} | {fmt(c['items_per_s'])} |"
            )
    flipped = record["flipped"]
    lines.append("")
    if flipped is None:
        lines.append(no_baseline(record, code, ACCEPT_ONE))
    else:
        test = flipped["mcnemar"]
        base = record["baseline"] or {}
        lines.append(
            f"Since the baseline ({text(base.get('eval_id'))}, accepted by "
            f"{text(base.get('accepted_by'))}): "
            f"{len(flipped['lost'])} items lost, {len(flipped['gained'])} gained of "
            f"{flipped['compared']}; McNemar p = {test['p_value']:.3g} ({test['method']})."
        )
        if flipped["lost"]:
            lines.append(f"Lost: {_ids(flipped['lost'])}.")
        if flipped["gained"]:
            lines.append(f"Gained: {_ids(flipped['gained'])}.")
    for warning in device["warnings"]:
        lines.append(f"Warning: {text(warning)}")
    outside = labels_outside(record)
    if outside:
        lines.append(f"Warning: {text(outside)}")
    if record["errors"]:
        first = record["errors"][0]
        lines.append(f"Item errors, first: {code(first['id'])}: {text(first['error'])}")
    if report is not None:
        lines.append(f"Report: {code(report)}")
    return "\n".join(lines) + "\n"
