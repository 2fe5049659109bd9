"""The history table: one row per evaluation, appended, in one Parquet file.

Columns: ``date`` (UTC), ``eval_id``, ``job``, ``job_file``, ``model``, ``model_sha256``,
``backend``, ``runtime_version``, ``driver_version``, ``reference_model_sha256``,
``items``, ``verdict`` (pass/fail), ``failed_gates``, ``baseline_eval_id``, ``host``,
``per_class_top1`` (a list, in class order), ``nodes`` (the Ray cluster's nodes that ran
the device model; null on one board), then one float column per metric (names as in
the job file's gates: ``top1``, ``cosine_mean``, ``reference.top1``, custom names, ...).
A metric that a later job adds becomes a new column, null in older rows.

Appending rewrites the file (read, concatenate, write a tmp file, rename): a nightly table
is small, and a reader never sees half a row. The evaluation lock keeps two writers apart.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from batchinfer.errors import RunFailedError
from batchinfer.evaluate.files import write_table

_FIXED = pa.schema(
    [
        ("date", pa.timestamp("us", tz="UTC")),
        ("eval_id", pa.string()),
        ("job", pa.string()),
        ("job_file", pa.string()),
        ("model", pa.string()),
        ("model_sha256", pa.string()),
        ("backend", pa.string()),
        ("runtime_version", pa.string()),
        ("driver_version", pa.string()),
        ("reference_model_sha256", pa.string()),
        ("items", pa.int64()),
        ("verdict", pa.string()),
        ("failed_gates", pa.list_(pa.string())),
        ("baseline_eval_id", pa.string()),
        ("host", pa.string()),
        ("per_class_top1", pa.list_(pa.float64())),
        ("nodes", pa.list_(pa.string())),
    ]
)
FIXED_COLUMNS = tuple(_FIXED.names)


def history_row(facts: Mapping[str, Any], metrics: Mapping[str, float]) -> pa.Table:
    """One evaluation as a one-row table (``facts`` has the fixed columns)."""
    clash = sorted(set(metrics) & set(FIXED_COLUMNS))
    if clash:  # custom metric names are checked against these; this is a safety net
        raise RunFailedError(f"metric names {clash} clash with history columns; rename them.")
    fields = list(_FIXED) + [pa.field(name, pa.float64()) for name in metrics]
    values = {name: [facts.get(name)] for name in FIXED_COLUMNS}
    values.update({name: [float(v)] for name, v in metrics.items()})
    return pa.Table.from_pydict(values, schema=pa.schema(fields))


def record_history_row(
    record: Mapping[str, Any], items: int, per_class_top1: list[float | None] | None
) -> pa.Table:
    """The history row of an evaluation's record (``result.json``): its fixed columns, with
    ``items`` evaluated and the per-class top-1 (None for detection), and every metric."""
    device, reference = record["device"], record["reference"]
    cluster = device.get("cluster")
    facts = {
        "date": dt.datetime.fromisoformat(record["date"]),
        "eval_id": record["eval_id"],
        "job": record["job"],
        "job_file": record["job_file"],
        "model": device["model"],
        "model_sha256": device["model_sha256"],
        "backend": device["backend"],
        "runtime_version": device["runtime_version"],
        "driver_version": device["driver_version"],
        "reference_model_sha256": reference["model_sha256"] if reference else None,
        "items": items,
        "verdict": record["verdict"],
        "failed_gates": [g["line"] for g in record["gates"] if g["passed"] is False],
        "baseline_eval_id": (record["baseline"] or {}).get("eval_id"),
        "host": record["host"].get("node"),
        "per_class_top1": per_class_top1,
        "nodes": [n["name"] for n in cluster["nodes"]] if cluster else None,
    }
    return history_row(facts, record["metrics"])


def history_problem(path: Path) -> str | None:
    """Why the file at ``path`` cannot be the history table, None when it can (or is absent).

    Reads only the Parquet footer, so a job is checked in milliseconds before it runs.
    """
    if not path.exists():
        return None
    if path.is_dir():
        return "a folder, not a Parquet file"
    try:
        pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        reason = str(exc).split(". ")[0].rstrip(".")  # Arrow adds a second guess
        return f"not a Parquet table ({reason})"
    return None


def read_history(path: Path) -> pa.Table | None:
    """The history table, or None when there is none yet."""
    if not path.exists():
        return None
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise RunFailedError(
            f"the history table {path} cannot be read ({exc}); restore it or move it aside "
            "(a new one is then started)."
        ) from None


def append_history(path: Path, row: pa.Table) -> pa.Table:
    """Append ``row`` to the table at ``path``; returns the whole table."""
    old = read_history(path)
    if old is None:
        table = row
    else:
        try:
            table = pa.concat_tables([old, row], promote_options="permissive")
        except pa.ArrowException as exc:
            raise RunFailedError(
                f"the history table {path} has columns this evaluation cannot append to "
                f"({exc}); move it aside (a new one is then started)."
            ) from None
    write_table(path, table)
    return table


def job_history(table: pa.Table | None, job: str, limit: int = 60) -> list[dict[str, Any]]:
    """The last ``limit`` rows of ``job`` as dicts, oldest first."""
    if table is None or table.num_rows == 0:
        return []
    rows = [r for r in table.to_pylist() if r.get("job") == job]
    rows.sort(key=lambda r: r["date"])
    return rows[-limit:]
