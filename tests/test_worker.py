"""The core worker's outbox: how finished results are grouped into "done" messages."""

from __future__ import annotations

from multiprocessing import Pipe

from batchinfer.engine.worker import BATCH_MAX, BATCH_WAIT_S, _BusyClock, _Outbox

REFILL_AT = 3


class _Worker:
    """What the outbox asks the worker: how many items it still has besides the results."""

    def __init__(self, left: int) -> None:
        self.left = left


def _outbox(left: int) -> tuple[_Outbox, _Worker, object]:
    receive, send = Pipe(duplex=False)
    worker = _Worker(left)
    return _Outbox(send, _BusyClock(), lambda: worker.left, REFILL_AT), worker, receive


def _result(slot: int, t0: float, t1: float) -> tuple:
    return (slot, slot, 0, t0, t1, None)


def _messages(receive) -> list[tuple]:
    out = []
    while receive.poll(0):
        out.append(receive.recv())
    return out


def _slots(message: tuple) -> list[int]:
    assert message[0] == "done"
    return [r[0] for r in message[1]]


def test_results_wait_until_reporting_them_would_start_a_refill() -> None:
    # The worker held 7 items; the coordinator refills it once it hears it is down to 3.
    outbox, worker, receive = _outbox(left=6)
    step = BATCH_WAIT_S / 10  # short inferences: age is no reason to send
    for slot in range(3):
        outbox.add(_result(slot, slot * step, (slot + 1) * step))
        worker.left -= 1
        assert _messages(receive) == [], f"with {worker.left + 1} left, result {slot} waits"
    # 3 left now, 6 as the coordinator counts: reporting these 4 makes it refill.
    outbox.add(_result(3, 3 * step, 4 * step))
    (msg,) = _messages(receive)
    assert _slots(msg) == [0, 1, 2, 3]


def test_a_worker_already_counted_as_hungry_batches_until_its_instance_goes_idle() -> None:
    # 2 items left of 3: the coordinator already refills whenever it has something ready,
    # so telling it sooner changes nothing until the worker runs out.
    outbox, worker, receive = _outbox(left=2)
    outbox.add(_result(0, 0.0, 0.0001))
    worker.left = 1
    outbox.add(_result(1, 0.0001, 0.0002))
    assert _messages(receive) == []
    worker.left = 0
    outbox.add(_result(2, 0.0002, 0.0003))
    (msg,) = _messages(receive)
    assert _slots(msg) == [0, 1, 2]


def test_results_do_not_wait_longer_than_the_batch_wait() -> None:
    outbox, _, receive = _outbox(left=10)
    step = BATCH_WAIT_S / 4.5
    for slot in range(4):
        outbox.add(_result(slot, slot * step, (slot + 1) * step))
    assert _messages(receive) == []
    # The oldest would pass the wait before the next inference ends: all go now.
    outbox.add(_result(4, 4 * step, 5 * step))
    (msg,) = _messages(receive)
    assert _slots(msg) == [0, 1, 2, 3, 4]


def test_long_inferences_are_not_held_for_the_next() -> None:
    outbox, _, receive = _outbox(left=10)
    outbox.add(_result(1, 10.0, 10.0 + 1.5 * BATCH_WAIT_S))
    (msg,) = _messages(receive)
    assert _slots(msg) == [1]


def test_batch_is_capped_and_send_flushes_the_rest() -> None:
    outbox, _, receive = _outbox(left=100)
    for slot in range(BATCH_MAX + 2):  # all finished at the same moment: no wait passes
        outbox.add(_result(slot, 10.0, 10.0))
    (msg,) = _messages(receive)
    assert len(msg[1]) == BATCH_MAX
    outbox.send()
    (rest,) = _messages(receive)
    assert _slots(rest) == [BATCH_MAX, BATCH_MAX + 1]
    outbox.send()  # nothing waits: nothing is sent
    assert _messages(receive) == []


def test_message_carries_busy_and_cpu_seconds() -> None:
    receive, send = Pipe(duplex=False)
    busy = _BusyClock()
    busy.enter(1.0)
    assert busy.active == 1
    busy.leave(3.5)
    assert busy.active == 0
    outbox = _Outbox(send, busy, lambda: 0, REFILL_AT)
    outbox.add(_result(0, 1.0, 3.5))
    (msg,) = _messages(receive)
    kind, _, busy_s, cpu_s = msg
    assert kind == "done" and busy_s == 2.5 and cpu_s > 0
