"""A core's busy time on a cluster: the union of its instances' time inside inference()."""

from __future__ import annotations

from collections import deque


class BusyUnion:
    """Seconds during which at least one instance of a core was inside inference().

    Each instance reports its calls' intervals in order, on its node's clock (which the
    instances of one core share), so the union is merged as the instances advance: an
    interval is merged once no instance still running a call could report an earlier
    one. An instance with no call in flight (idle, restarting) reports nothing earlier
    than now, so it holds nothing back; memory stays within the calls in flight.
    """

    def __init__(self, instances: int) -> None:
        self.streams: list[deque[tuple[float, float]]] = [deque() for _ in range(instances)]
        self.merged = 0.0
        self.span: tuple[float, float] | None = None  # the union's last, still open interval

    def add(self, instance: int, intervals: list[tuple[float, float]]) -> None:
        self.streams[instance].extend(intervals)

    def seconds(self, idle: set[int], final: bool = False) -> float:
        """Merge what can be merged (everything when ``final``); the union's length so far."""
        while True:
            heads = [i for i, s in enumerate(self.streams) if s]
            if not heads:
                break
            if not final and any(not s and i not in idle for i, s in enumerate(self.streams)):
                break  # a busy instance may still report an earlier interval
            i = min(heads, key=lambda j: self.streams[j][0][0])
            t0, t1 = self.streams[i].popleft()
            if self.span is None or t0 > self.span[1]:
                if self.span is not None:
                    self.merged += self.span[1] - self.span[0]
                self.span = (t0, t1)
            else:
                self.span = (self.span[0], max(self.span[1], t1))
        open_s = 0.0 if self.span is None else self.span[1] - self.span[0]
        return self.merged + open_s
