"""Read lanes: Ray read tasks standing in for the engine's reader processes.

The engine loop hands items to readers (``scheduler.take_reads`` → ``RayPool.send_reads``);
on a cluster a reader is a lane that runs one read task (up to READ_ITEMS items,
actors.read_items) at a time, where its scheduling strategy puts it: on the head (dataset
on the head only), on a node (shared storage), or anywhere. A task that fails (its worker
died, or it ran past the decode timeout for each item it holds and was cancelled) is a
reader death, reported as a :class:`~batchinfer.engine.pools.ReaderLost`: a one-item task
names its item as the culprit (the scheduler charges it an attempt), a larger task's items
are read alone next time, so that a second death names its file. Files that cannot be
decoded come back as errors of :class:`~batchinfer.engine.pools.ItemsRead` (error rows at
once). The lanes know the items the loop gave them (RayPool.send_reads), not the scheduler.

A source without readers (tensors in memory, synthetic) has no lanes: :class:`MemoryItems`
fills its items on the driver and puts them in Ray's object store instead.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchinfer.cluster.actors import read_items
from batchinfer.data.dataset import Item
from batchinfer.data.preprocess import Preprocess
from batchinfer.engine.pools import ItemRead, ItemsRead, ReaderLost
from batchinfer.engine.sources import ItemSource
from batchinfer.engine.watchdog import HangLimit

#: Items per read task at most.
READ_ITEMS = 8


@dataclass
class ReadTask:
    meta: Any
    arrays: list[Any]
    slots: list[int]
    indexes: list[int]  # the slots' items
    t_sent: float
    cancel_reason: str | None = None


@dataclass
class Lane:
    index: int
    strategy: Any  # Ray scheduling strategy of its tasks
    node_id: str | None  # the node it reads on, when there is one
    queue: deque[tuple[int, Item]] = field(default_factory=deque)  # (slot, item) to read
    task: ReadTask | None = None


class ReadLanes:
    """The read lanes of a run (see the module docstring)."""

    def __init__(
        self,
        ray: Any,
        lanes: list[tuple[Any, str | None]],
        preprocess: Preprocess,
        kind: str,
        decode_limit: HangLimit,
    ) -> None:
        self.ray = ray
        self.lanes = [Lane(i, strategy, node) for i, (strategy, node) in enumerate(lanes)]
        self.preprocess = preprocess
        self.kind = kind
        self.decode_limit = decode_limit  # per item of a task
        self.alone: set[int] = set()  # items to read alone (they were in a task that died)
        self._task = ray.remote(num_cpus=1, max_retries=0)(read_items) if lanes else None

    def send(self, lane: Lane, items: Sequence[tuple[int, Item]], now: float) -> ReadTask | None:
        """``items`` ((slot, item)) are to be read on ``lane``: the task started if the lane
        was idle (the pool waits for its ``meta``)."""
        lane.queue.extend(items)
        return self.next(lane, now)

    def next(self, lane: Lane, now: float) -> ReadTask | None:
        """The lane's next task, if it is idle and has slots queued."""
        if lane.task is not None or not lane.queue:
            return None
        batch: list[tuple[int, Item]] = []
        while lane.queue and len(batch) < READ_ITEMS:
            alone = lane.queue[0][1].index in self.alone
            if alone and batch:
                break
            batch.append(lane.queue.popleft())
            if alone:
                break
        items = [(it.index, it.path, it.id, it.member) for _, it in batch]
        assert self._task is not None, "a run with read lanes"
        refs = self._task.options(
            num_returns=len(batch) + 1, scheduling_strategy=lane.strategy
        ).remote(items, self.preprocess, self.kind)
        lane.task = ReadTask(
            refs[0], refs[1:], [s for s, _ in batch], [it.index for _, it in batch], now
        )
        return lane.task

    def done(
        self, lane: Lane, task: ReadTask, meta: list
    ) -> tuple[list[tuple[int, Any]], ItemsRead | None]:
        """A task's results: (slot, its tensor's object) of the items read, and what the
        scheduler is to be told (None: the task is stale)."""
        if lane.task is not task:
            return [], None
        lane.task = None
        ready: list[tuple[int, Any]] = []
        items: list[ItemRead] = []
        for slot, (read_ms, error), array in zip(task.slots, meta, task.arrays, strict=True):
            if error is None:
                ready.append((slot, array))
            items.append(ItemRead(slot, read_ms, error))
        return ready, ItemsRead(lane.index, items)

    def failed(
        self, lane: Lane, task: ReadTask, exc: Exception, node_gone: bool
    ) -> ReaderLost | None:
        """A task died or was cancelled (see the module docstring); None: it was stale."""
        if lane.task is not task:
            return None
        what = task.cancel_reason or f"died ({type(exc).__name__})"
        culprit = None
        if len(task.slots) == 1 and not node_gone:
            culprit = task.slots[0]
        else:  # whose fault it was is unknown (or it was the node's): read them one by one
            self.alone.update(task.indexes)
        lane.task = None
        lane.queue.clear()  # reader_lost hands every slot of this lane out again
        return ReaderLost(lane.index, what, culprit)

    def check_hangs(self, now: float) -> None:
        for lane in self.lanes:
            task = lane.task
            if task is None or task.cancel_reason is not None:
                continue
            limit = self.decode_limit.of(len(task.slots))
            if limit.passed(task.t_sent, now):
                task.cancel_reason = limit.stuck()
                with contextlib.suppress(Exception):
                    self.ray.cancel(task.meta, force=True)

    def shift(self, gap: float) -> None:
        """The loop was not running for ``gap`` seconds: not held against the tasks."""
        for lane in self.lanes:
            if lane.task is not None:
                lane.task.t_sent += gap

    def forget(self, live: set[int]) -> None:
        self.alone &= live

    def cancel(self) -> None:
        for lane in self.lanes:
            if lane.task is not None:
                with contextlib.suppress(Exception):
                    self.ray.cancel(lane.task.meta, force=True)


class MemoryItems:
    """The objects of a source's items that it fills in memory (no read tasks): one tensor
    per slot, filled on the driver and put for each item; a source whose slots' tensors
    never change (synthetic) has one object per slot, put once."""

    def __init__(self, ray: Any, source: ItemSource, preprocess: Preprocess, slots: int) -> None:
        self.ray, self.source = ray, source
        shape, dtype = preprocess.shape, preprocess.dtype
        self._buffers = [[np.zeros(shape, np.dtype(dtype))] for _ in range(slots)]
        source.prefill(lambda slot: self._buffers[slot], slots)
        self._slot_ref: dict[int, Any] = {}
        if type(source).fill is ItemSource.fill:  # the slots' tensors never change
            self._slot_ref = {s: ray.put(b[0]) for s, b in enumerate(self._buffers)}

    def put(self, slot: int, item: Item) -> Any:
        """The object of ``item``'s tensor (in ``slot``)."""
        if self._slot_ref:
            return self._slot_ref[slot]
        self.source.fill(item, self._buffers[slot])
        return self.ray.put(self._buffers[slot][0])

    def clear(self) -> None:
        self._slot_ref.clear()
