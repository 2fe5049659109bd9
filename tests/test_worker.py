"""The core worker's outbox and sender: how finished results become Done messages."""

from __future__ import annotations

from multiprocessing import Pipe

from batchinfer.engine.board.core_worker import BATCH_MAX, BATCH_WAIT_S, BusyClock, Outbox, Sender
from batchinfer.engine.protocol import Done, InferResult, decode

REFILL_AT = 3


class _Rig:
    """An outbox whose messages are kept in a list; ``left``: what the worker still has."""

    def __init__(self, left: int, busy: BusyClock | None = None) -> None:
        self.left = left
        self.sent: list[tuple[list[int], float]] = []
        self.direct: list[bool] = []
        self.outbox = Outbox(
            lambda batch, busy_s, direct: (
                self.sent.append(([r.slot for r in batch], busy_s)),
                self.direct.append(direct),
            ),
            busy or BusyClock(),
            lambda: self.left,
            REFILL_AT,
        )

    def add(self, slot: int, t0: float, t1: float) -> None:
        self.outbox.add(InferResult(slot, slot, 0, t0, t1, None, None))

    def take(self) -> list[list[int]]:
        out, self.sent = [slots for slots, _ in self.sent], []
        return out


def test_results_wait_until_reporting_them_would_start_a_refill() -> None:
    # The worker held 7 items; the coordinator refills it once it hears it is down to 3.
    rig = _Rig(left=6)
    step = BATCH_WAIT_S / 10  # short inferences: age is no reason to send
    for slot in range(3):
        rig.add(slot, slot * step, (slot + 1) * step)
        rig.left -= 1
        assert rig.take() == [], f"with {rig.left + 1} left, result {slot} waits"
    # 3 left now, 6 as the coordinator counts: reporting these 4 makes it refill.
    rig.add(3, 3 * step, 4 * step)
    assert rig.take() == [[0, 1, 2, 3]]


def test_a_worker_already_counted_as_hungry_batches_until_its_instance_goes_idle() -> None:
    # 2 items left of 3: the coordinator already refills whenever it has something ready,
    # so telling it sooner changes nothing until the worker runs out.
    rig = _Rig(left=2)
    rig.add(0, 0.0, 0.0001)
    rig.left = 1
    rig.add(1, 0.0001, 0.0002)
    assert rig.take() == []
    rig.left = 0
    rig.add(2, 0.0002, 0.0003)
    assert rig.take() == [[0, 1, 2]]


def test_results_do_not_wait_longer_than_the_batch_wait() -> None:
    rig = _Rig(left=10)
    step = BATCH_WAIT_S / 4.5
    for slot in range(4):
        rig.add(slot, slot * step, (slot + 1) * step)
    assert rig.take() == []
    # The oldest would pass the wait before the next inference ends: all go now.
    rig.add(4, 4 * step, 5 * step)
    assert rig.take() == [[0, 1, 2, 3, 4]]


def test_long_inferences_are_not_held_for_the_next() -> None:
    rig = _Rig(left=10)
    rig.add(1, 10.0, 10.0 + 1.5 * BATCH_WAIT_S)
    assert rig.take() == [[1]]


def test_batch_is_capped_and_send_takes_the_rest() -> None:
    rig = _Rig(left=100)
    for slot in range(BATCH_MAX + 2):  # all finished at the same moment: no wait passes
        rig.add(slot, 10.0, 10.0)
    assert rig.take() == [list(range(BATCH_MAX))]
    rig.outbox.send()
    assert rig.take() == [[BATCH_MAX, BATCH_MAX + 1]]
    rig.outbox.send()  # nothing waits: nothing is sent
    assert rig.take() == []


def test_a_batch_carries_the_busy_seconds_so_far() -> None:
    busy = BusyClock()
    busy.enter(1.0)
    assert busy.active == 1
    busy.leave(3.5)
    assert busy.active == 0
    rig = _Rig(left=0, busy=busy)
    rig.add(0, 1.0, 3.5)
    assert rig.sent == [([0], 2.5)]


def test_the_sender_writes_every_delivered_batch_in_order_before_close_returns() -> None:
    receive, send = Pipe(duplex=False)
    sender = Sender(send)
    batches = [[(slot, slot, 0, 0.0, 0.0, None)] for slot in range(50)]
    for i, batch in enumerate(batches):
        sender.deliver(batch, float(i))
    sender.close()
    got = []
    while receive.poll(0):
        got.append(decode(receive.recv()))
    assert [m.results for m in got] == batches
    assert [m.busy_s for m in got] == [float(i) for i in range(50)]
    assert all(isinstance(m, Done) and m.cpu_s > 0 for m in got)  # cpu seconds of the worker


def test_only_a_thread_with_nothing_left_sends_itself() -> None:
    rig = _Rig(left=2)
    rig.add(0, 10.0, 10.0 + 1.5 * BATCH_WAIT_S)  # long: goes at once, items still in hand
    rig.left = 0
    rig.add(1, 20.0, 20.001)  # the last: goes at once, nothing left to infer
    assert rig.take() == [[0], [1]]
    assert rig.direct == [False, True]


def test_direct_sends_keep_the_order_of_queued_ones() -> None:
    receive, send = Pipe(duplex=False)
    sender = Sender(send)
    for i in range(200):  # a direct one never overtakes one queued before it
        sender.deliver([(i, i, 0, 0.0, 0.0, None)], float(i), direct=i % 3 == 0)
    sender.close()
    got = []
    while receive.poll(0):
        got.append(decode(receive.recv()))
    assert [m.busy_s for m in got] == [float(i) for i in range(200)]


def test_due_in_says_when_to_look_again() -> None:
    rig = _Rig(left=0)
    assert rig.outbox.due_in(10.0) is None  # nothing held, nothing can come
    rig.left = 2
    assert rig.outbox.due_in(10.0) == BATCH_WAIT_S  # an item in hand may finish and wait
    rig.add(0, 9.9999, 10.0)
    assert rig.take() == []
    assert abs(rig.outbox.due_in(10.001) - (BATCH_WAIT_S - 0.001)) < 1e-9
    assert rig.outbox.due_in(11.0) == 0.0


def test_results_waiting_for_an_inference_that_hangs_go_after_the_batch_wait() -> None:
    # 4 items left after 2 quick results: they wait for company, and the next call hangs.
    rig = _Rig(left=6)
    step = BATCH_WAIT_S / 10
    for slot in range(2):
        rig.add(slot, 10.0 + slot * step, 10.0 + (slot + 1) * step)
        rig.left -= 1
    assert rig.take() == []
    rig.outbox.send_due(10.0 + step + BATCH_WAIT_S / 2)
    assert rig.take() == []  # not yet
    rig.outbox.send_due(10.0 + step + 1.01 * BATCH_WAIT_S)
    assert rig.take() == [[0, 1]]
    rig.outbox.send_due(20.0)  # nothing waits: nothing is sent
    assert rig.take() == []
