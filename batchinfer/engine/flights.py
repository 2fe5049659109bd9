"""What the scheduler keeps of each item in a slot (:class:`Flight`) and of each key
(:class:`CoreState`), and the rows it says are due (:class:`Finished`): the records that
scheduler.py's dispatch and core_life.py's worker life cycle both read and change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchinfer.data.dataset import Item
from batchinfer.engine.states import CoreStatus, SlotState


@dataclass(slots=True)
class Flight:
    """One item between its source and its row; lives in a slot."""

    item: Item
    state: SlotState
    reader: int | None = None
    core: int | None = None
    read_ms: float = 0.0
    t_ready: float = 0.0
    t_dispatched: float = 0.0
    failures: list[str] = field(default_factory=list)
    cores_tried: list[int] = field(default_factory=list)
    crashes: int = 0  # worker deaths this item was charged with
    suspect: bool = False  # in a crash with others, not charged: to be retried alone


@dataclass
class CoreState:
    core: int
    capacity: int
    state: CoreStatus = CoreStatus.STARTING
    inflight: set[int] = field(default_factory=set)
    crashes_in_row: int = 0
    restart_at: float | None = None
    restarts: int = 0
    suspect: int | None = None  # the slot of a suspect it is inferring alone
    # The slot (and its flight: a slot is used again) of a crash retry this core drains
    # for: no refills until it is empty, then that item goes to it alone (Scheduler._reserve).
    reserved: int | None = None
    reserved_flight: Flight | None = None


@dataclass(frozen=True)
class Finished:
    """An item's one row is due: success (``error`` None) or error."""

    slot: int
    error: str | None
    attempt: int
    core: int | None
