"""BoardPool judges a child's exit from what it sent that child (Child.held), never from
the scheduler's tables: which item a dead reader was decoding, whether a stopped reader
leaves anything to redo, whether a recycled worker gets a successor."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from batchinfer.data.dataset import Item
from batchinfer.engine.board import BoardPool
from batchinfer.engine.plumbing.children import Child, Exited
from batchinfer.engine.pools import ReaderLost, WorkerLost


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
