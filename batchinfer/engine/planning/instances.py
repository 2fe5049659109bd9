"""``-k auto``: how many runtime instances per core, chosen from a short measurement at start.

Why more than one: an RKNNLite call is host work (converting the inputs, fetching and
converting the outputs) and NPU work, and one instance does them one after the other, so
the NPU idles during the host part (boards: one instance keeps its core about a third busy,
runtime/CONTRACT.md). Instances on one core overlap one's host part with another's NPU part.
More than needed buys nothing: each instance holds its own copy of the model (memory) and
its calls only queue for the NPU, which lengthens every item's latency.

The measurement (:func:`measure`, in a child forked like a core worker by engine/board/
instance_probe.py), on the plan's first core before the run starts, with the canary input:

1. one instance alone: the median time of a call, ``call_ms`` = host + NPU;
2. :data:`AUTO_MAX` instances at once: calls per second at steady state. When they saturate
   the NPU that rate is 1 / npu; when they do not, npu is at most call_ms / AUTO_MAX.

So ``npu_ms = max(1000 / rate, call_ms / AUTO_MAX)`` (never more than call_ms) and
``host_ms = call_ms - npu_ms``; to host time the engine adds its own work per item between
two calls (:data:`ENGINE_GAP_MS`). The rule (:func:`pick_instances`, a pure function): k
instances give ``min(k / (npu + host), 1 / npu)`` calls per second (the emulator's time
model, runtime/sim.py, and the board's figures); take the smallest k whose throughput is
within :data:`TOLERANCE` of what :data:`AUTO_MAX` would give. That is the smallest k with
k · npu >= npu + host, give or take the tolerance.

The host parts of several instances overlap only where CPUs are free: measured with the
cores' instances at once, the rate says so; the rule then trusts the model for k between 1
and AUTO_MAX. Readers (decoding) run in other processes and are not measured here.

The choice, with what was measured, goes into the run's manifest (``instances_auto``),
the bench JSON and the console ("instances per core: 3 (auto: ...)"). A number given with
``-k`` / ``runtime.instances_per_core`` is used as it is. If the measurement fails (the
model cannot be loaded three times, a call fails) the run goes on with one instance per
core and says why; the core workers then meet the same problem and report it as always.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from batchinfer.engine.queue_depth import QUEUED_PER_INSTANCE
from batchinfer.errors import ConfigError, UsageError
from batchinfer.messages import setting

log = logging.getLogger("batchinfer")

#: The word that asks for the choice.
AUTO = "auto"
#: The most instances auto chooses, and how many it measures at once: boards' own tools
#: stop at three per core (CONTRACT.md: 3/6/9 instances on three cores), each instance is
#: another copy of the model in memory, and with the usual host:NPU ratio (2:1) three
#: already keep a core busy.
AUTO_MAX = 3
#: Fewer instances are as good when their throughput is within this share of the best.
TOLERANCE = 0.03
#: What auto falls back to when the measurement fails: today's default.
FALLBACK = 1
#: The engine's own work per item on an instance's thread, between two runtime calls (its
#: queue, the status board, the copy of the outputs): host time the probe's back-to-back
#: calls do not see. Measured with the emulator (tools/bench_instances_auto.py, npu 1 and
#: 0.5 ms, no host time): one instance per core reached 0.90 and 0.83 of the NPU's rate,
#: i.e. about 0.1 ms per item.
ENGINE_GAP_MS = 0.1

# How long each phase measures: at least this many calls per instance and this long, at
# most MAX_PHASE_S (a slow model's calls are long: a few of them are enough).
_MIN_CALLS = 5
_MIN_PHASE_S = 0.05
_MAX_PHASE_S = 1.0
_WARMUP_CALLS = 2


def planned_instances(value: int | str, where: str = "runtime.instances_per_core") -> int:
    """The instances per core a plan sizes for: the number given, or AUTO_MAX for auto
    (slots and status board rows for the most auto may choose; ``settle_instances``
    then sizes them for the choice). ConfigError for any other word."""
    if isinstance(value, str):
        if value.strip().lower() != AUTO:
            raise ConfigError(
                setting(where)
                + f" must be a number of instances per core or {AUTO!r}, not {value!r}.",
                where,
            )
        return AUTO_MAX
    return value


def is_auto(value: int | str) -> bool:
    return isinstance(value, str) and value.strip().lower() == AUTO


def default_slots(cores: int, k: int, max_readers: int) -> int:
    """The shared-memory slots of a plan that names none: each instance holds up to
    QUEUED_PER_INSTANCE slots in its worker and one more waits READY, so a finished item is
    replaced at once; two per reader are being decoded."""
    return cores * k * (QUEUED_PER_INSTANCE + 1) + max_readers * 2


# ------------------------------------------------------------------------ the rule
def throughput(k: int, npu_ms: float, host_ms: float) -> float:
    """Calls per second of ``k`` instances on one core: ``min(k / (npu + host), 1 / npu)``."""
    per_call = npu_ms + host_ms
    if per_call <= 0:
        return math.inf
    return 1e3 * min(k / per_call, 1 / npu_ms if npu_ms > 0 else math.inf)


def pick_instances(
    npu_ms: float, host_ms: float, cap: int = AUTO_MAX, tolerance: float = TOLERANCE
) -> int:
    """The smallest k (1..cap) whose :func:`throughput` is within ``tolerance`` of cap's."""
    best = throughput(cap, npu_ms, host_ms)
    for k in range(1, cap + 1):
        if throughput(k, npu_ms, host_ms) >= (1 - tolerance) * best:
            return k
    return cap


@dataclass(frozen=True)
class Timings:
    """What :func:`measure` found on one core."""

    call_ms: float  # one instance alone: the median time of a call (host + NPU)
    rate_per_s: float  # ``concurrent`` instances at once: calls per second, steady state
    concurrent: int
    calls: int  # calls timed in all (warm-up left out)
    seconds: float  # how long the calls took (warm-up included, loading the model not)
    cpu_s: float = 0.0  # the probe process's CPU seconds (imports, loading, calls)

    @property
    def npu_ms(self) -> float:
        """The NPU's share of a call (see the module docstring)."""
        saturated = 1e3 / self.rate_per_s if self.rate_per_s > 0 else self.call_ms
        return min(self.call_ms, max(saturated, self.call_ms / self.concurrent))

    @property
    def host_ms(self) -> float:
        return max(0.0, self.call_ms - self.npu_ms)


@dataclass(frozen=True)
class Choice:
    """Instances per core as chosen, and why (the manifest's ``instances_auto``)."""

    k: int
    reason: str
    core: int | None = None
    timings: Timings | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"instances_per_core": self.k, "reason": self.reason}
        if self.core is not None:
            out["core"] = self.core
        t = self.timings
        if t is not None:
            out.update(
                call_ms=round(t.call_ms, 3),
                npu_ms=round(t.npu_ms, 3),
                host_ms=round(t.host_ms, 3),
                rate_per_s=round(t.rate_per_s, 1),
                concurrent=t.concurrent,
                calls=t.calls,
                probe_s=round(t.seconds, 3),
                probe_cpu_s=round(t.cpu_s, 3),
            )
        return out

    def line(self) -> str:
        """The console's one line."""
        return f"instances per core: {self.k} (auto: {self.reason})"


def choose(timings: Timings, cap: int = AUTO_MAX) -> Choice:
    """The choice for what was measured (pure): the runtime's host time and the engine's
    own per item (:data:`ENGINE_GAP_MS`) are both time the NPU may idle."""
    npu, host = timings.npu_ms, timings.host_ms
    k = pick_instances(npu, host + ENGINE_GAP_MS, cap)
    saturated = 1e3 / timings.rate_per_s >= timings.call_ms / timings.concurrent * 1.03
    npu_text = f"npu {npu:.1f} ms" if saturated else f"npu <= {npu:.1f} ms"
    reason = f"{npu_text}, host {host:.1f} ms per call + {ENGINE_GAP_MS:g} ms the engine's"
    return Choice(k, reason, timings=timings)


# ---------------------------------------------------------------------- measuring
def measure(
    calls: Sequence[Callable[[], Any]],
    clock: Callable[[], float] = time.monotonic,
    min_phase_s: float = _MIN_PHASE_S,
) -> Timings:
    """Time ``calls[0]`` alone, then every call of ``calls`` at once from threads of its own
    (each a runtime instance's inference of the same input); see the module docstring."""
    t_begin = clock()
    for call in calls:  # the first calls of a runtime allocate
        for _ in range(_WARMUP_CALLS):
            call()
    alone: list[float] = []
    start = clock()
    while len(alone) < _MIN_CALLS or clock() - start < min_phase_s:
        t0 = clock()
        calls[0]()
        alone.append(clock() - t0)
        if clock() - start > _MAX_PHASE_S:
            break
    call_s = statistics.median(alone)
    ends: list[float] = []
    lock = threading.Lock()
    stop = threading.Event()
    go = threading.Barrier(len(calls))

    def loop(call: Callable[[], Any]) -> None:
        go.wait()
        done = 0
        while not stop.is_set() or done < _MIN_CALLS:
            call()
            done += 1
            with lock:
                ends.append(clock())

    threads = [threading.Thread(target=loop, args=(c,), daemon=True) for c in calls]
    for t in threads:
        t.start()
    window = min(_MAX_PHASE_S, max(min_phase_s, 2 * _MIN_CALLS * call_s))
    stop.wait(window)
    stop.set()
    for t in threads:
        t.join()
    ends.sort()
    # Steady state: from the end of the first round (every instance started together) on.
    first = min(len(calls), len(ends) - 2)
    span = ends[-1] - ends[first]
    rate = (len(ends) - 1 - first) / span if span > 0 else math.inf
    return Timings(1e3 * call_s, rate, len(calls), len(alone) + len(ends), clock() - t_begin)


def refuse_on_cluster(plan: Any) -> None:
    """``-k auto`` is not for Ray: each actor asks Ray for 1/K of its core's resource before
    anything runs, and measuring on the head node would say nothing of the nodes' cores."""
    if getattr(plan, "instances_auto", False):
        raise UsageError(
            setting("runtime.instances_per_core")
            + " auto is not available with Ray (each actor reserves "
            "1/K of its core before anything can be measured); give a number, e.g. 2, or run "
            "`batchinfer bench --sweep instances` on a node to choose one."
        )
