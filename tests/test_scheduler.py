"""The scheduler and the watchdog, driven by scripted events: no processes, no clock.

Each test plays what children would report (loaded, done, died) at chosen times and checks
the decisions: which core gets an item, what is retried, which row is due, when a core
restarts or retires, which child is hung.
"""

from __future__ import annotations

import numpy as np
import pytest

from batchinfer.data.dataset import Item
from batchinfer.engine.core_life import BACKOFF_S, MAX_CRASHES_IN_ROW
from batchinfer.engine.plumbing.children import Child
from batchinfer.engine.queue_depth import QUEUED_PER_INSTANCE, REFILL_AT
from batchinfer.engine.scheduler import (
    MAX_READER_DEATHS,
    READ_BATCH,
    ReaderDeathsExceeded,
    Scheduler,
)
from batchinfer.engine.watchdog import HangLimit, Watchdog
from batchinfer.options import ReliabilityOptions


def item(i: int) -> Item:
    return Item(index=i, path=f"/d/{i}.png", id=f"{i}.png", label=None, label_name=None)


def ready_scheduler(slots=8, cores=(0, 1, 2), k=1, readers=1, max_attempts=2) -> Scheduler:
    s = Scheduler(slots, cores, k, readers, max_attempts)
    for c in cores:
        s.life.core_ready(c)
    return s


def admit_ready(s: Scheduler, n: int, now: float = 0.0) -> list[int]:
    """Admit n items straight to READY (a source without readers)."""
    return [s.admit(item(i), now, needs_reader=False) for i in range(n)]


def test_reads_go_to_the_least_loaded_reader_and_errors_are_rows_at_once():
    s = Scheduler(6, (0,), 1, readers=2, max_attempts=3)
    slots = [s.admit(item(i), 0.0, needs_reader=True) for i in range(4)]
    reads = s.take_reads()
    assert reads == {0: [slots[0], slots[2]], 1: [slots[1], slots[3]]}
    assert s.take_reads() == {}  # sent once
    bad = s.loaded(slots[0], 1.5, "Cannot read 0.png: the file is empty.", 1.0)
    assert (bad.slot, bad.attempt, bad.core) == (slots[0], 0, None)  # no retry for input errors
    assert s.loaded(slots[1], 1.0, None, 1.0) is None
    assert list(s.ready) == [slots[1]]


def test_a_busy_reader_gets_new_reads_in_batches_an_idle_one_at_once():
    s = Scheduler(2 + 2 * READ_BATCH, (0,), 1, readers=1, max_attempts=2)
    first = [s.admit(item(0), 0.0, needs_reader=True)]
    assert s.take_reads() == {0: first}  # idle: at once
    more = [s.admit(item(i), 0.0, needs_reader=True) for i in range(1, READ_BATCH)]
    assert s.take_reads() == {}  # busy: they wait for company
    more.append(s.admit(item(READ_BATCH), 0.0, needs_reader=True))
    assert s.take_reads() == {0: more}  # a batch's worth
    late = s.admit(item(99), 0.0, needs_reader=True)
    assert s.take_reads() == {}
    for slot in first + more:
        s.loaded(slot, 1.0, None, 1.0)
    assert s.take_reads() == {0: [late]}  # idle again: what waits goes


def test_dispatch_balances_cores_and_respects_their_capacity():
    s = ready_scheduler(slots=20, k=1)
    admit_ready(s, 20)
    sent = s.dispatch(0.0)
    assert {c: len(v) for c, v in sent.items()} == {c: QUEUED_PER_INSTANCE for c in (0, 1, 2)}
    assert len(s.ready) == 20 - 3 * QUEUED_PER_INSTANCE
    assert s.dispatch(0.0) == {}  # every core full
    done = s.done(1, sent[1][0], None)
    assert (done.error, done.attempt, done.core) == (None, 1, 1)
    s.release(done.slot)
    # Core 1 has room for one, but still holds more than REFILL_AT: items are not sent one
    # by one as room appears; once it is down to REFILL_AT, it is filled up in one message.
    assert s.dispatch(0.0) == {}
    for slot in sent[1][1 : QUEUED_PER_INSTANCE - REFILL_AT]:
        s.release(s.done(1, slot, None).slot)
    assert len(s.cores[1].inflight) == REFILL_AT
    next_ready = list(s.ready)[: QUEUED_PER_INSTANCE - REFILL_AT]
    assert s.dispatch(0.0) == {1: next_ready}


def test_a_none_is_retried_on_a_core_the_item_has_not_tried():
    s = ready_scheduler(slots=4, cores=(0, 1), max_attempts=2)
    (slot,) = admit_ready(s, 1)
    assert s.dispatch(0.0) == {0: [slot]}
    first_core = 0
    assert s.done(first_core, slot, "inference() returned None") is None
    retry = s.dispatch(1.0)
    other = 1 - first_core
    assert retry == {other: [slot]}
    final = s.done(other, slot, "inference() returned None")
    assert final.attempt == 2 and final.core == other
    assert final.error.count("returned None") == 2
    assert f"core {first_core}:" in final.error and f"core {other}:" in final.error


def test_a_retry_waits_for_an_untried_core_rather_than_reusing_the_failed_one():
    n = 2 * QUEUED_PER_INSTANCE + 1  # both cores full, one item waiting
    s = ready_scheduler(slots=n + 2, cores=(0, 1), max_attempts=3)
    slots = admit_ready(s, n)
    sent = s.dispatch(0.0)
    victim = sent[0][0]
    assert s.done(0, victim, "boom") is None
    # Core 1 is full, core 0 has room: the retry must wait for core 1.
    assert victim not in s.dispatch(0.0).get(0, [])
    assert victim in s.ready
    for slot in sent[1][: QUEUED_PER_INSTANCE - REFILL_AT]:  # core 1 down to REFILL_AT
        s.release(s.done(1, slot, None).slot)
    assert victim in s.dispatch(0.0).get(1, [])
    assert len(slots) == n


def test_a_crash_charges_only_the_items_that_were_inferring_and_backs_off():
    s = ready_scheduler(slots=12, cores=(0, 1), k=2)
    admit_ready(s, 12)
    sent = s.dispatch(0.0)
    on_core0 = sent[0]
    inferring = {s.flight(on_core0[0]).item.index}  # one instance was inside inference()
    loss = s.life.core_lost(0, inferring, "worker process crashed (exit code -9)", now=10.0)
    assert loss.finished == []  # first attempt: retried, not yet a row
    assert loss.restart_at == 10.0 + BACKOFF_S[0] and not loss.blamed_items
    assert s.flight(on_core0[0]).failures == ["core 0: worker process crashed (exit code -9)"]
    for slot in on_core0[1:]:
        assert s.flight(slot).failures == []  # only queued: not charged
        assert slot in s.ready
    assert s.cores[0].state == "down" and not s.cores[0].inflight
    assert s.life.restarts_due(10.1) == []
    assert s.life.restarts_due(10.0 + BACKOFF_S[0]) == [0]
    assert s.cores[0].state == "starting"


def test_a_core_that_crashes_without_any_success_is_retired():
    s = ready_scheduler(slots=20, cores=(0, 1), max_attempts=9)
    admit_ready(s, 20)
    now = 0.0
    for crash in range(MAX_CRASHES_IN_ROW):
        sent = s.dispatch(now)
        assert 0 in sent
        charged = {s.flight(sent[0][0]).item.index}
        # A different, fresh item each time: the core is to blame, not an item.
        for slot in sent[0]:
            s.flight(slot).crashes = 0
        loss = s.life.core_lost(0, charged, "worker process crashed", now)
        if crash < MAX_CRASHES_IN_ROW - 1:
            assert loss.restart_at is not None
            now = loss.restart_at
            s.life.restarts_due(now)
            s.life.core_ready(0)
        else:
            assert loss.restart_at is None and s.cores[0].state == "retired"
    assert s.alive_cores() == [1]


def test_one_poison_item_never_retires_the_only_core():
    """Issue: `--cores 0 --max-attempts 3 --sim-fault crash:item=5` retired the only core."""
    s = ready_scheduler(slots=4, cores=(0,), max_attempts=3)
    (slot,) = admit_ready(s, 1)
    now, rows = 0.0, []
    for _ in range(3):
        assert s.dispatch(now) == {0: [slot]}
        loss = s.life.core_lost(0, {0}, "worker process crashed (exit code -9)", now)
        rows += loss.finished
        assert loss.restart_at is not None, "the core is never retired for the item's crashes"
        now = loss.restart_at
        s.life.restarts_due(now)
        s.life.core_ready(0)
    assert len(rows) == 1 and rows[0].attempt == 3 and rows[0].core == 0
    assert s.cores[0].crashes_in_row == 1  # only the first crash could have been the core's


def test_one_poison_item_does_not_retire_healthy_cores_across_three_cores():
    """Issue: with 3 cores and --max-attempts 9, one poison item retired two cores."""
    s = ready_scheduler(slots=4, cores=(0, 1, 2), max_attempts=9)
    (slot,) = admit_ready(s, 1)
    now, rows, crashed = 0.0, [], []
    while not rows:
        now += 10.0  # every back-off has passed
        for core in s.life.restarts_due(now):
            s.life.core_ready(core)
        ((core, [sent]),) = s.dispatch(now).items()
        assert sent == slot
        crashed.append(core)
        rows = s.life.core_lost(core, {0}, "crashed", now).finished
    assert len(crashed) == 9 and set(crashed) == {0, 1, 2}
    assert rows[0].attempt == 9
    assert all(st.state != "retired" for st in s.cores.values())
    assert max(st.crashes_in_row for st in s.cores.values()) == 1


def test_a_success_resets_the_crash_count():
    s = ready_scheduler(slots=8, cores=(0,), max_attempts=5)
    admit_ready(s, 8)
    sent = s.dispatch(0.0)
    s.life.core_lost(0, {s.flight(sent[0][0]).item.index}, "crashed", 0.0)
    s.life.restarts_due(1.0)
    s.life.core_ready(0)
    sent = s.dispatch(1.0)
    s.release(s.done(0, sent[0][0], None).slot)
    assert s.cores[0].crashes_in_row == 0


def test_a_reader_death_charges_the_file_it_was_decoding_and_rereads_the_rest():
    s = Scheduler(6, (0,), 1, readers=1, max_attempts=2)
    slots = [s.admit(item(i), 0.0, needs_reader=True) for i in range(3)]
    s.take_reads()
    assert s.reader_lost(0, slots[0], "was stuck for more than 1 s") == []
    assert s.flight(slots[0]).failures == [
        "cannot read 0.png: the reader process was stuck for more than 1 s"
    ]
    assert s.take_reads() == {0: slots}  # all read again by the new reader
    (row,) = s.reader_lost(0, slots[0], "was stuck for more than 1 s")
    assert row.slot == slots[0] and row.attempt == 0 and row.error.count("stuck") == 2
    assert s.reader_deaths == 0, "a file's fault is not the machine's"


def test_a_reader_being_stopped_is_never_sent_the_reads_it_was_waiting_to_batch():
    # Reader 1 is busy, so two more reads wait for a batch; then the run has readers to
    # spare and closes it. It once was told to stop as soon as its read in flight was
    # done, then sent the waiting reads: it exited holding them, and that counted as a
    # reader death with no file to blame (and "reader 1 stopped ...; started a new one").
    s = Scheduler(12, (0,), 1, readers=2, max_attempts=2)
    first = [s.admit(item(i), 0.0, needs_reader=True) for i in range(2)]
    assert s.take_reads() == {0: [first[0]], 1: [first[1]]}
    waiting = [s.admit(item(i), 0.0, needs_reader=True) for i in range(2, 6)]
    assert s.take_reads() == {}  # both readers busy: the new reads wait for a batch
    s.close_reader(1)
    assert s.held_by_reader(1) == 1  # the read in flight; once done, the loop stops it
    s.loaded(first[1], 1.0, None, 0.1)
    assert s.held_by_reader(1) == 0
    sent = s.take_reads()  # (the stop went out here) and nothing more may go to reader 1
    assert 1 not in sent and sorted(s.unsent[0] + sent.get(0, [])) == sorted(waiting)


def test_reader_deaths_with_no_file_to_blame_are_limited():
    s = Scheduler(4, (0,), 1, readers=1, max_attempts=2)
    for _ in range(MAX_READER_DEATHS):
        s.reader_lost(0, None, "died (exit code -9)")
    with pytest.raises(ReaderDeathsExceeded):
        s.reader_lost(0, None, "died (exit code -9)")


def test_after_a_stop_nothing_is_dispatched_and_unfinished_items_are_left_for_resume():
    s = ready_scheduler(slots=8, cores=(0,), max_attempts=3)
    admit_ready(s, 8)
    sent = s.dispatch(0.0)
    s.stop()
    assert not s.can_admit() and s.dispatch(1.0) == {}
    assert not s.ready  # READY items were released without rows
    assert s.done(0, sent[0][0], "boom") is None  # attempts left: released, not a row
    assert s.in_flight()
    for slot in sent[0][1:]:
        s.release(s.done(0, slot, None).slot)
    assert not s.in_flight() and not s.busy()


# ------------------------------------------------------------------------------ watchdog
def child(kind="worker", key=0, last_progress=0.0, held=0) -> Child:
    c = Child(kind, key, None, None, None, 0.0, None, "", "ready", last_progress)
    c.held = {slot: Item(slot, "", "", None, None) for slot in range(held)}
    return c


REL = ReliabilityOptions(inference_timeout_s=2.0, decode_timeout_s=5.0)


def watchdog():
    rows = {("worker", 0): slice(0, 2), ("reader", 0): slice(2, 3)}
    return Watchdog(REL, lambda c: rows[(c.kind, c.key)])


def board(*rows):
    return np.array(rows, dtype=np.float64)


def test_an_inference_past_its_timeout_is_hung_and_named():
    w, c = watchdog(), child()
    assert w.hung(2.0, [c], board((7, 1.0), (0, 0), (0, 0))) == []
    ((who, why, _),) = w.hung(3.5, [c], board((7, 1.0), (0, 0), (0, 0)))
    assert who is c and why.startswith("inference of item 7 hung for more than 2 s")


def test_a_reader_uses_the_decode_timeout():
    w, r = watchdog(), child("reader", 0)
    assert w.hung(5.0, [r], board((0, 0), (0, 0), (3, 1.0))) == []
    ((_, why, _),) = w.hung(6.5, [r], board((0, 0), (0, 0), (3, 1.0)))
    assert "more than 5 s (the decode timeout)" in why


def test_a_child_frozen_between_items_while_holding_some_is_hung():
    idle = board((0, 0), (0, 0), (0, 0))
    assert watchdog().hung(100.0, [child()], idle) == []  # idle and empty: fine
    assert watchdog().hung(1.5, [child(held=3)], idle) == []  # held briefly: fine
    ((_, why, _),) = watchdog().hung(2.5, [child(held=3)], idle)
    assert "made no progress for more than 2 s" in why and "holding 3 item(s)" in why


def test_a_child_still_starting_is_judged_by_its_deadline_only():
    c = child(held=3)
    c.state, c.deadline, c.phase = "starting", 10.0, "loading the model took too long"
    assert watchdog().hung(9.0, [c], board((7, 1.0), (0, 0), (0, 0))) == []
    assert watchdog().hung(10.5, [c], board((0, 0), (0, 0), (0, 0))) == [
        (c, "loading the model took too long; killed", None)
    ]


def test_time_the_coordinator_was_not_running_is_not_held_against_children():
    """Ctrl-Z for longer than the timeout: when the job continues, nobody is killed."""
    w, c = watchdog(), child(last_progress=1.0, held=2)
    busy = board((7, 1.0), (0, 0), (0, 0))
    # A minute stopped, as the loop found (tests/test_loop.py); the pool moves the clocks.
    w.resumed(61.0)
    c.last_progress += 60.0
    assert w.hung(61.1, [c], busy) == []
    assert w.hung(61.1, [c], board((0, 0), (0, 0), (0, 0))) == []
    # ... but time after the pause counts again.
    assert w.hung(63.5, [c], busy)


def test_one_hang_limit_makes_the_texts_of_the_board_and_the_cluster() -> None:
    """The board's watchdog and the Ray pool (a call of n items: n times the limit) say a
    hang in the same words (HangLimit)."""
    inference, decode = HangLimit.inference(REL), HangLimit.decode(REL)
    assert inference == HangLimit(2.0, "the inference timeout")
    call = inference.of(3)
    assert not call.passed(1.0, 7.0) and call.passed(1.0, 7.01)
    assert call.hung("inference of a call of 3 items", "actor") == (
        "inference of a call of 3 items hung for more than 6 s (the inference timeout); "
        "actor killed"
    )
    assert decode.of(2).stuck() == "was stuck for more than 10 s (the decode timeout)"
    ((_, why, _),) = watchdog().hung(3.5, [child()], board((7, 1.0), (0, 0), (0, 0)))
    assert why == inference.hung("inference of item 7", "worker")
    ((_, why, _),) = watchdog().hung(2.5, [child(held=3)], board((0, 0), (0, 0), (0, 0)))
    assert why == inference.frozen(3)


# ------------------------------------------------------------------------ reader scaling
def _turns(scaler, t: float, turns) -> float:
    """Script the loop's turns: each ``(wait_s, starved)`` is one turn that waited
    ``wait_s`` for its events in that state; returns the time after the last."""
    for wait_s, starved in turns:
        t += wait_s
        scaler.observe(t, starved)
    return t


def test_readers_grow_when_cores_wait_for_busy_readers_and_cpus_are_free():
    from batchinfer.engine.reader_scaling import WINDOW_S, ReaderScaler

    s = ReaderScaler(1, 4, start_at=0.0)
    t, change = 0.0, 0
    for _ in range(2):  # the first window after start is a cool-down
        t = _turns(s, t, [(WINDOW_S / 8, True)] * 8)
        s.decoded(0.95 * WINDOW_S)  # one reader decoding 95 % of the time
        change = s.decide(t, readers=1, idle_cpus=lambda: 1.0)
    assert change == 1


def test_readers_grow_with_a_third_of_a_cpu_free():
    """One reader on a 2-CPU board leaves about half a CPU to the workers and the
    coordinator's share: the free share a second reader finds is well under a whole CPU."""
    from batchinfer.engine.reader_scaling import WINDOW_S, ReaderScaler

    s = ReaderScaler(1, 2, start_at=0.0)
    t, changes = 0.0, []
    for _ in range(2):  # the first window after start is a cool-down
        t = _turns(s, t, [(WINDOW_S, True)])
        s.decoded(0.98 * WINDOW_S)
        changes.append(s.decide(t, readers=1, idle_cpus=lambda: 0.4))
    assert changes == [0, 1]


def test_a_starved_pipeline_grows_though_it_looks_fed_right_after_each_item_arrives():
    """Issue 11: one reader of big JPEGs (33 ms each) feeding a 2 ms NPU. A turn waits
    31 ms for the reader's item, which is READY once that turn's events are handled, then a
    turn waits 2 ms for the inference. Sampled after a turn's events, the pipeline looked
    fed after every item (the loop sampled there, so readers never grew); the cores waited
    all the time, and that time is what counts now."""
    from batchinfer.engine.reader_scaling import WINDOW_S, ReaderScaler

    s = ReaderScaler(1, 2, start_at=0.0)
    cycle = [(0.031, True), (0.002, True)]  # both waits: a core with room, nothing READY
    t, changes = 0.0, []
    while t < 2 * WINDOW_S + 0.1:
        t = _turns(s, t, cycle)
        s.decoded(0.033)
        changes.append(s.decide(t, readers=1, idle_cpus=lambda: 0.9))
    assert changes.count(1) == 1 and changes.index(1) > 0  # after the cool-down window


def test_once_start_up_is_over_a_short_window_is_judged_instead_of_the_cool_down():
    """Told that every process of the run is up, the scaler judges a window of
    FIRST_WINDOW_S from then, not the rest of its cool-down: a run of a few seconds grew its
    second reader only after 2 s, as the cool-down window (the first second) went unjudged.
    Told again, or once the cool-down is over, nothing changes."""
    from batchinfer.engine.reader_scaling import FIRST_WINDOW_S, WINDOW_S, ReaderScaler

    def starved_window(s: ReaderScaler, t: float, length: float) -> tuple[float, int]:
        t = _turns(s, t, [(length / 4, True)] * 4)
        s.decoded(0.95 * length)  # one reader decoding 95 % of the time
        return t, s.decide(t, readers=1, idle_cpus=lambda: 1.0)

    calls = []
    told = ReaderScaler(1, 2, start_at=0.0)
    t = _turns(told, 0.0, [(0.3, False)])  # start-up: processes starting
    told.started(t, idle_cpus=lambda: calls.append(t) or 1.0)
    told.started(t + 0.01, idle_cpus=lambda: calls.append(t + 0.01) or 1.0)
    assert calls == [t]  # once: the window's CPU measure starts there
    assert starved_window(told, t, FIRST_WINDOW_S) == (t + FIRST_WINDOW_S, 1)

    untold = ReaderScaler(1, 2, start_at=0.0)
    t = _turns(untold, 0.0, [(0.3, False)])
    assert starved_window(untold, t, WINDOW_S)[1] == 0  # still the cool-down window

    late = ReaderScaler(1, 2, start_at=0.0)  # start-up outlasted the cool-down window
    t, change = starved_window(late, 0.0, WINDOW_S)
    late.started(t, idle_cpus=lambda: 1.0)
    assert change == 0 and starved_window(late, t, FIRST_WINDOW_S)[1] == 0  # no short window
    assert starved_window(late, t + FIRST_WINDOW_S, WINDOW_S)[1] == 1


def test_the_window_after_a_change_is_not_judged():
    """It holds the new reader's start-up: judged, it would look like more of the same."""
    from batchinfer.engine.reader_scaling import WINDOW_S, ReaderScaler

    s = ReaderScaler(1, 4, start_at=0.0)
    t, changes = 0.0, []
    for _ in range(4):
        t = _turns(s, t, [(WINDOW_S, True)])
        s.decoded(WINDOW_S)
        changes.append(s.decide(t, readers=1, idle_cpus=lambda: 1.0))
    assert changes == [0, 1, 0, 1]


def test_starvation_is_weighed_by_time_not_by_turns():
    """Many short turns in which the cores waited do not outweigh the long one in which
    they were fed; a few long starved waits outweigh many short fed turns."""
    from batchinfer.engine.reader_scaling import WINDOW_S, ReaderScaler

    def after_cooldown(turns) -> int:
        s = ReaderScaler(1, 2, start_at=0.0)
        t = _turns(s, 0.0, [(WINDOW_S, False)])
        s.decide(t, readers=1, idle_cpus=lambda: 1.0)  # cool-down window
        t = _turns(s, t, turns)
        s.decoded(t - WINDOW_S)  # the reader was busy all the window
        return s.decide(t, readers=1, idle_cpus=lambda: 1.0)

    short_starved = [(0.001, True)] * 30 + [(WINDOW_S - 0.03, False)]  # 97 % of turns
    assert after_cooldown(short_starved) == 0
    long_starved = [(0.0001, False)] * 100 + [(WINDOW_S / 2, True)] * 2  # 2 % of turns
    assert after_cooldown(long_starved) == 1


def test_readers_do_not_grow_without_a_free_cpu_and_shrink_when_saturated_and_fed():
    from batchinfer.engine.reader_scaling import WINDOW_S, ReaderScaler

    s = ReaderScaler(1, 4, start_at=0.0)
    t = _turns(s, 0.0, [(WINDOW_S, True)])
    s.decide(t, readers=2, idle_cpus=lambda: 0.0)  # cool-down window
    t = _turns(s, t, [(WINDOW_S / 8, True)] * 8)
    s.decoded(2 * 0.95 * WINDOW_S)
    assert s.decide(t, readers=2, idle_cpus=lambda: 0.1) == 0  # starved, but no CPU free
    t = _turns(s, t, [(WINDOW_S / 8, False)] * 8)  # cores well fed
    assert s.decide(t, readers=2, idle_cpus=lambda: 0.05) == -1  # saturated: one fewer
    t = _turns(s, t, [(WINDOW_S, False)])
    assert s.decide(t, readers=1, idle_cpus=lambda: 0.05) == 0  # cool-down after a change
    t = _turns(s, t, [(WINDOW_S, False)])
    assert s.decide(t, readers=1, idle_cpus=lambda: 0.05) == 0  # never below the minimum


def test_fed_is_said_once_a_judged_window_had_the_cores_well_fed_and_stays_said():
    """What lowers the readers' priority (Engine._yield_to_workers): never for the cool-down
    window, nor for a starved one; once said, it stays (a priority is lowered once)."""
    from batchinfer.engine.reader_scaling import WINDOW_S, ReaderScaler

    s = ReaderScaler(1, 1, start_at=0.0)
    t = _turns(s, 0.0, [(WINDOW_S, False)])
    s.decide(t, readers=1, idle_cpus=lambda: 0.0)
    assert not s.fed  # the cool-down window: start-up, not judged
    t = _turns(s, t, [(WINDOW_S / 2, True), (WINDOW_S / 2, False)])
    s.decide(t, readers=1, idle_cpus=lambda: 0.0)
    assert not s.fed  # the cores waited half the time
    t = _turns(s, t, [(WINDOW_S / 8, False)] * 8)
    s.decide(t, readers=1, idle_cpus=lambda: 0.0)
    assert s.fed
    t = _turns(s, t, [(WINDOW_S, True)])
    s.decide(t, readers=1, idle_cpus=lambda: 0.0)
    assert s.fed


def test_readers_do_not_grow_when_idle_or_unobserved():
    """Starved cores with idle readers (something else is the bottleneck) add no reader;
    nor does a window in which nothing was observed (the dataset had run out)."""
    from batchinfer.engine.reader_scaling import WINDOW_S, ReaderScaler

    s = ReaderScaler(1, 4, start_at=0.0)
    t = _turns(s, 0.0, [(WINDOW_S, True)])
    s.decide(t, readers=1, idle_cpus=lambda: 1.0)  # cool-down window
    t = _turns(s, t, [(WINDOW_S, True)])
    s.decoded(0.5 * WINDOW_S)  # the reader waited half the time
    assert s.decide(t, readers=1, idle_cpus=lambda: 1.0) == 0
    s.decoded(WINDOW_S)
    t = _turns(s, t, [(WINDOW_S / 4, True)])  # then no more observations
    assert s.decide(t + WINDOW_S, readers=1, idle_cpus=lambda: 1.0) == 0


def test_items_in_a_crash_are_retried_alone_so_an_innocent_neighbour_survives():
    """Soak: with k=3, a poison item and its neighbour crashed together, went back together,
    landed on one core together and crashed together again, so the innocent one became an
    error row. Items that were in a crash together are now retried alone on a core."""
    s = ready_scheduler(slots=20, cores=(0, 1, 2), k=3, max_attempts=3)
    admit_ready(s, 12)
    sent = s.dispatch(0.0)
    poison, innocent = sent[0][0], sent[0][1]
    indexes = {s.flight(poison).item.index, s.flight(innocent).item.index}
    s.life.core_lost(0, indexes, "worker process crashed", 0.0)
    assert s.flight(poison).suspect and s.flight(innocent).suspect
    for core in (1, 2):  # cores 1 and 2 still hold their first items
        assert s.cores[core].inflight
    # Neither suspect may join a core that has other items in flight ...
    sent_now = [slot for slots in s.dispatch(1.0).values() for slot in slots]
    assert poison not in sent_now and innocent not in sent_now
    # ... but once core 1 is empty, one of them goes there, alone, and nothing joins it.
    for slot in list(s.cores[1].inflight):
        s.release(s.done(1, slot, None).slot)
    again = s.dispatch(2.0)
    assert again.get(1) in ([poison], [innocent])
    assert s.dispatch(2.0).get(1) is None, "nothing else goes to a core holding a suspect"
    alone = again[1][0]
    s.release(s.done(1, alone, None).slot)  # it was the innocent one, or the poison passed
    assert s.dispatch(3.0).get(1), "the core takes items again once the suspect is done"


def _finish(s: Scheduler, cores, n: int) -> None:
    """Each of ``cores`` finishes ``n`` of the items it holds, successfully."""
    for core in cores:
        for slot in sorted(s.cores[core].inflight)[:n]:
            s.release(s.done(core, slot, None).slot)


def test_a_crash_retry_has_an_untried_core_drained_for_it_instead_of_waiting_for_the_end():
    """An item charged with a crash may go only to an empty core it has not crashed. Cores
    are refilled before they empty, so while items flowed it waited for the end of the run
    (holding a slot). Now the least loaded untried core gets no refills until it is empty,
    then takes the item alone; the reservation ends when the item goes."""
    s = ready_scheduler(slots=40, cores=(0, 1, 2), k=1, max_attempts=3)
    admit_ready(s, 30)
    crashed = s.dispatch(0.0)[0][0]
    s.life.core_lost(0, {s.flight(crashed).item.index}, "worker process crashed", 0.0)
    assert s.flight(crashed).crashes == 1
    drained, t = _until_reserved(s, crashed, (1, 2))
    other = 3 - drained
    # The drained core finishes what it holds and gets nothing new; the other one is
    # refilled as usual; once the drained core is empty, the item goes there alone.
    while True:
        t += 1.0
        _finish(s, (drained, other), 1)
        out = s.dispatch(t)
        if crashed in out.get(drained, []):
            break
        assert drained not in out and s.cores[drained].inflight, "drains, then takes it"
    assert out[drained] == [crashed] and s.cores[drained].inflight == {crashed}
    assert s.cores[drained].reserved is None
    assert s.dispatch(t + 1).get(drained) is None  # nothing joins it until it is done
    s.release(s.done(drained, crashed, None).slot)
    assert s.dispatch(t + 2).get(drained)  # then it is refilled as before


def _until_reserved(s: Scheduler, slot: int, cores) -> tuple[int, float]:
    """Cores finish items and are refilled until one of ``cores`` is reserved for ``slot``
    (the retry waits in the ready queue behind what was there before it)."""
    for t in range(1, 20):
        _finish(s, cores, 3)  # down to REFILL_AT: due a refill
        s.dispatch(float(t))
        reserved = [c for c in cores if s.cores[c].reserved == slot]
        if reserved:
            return reserved[0], float(t)
    raise AssertionError("no core was reserved for the retry")


def test_a_reservation_ends_when_its_core_goes_down():
    s = ready_scheduler(slots=40, cores=(0, 1), k=1, max_attempts=3)
    admit_ready(s, 30)
    crashed = s.dispatch(0.0)[0][0]
    s.life.core_lost(0, {s.flight(crashed).item.index}, "worker process crashed", 0.0)
    _, t = _until_reserved(s, crashed, (1,))
    s.life.core_lost(1, set(), "worker process crashed", t)  # nothing was inferring
    s.dispatch(t + 0.1)
    assert s.cores[1].reserved is None


def test_slots_are_wanted_when_what_is_ready_or_read_does_not_cover_the_cores_room():
    s = ready_scheduler(slots=40, cores=(0, 1), k=1, readers=1)
    room = 2 * QUEUED_PER_INSTANCE
    assert s.slots_wanted()  # empty cores, nothing coming
    reading = [s.admit(item(i), 0.0, needs_reader=True) for i in range(room - 1)]
    assert s.slots_wanted()  # one short
    s.admit(item(99), 0.0, needs_reader=True)  # waiting for a reader counts too
    assert not s.slots_wanted()
    s.take_reads()
    for slot in reading:
        s.loaded(slot, 1.0, None, 0.0)  # READY now: still covers the room
    assert not s.slots_wanted()
    s.dispatch(0.0)  # the cores take them: room and cover shrink together
    assert not s.slots_wanted()
    s.life.core_retired(1)  # a retired core has no room; its items are READY again
    assert not s.slots_wanted()


def _inferring(s: Scheduler, core: int, k: int) -> set[int]:
    """The item indexes inside inference() on ``core``: its first k items."""
    return {s.flight(slot).item.index for slot in sorted(s.cores[core].inflight)[:k]}


def test_a_crash_with_three_inferring_charges_none_and_only_the_poison_becomes_a_row():
    """Issue 27: with k=3 a crash charged every item inside inference(), so an innocent
    neighbour of a poison item (or of a random crash) lost an attempt, and two such
    accidents made an error row. Now: the crash charges none of the three, each is retried
    alone (nothing else in flight on the core meanwhile), the poison crashes alone and is
    charged (an error row after max_attempts, never retiring the core), and the two
    innocents succeed on their first charged attempt with no failure recorded."""
    s = ready_scheduler(slots=20, cores=(0,), k=3, max_attempts=2)
    admit_ready(s, 10)
    sent = s.dispatch(0.0)[0]
    three = sent[:3]
    poison = three[1]
    p_index = s.flight(poison).item.index
    loss = s.life.core_lost(0, _inferring(s, 0, 3), "worker process crashed (exit code -11)", 0.0)
    assert loss.finished == [] and not loss.blamed_items
    for slot in three:
        f = s.flight(slot)
        assert f.failures == [] and f.crashes == 0 and f.suspect  # uncharged suspects
    assert s.cores[0].crashes_in_row == 1  # nobody blamed yet: it counts against the core
    now, rows, successes = loss.restart_at, [], {}
    while len(rows) + len(successes) < 10:
        for core in s.life.restarts_due(now):
            s.life.core_ready(core)
        out = s.dispatch(now).get(0, [])
        suspects = [slot for slot in s.cores[0].inflight if s.flight(slot).suspect]
        if suspects:  # a suspect is inferred alone, and nothing joins it
            assert s.cores[0].inflight == set(suspects) and len(suspects) == 1
        for slot in sorted(s.cores[0].inflight):
            if s.flight(slot).item.index == p_index:
                loss = s.life.core_lost(0, {p_index}, "worker process crashed", now)
                assert loss.blamed_items and loss.restart_at is not None  # never retired
                rows += loss.finished
                now = loss.restart_at
                break
            row = s.done(0, slot, None)
            successes[slot] = row
            s.release(slot)
        else:
            assert out or s.cores[0].inflight or rows, "no progress"
        now += 0.01
    assert [(r.slot, r.attempt) for r in rows] == [(poison, 2)]
    assert "exit code -11" not in rows[0].error  # the shared crash was never charged to it
    assert all(r.error is None and r.attempt == 1 for r in successes.values())
    assert set(successes) == set(range(10)) - {poison}
    assert s.cores[0].state != "retired"


def test_a_hang_charges_only_the_hung_item_and_the_others_go_back_uncharged():
    s = ready_scheduler(slots=20, cores=(0, 1), k=3, max_attempts=2)
    admit_ready(s, 12)
    sent = s.dispatch(0.0)[0]
    indexes = [s.flight(slot).item.index for slot in sent[:3]]
    loss = s.life.core_lost(
        0, set(indexes), "inference of item hung; worker killed", 5.0, culprits={indexes[2]}
    )
    assert loss.finished == []
    assert s.flight(sent[2]).failures == ["core 0: inference of item hung; worker killed"]
    for slot in sent[:2]:
        assert s.flight(slot).failures == [] and not s.flight(slot).suspect
        assert slot in s.ready


def test_the_watchdog_names_only_the_instance_that_hung():
    w, c = watchdog(), child()
    ((who, _, items),) = w.hung(3.5, [c], board((7, 1.0), (8, 3.0), (0, 0)))
    assert who is c and items == {7}  # item 8 was inferring too, but not for too long


def test_a_core_that_crashes_whatever_it_runs_is_retired_and_no_item_becomes_a_row():
    """Uncharged multi-item crashes still count against the core: core 0 crashes with every
    item it infers (three at a time, or a suspect alone); core 1 is healthy."""
    k = 3
    s = ready_scheduler(slots=24, cores=(0, 1), k=k, max_attempts=2)
    admit_ready(s, 24)
    now, rows, done = 0.0, [], 0
    while s.cores[0].state != "retired":
        now += 10.0
        for core in s.life.restarts_due(now):
            s.life.core_ready(core)
        s.dispatch(now)
        for slot in sorted(s.cores[1].inflight):
            s.release(s.done(1, slot, None).slot)
            done += 1
        if s.cores[0].state == "ready" and s.cores[0].inflight:
            rows += s.life.core_lost(0, _inferring(s, 0, k), "crashed", now).finished
        assert now < 1000.0, "core 0 was never retired"
    assert rows == []
