"""The short Markdown summary of an evaluation, for CI logs and chat (``summary.md``): its
frame, the same for every task, and the helpers the scorers' lines use. What lies between
the metrics and the warnings is the scorer's (evaluate/scoring.py); nothing here needs
matplotlib, so an environment without it (the toolkit's) still gets its summary.

Every name (job, model, item, metric) and message is data: code spans and escapes from
:mod:`batchinfer.evaluate.markdown`, so none can break out into markup or a table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from batchinfer.evaluate.baseline import ACCEPTED
from batchinfer.evaluate.gates import CHECK_WORDS, fmt
from batchinfer.evaluate.markdown import code, name, text
from batchinfer.evaluate.outside import Outside

_SHOW_IDS = 10
ACCEPT_ONE = "No baseline yet: accept this evaluation with `--update-baseline`."


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def ids_text(ids: list[str]) -> str:
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


def no_baseline(record: Mapping[str, Any], command: Callable[[str], str], advice: str) -> str:
    """The sentence for an evaluation with no baseline to compare with: on the night
    ``--update-baseline`` accepted it, that it is the baseline now; else ``advice`` (how to
    accept one). ``command`` marks a flag up (a Markdown code span, an HTML ``<code>``)."""
    if record.get(ACCEPTED):
        return (
            f"No baseline before this evaluation: {command('--update-baseline')} accepted it "
            "as the baseline, so the next evaluation is compared with it."
        )
    return advice


def core_table(
    cores: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, Callable[[Any], str]]]
) -> list[str]:
    """The per-core table (none without cores): where, items, errors, the task's
    ``columns`` (header, how a core's row shows), items/s; a blank line first."""
    if not cores:
        return []
    head = ["core", "items", "errors", *(h for h, _ in columns), "items/s"]
    lines = ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cores:
        cells = [text(c["place"]), str(c["items"]), str(c["errors"])]
        cells += [show(c) for _, show in columns] + [fmt(c["items_per_s"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown_summary(record: dict[str, Any], report: Path | None, scorer: Any) -> str:
    """A few lines of Markdown: verdict, every gate, key metrics, then the task's lines
    (``scorer``'s, a :class:`~batchinfer.evaluate.scoring.Scorer`, its class will do: per
    core, comparisons), warnings, the first item error. (Typed Any: the scorers import
    this module's helpers, and an import circle is refused even under TYPE_CHECKING.)"""
    device, reference = record["device"], record["reference"]
    metrics = record["metrics"]
    title = f"batchinfer eval {code(record['job'])}{scorer.summary_title(record)}"
    lines = [f"### {title}: {record['verdict'].upper()}", ""]
    facts = (
        f"{code(Path(device['model']).name)} (sha256 `{device['model_sha256'][:12]}`) on "
        f"{text(device['backend'])}, cores {','.join(map(str, device['cores']))}"
        f"{text(on_cluster(device))}; "
        f"{scorer.summary_items(record)}, {fmt(metrics.get('errors', 0))} errors"
    )
    if reference:
        cached = ", cached" if reference["cached"] else ""
        ref_model = code(Path(reference["model"]).name)
        facts += f"; reference {ref_model} on {text(reference['backend'])}{cached}"
    if device["backend"] == "sim":
        facts += " (emulated NPU: throughput is the emulator's, not a board's)"
    lines += [facts + f"; evaluation {record['eval_id']}.", ""]
    lines += scorer.summary_intro(record)

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
    shown = [m for m in dict.fromkeys([*scorer.summary_metrics(), *gated]) if m in metrics]
    lines += ["", "| metric | value | reference |", "|---|---|---|"]
    for metric in shown:
        value, ref = fmt(metrics[metric]), fmt(metrics.get("reference." + metric))
        lines.append(f"| {name(metric, cell=True)} | {value} | {ref} |")

    lines += scorer.summary_body(record)
    for warning in device["warnings"]:
        lines.append(f"Warning: {text(warning)}")
    lines += [f"Warning: {text(w)}" for w in scorer.summary_warnings(record)]
    if record["errors"]:
        first = record["errors"][0]
        lines.append(f"Item errors, first: {code(first['id'])}: {text(first['error'])}")
    if report is not None:
        lines.append(f"Report: {code(report)}")
    return "\n".join(lines) + "\n"
