"""The core worker's outbox: how finished results are grouped into "done" messages."""

from __future__ import annotations

from multiprocessing import Pipe

from batchinfer.engine.worker import BATCH_MAX, BATCH_WAIT_S, _BusyClock, _Outbox


class _Queue:
    """What the outbox asks the worker: is its queue low (the coordinator must refill)?"""

    def __init__(self) -> None:
        self.low = False


def _outbox() -> tuple[_Outbox, _Queue, object]:
    receive, send = Pipe(duplex=False)
    queue = _Queue()
    return _Outbox(send, _BusyClock(), lambda: queue.low), queue, receive


def _result(slot: int, t0: float, t1: float) -> tuple:
    return (slot, slot, 0, t0, t1, None)


def _messages(receive) -> list[tuple]:
    out = []
    while receive.poll(0):
        out.append(receive.recv())
    return out


def test_short_inferences_with_work_queued_share_one_message() -> None:
    outbox, _, receive = _outbox()
    step = BATCH_WAIT_S / 4.5  # inferences much shorter than the wait, one after another
    for slot in range(4):
        outbox.add(_result(slot, 100 + slot * step, 100 + (slot + 1) * step))
        assert _messages(receive) == [], f"result {slot} waits for company"
    # The fifth: the oldest would pass the wait before the next inference ends: all go now.
    outbox.add(_result(4, 100 + 4 * step, 100 + 5 * step))
    (msg,) = _messages(receive)
    assert msg[0] == "done"
    assert [r[0] for r in msg[1]] == [0, 1, 2, 3, 4]


def test_low_queue_sends_at_once() -> None:
    outbox, queue, receive = _outbox()
    queue.low = True
    outbox.add(_result(3, 10.0, 10.0001))
    (msg,) = _messages(receive)
    assert [r[0] for r in msg[1]] == [3]


def test_long_inferences_are_not_held_for_the_next() -> None:
    outbox, _, receive = _outbox()
    outbox.add(_result(1, 10.0, 10.0 + BATCH_WAIT_S))
    (msg,) = _messages(receive)
    assert [r[0] for r in msg[1]] == [1]


def test_batch_is_capped_and_send_flushes_the_rest() -> None:
    outbox, _, receive = _outbox()
    for slot in range(BATCH_MAX + 2):  # all finished at the same moment: no wait passes
        outbox.add(_result(slot, 10.0, 10.0))
    (msg,) = _messages(receive)
    assert len(msg[1]) == BATCH_MAX
    outbox.send()
    (rest,) = _messages(receive)
    assert [r[0] for r in rest[1]] == [BATCH_MAX, BATCH_MAX + 1]
    outbox.send()  # nothing waits: nothing is sent
    assert _messages(receive) == []


def test_message_carries_busy_and_cpu_seconds() -> None:
    receive, send = Pipe(duplex=False)
    busy = _BusyClock()
    busy.enter(1.0)
    busy.leave(3.5)
    outbox = _Outbox(send, busy, lambda: True)
    outbox.add(_result(0, 1.0, 3.5))
    (msg,) = _messages(receive)
    kind, _, busy_s, cpu_s = msg
    assert kind == "done" and busy_s == 2.5 and cpu_s > 0
