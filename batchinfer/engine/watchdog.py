"""The watchdog: which children are hung, from what the loop sees. No processes, no clock.

A child is hung when any of these holds (each with its own limit from ReliabilityOptions):
- it is still starting past its start-up deadline (model loading, then the canary);
- one of its board rows (an instance inferring, a reader decoding) started longer ago than
  the inference or decode timeout;
- it holds items, none of its rows is active, and it has sent nothing for longer than that
  timeout: it is frozen between two items (SIGSTOP, a stuck thread, a lost message).

The coordinator itself can stop running (Ctrl-Z, a frozen VM, starvation). Every clock here
is CLOCK_MONOTONIC, which keeps counting meanwhile, so after such a gap every child would
look hung at once. The loop notices a gap between two of its turns, and
:meth:`BoardPool.shift` (board/pool.py) moves every child's deadline by it and tells the
watchdog: a child is judged only on time we could watch it.

:class:`HangLimit` is the one place a hang's limit and its texts are made: this watchdog
judges the board's children by it, and the Ray pool (cluster/pool.py, cluster/reads.py)
its actors' calls and its read tasks (a call of n items gets n times the limit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from batchinfer.engine.plumbing.children import Child
from batchinfer.engine.states import ChildState
from batchinfer.options import ReliabilityOptions


@dataclass(frozen=True)
class HangLimit:
    """How long one item may run in inference (or in decoding) before its worker (reader,
    actor, read task) is hung, and the texts that say so (they become the items' errors)."""

    seconds: float
    name: str  # the setting, as the texts name it: "the inference timeout"

    @classmethod
    def inference(cls, rel: ReliabilityOptions) -> HangLimit:
        return cls(rel.inference_timeout_s, "the inference timeout")

    @classmethod
    def decode(cls, rel: ReliabilityOptions) -> HangLimit:
        return cls(rel.decode_timeout_s, "the decode timeout")

    def of(self, items: int) -> HangLimit:
        """The limit of one call (or task) of ``items`` items, run one after the other."""
        return HangLimit(self.seconds * items, self.name)

    def passed(self, since: float, now: float) -> bool:
        return now - since > self.seconds

    def _over(self) -> str:
        return f"more than {self.seconds:g} s ({self.name})"

    def hung(self, what: str, killed: str) -> str:
        """``what`` ("inference of item 7") ran past the limit; ``killed`` what was killed."""
        return f"{what} hung for {self._over()}; {killed} killed"

    def stuck(self) -> str:
        """A reader (or read task) that ran past the limit on one item."""
        return f"was stuck for {self._over()}"

    def frozen(self, held: int) -> str:
        """A child that holds items, infers or decodes none, and has said nothing."""
        return (
            f"made no progress for {self._over()} while holding {held} item(s): frozen or "
            "stopped; killed"
        )


class Hung(NamedTuple):
    """A child to kill: why (its items' error), and for a worker whose instance hung the
    items that hung (only they are charged); None when any item it held may be the cause."""

    child: Child
    reason: str
    items: frozenset[int] | None = None


class Watchdog:
    """Finds hung children (see the module docstring)."""

    def __init__(
        self,
        rel: ReliabilityOptions,
        rows_of: Callable[[Child], slice],
    ) -> None:
        self.rel = rel
        self.rows_of = rows_of
        self._resumed_at = 0.0

    def resumed(self, now: float) -> None:
        """The loop was not running until ``now`` (it finds such gaps, loop.py; the pool
        moves its children's clocks by the gap): rows that started before ``now`` are
        judged from ``now``."""
        self._resumed_at = now

    def _limit(self, child: Child) -> HangLimit:
        if child.kind == "worker":
            return HangLimit.inference(self.rel)
        return HangLimit.decode(self.rel)

    def hung(self, now: float, children: list[Child], board: np.ndarray) -> list[Hung]:
        """Children to kill now, each with the reason (it becomes their items' error)."""
        out: list[Hung] = []
        for child in children:
            if child.killed_for is not None:
                continue
            if child.deadline is not None:
                if now > child.deadline:
                    out.append(Hung(child, f"{child.phase}; killed"))
                continue
            if child.state != ChildState.READY:
                continue
            limit = self._limit(child)
            rows = board[self.rows_of(child)]
            active = [(int(i), max(t, self._resumed_at)) for i, t in rows if t > 0]
            late = [(i, t) for i, t in active if limit.passed(t, now)]
            if late:
                if child.kind == "worker":
                    # Its other instances did not hang: only these items are charged.
                    reason = limit.hung(f"inference of item {late[0][0]}", "worker")
                    out.append(Hung(child, reason, frozenset(i for i, _ in late)))
                else:
                    out.append(Hung(child, limit.stuck()))
            elif not active and child.held and limit.passed(child.last_progress, now):
                # What it holds: sent to it and not heard back (a reader's unsent ones wait in
                # the scheduler).
                out.append(Hung(child, limit.frozen(len(child.held))))
        return out
