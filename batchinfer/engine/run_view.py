"""What a pool may read of the run: :class:`RunView`, the scheduler's read-only view, which
the loop builds once and passes in the pool's ``wait`` and ``check`` (pools.RunState). The
pools import neither this module nor the scheduler (tests/test_import_layers.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from batchinfer.engine.states import CoreStatus

if TYPE_CHECKING:
    from batchinfer.engine.scheduler import Scheduler


class RunView:
    """What a pool may read of the run's state (pools.RunState): a read-only window on the
    scheduler, which the loop builds once and passes in ``wait`` and ``check``. A pool
    changes nothing here; what it wants changed comes back to the loop as an event
    (ReaderAdded, ReaderClosing)."""

    __slots__ = ("_s",)

    def __init__(self, scheduler: Scheduler) -> None:
        self._s = scheduler

    def starved(self) -> bool:
        """A runtime instance has nothing to infer and no item is READY: the workers wait
        for the readers. (Not "a core has room": a core is refilled long before it runs dry,
        so with room to spare and its instances busy it waits for nothing; counted that
        way, 8x8 PNGs that one reader decodes far faster than the cores consume looked
        starved 10-18 % of the time.)"""
        s = self._s
        k = s.instances
        return not s.ready and any(
            c.state == CoreStatus.READY and len(c.inflight) < k for c in s.cores.values()
        )

    def started(self) -> bool:
        """Every key is up or retired, and one is up: the workers' start-up is over."""
        cores = self._s.cores.values()
        return all(c.state in (CoreStatus.READY, CoreStatus.RETIRED) for c in cores) and any(
            c.state == CoreStatus.READY for c in cores
        )

    def released(self, slots: Iterable[int]) -> list[int]:
        """Those of ``slots`` that are free: their row was written, or left for --resume."""
        flights = self._s.flights
        return [slot for slot in slots if flights[slot] is None]

    def indexes(self) -> set[int]:
        """The indexes of the items in slots."""
        return {f.item.index for f in self._s.flights if f is not None}

    def readers(self) -> int:
        """Reader numbers in use, open or closing (the next new reader's number)."""
        return len(self._s.unsent)

    def open_readers(self) -> list[int]:
        return self._s.open_readers()

    def closing_readers(self) -> list[int]:
        """Readers that get no new reads: to be stopped once they hold none."""
        return sorted(self._s.closing)

    def held_by_reader(self, reader: int) -> int:
        return self._s.held_by_reader(reader)
