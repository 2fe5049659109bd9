"""Core workers that grow: when one is to be replaced (the policy; no processes, no clock).

Memory that grows over a long loop until the process is killed is a known trap of runtimes
on these boards. So each core worker's memory is watched, from the coordinator: the board's
pool reads it (``/proc/PID/statm`` through psutil, every ``RSS_EVERY_S`` of board/pool.py;
nothing runs in the worker) and reports it (pools.WorkerMemory); the loop gives it here with
the count of items that worker (this incarnation of it) has finished, and carries out the
answer.

What is watched is the worker's own memory: its resident set less its shared pages (RSS -
shared in /proc/PID/statm). The shared-memory slots every worker maps, and the libraries'
code, are shared pages: counted, they would grow with each slot a worker touches and say
nothing of a leak. Memory a driver maps into the process (an NPU's DMA buffers) is not
counted either, so a leak there is not seen.

A worker is to be recycled (stopped between items and started afresh on its core) when:

- limit: its memory is over ``max_worker_rss_mb`` (default :func:`default_limit_mb`), and
  its first sample, taken as it came up, was under it, or came after it had finished items
  (then it did not start over it). One that starts over the limit is
  said once and never recycled for its size (a fresh worker would be no smaller), only for
  growth;
- growth: ``recycle_after`` (N) is not 0, it has finished at least N items, and its memory
  grew *steadily* over its last N items: the samples taken over them (``MIN_SAMPLES`` at
  least: a worker fast enough to do N items in fewer samples is judged over its last
  ``MIN_SAMPLES`` samples, so over more items), split into four quarters in order, have each
  quarter's median above the quarter's before, and the last quarter's median at least
  ``GROWTH_MB`` above the first's.
  A single spike moves no quarter's median (each has three samples or more); a step (a
  cache filled once) raises one quarter, not three in a row; noise does not add up to
  ``GROWTH_MB``. Samples with no item finished in between count as one (the newest), so
  an idle worker's samples do not pile up.

The loop then drains the worker (no new items; those it holds finish), and once it holds
none asks the pool to recycle it (pools.py's ``recycle``); the new worker is watched from
its own first sample. Nothing is retried or charged: a recycled worker held no item.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import NamedTuple

from batchinfer.bounds import memory_bytes
from batchinfer.engine import events as ev
from batchinfer.engine.pools import WorkerPool
from batchinfer.engine.scheduler import Scheduler
from batchinfer.messages import Message, setting
from batchinfer.options import ReliabilityOptions
from batchinfer.sink.stats import CoreStatsRecorder

#: Samples over the last ``recycle_after`` items before growth is judged (3 per quarter).
MIN_SAMPLES = 12
#: Growth over the last ``recycle_after`` items that counts as steady (with each quarter up).
GROWTH_MB = 32.0
#: The default limit is this share of the machine's memory, split over the core workers...
MEMORY_SHARE = 0.5
#: ... and never below this.
LEAST_LIMIT_MB = 256.0


def default_limit_mb(workers: int, memory: int | None = None) -> float:
    """``max_worker_rss_mb``'s default: half the machine's memory over the core workers,
    at least LEAST_LIMIT_MB (an 8 GiB board with 3 cores: 1365 MB each)."""
    total = memory_bytes() if memory is None else memory
    if not total:
        return float("inf")  # memory unknown: only growth recycles
    return max(LEAST_LIMIT_MB, total / 2**20 * MEMORY_SHARE / max(1, workers))


class Recycle(NamedTuple):
    """Recycle the worker: its memory now; ``grew_mb`` None: over the limit, else how much
    it grew steadily over its last ``recycle_after`` items."""

    rss_mb: float
    grew_mb: float | None = None


class TooBig(NamedTuple):
    """The worker came up over the limit: said once, never recycled for its size."""

    rss_mb: float


@dataclass
class _Worker:
    items: int = 0  # finished by this incarnation
    first_mb: float | None = None  # its first sample after it came up
    samples: deque[tuple[int, float]] = field(default_factory=deque)  # (items, MB)
    too_big: bool = False  # it came up over the limit: never recycled for its size
    judged: bool = False  # to be recycled: no more verdicts


class RecyclePolicy:
    """Decides, from memory samples and items done, which workers to recycle (module
    docstring). Keys are the loop's worker keys."""

    def __init__(self, limit_mb: float, recycle_after: int) -> None:
        self.limit_mb = limit_mb
        self.recycle_after = recycle_after
        self._workers: dict[int, _Worker] = {}

    def up(self, key: int) -> None:
        """A fresh worker for ``key``: it is judged from its own first sample."""
        self._workers[key] = _Worker()

    def done(self, key: int, items: int) -> None:
        worker = self._workers.get(key)
        if worker is not None:
            worker.items += items

    def sample(self, key: int, rss_mb: float) -> Recycle | TooBig | None:
        """The worker's memory now: what to do about it (each worker gets one verdict)."""
        worker = self._workers.get(key)
        if worker is None or worker.judged:
            return None
        if worker.first_mb is None:
            worker.first_mb = rss_mb
            # Over the limit "from the start" only when no item was done yet: a first sample
            # taken late (after items) may be the leak itself, not the worker's own size.
            if rss_mb > self.limit_mb and worker.items == 0:
                worker.too_big = True
                return TooBig(rss_mb)
        if rss_mb > self.limit_mb and not worker.too_big:
            worker.judged = True
            return Recycle(rss_mb)
        grew = self._growth(worker, rss_mb)
        if grew is not None:
            worker.judged = True
            return Recycle(rss_mb, grew)
        return None

    def _growth(self, worker: _Worker, rss_mb: float) -> float | None:
        """The steady growth over the last ``recycle_after`` items, or None (module
        docstring); keeps only the samples that window needs."""
        n = self.recycle_after
        if not n:
            return None
        samples = worker.samples
        if samples and samples[-1][0] == worker.items:
            samples.pop()  # no item since: the newer sample stands for that point
        samples.append((worker.items, rss_mb))
        # The window: the newest samples spanning n items, and the one just before them
        # (the memory at the window's start); MIN_SAMPLES at least, so a worker that does
        # n items between two samples is judged over more items, not never.
        while len(samples) > MIN_SAMPLES and samples[1][0] <= worker.items - n:
            samples.popleft()
        if worker.items < n or samples[0][0] > worker.items - n or len(samples) < MIN_SAMPLES:
            return None
        return steady_growth([mb for _, mb in samples])


def steady_growth(values: list[float]) -> float | None:
    """How much ``values`` grew, when it grew steadily: each quarter's median above the
    one before and GROWTH_MB or more from the first quarter to the last; else None."""
    q = len(values) // 4
    if q < 3:
        return None
    # The quarters take every value: the first ones get what does not divide evenly.
    bounds = [0, *(len(values) - (4 - i) * q for i in range(1, 4)), len(values)]
    medians = [statistics.median(values[a:b]) for a, b in pairwise(bounds)]
    if any(b <= a for a, b in pairwise(medians)):
        return None
    growth = medians[-1] - medians[0]
    return growth if growth >= GROWTH_MB else None


class Recycler:
    """The loop's side of recycling (loop.py calls it): gives the policy the workers' items
    and memory, drains the workers it names and says why, and has the pool replace each
    once it holds nothing (counted in the core statistics, ``recycled``)."""

    def __init__(
        self,
        rel: ReliabilityOptions,
        scheduler: Scheduler,
        pool: WorkerPool,
        stats: CoreStatsRecorder,
        warn: Callable[[str], None],
        notify: Callable[[object], None],
        name: Callable[[int], str],
    ) -> None:
        limit = rel.max_worker_rss_mb
        workers = len(pool.layout.places)
        self.policy = RecyclePolicy(
            default_limit_mb(workers) if limit is None else limit, rel.recycle_after
        )
        self.scheduler, self.pool, self.stats = scheduler, pool, stats
        self.warn, self.notify, self.name = warn, notify, name

    def up(self, key: int) -> None:
        self.policy.up(key)

    def done(self, key: int, items: int) -> None:
        self.policy.done(key, items)

    def memory(self, key: int, rss_mb: float) -> None:
        """A worker's memory now (pools.WorkerMemory): drain it if the policy says so."""
        verdict = self.policy.sample(key, rss_mb)
        limit = setting("reliability.max_worker_rss_mb") + f" ({self.policy.limit_mb:.0f} MB)"
        if isinstance(verdict, TooBig):
            self.warn(
                f"{self.name(key)}: its worker uses {rss_mb:.0f} MB from the start, over "
                + limit
                + "; a new one would be no smaller, so it is recycled only if it grows. "
                "Raise the limit, or use fewer cores or instances per core."
            )
        elif isinstance(verdict, Recycle) and self.scheduler.life.drain(key):
            held = len(self.scheduler.cores[key].inflight)
            why: Message
            if verdict.grew_mb is None:
                why = "over " + limit
            else:
                why = (
                    f"grown steadily by {verdict.grew_mb:.0f} MB over its last "
                    f"{self.policy.recycle_after} items ("
                    + setting("reliability.recycle_after")
                    + ")"
                )
            self.warn(
                f"{self.name(key)}: its worker uses {rss_mb:.0f} MB, "
                + why
                + f"; recycling it: a new worker once its {held} item(s) in flight are done."
            )
            where = self.pool.where(key)
            self.notify(ev.Recycling(where.core, rss_mb, why, node=where.node))

    def due(self, now: float) -> None:
        """Replace the drained workers that hold nothing any more."""
        for key in self.scheduler.life.recycles_due():
            self.stats.add_recycle(self.pool.layout.place(key))
            self.pool.recycle(key, now)
