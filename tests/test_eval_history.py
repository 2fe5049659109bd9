"""History table (appended, new metrics become columns) and the baseline (who, when, sha)."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchinfer.errors import RunFailedError
from batchinfer.evaluate.baseline import read_baseline, write_baseline
from batchinfer.evaluate.history import append_history, history_row, job_history
from batchinfer.evaluate.scorers.classify import baseline_items


def facts(job: str, day: int, verdict: str = "pass") -> dict:
    return {
        "date": dt.datetime(2026, 12, day, 2, 0, tzinfo=dt.timezone.utc),
        "eval_id": f"202612{day:02d}T020000Z",
        "job": job,
        "model_sha256": "ab" * 32,
        "runtime_version": "2.5.0",
        "driver_version": "0.9.8",
        "items": 10,
        "verdict": verdict,
        "failed_gates": [] if verdict == "pass" else ["top1 >= 0.9 (floor): value 0.8"],
        "per_class_top1": [1.0, 0.5],
    }


def test_rows_append_and_a_new_metric_becomes_a_column(tmp_path):
    path = tmp_path / "h" / "history.parquet"
    append_history(path, history_row(facts("a", 1), {"top1": 0.9}))
    table = append_history(path, history_row(facts("a", 2, "fail"), {"top1": 0.8, "map50": 0.4}))
    assert table.num_rows == 2
    on_disk = pq.read_table(path)
    assert on_disk.column("top1").to_pylist() == [0.9, 0.8]
    assert on_disk.column("map50").to_pylist() == [None, 0.4]
    assert on_disk.column("verdict").to_pylist() == ["pass", "fail"]
    assert on_disk.column("failed_gates").to_pylist()[1] == ["top1 >= 0.9 (floor): value 0.8"]
    assert on_disk.schema.field("date").type == pa.timestamp("us", tz="UTC")
    assert not list(path.parent.glob(".*.tmp")), "the tmp file must be renamed away"


def test_job_history_is_one_jobs_rows_oldest_first(tmp_path):
    path = tmp_path / "history.parquet"
    for job, day in [("a", 3), ("b", 1), ("a", 1), ("a", 2)]:
        append_history(path, history_row(facts(job, day), {"top1": day / 10}))
    rows = job_history(pq.read_table(path), "a")
    assert [r["top1"] for r in rows] == [0.1, 0.2, 0.3]
    assert job_history(pq.read_table(path), "a", limit=2)[0]["top1"] == 0.2


def test_a_damaged_history_is_refused_not_overwritten(tmp_path):
    path = tmp_path / "history.parquet"
    path.write_bytes(b"not parquet")
    with pytest.raises(RunFailedError, match=r"cannot be read.*move it aside"):
        append_history(path, history_row(facts("a", 1), {"top1": 0.9}))
    assert path.read_bytes() == b"not parquet"


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_baseline_records_who_when_and_sha(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "job.toml").write_text("name = 'x'\n")
    subprocess.run([*git, "add", "job.toml"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "job"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()

    items = pa.table({"id": ["a.png", "b.png"], "correct": [True, False]})
    evaluation = {
        "eval_id": "20261202T020000Z",
        "date": "2026-12-02T02:00:00+00:00",
        "model": "/m.onnx",
        "model_sha256": "cd" * 32,
        "job_sha256": "ef" * 32,
        "metrics": {"top1": 0.5},
    }
    folder = tmp_path / "out" / "baseline"
    assert read_baseline(folder, baseline_items) is None
    record = write_baseline(folder, items, evaluation, repo)
    assert record["git_commit"] == head
    assert "@" in record["accepted_by"]
    baseline = read_baseline(folder, baseline_items)
    assert baseline is not None
    assert baseline.record["accepted_at"] == "2026-12-02T02:00:00+00:00"
    assert baseline.record["model_sha256"] == "cd" * 32
    assert baseline.items.id.tolist() == ["a.png", "b.png"]
    assert baseline.items.correct.tolist() == [True, False]
    assert baseline.metrics == {"top1": 0.5}
    # Outside a git work tree there is no commit to record.
    assert write_baseline(folder, items, evaluation, tmp_path)["git_commit"] is None


def test_a_damaged_baseline_says_how_to_recover(tmp_path):
    (tmp_path / "baseline.json").write_text("{")
    with pytest.raises(RunFailedError, match=r"cannot be read.*--update-baseline"):
        read_baseline(tmp_path, baseline_items)
