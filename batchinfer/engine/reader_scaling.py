"""How many readers: grown or shrunk while running, from what the run measures.

Decoding is often what limits a run on the board (JPEG decode and resize on the CPU), and
the right number of reader processes depends on the images, the model and what else the
CPUs do. So unless the user fixes it (``runtime.readers``), the run starts with about half
the CPUs it may use and, every ``WINDOW_S``, looks at the last window:

- **grow** by one when cores waited for input (no item READY while a core had room) in more
  than ``STARVED`` of the samples, the readers were busy decoding more than ``BUSY`` of
  their time, and at least ``IDLE_CPU`` of a CPU was free: decoding is the bottleneck and
  there is room for another decoder;
- **shrink** by one when the CPUs were saturated (less than ``SATURATED`` of a CPU free) and
  the cores were well fed (starved in at most ``FED`` of the samples): a reader fewer gives
  its CPU back to the core workers and the coordinator.

After a change it waits a window before judging again. No processes and no clock here:
the loop feeds samples and asks (tests/test_scheduler.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 1.0
STARVED = 0.2
BUSY = 0.7
IDLE_CPU = 0.7
SATURATED = 0.15
FED = 0.05


@dataclass
class _Window:
    start: float
    samples: int = 0
    starved: int = 0
    decode_s: float = 0.0


class ReaderScaler:
    """Decides +1 / -1 / 0 readers (see the module docstring)."""

    def __init__(self, minimum: int, maximum: int, start_at: float) -> None:
        self.minimum, self.maximum = minimum, maximum
        self._window = _Window(start_at)
        self._cooldown_until = start_at + WINDOW_S

    def sample(self, starved: bool) -> None:
        """One look at the pipeline: did a core wait for input just now?"""
        self._window.samples += 1
        self._window.starved += starved

    def decoded(self, seconds: float) -> None:
        """Readers spent ``seconds`` decoding (from their reports)."""
        self._window.decode_s += seconds

    def decide(self, now: float, readers: int, idle_cpus: Callable[[], float]) -> int:
        """+1, -1 or 0 readers, once a window is complete (0 meanwhile).

        ``idle_cpus()`` (CPUs free over the window) is called only when a window is judged.
        """
        w = self._window
        span = now - w.start
        if span < WINDOW_S or not w.samples:
            return 0
        self._window = _Window(now)
        idle = idle_cpus()
        if now < self._cooldown_until:
            return 0
        starved = w.starved / w.samples
        busy = w.decode_s / (span * max(readers, 1))
        change = 0
        if starved > STARVED and busy > BUSY and idle >= IDLE_CPU and readers < self.maximum:
            change = 1
        elif idle < SATURATED and starved <= FED and readers > self.minimum:
            change = -1
        if change:
            self._cooldown_until = now + WINDOW_S
        return change
