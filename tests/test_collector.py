"""The collector's flush policy: rows wait for a batch only while their slots are not needed."""

from __future__ import annotations

import numpy as np
import pytest

from batchinfer.data.dataset import Item
from batchinfer.engine.collector import FLUSH_AGE_S, FLUSH_ROWS, Collector
from batchinfer.engine.events import RowsDone
from batchinfer.engine.queue_depth import QUEUED_PER_INSTANCE
from batchinfer.engine.scheduler import Scheduler
from batchinfer.sink.rows import MemorySink
from batchinfer.sink.stats import CoreStatsRecorder


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class _Rig:
    """A scheduler with one ready core, a collector over a memory sink, scripted results."""

    def __init__(self, slots: int = 2 * FLUSH_ROWS + 4 * QUEUED_PER_INSTANCE) -> None:
        self.clock = _Clock()
        self.s = Scheduler(slots, (0,), 1, readers=1, max_attempts=2)
        self.s.life.core_ready(0)
        self.sink = MemorySink()
        self.events: list[object] = []
        self.c = Collector(
            self.s, self.sink, CoreStatsRecorder((0,), 1), self.events.append, 0, self.clock
        )
        self.c.outputs = {  # type: ignore[assignment]  # slot -> views, as the cluster gives
            slot: [np.zeros((1, 4), np.float32)] for slot in range(slots)
        }
        self.n = 0

    def reading(self, n: int) -> None:
        """n more items queued for the reader (they will cover the core's room)."""
        for _ in range(n):
            self.s.admit(self._item(), self.clock(), needs_reader=True)

    def finish(self, n: int) -> None:
        """n items go through the core and come back done."""
        for _ in range(n):
            slot = self.s.admit(self._item(), self.clock(), needs_reader=False)
            assert self.s.dispatch(self.clock()) == {0: [slot]}
            assert self.s.done(0, slot, None) is not None
            self.c.success(slot, 0, 0, self.clock() - 0.001, self.clock())

    def _item(self) -> Item:
        self.n += 1
        return Item(self.n, f"/d/{self.n}", f"{self.n}", None, None)


def test_rows_wait_while_their_slots_are_not_needed_then_go_at_the_age_limit() -> None:
    rig = _Rig()
    rig.reading(rig.s.cores[0].capacity + 1)  # the core's room is covered
    rig.finish(3)
    rig.c.flush_due(rig.clock())
    assert rig.sink.rows == [] and rig.c.pending
    assert rig.c.wait_s(rig.clock(), 1.0) == pytest.approx(FLUSH_AGE_S)
    rig.clock.t += FLUSH_AGE_S / 2
    rig.c.flush_due(rig.clock())
    assert rig.sink.rows == []
    rig.clock.t += FLUSH_AGE_S
    assert rig.c.wait_s(rig.clock(), 1.0) == 0.0
    rig.c.flush_due(rig.clock())
    assert len(rig.sink.rows) == 3 and not rig.c.pending
    assert sum(isinstance(e, RowsDone) for e in rig.events) == 1  # one batch, one event
    assert rig.c.counts["succeeded"] == 3
    assert rig.c.wait_s(rig.clock(), 1.0) == 1.0  # nothing pending: the loop's own tick


def test_rows_go_at_once_when_their_slots_are_wanted() -> None:
    rig = _Rig()
    rig.reading(1)  # far less than the core's room
    rig.finish(2)
    free = len(rig.s.free)
    rig.c.flush_due(rig.clock())
    assert len(rig.sink.rows) == 2
    assert len(rig.s.free) == free + 2  # the slots are free again


def test_rows_go_when_a_full_batch_waits() -> None:
    rig = _Rig()
    rig.reading(rig.s.cores[0].capacity + 1)
    rig.finish(FLUSH_ROWS - 1)
    rig.c.flush_due(rig.clock())
    assert rig.sink.rows == []
    rig.finish(1)
    rig.c.flush_due(rig.clock())
    assert len(rig.sink.rows) == FLUSH_ROWS


def test_rows_go_at_once_when_no_other_item_is_on_its_way_or_the_run_is_stopping() -> None:
    rig = _Rig()
    rig.finish(2)  # nothing read, nothing inferring: no more results can come
    rig.c.flush_due(rig.clock())
    assert len(rig.sink.rows) == 2
    rig.reading(rig.s.cores[0].capacity + 1)
    rig.finish(1)
    rig.c.flush_due(rig.clock())
    assert len(rig.sink.rows) == 2
    rig.s.stop()
    rig.c.flush_due(rig.clock())
    assert len(rig.sink.rows) == 3


def test_rows_that_cannot_be_written_yet_do_not_make_the_loop_spin() -> None:
    # Before the first worker reports its output shapes the sink is not open: an input
    # error's row waits, and the loop keeps its own tick instead of polling without waiting.
    rig = _Rig()
    rig.c.outputs = None
    slot = rig.s.admit(Item(0, "/d/0", "0", None, None), rig.clock(), needs_reader=True)
    rig.s.take_reads()
    rig.c.error(rig.s.loaded(slot, 1.0, "cannot read 0", rig.clock()))
    rig.clock.t += 10 * FLUSH_AGE_S
    assert rig.c.wait_s(rig.clock(), 0.1) == 0.1
    rig.c.flush_due(rig.clock())
    assert rig.sink.rows == [] and rig.c.pending
