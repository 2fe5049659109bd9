"""A value Parquet cannot hold costs its own row, never the part (issue 40, item 5).

A label of 2**63 stopped a run at its first part, blamed the disk ("free disk space"), and
every ``--resume`` failed the same way with 0 rows written. Now such a row is an error row
(its bad field null, its error saying which value), its part is written, and a resume
runs that item again: the run always makes progress, no item is lost and none is
written twice. A write that does fail says whether the disk or the data is the cause.
"""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from batchinfer.cli import main
from batchinfer.engine import collector
from batchinfer.errors import OutputWriteError
from batchinfer.results import read_predictions
from batchinfer.sink import PredictionWriter, prepare_resume
from batchinfer.sink.atomic import write_error
from batchinfer.sink.manifest import RunManifest

BIG = 2**63  # one more than int64 holds


def add(writer: PredictionWriter, index: int, *, label: object = None, **fields) -> None:
    writer.add(
        **{
            "index": index,
            "id": f"img/{index}.png",
            "label": index if label is None else label,
            "label_name": None,
            "core": 0,
            "instance": 0,
            "attempt": 1,
            "latency_ms": 2.0,
            "read_ms": 1.0,
            "wait_ms": 0.0,
            "error": None,
            "outputs": [np.arange(10, dtype=np.float32) + index],
            **fields,
        }
    )


def ledger(out: Path) -> RunManifest:
    manifest = RunManifest.new(out)
    manifest.save()
    return manifest


# ----------------------------------------------------------------- rows fed to the writer
@pytest.mark.parametrize("bad", [BIG, -(2**63) - 1, 10**30])
def test_a_label_arrow_cannot_hold_makes_that_row_an_error_row_and_the_part_is_written(
    tmp_path, bad
):
    manifest = ledger(tmp_path)
    with PredictionWriter(
        tmp_path, rows_per_part=4, ledger=manifest, save_outputs=[("y", (10,))]
    ) as w:
        for i in range(6):
            add(w, i, label=bad if i == 2 else None)
    rows = read_predictions(tmp_path).to_pylist()
    assert [r["index"] for r in rows] == list(range(6))  # every row, exactly once
    bad_row = rows[2]
    assert bad_row["label"] is None and bad_row["pred"] is None
    assert bad_row["topk_index"] is None and bad_row["out_y"] is None
    assert f"label {bad} cannot be stored" in bad_row["error"]
    assert "disk" not in bad_row["error"]
    good = [r for r in rows if r["index"] != 2]
    assert all(r["error"] is None and r["label"] == r["index"] for r in good)
    assert all(r["pred"] == 9 and r["out_y"][0] == r["index"] for r in good)
    # The ledger counts it as the error row it is.
    assert w.errors_written == 1 and manifest.rows_on_disk() == (6, 1)


def test_a_resume_after_an_unstorable_label_redoes_that_item_only(tmp_path):
    manifest = ledger(tmp_path)
    with PredictionWriter(tmp_path, rows_per_part=4, ledger=manifest) as w:
        for i in range(6):
            add(w, i, label=BIG if i == 4 else None)
    state = prepare_resume(RunManifest.load(tmp_path))
    assert sorted(state.done_indices.tolist()) == [0, 1, 2, 3, 5]
    assert not state.is_done(b"img/4.png") and state.dropped_errors == 1
    assert read_predictions(tmp_path).num_rows == 5  # the error row goes; its item runs again


def test_a_meta_value_arrow_cannot_hold_is_said_in_an_error_row_not_dropped_silently(tmp_path):
    meta = pa.struct([pa.field("weight", pa.int64())])
    with PredictionWriter(tmp_path, meta=meta) as w:
        add(w, 0, meta={"weight": 3})
        add(w, 1, meta={"weight": BIG})
    rows = read_predictions(tmp_path).to_pylist()
    assert rows[0]["meta"] == {"weight": 3} and rows[0]["error"] is None
    assert rows[1]["meta"] is None and "meta" in rows[1]["error"] and str(BIG) in rows[1]["error"]


def test_an_error_row_with_an_unstorable_label_keeps_its_own_error(tmp_path):
    with PredictionWriter(tmp_path) as w:
        add(w, 0, label=BIG, error="Cannot read img/0.png: truncated", outputs=None)
    (row,) = read_predictions(tmp_path).to_pylist()
    assert row["error"] == "Cannot read img/0.png: truncated" and row["label"] is None


def test_the_library_table_gets_the_same_error_row(tmp_path):
    w = PredictionWriter(None)
    add(w, 0, label=BIG)
    add(w, 1)
    table = w.take_table()
    assert table.column("error").null_count == 1
    assert table.column("label").to_pylist() == [None, 1]


# ------------------------------------------------------------------- the disk or the data
@pytest.mark.parametrize(
    ("code", "says"),
    [
        (errno.ENOSPC, "free disk space"),
        (errno.EDQUOT, "free disk space"),
        (errno.EACCES, "make the folder writable"),
        (errno.EROFS, "make the folder writable"),
        (errno.EIO, "check the disk"),
    ],
)
def test_a_disk_error_says_the_disk_and_its_remedy(code, says):
    message = str(write_error(Path("/o/predictions/part-00000.parquet"), OSError(code, "x")))
    assert says in message and "output.resume" in message
    others = {"free disk space", "make the folder writable", "check the disk"} - {says}
    assert not any(other in message for other in others)


@pytest.mark.parametrize(
    "exc",
    [
        OverflowError("Python int too large to convert to C long"),
        pa.ArrowInvalid("Value 9223372036854775808 too large"),
        pa.ArrowTypeError("Expected bytes, got a 'int' object"),
    ],
)
def test_a_data_error_never_blames_the_disk(exc):
    message = str(write_error(Path("/o/predictions/part-00000.parquet"), exc))
    assert "free disk space" not in message and "permissions" not in message
    assert "the disk is not the cause" in message and str(exc) in message


def test_a_part_the_parquet_writer_refuses_for_its_data_says_so(tmp_path, monkeypatch):
    w = PredictionWriter(tmp_path)
    add(w, 0)

    def refuse(*args, **kwargs):
        raise pa.ArrowInvalid("simulated: a value Parquet cannot hold")

    monkeypatch.setattr(pq, "write_table", refuse)
    with pytest.raises(OutputWriteError) as info:
        w.flush()
    assert "free disk space" not in str(info.value)
    assert "the disk is not the cause" in str(info.value)
    assert w.rows_buffered == 1  # kept: nothing lost


# ---------------------------------------------------------------------------- end to end
FAST = ["--backend", "sim", "--sim-npu-ms", "0.2", "--sim-host-ms", "0", "--no-progress"]


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


@pytest.fixture
def data(demo_kit, tmp_path) -> Path:
    root = tmp_path / "data"
    for label in ("0", "1"):
        (root / label).mkdir(parents=True)
        for png in sorted((demo_kit.dataset / label).iterdir())[:6]:
            shutil.copy(png, root / label / png.name)
    return root


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_a_run_whose_item_has_an_unstorable_label_finishes_and_every_resume_progresses(
    data, demo_kit, tmp_path, monkeypatch
):
    """The label reaches the writer as if a dataset reader had let it through (readers
    validate labels themselves; this is the writer's own guard, behind them)."""
    victim = sorted(p.name for p in (data / "1").iterdir())[2]
    real_row = collector.Row

    def row(**fields):
        if fields["id"] == f"1/{victim}":
            fields["label"] = BIG
        return real_row(**fields)

    monkeypatch.setattr(collector, "Row", row)
    out = tmp_path / "o"
    args = ["run", data, "--model", demo_kit.models["digits"], "--out", out, *FAST]
    args += ["--part-rows", "4"]
    first = invoke(*args)
    assert "Traceback" not in first.output and "free disk space" not in first.output
    assert first.exit_code == 1, first.output  # an item failed: its error row says why
    table = read_predictions(out)
    assert sorted(table["index"].to_pylist()) == list(range(12))
    (bad,) = [r for r in table.to_pylist() if r["error"] is not None]
    assert bad["id"] == f"1/{victim}" and f"label {BIG} cannot be stored" in bad["error"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["rows_on_disk"] == 12 and manifest["counts"]["errors_on_disk"] == 1

    again = invoke(*args, "--resume")
    assert again.exit_code == 1, again.output
    assert "11 already done (resumed)" in again.stdout
    table = read_predictions(out)
    assert sorted(table["index"].to_pylist()) == list(range(12))  # none lost, none twice
    assert table["error"].null_count == 11
