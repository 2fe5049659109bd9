"""The keys' workers' life cycle, as the scheduler sees it: a worker starts, comes up, is
lost (it crashed or hung) or retired, is drained to be recycled, and restarts after a
back-off. The failure policy it applies (what a death charges, when a core is retired) is
written down once, in scheduler.py's docstring: this is its workers' half. No processes, no
clock: the loop passes ``now`` and carries out what comes back (:class:`CoreLoss`, the keys
due to restart or to be recycled).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from batchinfer.engine.flights import CoreState, Finished, Flight
from batchinfer.engine.states import CoreStatus

MAX_CRASHES_IN_ROW = 3
BACKOFF_S = (0.25, 1.0, 4.0)


@dataclass(frozen=True)
class CoreLoss:
    """What a worker's death means: rows due, and when to restart it (None: retired)."""

    finished: list[Finished]
    restart_at: float | None
    reason: str
    blamed_items: bool


class CoreLife:
    """Starts, losses, retirements and recycling's drain of the keys in ``cores`` (the
    scheduler's table of them, shared). What it shares with the scheduler's dispatch comes
    as callables: ``flight`` (a slot's Flight), ``fail`` (charge an item a failure: its
    error row is due, or it goes back to the ready queue), ``give_back`` (an item a worker
    held goes back uncharged), ``stopping`` (a stop was requested: nothing restarts) and
    ``name`` (a key in failure texts)."""

    def __init__(
        self,
        cores: dict[int, CoreState],
        flight: Callable[[int], Flight],
        fail: Callable[[int, str, int | None], Finished | None],
        give_back: Callable[[int], None],
        stopping: Callable[[], bool],
        name: Callable[[int], str],
    ) -> None:
        self.cores = cores
        self.flight, self.fail, self.give_back = flight, fail, give_back
        self.stopping, self.name = stopping, name

    def core_ready(self, core: int) -> None:
        self.cores[core].state = CoreStatus.READY

    def core_starting(self, core: int) -> None:
        state = self.cores[core]
        state.state, state.restart_at = CoreStatus.STARTING, None

    def core_retired(self, core: int) -> None:
        """A core that will not come back (its init failed): its items go back to READY."""
        state = self.cores[core]
        state.state = CoreStatus.RETIRED
        self._requeue(state)

    def core_lost(
        self,
        core: int,
        working: set[int],
        reason: str,
        now: float,
        culprits: set[int] | None = None,
    ) -> CoreLoss:
        """Core ``core``'s worker died or was killed; ``working``: item indexes that were
        inside inference() then (from the status board); ``culprits``: the ones known to
        have caused it (a hang names them), None when any of ``working`` may have (a crash).

        Charged: the culprits, else the one item working; several items working and no
        culprit known: none is charged, each becomes a suspect (module docstring)."""
        state = self.cores[core]
        finished = []
        charged = working if culprits is None else culprits
        mine = [s for s in sorted(state.inflight) if self.flight(s).item.index in working]
        blamed_items = any(self.flight(s).crashes or self.flight(s).suspect for s in mine)
        if culprits is None and len(mine) > 1:
            charged = set()
            for slot in mine:
                self.flight(slot).suspect = True
        for slot in sorted(state.inflight):
            flight = self.flight(slot)
            if flight.item.index not in charged:
                continue
            state.inflight.discard(slot)
            flight.crashes += 1
            flight.suspect = False
            flight.cores_tried.append(core)
            result = self.fail(slot, f"{self.name(core)}: {reason}", core)
            if result is not None:
                finished.append(result)
        self._requeue(state)
        state.restarts += 1
        if not blamed_items:
            state.crashes_in_row += 1
        if state.crashes_in_row >= MAX_CRASHES_IN_ROW:
            state.state = CoreStatus.RETIRED
            return CoreLoss(finished, None, reason, blamed_items)
        delay = BACKOFF_S[min(max(state.crashes_in_row, 1), len(BACKOFF_S)) - 1]
        state.state, state.restart_at = CoreStatus.DOWN, now + delay
        return CoreLoss(finished, state.restart_at, reason, blamed_items)

    def _requeue(self, state: CoreState) -> None:
        state.suspect = None
        for slot in sorted(state.inflight, reverse=True):
            self.give_back(slot)
        state.inflight.clear()

    def drain(self, core: int) -> bool:
        """Send ``core`` nothing more until it is recycled (False: it is not READY)."""
        state = self.cores[core]
        if state.state != CoreStatus.READY or self.stopping():
            return False
        state.state = CoreStatus.DRAINING
        return True

    def recycles_due(self) -> list[int]:
        """DRAINING cores that hold nothing any more (they are starting from here on)."""
        if self.stopping():
            return []
        due = [
            c.core for c in self.cores.values() if c.state == CoreStatus.DRAINING and not c.inflight
        ]
        for core in due:
            self.core_starting(core)
        return due

    def restarts_due(self, now: float) -> list[int]:
        """Cores whose back-off has passed (they are starting from here on)."""
        if self.stopping():
            return []
        due = [
            c.core
            for c in self.cores.values()
            if c.state == CoreStatus.DOWN and c.restart_at is not None and now >= c.restart_at
        ]
        for core in due:
            self.core_starting(core)
        return due
