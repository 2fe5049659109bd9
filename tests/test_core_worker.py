"""The core worker's loops (engine/board/core_worker.py: CoreWorker) with a fake runtime and fake
slots, in this process: what an item's result says and when results are sent."""

from __future__ import annotations

import logging
import threading
from multiprocessing import Pipe
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from batchinfer.engine.board.core_worker import CoreSlots, CoreWorker, Serving
from batchinfer.engine.protocol import Infer, InferResult, InferTask, Stop, encode
from batchinfer.runtime.adapter import RuntimeAdapter


class _Log:
    def __init__(self) -> None:
        self.logger = logging.Logger("fake-rknnlite")  # not registered, like RKNNLite's
        self.logger.propagate = False


class _Runtime:
    """RKNNLite-shaped: doubles its input; for an item in ``fails``, logs E lines as the
    runtime does and returns None."""

    def __init__(self, fails: tuple[int, ...] = ()) -> None:
        self.rknn_log = _Log()
        self.fails = fails
        self.item: int | None = None

    def set_current_item(self, index: int | None) -> None:
        self.item = index

    def inference(self, inputs: list, data_format: Any = None, reuse_outputs: bool = False):
        if self.item in self.fails:
            log = self.rknn_log.logger
            log.error("RKNN: [12:00:01.234] failed to submit!, op id: 1, RKNN_ERR_FAIL")
            log.error("Catch exception when running RKNN model.")
            return None
        return [inputs[0].astype(np.float32) * 2]

    def release(self) -> None:
        pass


class _Board:
    def __init__(self) -> None:
        self.rows: dict[int, tuple[int, float] | None] = {}
        self.started: list[tuple[int, int]] = []

    def start(self, row: int, index: int, t: float) -> None:
        self.rows[row] = (index, t)
        self.started.append((row, index))

    def finish(self, row: int) -> None:
        self.rows[row] = None


class _Rig:
    """A worker of ``instances`` fake runtimes over 4 slots; its messages kept in ``sent``."""

    def __init__(
        self,
        fails: tuple[int, ...] = (),
        decode: Any = None,
        refill_at: int = 8,
        save_outputs: bool = False,
    ) -> None:
        self.inputs = [[np.full((1, 3), slot, np.uint8)] for slot in range(4)]
        self.outputs = [[np.zeros((1, 3), np.float32)] for _ in range(4)]
        self.geometry = [(np.full(6, slot, np.float64),) for slot in range(4)]
        self.board = _Board()
        self.sent: list[list[InferResult]] = []
        self.direct: list[bool] = []
        adapter = RuntimeAdapter(_Runtime(fails), core=2, model=Path("m.rknn"))
        slots: Any = CoreSlots(self.inputs, self.outputs, self.board, self.geometry)  # fakes
        serving = Serving(2, 5, refill_at, "nhwc", save_outputs=save_outputs)
        decoders = [decode] if decode is not None else []
        self.worker = CoreWorker([adapter], slots, self._deliver, serving, decoders)
        self.worker.clock = lambda: 100.0  # no time passes: only the refill rule decides
        self.expected = 0
        self.all_sent = threading.Event()

    def _deliver(self, batch: list[InferResult], busy_s: float, direct: bool) -> None:
        self.sent.append(batch)
        self.direct.append(direct)
        if len(self.results()) == self.expected:
            self.all_sent.set()

    def infer(self, *slots: int) -> None:
        """Run the instance (and its decoder) over ``slots`` (item index = slot + 10) until
        every result is sent, then stop them as serve does."""
        self.expected = len(slots)
        for slot in slots:
            self.worker.work.put(InferTask(slot, slot + 10))
        threads = [threading.Thread(target=self.worker.instance_loop, args=(0,))]
        if self.worker.to_decode:
            threads.append(threading.Thread(target=self.worker.decode_loop, args=(0,)))
        for t in threads:
            t.start()
        # The last result goes as soon as nothing is left: the stop sentinel, queued
        # before, would count as an item left (serve sends what waits after it).
        assert self.all_sent.wait(10)
        self.worker.work.put(None)
        for waiting in self.worker.to_decode:
            waiting.put(None)
        for t in threads:
            t.join()

    def results(self) -> list[InferResult]:
        return [r for batch in self.sent for r in batch]


def test_an_item_is_inferred_into_its_slot_and_reported() -> None:
    rig = _Rig()
    rig.infer(1)
    (result,) = rig.results()
    assert (result.slot, result.item_index, result.instance, result.error) == (1, 11, 0, None)
    np.testing.assert_array_equal(rig.outputs[1][0], np.full((1, 3), 2.0))
    assert rig.board.started == [(5, 11)] and rig.board.rows[5] is None  # held, then freed
    assert rig.worker.busy.active == 0 and rig.direct == [True]


def test_an_item_is_decoded_with_its_slots_geometry() -> None:
    seen = []

    def decode(outs, geometry):
        seen.append(geometry[0])
        return ("boxes", float(outs[0].sum()))

    rig = _Rig(decode=decode)
    rig.infer(3)
    (result,) = rig.results()
    assert result.error is None and result.decoded == ("boxes", 18.0)
    assert seen == [3.0]
    assert not rig.outputs[3][0].any()  # a task decoding here copies no outputs unless saved


def test_a_none_from_the_runtime_says_its_e_line_and_skips_the_decoder() -> None:
    decoded = []
    rig = _Rig(fails=(12,), decode=lambda outs, g: decoded.append(outs))
    rig.infer(1, 2)
    by_index = {r.item_index: r for r in rig.results()}
    assert by_index[12].error == (
        "inference() returned None: E RKNN: failed to submit!, op id: 1, RKNN_ERR_FAIL"
    )
    assert by_index[12].decoded is None and by_index[11].error is None
    assert len(decoded) == 1  # only the item that was inferred reached the decoder


def test_a_decode_that_raises_makes_that_item_an_error_row() -> None:
    def decode(outs, geometry):
        if geometry[0] == 2:
            raise ValueError("bad head")
        return "ok"

    rig = _Rig(decode=decode)
    rig.infer(1, 2, 3)
    errors = {r.item_index: r.error for r in rig.results()}
    assert errors == {
        11: None,
        12: "decoding the outputs failed: ValueError: bad head",
        13: None,
    }


def test_results_wait_for_company_until_reporting_them_starts_a_refill() -> None:
    # Refilled at 1 item left: the first result waits (2 still queued), the second goes
    # with it (the coordinator then sees 1 left), the last goes alone, sent by the instance
    # itself (nothing left to infer).
    rig = _Rig(refill_at=1)
    rig.infer(0, 1, 2)
    assert [[r.slot for r in batch] for batch in rig.sent] == [[0, 1], [2]]
    assert rig.direct == [False, True]


def test_items_waiting_to_be_decoded_count_as_held() -> None:
    rig = _Rig(decode=lambda outs, g: None)
    for slot in range(3):
        rig.worker.work.put(InferTask(slot, slot))
    assert rig.worker.left() == 3
    rig.worker.work.put(None)
    rig.worker.instance_loop(0)  # no decoder thread runs: the three wait for it
    assert rig.worker.left() == 3 and rig.sent == []  # inferred, not decoded: still held


@pytest.mark.parametrize("decoding", [False, True])
def test_serve_answers_every_item_given_before_stop(decoding: bool) -> None:
    rig = _Rig(fails=(11,), decode=(lambda outs, g: "ok") if decoding else None)
    tasks, send = Pipe(duplex=False)
    send.send(encode(Infer([InferTask(0, 10), InferTask(1, 11)])))
    send.send(encode(Infer([InferTask(2, 12)])))
    send.send(encode(Stop()))
    rig.worker.serve(tasks)
    results = sorted(rig.results(), key=lambda r: r.item_index)
    assert [r.item_index for r in results] == [10, 11, 12]
    assert [r.error is None for r in results] == [True, False, True]
    tasks.close()
    send.close()
