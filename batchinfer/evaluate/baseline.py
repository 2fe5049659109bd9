"""The baseline: the last accepted evaluation's per-item results, and who accepted it.

``--update-baseline`` copies the current evaluation's ``items.parquet`` into the job's
baseline folder with ``baseline.json`` beside it: the evaluation id, its metrics, the
model's sha256, who accepted it, when, on which host, and the git commit of the job
file's repository when there is one. Later evaluations are compared with it item by item
(matched by item id, so a dataset that gained or lost items still compares what both
have). The items go first and the record last, so a baseline is whole or absent.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from batchinfer.errors import RunFailedError
from batchinfer.evaluate.files import write_json, write_table

RECORD = "baseline.json"
ITEMS = "items.parquet"
#: The evaluation record's key that says ``--update-baseline`` accepted it.
ACCEPTED = "accepted_as_baseline"

log = logging.getLogger("batchinfer")


@dataclass(frozen=True)
class Baseline:
    """An accepted evaluation: its per-item results (as its job's scorer reads them) and
    its record."""

    items: Any
    record: dict[str, Any]

    @property
    def metrics(self) -> dict[str, float]:
        return dict(self.record.get("metrics") or {})


def unreadable(folder: Path, why: str) -> RunFailedError:
    """The error of a baseline that cannot be used (``why``: what is wrong with it)."""
    return RunFailedError(
        f"the baseline in {folder} {why}; restore it, or move the folder aside and accept a "
        "new baseline with --update-baseline."
    )


def read_baseline(
    folder: Path, read_items: Callable[[pa.Table, dict[str, Any]], Any]
) -> Baseline | None:
    """The baseline in ``folder``, or None when none was accepted yet. ``read_items(table,
    record)``: the items as the job's scorer reads them (it raises :func:`unreadable` for
    a baseline of another task)."""
    record_path = folder / RECORD
    if not record_path.exists():
        return None
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        table = pq.read_table(folder / ITEMS)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise unreadable(folder, f"cannot be read ({exc})") from None
    return Baseline(read_items(table, record), record)


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def git_commit(folder: Path) -> str | None:
    """The commit checked out in the git work tree holding ``folder``, if any."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if done.returncode == 0:
            return done.stdout.strip() or None
    return None


def write_baseline(
    folder: Path, items: pa.Table, evaluation: dict[str, Any], job_folder: Path
) -> dict[str, Any]:
    """Accept an evaluation (its items table and record) as the baseline; returns its record."""
    record = {
        "eval_id": evaluation["eval_id"],
        "accepted_by": _who(),
        "accepted_at": evaluation["date"],
        "model": evaluation["model"],
        "model_sha256": evaluation["model_sha256"],
        "job_sha256": evaluation["job_sha256"],
        "git_commit": git_commit(job_folder),
        "items": items.num_rows,
        "metrics": evaluation["metrics"],
    }
    write_table(folder / ITEMS, items)
    write_json(folder / RECORD, record)
    return record


def accept_evaluation(
    folder: Path, items: pa.Table, evaluation: dict[str, Any], job_folder: Path, record_file: Path
) -> dict[str, Any]:
    """``--update-baseline``: write the baseline, then mark the evaluation's record
    (``evaluation[ACCEPTED]``, rewritten to ``record_file``) so that its summary and
    report say it is the baseline now; returns the baseline's record."""
    accepted = write_baseline(folder, items, evaluation, job_folder)
    # Marked only once the baseline is whole: a failed write leaves the record unmarked.
    evaluation[ACCEPTED] = True
    write_json(record_file, evaluation)
    log.info(f"baseline: evaluation {evaluation['eval_id']} accepted by {accepted['accepted_by']}")
    return accepted
