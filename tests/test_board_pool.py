"""BoardPool judges a child's exit from what it sent that child (Child.held), never from
the scheduler's tables: which item a dead reader was decoding, whether a stopped reader
leaves anything to redo, whether a recycled worker gets a successor. Its reader scaling
reads the run through the loop's RunState and tells the loop what it changed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from batchinfer.data.dataset import Item
from batchinfer.engine.board.pool import BoardPool
from batchinfer.engine.plumbing.children import Child, Exited
from batchinfer.engine.pools import ReaderAdded, ReaderClosing, ReaderLost, WorkerLost
from batchinfer.engine.protocol import Stop


class _Board:
    """A status board of two rows: 0 the worker's, 1 the reader's; (index, start time)."""

    def __init__(self) -> None:
        self.rows = np.zeros((2, 2))

    def snapshot(self) -> np.ndarray:
        return self.rows.copy()


def _pool() -> Any:
    """A BoardPool with no processes and no scheduler: only what _on_exit uses."""
    pool: Any = BoardPool.__new__(BoardPool)
    pool.usage = SimpleNamespace(child_gone=lambda child: None)
    pool._board = _Board()
    pool._memory = SimpleNamespace(worker_rows=lambda key: slice(0, 1), reader_row=lambda key: 1)
    pool._stats = SimpleNamespace(add_busy=lambda *a: None, set_busy=lambda *a: None)
    pool._recycling, pool._retired, pool._stopping = {}, set(), False
    pool.started = []
    pool.start_worker = lambda key, now: pool.started.append(key)
    pool.clock = lambda: 5.0
    return pool


def _child(kind: str, held: dict[int, tuple[int, str]] | None = None) -> Child:
    """A child of key 0 that was sent ``held``: slot -> (item index, id)."""
    child = Child(kind, 0, None, None, None, 0.0, None, "", "ready")  # type: ignore[arg-type]
    for slot, (index, name) in (held or {}).items():
        child.held[slot] = Item(index, f"/d/{name}", name, None, None)
    return child


def test_a_dead_reader_names_the_item_it_was_decoding_among_those_it_was_sent() -> None:
    pool = _pool()
    reader = _child("reader", {3: (7, "a.jpg"), 4: (8, "b.jpg")})
    pool._board.rows[1] = (8, 1.0)  # decoding item 8
    lost = pool._on_exit(Exited(reader, -9))
    assert lost == ReaderLost(0, "died (exit code -9) while decoding b.jpg", 4)


def test_a_reader_stopped_for_being_one_too_many_leaves_nothing_to_redo() -> None:
    pool = _pool()
    reader = _child("reader")
    reader.stopped, reader.killed_for = True, "stopped: fewer readers are enough"
    assert pool._on_exit(Exited(reader, 0)) is None
    reader = _child("reader", {3: (7, "a.jpg")})  # it still held one: redone
    reader.stopped = True
    assert isinstance(pool._on_exit(Exited(reader, 0)), ReaderLost)


def test_a_recycled_worker_gets_a_successor_unless_the_run_is_stopping() -> None:
    pool = _pool()
    worker = _child("worker")
    pool._recycling[id(worker)] = worker
    assert pool._on_exit(Exited(worker, 0)) is None and pool.started == [0]
    pool.stopping()
    worker = _child("worker")
    pool._recycling[id(worker)] = worker
    assert pool._on_exit(Exited(worker, 0)) is None and pool.started == [0]
    crashed = _child("worker", {3: (7, "a.jpg")})
    pool._board.rows[0] = (7, 1.0)
    lost = pool._on_exit(Exited(crashed, 139))
    assert lost == WorkerLost(0, "worker process crashed (exit code 139)", frozenset({7}))


class _Run:
    """A RunState of readers: ``numbers`` in use, ``closing`` among them, ``held`` by each."""

    def __init__(self, numbers: int, closing: list[int], held: dict[int, int]) -> None:
        self.numbers, self.closing, self.held = numbers, closing, held

    def readers(self) -> int:
        return self.numbers

    def open_readers(self) -> list[int]:
        return [r for r in range(self.numbers) if r not in self.closing]

    def closing_readers(self) -> list[int]:
        return self.closing

    def held_by_reader(self, reader: int) -> int:
        return self.held.get(reader, 0)


def _scaling(change: int, live: list[Child]) -> Any:
    """A pool whose scaler answers ``change`` and whose live children are ``live``."""
    pool = _pool()
    pool.scaler = SimpleNamespace(decide=lambda now, readers, idle: change, fed=False)
    pool.usage.idle_cpus = lambda: 1.0
    pool._max_readers = 3
    pool.sent, pool.begun = [], []
    pool.children = SimpleNamespace(
        children=live, send=lambda child, msg: pool.sent.append((child.key, type(msg)))
    )
    pool._start_reader = pool.begun.append
    return pool


def _reader(key: int) -> Child:
    child = _child("reader")
    child.key = key
    return child


def test_reader_scaling_tells_the_loop_what_it_started_and_what_is_to_close() -> None:
    # Grow: a new number (the next one), started here and told to the loop.
    pool = _scaling(+1, [_reader(0), _reader(1)])
    assert pool._scale_readers(1.0, _Run(2, [], {})) == [ReaderAdded(2)]
    assert pool.begun == [2] and pool.sent == []
    # Grow again with reader 1 closed and gone: its number is used again.
    pool = _scaling(+1, [_reader(0)])
    assert pool._scale_readers(1.0, _Run(2, [1], {})) == [ReaderAdded(1)]
    # Shrink: the last open reader is to close; nothing is stopped yet (it may hold reads).
    pool = _scaling(-1, [_reader(0), _reader(1)])
    assert pool._scale_readers(1.0, _Run(2, [], {1: 2})) == [ReaderClosing(1)]
    assert pool.sent == [] and pool.begun == []
    # A closing reader is stopped once it holds nothing, and only then.
    pool = _scaling(0, [_reader(0), _reader(1)])
    assert pool._scale_readers(1.0, _Run(2, [1], {1: 1})) == [] and pool.sent == []
    assert pool._scale_readers(1.0, _Run(2, [1], {})) == [] and pool.sent == [(1, Stop)]


def test_a_part_made_by_setup_is_refused_before_it_and_given_after():
    pool: Any = BoardPool.__new__(BoardPool)
    pool._stats = None
    with pytest.raises(AssertionError, match="the pool is not set up"):
        pool.stats  # noqa: B018 (the read is the test)
    pool._stats = recorder = SimpleNamespace()
    assert pool.stats is recorder
