"""The scheduler: slots, the ready queue, which core gets an item, retries and error rows.

It has no processes and no clock of its own: methods take ``now`` where time matters and
return decisions that the engine loop (loop.py) carries out: reads to send, items to
dispatch, rows that are due (:class:`Finished`), workers to restart. So the whole policy
is tested in milliseconds with scripted events (tests/test_scheduler.py).

Slot states follow the NOTE in slots.py: FREE → READING → READY → INFERRING → DONE → FREE.

Failure policy:
- A core worker that dies, or hangs (killed by the loop), charges attempts only where the
  cause is known; items only queued in it go back to the front of the ready queue
  uncharged. A hang names its item (the watchdog saw which instance hung): that item is
  charged, the others that were inside inference() go back uncharged. A crash charges the
  item inside inference() if there was exactly one; when several instances were inferring,
  any of them may have crashed the process, so none is charged: each becomes an uncharged
  *suspect*, and no innocent item loses an attempt to its neighbour.
- Whom to blame for a crash: when an item that was being inferred had already been in a
  crash (on this core or another, charged or not), the item is the likely cause, so the
  crash does not count against the core. Otherwise (a first crash, with one item or
  several inferring, or with none) the core's count of crashes in a row goes up; a success
  on the core resets it. After ``MAX_CRASHES_IN_ROW`` the core is retired; before that it
  restarts after a back-off (``BACKOFF_S``). So a poison item never retires a core (its
  first crash counts once, its crashes alone are blamed on it), and a core that crashes
  whatever it runs is still retired (its crashes with fresh items count).
- An item that was in a crash is a *suspect*: it is retried alone, on a core with nothing
  else in flight, and nothing joins that core until it is done, so a poison item can never
  take an innocent neighbour down with it a second time. Suspects wait at the front of the
  ready queue and go out one at a time per core (the restarted core, empty, takes them
  first); one that crashes alone is charged, one that comes back was innocent. An item
  charged with a crash goes to a core it has not crashed; cores are refilled before they
  empty, so such a core is *drained* for it (no refills until it is empty, then the item
  alone), or the item would wait for the end of the run.
- ``inference()`` returning None (or raising) charges one attempt; the retry goes to a core
  the item has not tried while one is alive, even if it has to wait for room there.
- An item that failed ``max_attempts`` times is due as an error row naming each failure.
- Input errors (unreadable files) are due as error rows at once: retrying cannot help.
- A reader that dies or hangs while decoding a file charges that file one attempt (a file
  that hangs or crashes its decoder is the file's fault); its other files are read again.
  Only reader deaths with no file in hand count toward ``MAX_READER_DEATHS``: that limit
  is for a broken machine (the OOM killer), not for bad files.
- After a stop request nothing new is admitted or dispatched; items that come back with
  attempts left are released without a row, so --resume runs them.
- A worker to be recycled (it grew: recycling.py) is DRAINING: it gets nothing new, the
  items it holds finish as usual, and once it holds none its restart is due
  (``recycles_due``). Nothing is charged: a death meanwhile is a death.

Where it is: admission, reads and dispatch here; the workers' life cycle (starts, losses,
retirements, recycling's drain, back-offs: ``Scheduler.life``) in core_life.py; the
records of slots and keys in flights.py.

The scheduler's "cores" are keys: core numbers on one board. A cluster driver
(batchinfer.cluster) schedules one key per runtime instance (a Ray actor), several of
which share a physical core; it passes ``physical(key)``, so that "another core" for a
retry means another physical core there too, and ``name(key)`` for the failure texts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable

from batchinfer.data.dataset import Item
from batchinfer.engine.core_life import CoreLife
from batchinfer.engine.flights import CoreState, Finished, Flight
from batchinfer.engine.queue_depth import QUEUED_PER_INSTANCE, REFILL_AT
from batchinfer.engine.states import CoreStatus, SlotState

MAX_READER_DEATHS = 10
# A core's queue depth and refill point (QUEUED_PER_INSTANCE, REFILL_AT) are in
# queue_depth.py. Likewise a reader gets new reads when it holds none, or once READ_BATCH of
# them are waiting: fewer, larger messages.
READ_BATCH = 4
# Item groups whose reader is remembered (a few per reader are open at a time).
_GROUPS_KEPT = 4096

FREE, READING, READY, INFERRING, DONE = (
    SlotState.FREE,
    SlotState.READING,
    SlotState.READY,
    SlotState.INFERRING,
    SlotState.DONE,
)


class ReaderDeathsExceeded(Exception):
    """Readers died without a file to blame more than MAX_READER_DEATHS times."""


class Scheduler:
    """Slot and core bookkeeping and the failure policy (see the module docstring)."""

    def __init__(
        self,
        slots: int,
        cores: Iterable[int],
        instances_per_core: int,
        readers: int,
        max_attempts: int,
        physical: Callable[[int], Hashable] | None = None,
        name: Callable[[int], str] | None = None,
        capacity: int | None = None,
    ) -> None:
        """``capacity``: items a core (key) holds at most; by default QUEUED_PER_INSTANCE
        per instance (a cluster's key, one Ray actor, takes several calls' worth)."""
        self.flights: list[Flight | None] = [None] * slots
        self.free: deque[int] = deque(range(slots))
        self.ready: deque[int] = deque()
        if capacity is None:
            capacity = QUEUED_PER_INSTANCE * instances_per_core
        self.cores = {c: CoreState(c, capacity) for c in cores}
        self.instances = instances_per_core
        self.refill_at = REFILL_AT * instances_per_core
        self.max_attempts = max_attempts
        self.unsent: list[list[int]] = [[] for _ in range(readers)]
        self.reading: list[deque[int]] = [deque() for _ in range(readers)]
        self.closing: set[int] = set()  # readers being stopped: no new reads for them
        self._groups: dict[Hashable, int] = {}  # item group -> its reader (_assign_reader)
        self.reader_deaths = 0
        self.stopping = False
        self.physical = physical or (lambda core: core)
        self.name = name or (lambda core: f"core {core}")
        # Starts, losses, retirements, recycling's drain (core_life.py).
        self.life = CoreLife(
            self.cores, self.flight, self._fail, self._give_back, lambda: self.stopping, self.name
        )

    # ------------------------------------------------------------------ queries
    def flight(self, slot: int) -> Flight:
        f = self.flights[slot]
        assert f is not None, f"slot {slot} is free"
        return f

    def can_admit(self) -> bool:
        return bool(self.free) and not self.stopping

    def busy(self) -> bool:
        """True while any item is in a slot."""
        return len(self.free) < len(self.flights)

    def in_flight(self) -> bool:
        """True while a reader or a worker holds an item (what a drain waits for)."""
        return any(c.inflight for c in self.cores.values()) or any(self.reading)

    def alive_cores(self) -> list[int]:
        return [c for c, s in self.cores.items() if s.state != CoreStatus.RETIRED]

    def slots_wanted(self) -> bool:
        """True when the cores have more room than what is READY or being read covers:
        then a slot freed now lets another item start (the collector frees its slots at
        once instead of holding them for a larger batch)."""
        room = sum(
            c.capacity - len(c.inflight) for c in self.cores.values() if c.state == CoreStatus.READY
        )
        coming = len(self.ready)
        for reading, unsent in zip(self.reading, self.unsent, strict=True):
            coming += len(reading) + len(unsent)
        return coming < room

    def held_by_reader(self, reader: int) -> int:
        """Slots sent to ``reader`` and not loaded yet (the ones waiting for a batch too)."""
        return len(self.reading[reader]) + len(self.unsent[reader])

    # ------------------------------------------------------------------ admission and reads
    def admit(self, item: Item, now: float, needs_reader: bool) -> int:
        """Put ``item`` into a free slot: READING (queued for a reader) or READY."""
        slot = self.free.popleft()
        flight = Flight(item, READY if not needs_reader else READING)
        self.flights[slot] = flight
        if needs_reader:
            self._assign_reader(slot)
        else:
            flight.t_ready = now
            self.ready.append(slot)
        return slot

    def open_reader(self, reader: int) -> None:
        """Reader ``reader`` takes reads from now on: the next number, or a closed reader's
        again (the pool started it: a ReaderAdded)."""
        while len(self.unsent) <= reader:
            self.unsent.append([])
            self.reading.append(deque())
        self.closing.discard(reader)

    def close_reader(self, reader: int) -> None:
        """Reader ``reader`` gets no new reads (it is stopped once it holds none).

        Slots it was given but not yet sent (waiting for a batch) go to the open readers:
        a reader that is told to stop must never be sent a read after that.
        """
        self.closing.add(reader)
        waiting, self.unsent[reader] = self.unsent[reader], []
        for slot in waiting:
            self._assign_reader(slot)

    def open_readers(self) -> list[int]:
        return [r for r in range(len(self.unsent)) if r not in self.closing]

    def _assign_reader(self, slot: int) -> None:
        # Items of one group (a video's keyframe range: data/video/dataset.py) go to one
        # reader, which decodes the range once, in order; a new group to the least busy.
        group = self.flight(slot).item.group
        if len(self.unsent) == 1 and not self.closing:  # one reader: every item's case
            reader = 0
        elif group is not None and self._groups.get(group, -1) in self.open_readers():
            reader = self._groups[group]
        else:
            reader = min(self.open_readers(), key=lambda r: self.held_by_reader(r))
        if group is not None:
            self._groups[group] = reader
            if len(self._groups) > _GROUPS_KEPT:
                del self._groups[next(iter(self._groups))]  # the oldest: long finished
        self.flight(slot).reader = reader
        self.unsent[reader].append(slot)

    def take_reads(self) -> dict[int, list[int]]:
        """Slots to send to each reader now (they count as being read from here on)."""
        out = {}
        for reader, slots in enumerate(self.unsent):
            if slots and (not self.reading[reader] or len(slots) >= READ_BATCH):
                out[reader] = slots
                self.reading[reader].extend(slots)
                self.unsent[reader] = []
        return out

    def loaded(self, slot: int, read_ms: float, error: str | None, now: float) -> Finished | None:
        """A reader finished ``slot``: an error row is due, or the item is READY."""
        flight = self.flight(slot)
        self.reading[flight.reader].remove(slot)  # type: ignore[index]
        flight.read_ms = read_ms
        flight.t_ready = now
        if error is not None:
            flight.state = DONE
            return Finished(slot, error, attempt=0, core=None)
        if self.stopping:
            self.release(slot)  # never dispatched: left to do for --resume
            return None
        flight.state = READY
        self.ready.append(slot)
        return None

    def reader_lost(self, reader: int, culprit: int | None, what: str) -> list[Finished]:
        """Reader ``reader`` died or was killed; ``culprit``: the slot it was decoding.

        The culprit is charged an attempt (an error row once it has used them all); the
        reader's other slots are read again. A death with no culprit counts toward
        MAX_READER_DEATHS (ReaderDeathsExceeded).
        """
        slots = list(self.reading[reader]) + self.unsent[reader]
        self.reading[reader].clear()
        self.unsent[reader] = []
        finished = []
        if culprit is None:
            self.reader_deaths += 1
            if self.reader_deaths > MAX_READER_DEATHS:
                raise ReaderDeathsExceeded(what)
        else:
            flight = self.flight(culprit)
            flight.failures.append(f"cannot read {flight.item.id}: the reader process {what}")
            if len(flight.failures) >= self.max_attempts:
                flight.state = DONE
                finished.append(Finished(culprit, "; ".join(flight.failures), 0, None))
                slots.remove(culprit)
        for slot in slots:
            if self.stopping:
                self.release(slot)
            else:
                self._assign_reader(slot)
        return finished

    # ------------------------------------------------------------------ dispatch
    def dispatch(self, now: float) -> dict[int, list[int]]:
        """READY slots to send to each core now (they are INFERRING from here on): to cores
        that are down to REFILL_AT items per instance, up to their capacity."""
        out: dict[int, list[int]] = {}
        if self.stopping or not self.ready:  # the usual turn: nothing READY (cheap to say)
            return out
        waiting: list[int] = []
        self._dispatch_reserved(now, out)
        hungry = [
            c
            for c in self.cores.values()
            if c.state == CoreStatus.READY
            and len(c.inflight) <= self.refill_at
            and c.suspect is None
            and c.reserved is None
        ]
        while self.ready:
            open_cores = [c for c in hungry if len(c.inflight) < c.capacity and c.suspect is None]
            if not open_cores:
                break
            slot = self.ready.popleft()
            core = self._pick_core(self.flight(slot), open_cores)
            if core is None:
                waiting.append(slot)  # a retry waiting for a core it has not tried
                self._reserve(slot)
                continue
            self._send(slot, core, now, out)
        self.ready.extendleft(reversed(waiting))
        return out

    def _send(self, slot: int, core: CoreState, now: float, out: dict[int, list[int]]) -> None:
        flight = self.flight(slot)
        flight.state, flight.core, flight.t_dispatched = INFERRING, core.core, now
        core.inflight.add(slot)
        if flight.crashes or flight.suspect:
            core.suspect = slot
            for c in self.cores.values():  # only such items are reserved for (_reserve)
                if c.reserved == slot:
                    c.reserved = c.reserved_flight = None
        out.setdefault(core.core, []).append(slot)

    def _reserve(self, slot: int) -> None:
        """Have a core drain for a crash retry that may go only to an empty core it has not
        tried: cores are refilled before they run dry, so while items flow no such core
        empties, and the item waited for the end of the run. The least loaded such core
        gets no refills until it is empty; then the item goes there (_dispatch_reserved)."""
        flight = self.flight(slot)
        if not (flight.crashes or flight.suspect) or not flight.cores_tried:
            return
        if any(c.reserved == slot for c in self.cores.values()):
            return
        tried = {self.physical(c) for c in flight.cores_tried}
        free = [
            c
            for c in self.cores.values()
            if c.state == CoreStatus.READY
            and c.suspect is None
            and c.reserved is None
            and self.physical(c.core) not in tried
        ]
        if free:
            core = min(free, key=lambda c: len(c.inflight))
            core.reserved, core.reserved_flight = slot, flight

    def _dispatch_reserved(self, now: float, out: dict[int, list[int]]) -> None:
        """Send each reserved item to its core once that core is empty; a reservation whose
        core is no longer up or whose item is no longer waiting is dropped."""
        for core in self.cores.values():
            slot = core.reserved
            if slot is None:
                continue
            flight = self.flights[slot]
            if (
                flight is None
                or flight is not core.reserved_flight
                or flight.state != READY
                or core.state != CoreStatus.READY
            ):
                core.reserved = core.reserved_flight = None
            elif not core.inflight and core.suspect is None and slot in self.ready:
                self.ready.remove(slot)
                self._send(slot, core, now, out)

    def _pick_core(self, flight: Flight, open_cores: list[CoreState]) -> CoreState | None:
        """The least loaded open core; a retry waits for a core it has not tried (on a
        cluster, another physical core); a suspect (an item that was in a crash) waits for an
        empty core."""
        if flight.crashes or flight.suspect:
            open_cores = [c for c in open_cores if not c.inflight]
            if not open_cores:
                return None
        if not flight.cores_tried:
            return min(open_cores, key=lambda c: len(c.inflight))
        tried = {self.physical(c) for c in flight.cores_tried}
        fresh = [c for c in open_cores if self.physical(c.core) not in tried]
        if fresh:
            return min(fresh, key=lambda c: len(c.inflight))
        if any(
            c.state != CoreStatus.RETIRED and self.physical(c.core) not in tried
            for c in self.cores.values()
        ):
            return None
        return min(open_cores, key=lambda c: len(c.inflight))

    def done(self, core: int, slot: int, error: str | None) -> Finished | None:
        """A worker finished ``slot``: success, or a failure to retry (None) or to write."""
        state = self.cores[core]
        state.inflight.discard(slot)
        if state.suspect == slot:
            state.suspect = None
        flight = self.flight(slot)
        flight.cores_tried.append(core)
        flight.suspect = False  # it came back: it did not crash its worker
        if error is None:
            state.crashes_in_row = 0
            flight.state = DONE
            return Finished(slot, None, attempt=len(flight.failures) + 1, core=core)
        return self._fail(slot, f"{self.name(core)}: {error}", core)

    def _fail(self, slot: int, failure: str, core: int | None) -> Finished | None:
        flight = self.flight(slot)
        flight.failures.append(failure)
        if len(flight.failures) >= self.max_attempts:
            flight.state = DONE
            return Finished(slot, "; ".join(flight.failures), len(flight.failures), core)
        if self.stopping:
            self.release(slot)  # left to do for --resume
            return None
        flight.state = READY
        self.ready.appendleft(slot)
        return None

    def _give_back(self, slot: int) -> None:
        """An item a lost or retired worker held goes back uncharged: to the front of the
        ready queue, or left for --resume while stopping."""
        if self.stopping:
            self.release(slot)
            return
        self.flight(slot).state = READY
        self.ready.appendleft(slot)

    # ------------------------------------------------------------------ ending
    def release(self, slot: int) -> None:
        """The slot is FREE again (its row was written, or it is left for --resume)."""
        self.flights[slot] = None
        self.free.append(slot)

    def stop(self) -> None:
        """Admit and dispatch nothing more; READY items are left for --resume."""
        self.stopping = True
        while self.ready:
            self.release(self.ready.popleft())
        for reader, slots in enumerate(self.unsent):
            for slot in slots:
                self.release(slot)
            self.unsent[reader] = []
