"""The states of the engine's moving parts, as enums (their meanings are where they change:
scheduler.py for slots and cores, plumbing/children.py for child processes, cluster/pool.py for Ray
actors).

Each member is also its old string (a ``str`` mixin: Python 3.10 has no StrEnum), so a
state compares equal to, and prints as, the word it replaced.
"""

from __future__ import annotations

from enum import Enum


class _Word(str, Enum):
    """An enum whose members are strings and print as their value."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class SlotState(_Word):
    """An item's place in the slot life cycle (NOTE in slots.py)."""

    FREE = "free"
    READING = "reading"
    READY = "ready"
    INFERRING = "inferring"
    DONE = "done"


class CoreStatus(_Word):
    """An NPU core (or a Ray actor on one) as the scheduler sees it."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"  # to be recycled: no new items; those it holds finish
    DOWN = "down"  # its worker died; restarted at restart_at
    RETIRED = "retired"  # for the rest of the run


class ChildState(_Word):
    """A reader or core-worker process, as the pool sees it."""

    STARTING = "starting"
    READY = "ready"
    GONE = "gone"
