"""Tests of batchinfer.sink: prediction parts, resume, core stats, timeline, manifest."""

from __future__ import annotations

import errno
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchinfer.cli.console import format_summary
from batchinfer.errors import ModelError, OutputWriteError, UsageError
from batchinfer.hostinfo import host_facts
from batchinfer.results import read_predictions
from batchinfer.sink import (
    CoreStatsRecorder,
    LatencyHistogram,
    PredictionWriter,
    model_sha256,
    prepare_resume,
    read_manifest,
    top_k,
    write_core_stats,
    write_manifest,
    write_timeline,
)
from batchinfer.sink.manifest import RunManifest
from batchinfer.sink.predictions import META_OUTPUT_SHAPES, META_TOPK
from batchinfer.sink.stats import PERCENTILE_REL_ERROR


def add_row(writer: PredictionWriter, index: int, *, error: str | None = None, outputs=None):
    """Add a row with plausible values; success rows get a 10-class output by default."""
    if outputs is None and error is None:
        outputs = [np.random.default_rng(index).random((1, 10), dtype=np.float32)]
    writer.add(
        index=index,
        id=f"img/{index}.png",
        label=index % 10,
        label_name=f"c{index % 10}",
        core=None if error == "unreadable" else index % 3,
        instance=None if error == "unreadable" else 0,
        attempt=1,
        latency_ms=None if error else 2.5,
        read_ms=1.0,
        wait_ms=None if error == "unreadable" else 0.5,
        error=error,
        outputs=outputs,
    )


def part_files(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "predictions").iterdir())


# -- predictions ------------------------------------------------------------------------


def test_parts_by_count_are_whole_and_readable(tmp_path: Path) -> None:
    with PredictionWriter(tmp_path, rows_per_part=4) as w:
        for i in range(10):
            add_row(w, i)
            if i == 3:
                # A part was written as soon as 4 rows were buffered.
                assert part_files(tmp_path) == ["part-00000.parquet"]
                assert w.rows_written == 4 and w.rows_buffered == 0
    assert w.rows_written == 10
    assert part_files(tmp_path) == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    assert [pq.read_metadata(tmp_path / "predictions" / p).num_rows for p in part_files(tmp_path)]
    table = read_predictions(tmp_path)
    assert table.column("index").to_pylist() == list(range(10))
    assert table.column("id")[3].as_py() == "img/3.png"
    assert table.schema.field("core").type == pa.int16()
    assert table.schema.field("latency_ms").type == pa.float32()
    assert table.column("error").null_count == 10


def test_error_rows_have_nulls(tmp_path: Path) -> None:
    with PredictionWriter(tmp_path) as w:
        add_row(w, 0, error="unreadable")
        add_row(w, 1, error="inference returned None", outputs=[np.ones(10, np.float32)])
        add_row(w, 2)
    rows = read_predictions(tmp_path).to_pylist()
    assert rows[0]["error"] == "unreadable"
    assert rows[0]["core"] is None and rows[0]["instance"] is None
    # Outputs passed along with an error are ignored: nothing to rank.
    assert rows[1]["pred"] is None and rows[1]["topk_index"] is None
    assert rows[1]["core"] == 1
    assert rows[2]["error"] is None and rows[2]["pred"] is not None


def test_topk_matches_argsort_reference(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    logits = [rng.standard_normal((1, 1000)).astype(np.float32) for _ in range(20)]
    with PredictionWriter(tmp_path, topk=5) as w:
        for i, x in enumerate(logits):
            add_row(w, i, outputs=[x])
    table = read_predictions(tmp_path)
    assert table.schema.metadata[META_TOPK] == b"5"
    for i, x in enumerate(logits):
        ref = np.argsort(-x.ravel(), kind="stable")[:5]
        assert table.column("topk_index")[i].as_py() == ref.tolist()
        np.testing.assert_array_equal(
            np.array(table.column("topk_score")[i].as_py(), np.float32), x.ravel()[ref]
        )
        assert table.column("pred")[i].as_py() == int(ref[0])


def test_topk_edge_cases() -> None:
    idx, score = top_k(np.array([0.1, 0.9, 0.9]), 5)  # k capped at n; ties: lower index first
    assert idx.tolist() == [1, 2, 0] and score.dtype == np.float32
    idx, _ = top_k(np.array([np.nan, 0.2, 0.1]), 2)  # NaN ranks last
    assert idx.tolist() == [1, 2]
    assert top_k(np.arange(4.0), 0)[0].size == 0


def test_scalar_first_output_is_not_a_classification(tmp_path: Path) -> None:
    with PredictionWriter(tmp_path) as w:
        add_row(w, 0, outputs=[np.array([[3.0]], np.float32)])
    row = read_predictions(tmp_path).to_pylist()[0]
    assert row["pred"] is None and row["topk_index"] is None and row["error"] is None


def test_save_outputs_columns_and_shape_metadata(tmp_path: Path) -> None:
    shapes = [("logits", (1, 10)), ("feat", (1, 2, 3))]
    rng = np.random.default_rng(0)
    outs = [[rng.random(s, dtype=np.float32) for _, s in shapes] for _ in range(3)]
    with PredictionWriter(tmp_path, save_outputs=shapes) as w:
        for i, o in enumerate(outs):
            add_row(w, i, outputs=o)
        add_row(w, 3, error="crashed twice")
    table = read_predictions(tmp_path)
    meta = json.loads(table.schema.metadata[META_OUTPUT_SHAPES])
    assert meta == {"logits": [1, 10], "feat": [1, 2, 3]}
    assert table.schema.field("out_feat").type == pa.list_(pa.float32())
    for i, o in enumerate(outs):
        got = np.array(table.column("out_feat")[i].as_py(), np.float32).reshape(meta["feat"])
        np.testing.assert_array_equal(got, o[1])
    assert table.column("out_logits")[3].as_py() is None


def test_save_outputs_copies_reused_buffers(tmp_path: Path) -> None:
    buf = np.zeros((1, 4), np.float32)  # like reuse_outputs=True: one buffer, overwritten
    with PredictionWriter(tmp_path, save_outputs=[("y", (1, 4))]) as w:
        for i in range(3):
            buf[:] = i
            add_row(w, i, outputs=[buf])
    rows = read_predictions(tmp_path).column("out_y").to_pylist()
    assert rows == [[0.0] * 4, [1.0] * 4, [2.0] * 4]


def test_save_outputs_size_mismatch_is_refused_and_writer_stays_usable(tmp_path: Path) -> None:
    with PredictionWriter(tmp_path, save_outputs=[("y", (1, 4))]) as w:
        with pytest.raises(ValueError, match="expected shape"):
            add_row(w, 0, outputs=[np.zeros(5, np.float32)])
        assert w.rows_buffered == 0
        add_row(w, 1, outputs=[np.ones(4, np.float32)])
    assert read_predictions(tmp_path).column("index").to_pylist() == [1]


def test_flush_by_interval_uses_the_clock(tmp_path: Path) -> None:
    now = [0.0]
    w = PredictionWriter(tmp_path, flush_interval_s=10.0, clock=lambda: now[0])
    for i in range(40):
        add_row(w, i)
    assert w.rows_written == 0  # interval not reached
    now[0] = 11.0
    for i in range(40, 40 + 32):  # the clock is read within the next 32 adds
        add_row(w, i)
    assert w.rows_written > 0 and part_files(tmp_path) == ["part-00000.parquet"]
    w.close()
    assert w.rows_written == 72


def test_flush_by_buffered_bytes(tmp_path: Path) -> None:
    big = np.zeros(1000, np.float32)  # 4000 bytes per row
    with PredictionWriter(tmp_path, save_outputs=[("y", (1000,))], max_buffer_bytes=10_000) as w:
        for i in range(3):
            add_row(w, i, outputs=[big])
        assert w.rows_written == 3  # the third row crossed 10 kB


def test_write_failure_keeps_rows_and_retry_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = PredictionWriter(tmp_path, first_part=7)
    for i in range(5):
        add_row(w, i)
    real = pq.write_table

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", disk_full)
    with pytest.raises(OutputWriteError) as info:
        w.flush()
    msg = str(info.value)
    assert "part-00007.parquet" in msg and "No space left on device" in msg
    assert "output.resume" in msg
    assert part_files(tmp_path) == []  # no part, no leftover tmp
    assert w.rows_buffered == 5 and w.rows_written == 0

    monkeypatch.setattr(pq, "write_table", real)
    assert w.flush() == tmp_path / "predictions" / "part-00007.parquet"
    w.close()
    assert read_predictions(tmp_path).column("index").to_pylist() == list(range(5))


def test_unwritable_output_folder_is_an_output_write_error(tmp_path: Path) -> None:
    blocker = tmp_path / "out"
    blocker.write_text("a file where the folder should be")
    with pytest.raises(OutputWriteError, match="out/predictions"):
        PredictionWriter(blocker)


def test_closed_writer_refuses_rows(tmp_path: Path) -> None:
    w = PredictionWriter(tmp_path)
    w.close()
    w.close()
    with pytest.raises(ValueError, match="closed"):
        add_row(w, 0)


def test_context_exit_on_exception_keeps_rows(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), PredictionWriter(tmp_path) as w:
        add_row(w, 0)
        raise KeyboardInterrupt
    assert read_predictions(tmp_path).num_rows == 1


def test_a_writer_writes_into_the_folder_it_opened_whatever_its_path_leads_to_later(
    tmp_path: Path,
) -> None:
    out, victim = tmp_path / "o", tmp_path / "victim"
    victim.mkdir()
    w = PredictionWriter(out, rows_per_part=1)
    add_row(w, 0)
    (out / "predictions").rename(out / "moved")
    (out / "predictions").symlink_to(victim)  # swapped between two parts
    add_row(w, 1)
    w.close()
    assert list(victim.iterdir()) == []
    assert sorted(p.name for p in (out / "moved").iterdir()) == [
        "part-00000.parquet",
        "part-00001.parquet",
    ]


def test_a_link_planted_under_a_parts_tmp_name_is_replaced_not_written_through(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "elsewhere.bin"
    elsewhere.write_bytes(b"someone else's")
    w = PredictionWriter(tmp_path / "o")
    (tmp_path / "o" / "predictions" / ".part-00000.parquet.tmp").symlink_to(elsewhere)
    add_row(w, 0)
    w.close()
    assert elsewhere.read_bytes() == b"someone else's"
    assert read_predictions(tmp_path / "o").num_rows == 1
    assert part_files(tmp_path / "o") == ["part-00000.parquet"]


# -- resume -----------------------------------------------------------------------------


def _ledger(out: Path) -> RunManifest:
    """A run folder's manifest, saved, so writers can record parts in it."""
    manifest = RunManifest.new(out)
    manifest.save()
    return manifest


def _keys(*ids: int) -> list[bytes]:
    return [f"img/{i}.png".encode() for i in ids]


def test_resume_drops_errors_and_tmp_files(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    with PredictionWriter(tmp_path, rows_per_part=4, ledger=ledger) as w:
        for i in range(8):
            add_row(w, i, error="boom" if i in (1, 5) else None)
        for i in range(8, 10):  # part 2 holds only errors: it goes away
            add_row(w, i, error="boom")
    assert ledger.rows_on_disk() == (10, 4)
    pred = tmp_path / "predictions"
    (pred / ".part-00003.parquet.tmp").write_bytes(b"half a part")
    meta_before = pq.read_schema(pred / "part-00000.parquet").metadata

    state = prepare_resume(RunManifest.load(tmp_path))
    assert sorted(state.done_indices.tolist()) == [0, 2, 3, 4, 6, 7]
    assert state.dropped_errors == 4 and state.next_part == 5
    # Parts that held errors were rewritten under new numbers, through the ledger.
    assert part_files(tmp_path) == ["part-00003.parquet", "part-00004.parquet"]
    assert pq.read_schema(pred / "part-00003.parquet").metadata == meta_before
    assert all(state.is_done(k) for k in _keys(0, 2, 3, 4, 6, 7))
    assert not any(state.is_done(k) for k in _keys(1, 5, 8, 99))
    assert state.done_below(4) == 3
    assert RunManifest.load(tmp_path).rows_on_disk() == (6, 0)

    # The resumed run writes the failed items again; each appears exactly once.
    ledger = RunManifest.load(tmp_path)
    with PredictionWriter(tmp_path, first_part=state.next_part, ledger=ledger) as w:
        for i in (1, 5, 8, 9):
            add_row(w, i)
    table = read_predictions(tmp_path)
    assert table.column("index").to_pylist() == list(range(10))
    assert table.column("error").null_count == 10
    again = prepare_resume(RunManifest.load(tmp_path))
    assert sorted(again.done_indices.tolist()) == list(range(10)) and again.dropped_errors == 0


def test_resume_keeps_first_of_duplicates(tmp_path: Path, caplog) -> None:
    with PredictionWriter(tmp_path, rows_per_part=2, ledger=_ledger(tmp_path)) as w:
        for i in (0, 1, 1, 2):
            add_row(w, i)
    state = prepare_resume(RunManifest.load(tmp_path))
    assert sorted(state.done_indices.tolist()) == [0, 1, 2] and state.dropped_duplicates == 1
    assert "duplicate" in caplog.text
    assert read_predictions(tmp_path).column("index").to_pylist() == [0, 1, 2]


def test_resume_of_a_run_with_no_parts(tmp_path: Path) -> None:
    state = prepare_resume(_ledger(tmp_path))
    assert state.done_keys.size == 0 and state.next_part == 0 and not state.is_done(b"0.png")
    assert state.done_below(10) == 0
    assert read_predictions(tmp_path).num_rows == 0


def test_resume_refuses_unknown_and_damaged_parts_touching_nothing(tmp_path: Path) -> None:
    with PredictionWriter(tmp_path, rows_per_part=2, ledger=_ledger(tmp_path)) as w:
        for i in range(4):
            add_row(w, i, error="boom" if i == 1 else None)
    pred = tmp_path / "predictions"
    before = {p.name: p.read_bytes() for p in pred.iterdir()}

    for stray in ("part-final.parquet", "part-00001 (copy).parquet", "notes.txt"):
        (pred / stray).write_bytes(before["part-00001.parquet"])
        with pytest.raises(UsageError, match="which no batchinfer run wrote"):
            prepare_resume(RunManifest.load(tmp_path))
        (pred / stray).unlink()
    # A well-named part the ledger does not know: a copy from another run.
    (pred / "part-00007.parquet").write_bytes(before["part-00001.parquet"])
    with pytest.raises(UsageError, match="not recorded"):
        prepare_resume(RunManifest.load(tmp_path))
    (pred / "part-00007.parquet").unlink()
    # A part whose bytes changed after it was written: one byte in the middle.
    damaged = bytearray(before["part-00000.parquet"])
    damaged[len(damaged) // 2] ^= 0xFF
    (pred / "part-00000.parquet").write_bytes(bytes(damaged))
    with pytest.raises(UsageError, match="does not match the checksum"):
        prepare_resume(RunManifest.load(tmp_path))
    assert {p.name for p in pred.iterdir()} == set(before), "a refused resume changes nothing"
    assert (pred / "part-00001.parquet").read_bytes() == before["part-00001.parquet"]


def test_a_crash_while_resume_rewrites_a_part_leaves_a_folder_resume_can_read(tmp_path: Path):
    """Crash after the ledger retired the old part and recorded the new one, before the
    rename: the new part is only a tmp file, the old one is still there, retired."""
    with PredictionWriter(tmp_path, rows_per_part=3, ledger=_ledger(tmp_path)) as w:
        for i in range(3):
            add_row(w, i, error="boom" if i == 1 else None)
    manifest = RunManifest.load(tmp_path)
    pred = tmp_path / "predictions"
    (pred / ".part-00001.parquet.tmp").write_bytes(b"the rewritten part, never renamed")
    manifest.replace_part("part-00000.parquet", "part-00001.parquet", rows=2, errors=0, sha256="x")

    state = prepare_resume(RunManifest.load(tmp_path))
    assert part_files(tmp_path) == [], "the retired part and the tmp file are ours to remove"
    assert state.done_keys.size == 0, "its rows were not on disk under a live part: redone"
    assert RunManifest.load(tmp_path).parts == {}


def test_non_utf8_ids_are_kept_losslessly(tmp_path: Path) -> None:
    import os

    raw = b"caf\xe9/p\xf6t.png"
    with PredictionWriter(tmp_path, ledger=_ledger(tmp_path)) as w:
        w.add(
            index=0,
            id=raw.decode("utf-8", "backslashreplace"),
            id_bytes=raw,
            label=None,
            label_name=None,
            core=0,
            instance=0,
            attempt=1,
            latency_ms=1.0,
            read_ms=1.0,
            wait_ms=1.0,
            # An error message quoting the name as Python holds it (lone surrogates).
            error=f"Cannot read {os.fsdecode(raw)}: boom",
            outputs=None,
        )
    row = read_predictions(tmp_path).to_pylist()[0]
    assert row["id"] == "caf\\xe9/p\\xf6t.png" and row["id_bytes"] == raw
    assert row["error"] == "Cannot read caf\\xe9/p\\xf6t.png: boom"


def test_a_row_arrow_refuses_costs_no_other_row(tmp_path: Path, monkeypatch) -> None:
    ledger = _ledger(tmp_path)
    w = PredictionWriter(tmp_path, ledger=ledger)
    for i in range(3):
        add_row(w, i)
    real = pq.write_table

    def refuse(*args, **kwargs):
        raise pa.ArrowInvalid("simulated: a value Parquet cannot hold")

    monkeypatch.setattr(pq, "write_table", refuse)
    with pytest.raises(OutputWriteError, match="simulated"):
        w.flush()
    assert w.rows_buffered == 3 and ledger.rows_on_disk() == (0, 0)
    monkeypatch.setattr(pq, "write_table", real)
    w.close()
    assert read_predictions(tmp_path).column("index").to_pylist() == [0, 1, 2]


# -- stats ------------------------------------------------------------------------------


@pytest.mark.parametrize("q", [50, 90, 99])
def test_percentiles_within_documented_bound(q: int) -> None:
    rng = np.random.default_rng(q)
    lat = np.concatenate([rng.lognormal(1.0, 0.6, 20_000), rng.uniform(50, 400, 300)])
    h = LatencyHistogram()
    for x in lat:
        h.add(float(x))
    ref = float(np.percentile(lat, q, method="inverted_cdf"))
    assert abs(h.percentile(q) - ref) <= PERCENTILE_REL_ERROR * ref * (1 + 1e-9)
    assert h.max == lat.max()


def test_histogram_extremes_are_exact() -> None:
    h = LatencyHistogram()
    assert h.percentile(50) is None
    for x in (0.0, 0.0002, 5e9):  # below 1 µs and above 1 h
        h.add(x)
    h.add(float("nan"))  # ignored
    assert h.n == 3
    assert h.percentile(1) == 0.0 and h.percentile(100) == 5e9


def test_core_stats_total_row_arithmetic() -> None:
    rec = CoreStatsRecorder([0, 1], instances_per_core=2)
    rec.mark_dispatch(100.0)
    rec.mark_dispatch(105.0)  # ignored: the first dispatch wins
    for i in range(6):
        rec.record(0, 100.0 + i, 2.0, ok=i != 3)
    for i in range(4):
        rec.record(1, 102.0 + i, 4.0, ok=True)
    rec.record(None, 110.0, None, ok=False)  # input error: total row only
    rec.set_busy(0, 3.0)
    rec.add_busy(1, 1.5)  # carried over from an incarnation that died...
    rec.add_restart(1)
    rec.set_busy(1, 0.5)  # ...and the new one reports from 0
    rec.add_recycle(0)  # a worker replaced because it grew
    rows = rec.table().to_pylist()
    assert [r["core"] for r in rows] == [0, 1, None]
    c0, c1, total = rows
    assert (c0["items"], c0["errors"], c0["restarts"]) == (6, 1, 0)
    assert c0["wall_s"] == 5.0 and c0["items_per_s"] == pytest.approx(6 / 5)
    assert c0["utilization"] == pytest.approx(3.0 / 5.0)
    assert c1["busy_s"] == 2.0 and c1["restarts"] == 1 and c1["wall_s"] == 5.0
    assert total["items"] == 11 and total["errors"] == 2 and total["restarts"] == 1
    assert (c0["recycles"], c1["recycles"], total["recycles"]) == (1, 0, 1)
    assert total["wall_s"] == 10.0 and total["items_per_s"] == pytest.approx(1.1)
    assert total["busy_s"] == 5.0
    assert total["utilization"] == pytest.approx(5.0 / (10.0 * 2))
    assert total["instances"] == 4 and c0["instances"] == 2
    assert c0["max_ms"] == 2.0 and total["max_ms"] == 4.0
    assert total["p50_ms"] == pytest.approx(2.0, rel=PERCENTILE_REL_ERROR)
    assert total["p99_ms"] == pytest.approx(4.0, rel=PERCENTILE_REL_ERROR)


def test_core_without_completions_has_null_rates() -> None:
    rec = CoreStatsRecorder([0, 1, 2], instances_per_core=1)
    rec.mark_dispatch(0.0)
    rec.record(0, 1.0, 1.0, ok=True)
    rows = rec.table().to_pylist()
    assert rows[2]["items"] == 0 and rows[2]["items_per_s"] is None
    assert rows[2]["p50_ms"] is None
    summary = format_summary(rec.table())
    lines = summary.splitlines()
    assert lines[0].split() == [
        "core", "items", "errors", "restarts", "recycles", "items/s", "util", "%", "p50", "ms",
        "p99", "ms"
    ]  # fmt: skip
    assert [ln.split()[0] for ln in lines[1:]] == ["0", "1", "2", "all"]
    assert lines[3].split()[5] == "-"


def test_timeline_counts() -> None:
    rec = CoreStatsRecorder([0, 1], instances_per_core=1)
    rec.mark_dispatch(50.0)
    for t, core, ok in [
        (50.2, 0, True),
        (50.9, 0, False),
        (50.5, 1, True),
        (52.1, 0, True),
        (52.7, None, False),
    ]:
        rec.record(core, t, 1.0 if core is not None else None, ok)
    rows = rec.timeline_table().to_pylist()
    assert rows == [
        {"invocation": 0, "node": None, "core": 0, "second": 0, "completed": 2, "errors": 1},
        {"invocation": 0, "node": None, "core": 1, "second": 0, "completed": 1, "errors": 0},
        {"invocation": 0, "node": None, "core": None, "second": 2, "completed": 1, "errors": 1},
        {"invocation": 0, "node": None, "core": 0, "second": 2, "completed": 1, "errors": 0},
    ]
    assert sum(r["completed"] for r in rows) == rec.table().to_pylist()[-1]["items"]


def test_stats_files_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = CoreStatsRecorder([0], instances_per_core=1)
    rec.record(0, 1.0, 1.0, ok=True)
    assert pq.read_table(write_core_stats(tmp_path, rec)).num_rows == 2
    assert pq.read_table(write_timeline(tmp_path, rec)).num_rows == 1

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(pq, "write_table", denied)
    with pytest.raises(OutputWriteError, match="Permission denied"):
        write_core_stats(tmp_path, rec)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["core_stats.parquet", "timeline.parquet"]


# -- manifest ---------------------------------------------------------------------------


def test_manifest_round_trip(tmp_path: Path) -> None:
    manifest = {
        "run_id": "r1",
        "model": tmp_path / "m.rknn",
        "counts": {"items": np.int64(10), "errors": np.int32(0)},
        "rate": np.float32(1.5),
        "cores": np.array([0, 1, 2]),
        "status": "ok",
    }
    path = write_manifest(tmp_path, manifest)
    text = path.read_text()
    assert text.index('"cores"') < text.index('"run_id"')  # sorted keys
    assert text.endswith("}\n") and '\n  "counts": {' in text  # indent 2
    back = read_manifest(tmp_path)
    assert back["counts"] == {"items": 10, "errors": 0}
    assert back["model"] == str(tmp_path / "m.rknn") and back["cores"] == [0, 1, 2]
    assert back["rate"] == 1.5
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_manifest_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a batchinfer output folder"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{half")
    with pytest.raises(UsageError, match="cannot be read"):
        read_manifest(tmp_path)
    with pytest.raises(TypeError):
        write_manifest(tmp_path, {"x": object()})


def test_model_sha256_streams(tmp_path: Path) -> None:
    import hashlib

    data = np.random.default_rng(1).bytes(3 << 20)
    (tmp_path / "m.rknn").write_bytes(data)
    assert model_sha256(tmp_path / "m.rknn", chunk_size=1 << 16) == hashlib.sha256(data).hexdigest()
    with pytest.raises(ModelError, match="check the model path"):
        model_sha256(tmp_path / "missing.rknn")


def test_host_facts_never_raises_and_reads_fake_sysfs(tmp_path: Path) -> None:
    facts = host_facts()
    assert facts["cpu_count"] >= 1 and "python" in facts
    json.dumps(facts)

    policy = tmp_path / "sys/devices/system/cpu/cpufreq/policy4"
    policy.mkdir(parents=True)
    (policy / "scaling_governor").write_text("performance\n")
    (policy / "scaling_cur_freq").write_text("2256000\n")
    (policy / "cpuinfo_max_freq").write_text("garbage\n")
    (policy / "affected_cpus").write_text("4 5\n")
    zone = tmp_path / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "temp").write_text("45230\n")
    (zone / "type").write_text("soc-thermal\n")
    (tmp_path / "sys/class/thermal/thermal_zone1").mkdir()  # no temp: left out
    npu = tmp_path / "sys/class/devfreq/fdab0000.npu"
    npu.mkdir(parents=True)
    (npu / "cur_freq").write_text("1000000000\n")
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "proc/device-tree/model").write_bytes(b"Radxa ROCK 5B\x00")

    facts = host_facts(tmp_path)
    assert facts["cpufreq"] == {
        "policy4": {"cpus": "4 5", "governor": "performance", "cur_khz": 2256000}
    }
    assert facts["thermal"] == {"thermal_zone0": {"type": "soc-thermal", "temp_c": 45.23}}
    assert facts["npu"] == {"fdab0000.npu": {"cur_hz": 1000000000}}
    assert facts["board"] == "Radxa ROCK 5B"
    assert not math.isnan(facts["thermal"]["thermal_zone0"]["temp_c"])


def test_error_rows_before_the_first_result_in_a_part_get_null_topk(tmp_path):
    # The top-k width is learnt from the first successful row; rows before it stay null.
    rng = np.random.default_rng(0)
    writer = PredictionWriter(tmp_path, topk=3, rows_per_part=700)
    expected = {}
    for i in range(1500):
        failed = i < 400 or i % 7 == 0
        scores = rng.random((1, 50), dtype=np.float32)
        expected[i] = None if failed else np.argsort(-scores[0], kind="stable")[:3].tolist()
        writer.add(
            index=i, id=f"x/{i}", label=None, label_name=None, core=None if failed else 0,
            instance=0, attempt=1, latency_ms=1.0, read_ms=None, wait_ms=None,
            error="boom" if failed else None, outputs=[scores],
        )  # fmt: skip
    writer.close()
    rows = read_predictions(tmp_path).to_pylist()
    assert [r["topk_index"] for r in rows] == [expected[i] for i in range(1500)]
    assert [r["pred"] for r in rows] == [None if e is None else e[0] for e in expected.values()]


def test_topk_ties_go_to_the_lower_class_index_also_at_the_kth_place() -> None:
    # Equal scores at the boundary: argpartition alone picked 8 and 9 here, not 0 and 1.
    scores = np.zeros(10, np.float32)
    scores[3] = 1.0
    index, values = top_k(scores, 3)
    assert index.tolist() == [3, 0, 1] and values.tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("k", [1, 6, 16, 17, 29])  # small k: argmax passes; larger: a sort
def test_topk_batch_agrees_with_a_stable_sort_row_by_row(k: int) -> None:
    from batchinfer.sink.predictions import top_k_batch

    rng = np.random.default_rng(3)
    scores = rng.integers(0, 4, (50, 30)).astype(np.float32)  # many ties
    scores[5, 7] = np.nan
    scores[6, :] = -np.inf  # fewer real scores than k: -inf ties, lower index first
    scores[6, 9] = 1.0
    scores[7, 25:] = np.nan
    scores[7, :20] = -np.inf
    scores[8, :] = np.nan
    scores[9, 3] = np.inf
    index, values = top_k_batch(scores, k)
    for row, idx, val in zip(scores, index, values, strict=True):
        key = np.where(np.isnan(row), -np.inf, row)
        expected = np.lexsort((np.arange(row.size), -key))[:k]
        assert idx.tolist() == expected.tolist()
        assert np.array_equal(val, row[expected], equal_nan=True)


def test_recording_rows_in_batches_counts_exactly_as_one_by_one() -> None:
    from types import SimpleNamespace

    rng = np.random.default_rng(1)
    rows = [
        SimpleNamespace(
            core=int(c), t_done=float(t), latency_ms=float(ms) if ok else None,
            error=None if ok else "boom",
        )
        for c, t, ms, ok in zip(
            rng.integers(0, 3, 500), 10 + rng.random(500) * 5, rng.random(500) * 3,
            rng.random(500) > 0.1, strict=True,
        )
    ]  # fmt: skip
    one, batch = CoreStatsRecorder([0, 1, 2], 1), CoreStatsRecorder([0, 1, 2], 1)
    for rec in (one, batch):
        rec.mark_dispatch(10.0)
    for r in rows:
        one.record(r.core, r.t_done, r.latency_ms, r.error is None)
    batch.record_rows(rows[:123])
    batch.record_rows(rows[123:])
    assert one.table().equals(batch.table())
    assert one.timeline_table().equals(batch.timeline_table())


def test_reading_some_columns_still_gives_rows_in_dataset_order(tmp_path: Path) -> None:
    with PredictionWriter(tmp_path, rows_per_part=2, ledger=_ledger(tmp_path)) as w:
        for i in (5, 1, 4, 0, 3, 2):
            add_row(w, i)
    assert read_predictions(tmp_path, columns=["id"])["id"].to_pylist() == [
        f"img/{i}.png" for i in range(6)
    ]
