"""How many readers: grown or shrunk while running, from what the run measures.

Decoding is often what limits a run on the board (JPEG decode and resize on the CPU), and
the right number of reader processes depends on the images, the model and what else the
CPUs do. So unless the user fixes it (``runtime.readers``), the run starts with about half
the CPUs it may use and, every window (``WINDOW_S`` unless given), looks at the last one:

- **grow** by one when cores waited for input (no item READY while a runtime instance had
  nothing to infer) more than ``STARVED`` of the time, the readers were busy decoding more
  than ``BUSY`` of their time, and at least ``IDLE_CPU`` of a CPU was free: decoding is the
  bottleneck and there is room for another decoder;
- **shrink** by one when the CPUs were saturated (less than ``SATURATED`` of a CPU free) and
  the cores were well fed (starved at most ``FED`` of the time): a reader fewer gives its CPU
  back to the core workers and the coordinator.

Readers of images run at normal priority until a judged window shows the cores well fed
(``fed``): then the loop lowers their priority, so a worker whose inference just ended runs
before a reader filling a slot backlog (an idle NPU is lost time; the slots are the readers'
buffer). An unprivileged process can lower a priority but never raise it back, so this
happens once, and only when decoding is not the bottleneck; a reader grown later starts at
normal priority. With ``runtime.readers`` fixed the count never changes, but the same
judgement decides the priority. Readers of ``.npy`` tensors (a copy into the slot) yield
from the start: at npu 2 ms, readers at normal priority for the first seconds cost the
3-core run about 6 % (1354 against 1446 items/s, ``tools/bench_run.py --scenario ideal``, 3
runs each, back to back), the core workers' calls overrunning their 2 ms (2.14 against 2.04
ms).

The first window, and the first after a change, are not judged: they hold the start-up of
the run's or of the new reader's processes, not what the readers can do. The first one ends
early when the pool says every process is up (:meth:`ReaderScaler.started`, every core
ready): then a short window (``FIRST_WINDOW_S``) is judged. Waiting out the whole cool-down
second meant a second reader came 2 s into a run at the earliest, after most of a run over
a few thousand images. ``python tools/cpu_by_role.py --trees BEFORE,. --workload W
--items N --repeats 5`` (the ``batchinfer run`` command's wall time, medians of 5 runs
alternating with the commit before, 2-CPU VM, emulated NPU, 2026-12-06): ``jpeg-640``
(640x480 JPEGs, npu 2 ms) 2.44 → 1.82 s at 1,000 items and 4.87 → 4.29 s at 3,000;
``jpeg-64-4ms`` (3,000 64x64 JPEGs at npu 4 ms: one reader is enough) 4.53 s both, and
the same CPU per item (1.27 and 1.26 ms), so no reader was added. Starting image runs with
every CPU as a reader instead (``batchinfer run ... --readers 2`` against the default,
interleaved, earlier that day) did a little better when decode-bound but made a run of
3,000 64x64 JPEGs at npu 2 ms pay about 20 % more CPU per item (1.12 → 1.35 ms) for no
speed, the second reader contending with the core workers.

Starvation is measured in time, not in samples. The loop tells :meth:`ReaderScaler.observe`
at the end of every turn whether the pipeline was starved while it waited for that turn's
events (the state after the previous turn had dispatched what it could), and the time since
the previous turn is added to the window's starved or fed time. Samples taken at some
point of the loop were biased by where they were taken: sampled after a turn's events were
handled, a pipeline whose reader had just made an item READY looked fed at the very moment
of the sample, though the cores then waited for the next item for the rest of its decode
(in ``bench --dataset`` over 12 MP JPEGs, one reader starving three cores showed 0-4
starved samples of 11-17 a second, mostly 0). A sample at the start of every turn would
have no such bias, but would weigh a turn of 1 ms (an inference's result coming back) as much
as a wait of 30 ms for a decode; time has neither fault, and counts however few turns there
are.

The thresholds, measured on the 2-CPU development VM (12 MP JPEGs, emulated NPU at 2 ms,
2026-12-03, shared with other developers): with one reader as the bottleneck its busy
fraction was 0.96-1.00 in every judged window and the starved time 1.0 of each window; the
window holding the run's start-up read 0.32-0.66 busy, which is why it is not judged. Busy
time is the wall time of each decode, preemption included, so two readers on two saturated
CPUs still read about 0.97 each: ``BUSY`` tells readers that wait for work from readers that
decode, and ``IDLE_CPU`` decides whether another one has a CPU to run on. A decode is
counted when its item comes back, so with items of several tenths of a second a window holds
one item more or less: ``BUSY`` 0.7 leaves room for that. ``Usage.idle_cpus`` reported
0.77-0.94 of a CPU free in the quietest windows seen (one reader decoding), and 0.00-0.1
while other developers' test suites ran: then no reader is added, which is what
``IDLE_CPU`` is for. It was 0.7 (most of a CPU) and is 0.3: on the 2-CPU VM, with one
reader decoding 640x480 JPEGs for three 2 ms cores, the core workers and the coordinator
take enough of the second CPU that the free share sat around 0.5-0.7, so a run grew its
second reader in 2 of 5 runs at 0.7 and in 4 of 4 at 0.3 (403-467 against 541-550
items/s, same sitting). Below 0.3 (and above ``SATURATED``) a second decoder would mostly
contend for CPUs already in use.

No processes and no clock here: the loop feeds observations and asks (tests/test_scheduler.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 1.0
FIRST_WINDOW_S = 0.25
STARVED = 0.2
BUSY = 0.7
IDLE_CPU = 0.3
SATURATED = 0.15
FED = 0.05


@dataclass
class _Window:
    start: float
    observed_s: float = 0.0
    starved_s: float = 0.0
    decode_s: float = 0.0


class ReaderScaler:
    """Decides +1 / -1 / 0 readers (see the module docstring)."""

    def __init__(
        self,
        minimum: int,
        maximum: int,
        start_at: float,
        window_s: float = WINDOW_S,
        first_window_s: float = FIRST_WINDOW_S,
    ) -> None:
        self.minimum, self.maximum = minimum, maximum
        self.window_s, self.first_window_s = window_s, first_window_s
        self._window = _Window(start_at)
        self._length = window_s  # of the window under way
        self._seen = start_at  # observed up to here
        self._cooldown_until = start_at + window_s  # windows starting before: not judged
        self._started = False
        # A judged window had the cores well fed: decoding is not what they wait for, so
        # readers may yield the CPU to the core workers (Engine._yield_to_workers).
        self.fed = False

    def started(self, now: float, idle_cpus: Callable[[], float]) -> None:
        """Every process of the run is up (its cores ready): the start-up the cool-down
        window stands for is over, so a window of ``first_window_s`` from ``now`` is judged
        (once; nothing changes if the cool-down had already passed). ``idle_cpus`` is
        called to start the window's CPU measure."""
        if self._started:
            return
        self._started = True
        if now >= self._cooldown_until:
            return
        self._window = _Window(now)
        self._length = self.first_window_s
        self._cooldown_until = now
        idle_cpus()

    def observe(self, now: float, starved: bool) -> None:
        """Since the last observation, until ``now``, the pipeline was ``starved`` (a runtime
        instance had nothing to infer and no item was READY: Engine._starved) or not."""
        span = now - max(self._seen, self._window.start)
        self._seen = max(self._seen, now)
        if span <= 0:
            return
        self._window.observed_s += span
        if starved:
            self._window.starved_s += span

    def decoded(self, seconds: float) -> None:
        """Readers spent ``seconds`` decoding (from their reports)."""
        self._window.decode_s += seconds

    def decide(self, now: float, readers: int, idle_cpus: Callable[[], float]) -> int:
        """+1, -1 or 0 readers, once a window is complete (0 meanwhile).

        A window observed for less than half its length (the dataset ran out, so nothing
        was observed) is not judged. ``idle_cpus()`` (CPUs free over the window) is called
        only when a window is complete.
        """
        w = self._window
        span = now - w.start
        if span < self._length:
            return 0
        self._window, self._length = _Window(now), self.window_s
        idle = idle_cpus()
        if w.start < self._cooldown_until or w.observed_s < span / 2:
            return 0
        starved = w.starved_s / w.observed_s
        self.fed = self.fed or starved <= FED
        busy = w.decode_s / (span * max(readers, 1))
        change = 0
        if starved > STARVED and busy > BUSY and idle >= IDLE_CPU and readers < self.maximum:
            change = 1
        elif idle < SATURATED and starved <= FED and readers > self.minimum:
            change = -1
        if change:
            self._cooldown_until = now + self.window_s
        return change
