"""The short Markdown summary of an evaluation, for CI logs and chat (``summary.md``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchinfer.evaluate.gates import CHECK_WORDS, fmt

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


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def _ids(ids: list[str]) -> str:
    shown = ", ".join(f"`{i}`" for i in ids[:_SHOW_IDS])
    return shown + (f" and {len(ids) - _SHOW_IDS} more" if len(ids) > _SHOW_IDS else "")


def on_cluster(device: dict[str, Any]) -> str:
    """`` of 3 Ray nodes (node0, node1, node2)`` for a device side run on a cluster, else ''."""
    cluster = device.get("cluster")
    if not cluster:
        return ""
    names = [n["name"] for n in cluster["nodes"]]
    return f" of {len(names)} Ray nodes ({', '.join(names)})"


def markdown_summary(record: dict[str, Any], report: Path | None) -> str:
    """A few lines of Markdown: verdict, every gate, key metrics, per core, flips, warnings."""
    device, reference = record["device"], record["reference"]
    metrics = record["metrics"]
    lines = [f"### batchinfer eval `{record['job']}`: {record['verdict'].upper()}", ""]
    facts = (
        f"`{Path(device['model']).name}` (sha256 `{device['model_sha256'][:12]}`) on "
        f"{device['backend']}, cores {','.join(map(str, device['cores']))}{on_cluster(device)}; "
        f"{record['dataset']['evaluated']} items, {fmt(metrics.get('errors', 0))} errors"
    )
    if reference:
        cached = ", cached" if reference["cached"] else ""
        facts += f"; reference `{Path(reference['model']).name}` on {reference['backend']}{cached}"
    if device["backend"] == "sim":
        facts += " (emulated NPU: throughput is the emulator's, not a board's)"
    lines += [facts + f"; evaluation {record['eval_id']}.", ""]

    lines += ["| gate | value | limit | result |", "|---|---|---|---|"]
    for g in record["gates"]:
        op = "<=" if g["check"] == "max" else ">="
        limit = "-" if g["limit"] is None else f"{op} {fmt(g['limit'])}"
        check = CHECK_WORDS[g["check"]]
        note = f": {g['note']}" if g["note"] else ""
        result = {True: "pass", False: "**FAIL**", None: "not checked"}[g["passed"]]
        lines.append(f"| {g['metric']} {check} | {fmt(g['value'])} | {limit} | {result}{note} |")
    gated = [g["metric"] for g in record["gates"]]
    shown = [m for m in dict.fromkeys([*KEY_METRICS, *gated]) if m in metrics]
    lines += ["", "| metric | value | reference |", "|---|---|---|"]
    for name in shown:
        lines.append(f"| {name} | {fmt(metrics[name])} | {fmt(metrics.get('reference.' + name))} |")

    if record["per_core"]:
        lines += ["", "| core | items | errors | top-1 | agreement | cosine | items/s |"]
        lines.append("|---|---|---|---|---|---|---|")
        for c in record["per_core"]:
            cos = "-" if c["cosine_mean"] is None else f"{c['cosine_mean']:.6f}"
            lines.append(
                f"| {c['place']} | {c['items']} | {c['errors']} | {_pct(c['top1'])} | "
                f"{_pct(c['agreement'])} | {cos} | {fmt(c['items_per_s'])} |"
            )
    flipped = record["flipped"]
    lines.append("")
    if flipped is None:
        lines.append("No baseline yet: accept this evaluation with `--update-baseline`.")
    else:
        test = flipped["mcnemar"]
        base = record["baseline"] or {}
        lines.append(
            f"Since the baseline ({base.get('eval_id')}, accepted by {base.get('accepted_by')}): "
            f"{len(flipped['lost'])} items lost, {len(flipped['gained'])} gained of "
            f"{flipped['compared']}; McNemar p = {test['p_value']:.3g} ({test['method']})."
        )
        if flipped["lost"]:
            lines.append(f"Lost: {_ids(flipped['lost'])}.")
        if flipped["gained"]:
            lines.append(f"Gained: {_ids(flipped['gained'])}.")
    for warning in device["warnings"]:
        lines.append(f"Warning: {warning}")
    if record["errors"]:
        first = record["errors"][0]
        lines.append(f"Item errors, first: `{first['id']}`: {first['error']}")
    if report is not None:
        lines.append(f"Report: {report}")
    return "\n".join(lines) + "\n"
