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
:meth:`BoardPool.shift` (board.py) moves every child's deadline by it and tells the
watchdog: a child is judged only on time we could watch it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from batchinfer.engine.children import Child
from batchinfer.engine.states import ChildState
from batchinfer.options import ReliabilityOptions


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
        held_by: Callable[[Child], int],
    ) -> None:
        self.rel = rel
        self.rows_of = rows_of
        self.held_by = held_by
        self._resumed_at = 0.0

    def resumed(self, now: float) -> None:
        """The loop was not running until ``now`` (it finds such gaps, loop.py; the pool
        moves its children's clocks by the gap): rows that started before ``now`` are
        judged from ``now``."""
        self._resumed_at = now

    def _limit(self, child: Child) -> tuple[float, str]:
        if child.kind == "worker":
            return self.rel.inference_timeout_s, "the inference timeout"
        return self.rel.decode_timeout_s, "the decode timeout"

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
            limit, name = self._limit(child)
            rows = board[self.rows_of(child)]
            active = [(int(i), max(t, self._resumed_at)) for i, t in rows if t > 0]
            late = [(i, t) for i, t in active if now - t > limit]
            if late:
                index = late[0][0]
                if child.kind == "worker":
                    # Its other instances did not hang: only these items are charged.
                    reason = (
                        f"inference of item {index} hung for more than {limit:g} s ({name}); "
                        "worker killed"
                    )
                    out.append(Hung(child, reason, frozenset(i for i, _ in late)))
                else:
                    out.append(Hung(child, f"was stuck for more than {limit:g} s ({name})"))
            elif not active and self.held_by(child) and now - child.last_progress > limit:
                held = self.held_by(child)
                out.append(
                    Hung(
                        child,
                        f"made no progress for more than {limit:g} s ({name}) while holding "
                        f"{held} item(s): frozen or stopped; killed",
                    )
                )
        return out
