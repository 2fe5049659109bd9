"""A leaking core worker on the emulator is recycled, and every item has exactly one row.

The emulator's ``leak:core=C:mb=M`` fault keeps M MB per call in the worker of core C
(runtime/sim.py); the board's pool reads the workers' memory from the coordinator and the
loop recycles the one that grows steadily (engine/recycling.py). The policy and the loop's
side alone, against scripted samples: test_recycling.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal

import pyarrow.parquet as pq
import pytest
from runs import config, exit_code, fast_sim

from batchinfer import run
from batchinfer.engine import events as ev
from batchinfer.engine.board import pool as board
from batchinfer.results import read_predictions

N = 200
#: Core 1's worker keeps 2 MB per call: 80 MB over the 40 items it is judged on.
LEAK = "leak:core=1:mb=2"


@pytest.fixture
def often(monkeypatch):
    """Read the workers' memory every 10 ms (0.25 s by default), so that the 12 samples
    growth is judged on come within a short run."""
    monkeypatch.setattr(board, "CHECK_EVERY_S", 0.01)
    monkeypatch.setattr(board, "RSS_EVERY_S", 0.01)


def _config(demo_kit, out, limit=N, **extra):
    return config(
        dataset=demo_kit.dataset,
        model=demo_kit.models["digits"],
        backend="sim",
        sim=fast_sim(LEAK, npu_ms=4),
        recycle_after=40,
        cores=(0, 1),  # core 1 does about half the items: several times 40
        limit=limit,
        out=out,
        **extra,
    )


def _stats(out) -> list[dict]:
    return pq.read_table(out / "core_stats.parquet").to_pylist()


def test_a_leaking_worker_is_recycled_and_every_item_has_one_row(demo_kit, tmp_path, often):
    result = run(_config(demo_kit, tmp_path / "o"))
    assert (result.status, exit_code(result)) == ("complete", 0)
    table = read_predictions(result.out)
    assert sorted(table["index"].to_pylist()) == list(range(N))
    assert table["error"].null_count == N
    recycles = {r["core"]: r["recycles"] for r in _stats(result.out)}
    assert recycles[1] >= 1 and recycles[0] == 0
    assert recycles[None] == recycles[1]
    said = [str(w) for w in result.warnings if "recycling it" in w]
    assert len(said) == recycles[1]
    assert said[0].startswith("core 1: its worker uses ")
    assert "grown steadily by " in said[0] and "over its last 40 items" in said[0]
    assert not any("crashed" in str(w) for w in result.warnings)  # replaced, not lost


@pytest.mark.slow  # ~4 s: two runs; default-tier sibling: the test above
def test_a_run_stopped_after_a_recycling_resumes_to_every_item_once(demo_kit, tmp_path, often):
    class StopAfterRecycling:
        """Ctrl-C (SIGINT to this process, as a user's) a little after the first recycling."""

        def __init__(self) -> None:
            self.rows_after: int | None = None

        def notify(self, event: object) -> None:
            if isinstance(event, ev.Recycling) and self.rows_after is None:
                self.rows_after = 0
            elif isinstance(event, ev.RowsDone) and self.rows_after is not None:
                self.rows_after += len(event.rows)
                if self.rows_after >= 30:
                    self.rows_after = -(10**9)  # once
                    os.kill(os.getpid(), signal.SIGINT)

    cfg = _config(demo_kit, tmp_path / "o")
    first = run(cfg, observers=[StopAfterRecycling()])
    assert first.status == "interrupted"
    written = read_predictions(first.out).num_rows
    assert 0 < written < N
    resumed = run(dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, resume=True)))
    assert (resumed.status, exit_code(resumed)) == ("complete", 0)
    assert resumed.skipped == written
    assert sorted(read_predictions(resumed.out)["index"].to_pylist()) == list(range(N))
    assert json.loads((resumed.out / "manifest.json").read_text())["status"] == "complete"
    by_invocation = {(r["invocation"], r["core"]): r["recycles"] for r in _stats(resumed.out)}
    assert by_invocation[(0, 1)] >= 1  # the first run's, kept beside the resumed run's
    assert (1, None) in by_invocation


@pytest.mark.slow  # ~3 s; default-tier sibling: the first test (a worker that stops)
def test_a_recycled_worker_that_does_not_stop_is_killed_and_replaced(
    demo_kit, tmp_path, often, monkeypatch
):
    real = board.BoardPool.recycle

    def frozen(self, key: int, now: float) -> None:
        child = self._child("worker", key)
        os.kill(child.proc.pid, signal.SIGSTOP)  # it will never read its Stop
        real(self, key, now)

    monkeypatch.setattr(board, "_JOIN_TIMEOUT_S", 0.3)
    monkeypatch.setattr(board.BoardPool, "recycle", frozen)
    # Long enough for the watchdog to find it (else the run's end kills it, said otherwise).
    result = run(_config(demo_kit, tmp_path / "o", limit=3 * N))
    assert (result.status, exit_code(result)) == ("complete", 0)
    assert sorted(read_predictions(result.out)["index"].to_pylist()) == list(range(3 * N))
    stats = {r["core"]: r for r in _stats(result.out)}
    assert stats[1]["recycles"] >= 1 and stats[1]["restarts"] == 0
    killed = [str(w) for w in result.warnings if "of being recycled" in w]
    assert killed[0] == "core 1: its worker did not stop within 0.3 s of being recycled; killed."
