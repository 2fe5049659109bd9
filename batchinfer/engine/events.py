"""Events the engine sends to observers while it runs.

Observers watch a run without being part of it: the CLI's progress bar, summary and log
lines, bench's windowed throughput, a test that waits for a row. An observer is any object
with ``notify(event)``; it runs in the engine's loop, so it must be quick and must not
raise (an exception from an observer stops the run as a failure).

On a cluster (batchinfer.cluster) the same events come from the Ray driver: a core is then
a core of one node, named by ``node`` (None on one board).

Messages (``Warned.message``) are :class:`batchinfer.messages.Message` strings: their text
names settings by field (``runtime.cores``); a front end renders them its own way with
``message.render(name)`` or :func:`batchinfer.messages.render`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from batchinfer.sink.rows import Row


class Observer(Protocol):
    def notify(self, event: object) -> None: ...


@dataclass(frozen=True)
class Started:
    """Items start to flow (readers decode, and each core gets items once its worker is
    ready; on one board, core workers may still be starting); ``todo``: None when unknown."""

    todo: int | None
    cores: tuple[int, ...]
    backend: str
    instances_per_core: int
    t: float
    nodes: tuple[str, ...] = ()  # the cluster's nodes; () on one board


@dataclass(frozen=True)
class CoresReady:
    """Every core worker (on a cluster, every actor) is ready or retired: from here on the
    run is in its steady state (bench's warm-up starts here). Comes after Started; on one
    board items may already have flowed to the cores that were ready first."""

    t: float


@dataclass(frozen=True)
class ChildReady:
    """A reader or core worker process is up (``kind`` "reader" or "worker", ``key`` its
    number or core; on a cluster "actor", a runtime instance on core ``key`` of ``node``, its
    pid on that node); observers that account CPU by role use the pid."""

    kind: str
    key: int
    pid: int
    node: str | None = None


@dataclass(frozen=True)
class Dispatched:
    """``count`` items were sent to ``core``'s worker."""

    core: int
    count: int
    t: float
    node: str | None = None


@dataclass(frozen=True)
class RowsDone:
    """Rows that were just handed to the sink (successes and errors)."""

    rows: list[Row]
    t: float


@dataclass(frozen=True)
class Warned:
    """Something the user should know; the run goes on."""

    message: str


@dataclass(frozen=True)
class Restarted:
    """A core's worker died or hung and will be started again after ``delay_s``."""

    core: int
    reason: str
    delay_s: float
    node: str | None = None


@dataclass(frozen=True)
class Recycling:
    """A core's worker grew (``rss_mb``, its own memory; ``reason``: over the limit, or
    steady growth): it gets no new items and is replaced once it holds none
    (engine/recycling.py)."""

    core: int
    rss_mb: float
    reason: str
    node: str | None = None


@dataclass(frozen=True)
class CoreRetired:
    """A core takes no more items for the rest of the run."""

    core: int
    reason: str
    node: str | None = None


@dataclass(frozen=True)
class Stopping:
    """A stop was requested (signal, or a caller): items in flight finish, nothing new starts."""

    reason: str
