"""The engine loop's policy against a scripted pool (tests/fake_pool.py) and a fake clock:
rows, retries and charges, back-offs and retirement, start-up, gaps, stopping, readers, and
the events observers see. No processes: each case runs in milliseconds, and every time it
asserts is the fake clock's. (The same loop against the real pools: test_loop_pools.py.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fake_pool import (
    Crash,
    Fail,
    FailsToStart,
    FakeClock,
    FakePool,
    Hang,
    Read,
    ReaderDies,
    Succeed,
    Up,
)

from batchinfer.data.input_spec import Preprocess
from batchinfer.engine import Engine, EnginePlan
from batchinfer.engine import events as ev
from batchinfer.engine.core_life import BACKOFF_S, MAX_CRASHES_IN_ROW
from batchinfer.engine.loop import TICK_S
from batchinfer.engine.pools import ReaderAdded, ReaderClosing, Said, Where, WorkerRetired
from batchinfer.engine.sources import ArraySource, SyntheticSource
from batchinfer.errors import NoCoreError, RunFailedError
from batchinfer.options import ReliabilityOptions
from batchinfer.runtime.adapter import CoreReason, Mark
from batchinfer.runtime.backends import SimBackend
from batchinfer.sink.rows import MemorySink

T0 = 100.0  # the fake clock's start: setup, and every worker that comes up at once
CRASHED = "worker process crashed (killed by SIGKILL)"
# A reason naming its core, as the runtime's init failures do (cores that fail alike).
UNAVAILABLE = CoreReason.of(
    Mark.CORE,
    " failed to initialise: RKNN_ERR_DEVICE_UNAVAILABLE; ",
    Mark.ADVICE,
    "check the driver.",
)


def _plan(keys=(0, 1, 2), k=1, slots=16, **reliability) -> EnginePlan:
    """An EnginePlan for the fake pool: only its reliability settings and names matter."""
    start_together = reliability.pop("cores_start_together", False)
    return EnginePlan(
        backend=SimBackend(model=Path("fake.rknn")),
        cores=tuple(keys),
        instances_per_core=k,
        preprocess=Preprocess((1, 8, 8, 3), "uint8"),
        slots=slots,
        readers=0,
        cpus=None,
        reliability=ReliabilityOptions(**reliability),
        topk=1,
        cores_start_together=start_together,
    )


class _Watch:
    """Keeps every event with the fake clock's time; ``act(watch, event)`` after each."""

    def __init__(self, clock: FakeClock, act=None) -> None:
        self.clock = clock
        self.events: list = []
        self.times: list[float] = []
        self.act = act
        self.engine: Engine | None = None

    def notify(self, event: object) -> None:
        self.events.append(event)
        self.times.append(self.clock.now)
        if self.act is not None:
            self.act(self, event)

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]

    def when(self, kind: type) -> list[float]:
        return [t for e, t in zip(self.events, self.times, strict=True) if isinstance(e, kind)]

    @property
    def rows(self) -> list:
        return [r for e in self.of(ev.RowsDone) for r in e.rows]

    def said(self) -> list[str]:
        return [str(e.message) for e in self.of(ev.Warned)]


def _run(pool: FakePool, plan: EnginePlan, n: int = 20, source=None, act=None):
    """Run ``n`` items (or ``source``) through ``pool``: (result, rows by index, watch)."""
    sink = MemorySink()
    watch = _Watch(pool.clock, act)
    source = source if source is not None else SyntheticSource(n)
    engine = Engine(plan, source, sink, [watch], clock=pool.clock, pool=pool)
    watch.engine = engine
    result = engine.run()
    indexes = [r.index for r in sink.rows]
    assert len(indexes) == len(set(indexes)), f"an item has two rows: {sorted(indexes)}"
    assert pool.closed_at is not None
    return result, {r.index: r for r in sink.rows}, watch


def _sends(pool: FakePool) -> list[tuple[int, list[int]]]:
    return [(key, indexes) for _, key, indexes, _ in pool.of("send_work")]


# ---------------------------------------------------------------- rows, retries, charges
def test_every_item_ends_in_exactly_one_row_across_keys():
    clock = FakeClock(T0)
    items = {3: [Fail(), Succeed()], 7: Fail(), 11: [Fail(), Fail(), Succeed()]}
    pool = FakePool(clock, keys=(0, 1, 2), items=items)
    result, rows, _ = _run(pool, _plan(max_attempts=2), n=40)
    assert result.status == "complete" and result.error is None
    assert sorted(rows) == list(range(40))
    assert result.counts == {"succeeded": 38, "errors": 2, "input_errors": 0}
    assert {i for i, r in rows.items() if r.error} == {7, 11}
    assert rows[3].error is None and rows[3].attempt == 2
    # Each error names its two attempts, on two different cores (a retry goes elsewhere).
    failures = rows[7].error.split("; ")
    assert len(failures) == 2 and all("inference returned None" in f for f in failures)
    assert len({f.split(":")[0] for f in failures}) == 2
    assert {r.core for r in rows.values() if r.error is None} == {0, 1, 2}
    assert pool.of("close") == [("close", False)]


def test_a_crash_with_one_item_inferring_charges_that_item():
    clock = FakeClock(T0)
    pool = FakePool(clock, keys=(0, 1), items={5: [Crash(0.05), Succeed()]})
    result, rows, watch = _run(pool, _plan(keys=(0, 1)), n=12)
    assert result.status == "complete" and sorted(rows) == list(range(12))
    (crashed,) = [key for key, sent in _sends(pool) if 5 in sent][:1]
    assert rows[5].error is None and rows[5].attempt == 2  # charged: its second attempt
    assert rows[5].core != crashed  # retried on the other core
    assert f"core {crashed}: {CRASHED}; restarting it in {BACKOFF_S[0]:.2g} s." in watch.said()
    assert all(r.attempt == 1 for i, r in rows.items() if i != 5)


def test_a_crash_with_several_items_inferring_charges_none_and_retries_each_alone():
    """Two instances inferring when the worker dies: either may have killed it, so neither
    is charged; each goes back alone to an empty worker, one after the other."""
    clock = FakeClock(T0)
    items = {0: [Crash(0.5), Succeed()], 1: Succeed(1.0)}
    pool = FakePool(clock, keys=(0,), instances=2, items=items)
    result, rows, watch = _run(pool, _plan(keys=(0,), k=2), n=6)
    assert result.status == "complete" and sorted(rows) == list(range(6))
    assert [(i, r.attempt, r.error) for i, r in sorted(rows.items())] == [
        (i, 1, None) for i in range(6)
    ]
    assert _sends(pool)[0] == (0, [0, 1, 2, 3, 4, 5])
    # After the restart: the suspects alone, each once the one before came back, then the rest.
    assert _sends(pool)[1:] == [(0, [0]), (0, [1]), (0, [2, 3, 4, 5])]
    assert f"core 0: {CRASHED}; restarting it in {BACKOFF_S[0]:.2g} s." in watch.said()


def test_a_hang_found_by_check_charges_the_hung_item_only():
    """The pool's check kills a worker whose item is past the inference timeout and names
    it: that item is charged; the one inferring beside it goes back uncharged."""
    clock = FakeClock(T0)
    items = {0: [Hang(), Succeed()], 1: Succeed(1.9), 2: Succeed(1.0)}
    pool = FakePool(clock, keys=(0,), instances=2, inference_timeout_s=2.0, items=items)
    result, rows, watch = _run(pool, _plan(keys=(0,), k=2), n=4)
    assert result.status == "complete" and sorted(rows) == list(range(4))
    assert rows[0].attempt == 2 and rows[0].error is None  # charged
    assert rows[2].attempt == 1  # was inferring (since 1.9 s) when the worker was killed
    assert "core 0: hung for more than 2 s; restarting it in 0.25 s." in watch.said()
    (found,) = watch.when(ev.Restarted)
    assert T0 + 2.0 <= found <= T0 + 2.0 + TICK_S


def test_an_item_that_crashes_every_worker_is_an_error_row_and_its_keys_restart():
    clock = FakeClock(T0)
    pool = FakePool(
        clock, keys=(0, 1), items=lambda i, key, n: Crash(0.05) if i == 3 else Succeed(0.05)
    )
    result, rows, watch = _run(pool, _plan(keys=(0, 1), max_attempts=2), n=60)
    assert result.status == "complete" and sorted(rows) == list(range(60))
    assert {i for i, r in rows.items() if r.error} == {3}
    assert rows[3].attempt == 2 and rows[3].error.count(CRASHED) == 2
    assert {f.split(":")[0] for f in rows[3].error.split("; ")} == {"core 0", "core 1"}
    first, second = watch.of(ev.Restarted)
    assert first.core != second.core
    # Its second crash is the item's doing (it was in one before), not the core's.
    assert [w for w in watch.said() if "blamed on the item" in w] == [
        f"core {second.core}: {CRASHED} (blamed on the item, not the core); "
        f"restarting it in {BACKOFF_S[0]:.2g} s."
    ]
    # Each key starts again once its back-off is over, on the loop's (fake) clock.
    starts = pool.of("start_worker")
    assert [key for _, key, _ in starts] == [first.core, second.core]
    for (_, _, t), lost in zip(starts, watch.when(ev.Restarted), strict=True):
        assert lost + BACKOFF_S[0] <= t <= lost + BACKOFF_S[0] + TICK_S
    assert not pool.of("retire") and result.retired_cores == []
    # The retry did not wait for the end of the run: it may go only to an empty key it has
    # not crashed, and keys are refilled before they empty, so that key was drained for it
    # (no refills) and took it alone. Rows kept coming after its second crash.
    second_lost = watch.when(ev.Restarted)[1]
    after = [
        r
        for e, t in zip(watch.events, watch.times, strict=True)
        if isinstance(e, ev.RowsDone) and t > second_lost
        for r in e.rows
        if r.error is None
    ]
    assert len(after) >= 10


def test_a_key_that_crashes_whatever_it_runs_is_retired_after_crashes_in_a_row():
    clock = FakeClock(T0)

    def items(index: int, key: int, nth: int):
        return Crash(0.05) if key == 1 else Succeed(0.2)

    pool = FakePool(clock, keys=(0, 1), items=items)
    result, rows, watch = _run(pool, _plan(keys=(0, 1), max_attempts=2), n=40)
    assert result.status == "complete" and result.counts["succeeded"] == 40
    assert {r.core for r in rows.values()} == {0}
    charged = sorted(i for i, r in rows.items() if r.attempt == 2)
    assert len(charged) == MAX_CRASHES_IN_ROW  # each crash charged the item inferring
    # Restarted after each back-off in turn, then retired at the last crash in a row.
    lost_at = watch.when(ev.Restarted)
    starts = [t for _, key, t in pool.of("start_worker") if key == 1]
    assert len(lost_at) == len(starts) == MAX_CRASHES_IN_ROW - 1
    for at, t, backoff in zip(lost_at, starts, BACKOFF_S, strict=False):
        assert at + backoff <= t <= at + backoff + TICK_S
    assert pool.of("retire") == [("retire", 1)]
    assert (
        f"core 1 retired after {MAX_CRASHES_IN_ROW} crashes in a row (last: {CRASHED}); "
        "the run goes on with the other cores." in watch.said()
    )
    assert [(e.core, e.reason) for e in watch.of(ev.CoreRetired)] == [(1, CRASHED)]
    assert result.retired_cores == [1]
    assert {r["core"]: r["restarts"] for r in result.stats.table().to_pylist()}[1] == 3


# ---------------------------------------------------------------- start-up
def test_every_key_failing_to_start_alike_is_one_no_core_error():
    clock = FakeClock(T0)
    starts = {k: FailsToStart(UNAVAILABLE, after_s=0.1 * k) for k in (0, 1, 2)}
    pool = FakePool(clock, keys=(0, 1, 2), starts=starts)
    result, rows, watch = _run(pool, _plan(), n=5)
    assert result.status == "failed" and isinstance(result.error, NoCoreError)
    message = str(result.error)
    assert message == (
        "no NPU core could be started: cores 0, 1, 2 failed to initialise: "
        "RKNN_ERR_DEVICE_UNAVAILABLE; check the driver."
    )  # once for the three, without the advice to leave them out (it cannot help)
    assert not [w for w in watch.said() if "retired" in w]  # no line per core before it
    assert rows == {} and not pool.of("send_work")


def test_on_a_cluster_the_no_core_error_names_the_nodes_it_tried():
    """Ray-shaped keys (core 0 of nodes a and b) that all fail alike: one error, which says
    where (it said "cores 0" alone, leaving the user to guess which machines)."""
    clock = FakeClock(T0)
    starts = {k: FailsToStart(UNAVAILABLE, after_s=0.1) for k in (0, 1)}
    pool = FakePool(
        clock,
        keys=(0, 1),
        starts=starts,
        where=lambda key: Where(core=0, node="ab"[key]),
        place=lambda key: ("ab"[key], 0),
        physical=lambda key: ("ab"[key], 0),
        nodes=("a", "b"),
    )
    result, _, _ = _run(pool, _plan(keys=(0, 1)), n=5)
    assert isinstance(result.error, NoCoreError)
    assert str(result.error).startswith("no NPU core could be started on nodes a, b: core 0 ")


@pytest.mark.parametrize(
    ("keys", "failing", "said"),
    [
        ((0, 1, 2), (1,), "core 1 retired: core 1 failed to initialise"),
        ((0, 1, 2, 3), (1, 3), "cores 1, 3 retired: cores 1, 3 failed to initialise"),
    ],
)
def test_keys_failing_while_others_start_are_said_once_after_start_up(keys, failing, said):
    clock = FakeClock(T0)
    starts = {k: FailsToStart(UNAVAILABLE, after_s=0.1) if k in failing else Up(0.5) for k in keys}
    pool = FakePool(clock, keys=keys, starts=starts)
    result, rows, watch = _run(pool, _plan(keys=keys), n=20)
    assert result.status == "complete" and sorted(rows) == list(range(20))
    retired = [(i, e) for i, e in enumerate(watch.events) if isinstance(e, ev.Warned)]
    ((at, warned),) = [(i, e) for i, e in retired if "retired" in str(e.message)]
    assert str(warned.message).startswith(said)
    assert "leave " in str(warned.message)  # the others run: leaving these out can help
    # Said once start-up is over: after every other worker came up, before CoresReady.
    ups = [i for i, e in enumerate(watch.events) if isinstance(e, ev.ChildReady)]
    (ready,) = [i for i, e in enumerate(watch.events) if isinstance(e, ev.CoresReady)]
    assert max(ups) < at < ready
    assert watch.when(ev.CoreRetired) == [T0 + 0.1] * len(failing)  # retired at once
    assert result.retired_cores == list(failing)
    assert sorted(k for _, k in pool.of("retire")) == list(failing)


def test_canaries_that_differ_name_the_odd_core_out():
    clock = FakeClock(T0)
    same, odd = [np.ones(10, np.float32)], [np.full(10, 2.0, np.float32)]
    starts = {0: Up(canary=same), 1: Up(0.2, canary=odd), 2: Up(0.1, canary=same)}
    pool = FakePool(clock, keys=(0, 1, 2), starts=starts, items=lambda i, key, n: Succeed(0.1))
    result, _, watch = _run(pool, _plan(), n=20)
    assert result.status == "complete"
    (differs,) = [w for w in watch.said() if "different outputs" in w]
    assert differs.startswith("core 1 gives different outputs from core 0")


# ---------------------------------------------------------------- time
def test_a_gap_in_the_loops_turns_shifts_the_pool_and_blames_nothing():
    """The loop does not run for 10 s (a suspended process) while an item of 2 s is being
    inferred with a 5 s timeout: the pool is told of the gap, so its check finds no hang."""
    clock = FakeClock(T0)
    pool = FakePool(clock, keys=(0,), inference_timeout_s=5.0, items={0: Succeed(2.0)})
    pool.stall(T0 + 1.0, 10.0)
    result, rows, watch = _run(pool, _plan(keys=(0,)), n=3)
    assert result.status == "complete" and sorted(rows) == list(range(3))
    ((_, gap),) = pool.of("shift")
    assert 10.0 <= gap <= 10.0 + TICK_S
    assert all(r.attempt == 1 and r.error is None for r in rows.values())
    assert not watch.of(ev.Restarted) and not pool.of("start_worker")
    assert watch.said() == []


# ---------------------------------------------------------------- stopping
def _stop_after(rows: int, reason: str = "interrupted by a test", twice: bool = False):
    """An observer's act: request a stop once ``rows`` rows are done (again at Stopping)."""

    def act(watch: _Watch, event: object) -> None:
        if isinstance(event, ev.RowsDone) and len(watch.rows) >= rows and not watch.of(ev.Stopping):
            watch.engine.request_stop(reason)
        if twice and isinstance(event, ev.Stopping):
            watch.engine.request_stop(reason)

    return act


def test_a_stop_request_drains_the_items_in_flight():
    clock = FakeClock(T0)
    pool = FakePool(clock, keys=(0, 1), items=lambda i, key, n: Succeed(0.5))
    result, rows, watch = _run(pool, _plan(keys=(0, 1)), n=40, act=_stop_after(4))
    assert result.status == "interrupted" and result.error is None
    (stopped_at,) = watch.when(ev.Stopping)
    sent = [i for _, _, indexes, t in pool.of("send_work") for i in indexes]
    assert all(t <= stopped_at for *_, t in pool.of("send_work"))  # nothing sent after it
    assert sorted(rows) == sorted(sent) and len(rows) < 40  # every item in flight finished
    # The pool is told once, so that it starts no worker while the run drains.
    assert pool.of("stopping") == [("stopping",)]
    assert pool.calls.index(("stopping",)) > pool.calls.index(pool.of("send_work")[-1])
    assert all(r.error is None for r in rows.values())
    assert (
        "interrupted by a test: finishing the items in flight (at most 10 s); press Ctrl-C "
        "again to stop at once." in watch.said()
    )
    assert pool.of("close") == [("close", False)]


def test_a_second_stop_request_stops_at_once():
    clock = FakeClock(T0)
    pool = FakePool(clock, keys=(0, 1), items=lambda i, key, n: Succeed(0.5))
    result, rows, watch = _run(pool, _plan(keys=(0, 1)), n=40, act=_stop_after(4, twice=True))
    assert result.status == "interrupted"
    (stopped_at,) = watch.when(ev.Stopping)
    sent = {i for _, _, indexes, _ in pool.of("send_work") for i in indexes}
    assert set(rows) < sent  # items in flight were left, not waited for
    assert pool.closed_at is not None and pool.closed_at - stopped_at <= TICK_S
    assert pool.of("close") == [("close", True)]


def test_the_drain_timeout_ends_a_stuck_drain_as_interrupted():
    clock = FakeClock(T0)
    pool = FakePool(clock, keys=(0,), inference_timeout_s=1e6, items={2: Hang()})
    plan = _plan(keys=(0,), drain_timeout_s=3.0)
    result, rows, watch = _run(pool, plan, n=10, act=_stop_after(1))
    assert result.status == "interrupted"
    (stopped_at,) = watch.when(ev.Stopping)
    assert pool.closed_at is not None
    assert stopped_at + 3.0 <= pool.closed_at <= stopped_at + 3.0 + TICK_S
    assert 2 not in rows and sorted(rows) == [0, 1]
    assert pool.of("close") == [("close", False)]


def test_a_worker_lost_while_stopping_is_not_restarted():
    clock = FakeClock(T0)
    items = {3: Crash(0.5)}
    pool = FakePool(clock, keys=(0,), items=lambda i, key, n: items.get(i, Succeed(0.5)))
    result, rows, watch = _run(pool, _plan(keys=(0,)), n=10, act=_stop_after(1))
    assert result.status == "interrupted"
    assert f"core 0: {CRASHED} while the run was stopping; not restarted." in watch.said()
    assert not pool.of("start_worker") and not watch.of(ev.Restarted)
    assert sorted(rows) == [0, 1, 2]  # 3 and what was queued behind it are left for resume


# ---------------------------------------------------------------- readers
class _FilesSource(ArraySource):
    """Items that a reader reads (as files would be)."""

    needs_reader = True
    kind = "npy"


def test_a_reader_lost_with_a_culprit_charges_that_item():
    clock = FakeClock(T0)
    reads = {4: [ReaderDies(), Read()], 6: ReaderDies()}
    pool = FakePool(clock, keys=(0, 1), readers=1, reads=reads)
    source = _FilesSource([np.zeros((1, 8, 8, 1), np.uint8)] * 12)
    result, rows, watch = _run(pool, _plan(keys=(0, 1), max_attempts=2), source=source)
    assert result.status == "complete" and sorted(rows) == list(range(12))
    assert rows[4].error is None and rows[4].attempt == 2  # charged one attempt
    assert rows[6].error == (
        "cannot read array/6: the reader process died (killed by SIGKILL); "
        "cannot read array/6: the reader process died (killed by SIGKILL)"
    )
    assert result.counts["input_errors"] == 1
    assert all(r.attempt == 1 for i, r in rows.items() if i not in (4, 6))
    assert pool.of("restart_reader") == [("restart_reader", 0)] * 3
    assert watch.said().count("reader 0 died (killed by SIGKILL); started a new one.") == 3
    assert len([e for e in watch.of(ev.ChildReady) if e.kind == "reader"]) == 4


def test_readers_the_pool_adds_and_closes_take_reads_and_stop_taking_them():
    """The pool's reader scaling comes to the loop as events (it holds no scheduler): the
    scheduler sends reads to a reader added (ReaderAdded) and none to one closing."""
    clock = FakeClock(T0)
    reads = {i: Read(0.2) for i in range(60)}  # slower than the worker: both readers busy
    pool = FakePool(clock, keys=(0,), readers=1, reads=reads, items=lambda i, k, n: Succeed(0.1))
    pool.at(T0 + 1.0, ReaderAdded(1))
    pool.at(T0 + 3.0, ReaderClosing(0))
    source = _FilesSource([np.zeros((1, 8, 8, 1), np.uint8)] * 60)
    result, rows, _ = _run(pool, _plan(keys=(0,)), source=source)
    assert result.status == "complete" and sorted(rows) == list(range(60))
    reads = [(reader, t) for _, reader, _, t in pool.of("send_reads")]
    assert {r for r, t in reads if t < T0 + 1.0} == {0}
    assert 1 in {r for r, t in reads if T0 + 1.0 < t < T0 + 3.0}
    assert {r for r, t in reads if t > T0 + 3.0} == {1}  # without the closing: 0 and 1


# ---------------------------------------------------------------- the pool says
def test_every_key_retired_mid_run_fails_the_run():
    clock = FakeClock(T0)
    pool = FakePool(clock, keys=(0, 1), items=lambda i, key, n: Succeed(1.0))
    left = CoreReason.of("its node left the cluster")
    pool.at(T0 + 2.5, WorkerRetired(0, left, quiet=True))
    pool.at(T0 + 2.5, WorkerRetired(1, left, quiet=True))
    result, rows, watch = _run(pool, _plan(keys=(0, 1)), n=40)
    assert result.status == "failed" and isinstance(result.error, RunFailedError)
    assert "every NPU core was retired" in str(result.error)
    assert sorted(k for _, k in pool.of("retire")) == [0, 1]
    assert not [w for w in watch.said() if "retired" in w]  # quiet: the pool said why
    assert [e.core for e in watch.of(ev.CoreRetired)] == [0, 1]
    assert len(rows) == 4  # two each, before they left; nothing after


def test_what_the_pool_says_is_a_warning():
    clock = FakeClock(T0)
    pool = FakePool(clock, keys=(0,), items=lambda i, key, n: Succeed(0.1))
    pool.at(T0 + 0.5, Said("node b left the cluster; its items run elsewhere."))
    result, rows, watch = _run(pool, _plan(keys=(0,)), n=20)
    assert result.status == "complete" and sorted(rows) == list(range(20))
    assert watch.said() == ["node b left the cluster; its items run elsewhere."]
    assert [str(w) for w in result.warnings] == watch.said()


def test_keys_of_a_cluster_are_named_by_node_core_and_instance():
    """A Ray-shaped layout: one key per instance of core 0 on nodes a and b."""
    clock = FakeClock(T0)

    def where(key: int) -> Where:
        return Where(core=0, node="ab"[key // 2], instance=key % 2)

    pool = FakePool(
        clock,
        keys=(0, 1, 2, 3),
        items={5: [Crash(0.05), Succeed()]},
        where=where,
        place=lambda key: ("ab"[key // 2], 0),
        physical=lambda key: ("ab"[key // 2], 0),
        nodes=("a", "b"),
    )
    result, rows, watch = _run(pool, _plan(keys=(0,)), n=12)
    assert result.status == "complete" and sorted(rows) == list(range(12))
    (crashed,) = [key for key, sent in _sends(pool) if 5 in sent][:1]
    w = where(crashed)
    assert (
        f"core 0 of node {w.node} (instance {w.instance}): {CRASHED}; restarting it in 0.25 s."
        in watch.said()
    )
    assert rows[5].node != w.node  # retried on the other node's core
    assert set(result.sdk_versions) == {"a/0", "b/0"}
    assert watch.of(ev.Started)[0].nodes == ("a", "b")


# ---------------------------------------------------------------- events
def test_observers_see_the_runs_events_in_order():
    clock = FakeClock(T0)
    starts = {0: Up(0.1), 1: FailsToStart(UNAVAILABLE, after_s=0.3)}
    pool = FakePool(clock, keys=(0, 1), starts=starts, items={2: [Crash(0.05), Succeed()]})
    plan = _plan(keys=(0, 1), cores_start_together=True)
    result, rows, watch = _run(pool, plan, n=4)
    assert result.status == "complete" and sorted(rows) == list(range(4))
    kinds = (ev.Started, ev.ChildReady, ev.CoreRetired, ev.CoresReady, ev.Dispatched, ev.Restarted)
    seen = [
        (type(e).__name__, getattr(e, "core", getattr(e, "key", None)), getattr(e, "count", None))
        for e in watch.events
        if isinstance(e, kinds)
    ]
    assert seen == [
        ("Started", None, None),
        ("ChildReady", 0, None),
        ("CoreRetired", 1, None),
        ("CoresReady", None, None),
        ("Dispatched", 0, 4),
        ("Restarted", 0, None),
        ("ChildReady", 0, None),
        ("Dispatched", 0, 1),  # the crashed item alone
        ("Dispatched", 0, 1),
    ]
    started = watch.of(ev.Started)[0]
    assert (started.todo, started.cores, started.backend, started.t) == (4, (0, 1), "sim", T0)
