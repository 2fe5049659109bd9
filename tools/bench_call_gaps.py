"""Where an NPU-bound run loses its cores' time: late calls or the engine between calls.

An emulated call holds its core for ``npu_ms`` and should end at that deadline. This runs
the engine in-process (``batchinfer.engine.runner.run``, ``--backend sim``, host 0 ms)
over ``.npy`` tensors and records every call's start and end as the core workers report
them (the coordinator's collector sees each result's ``t0``/``t1``, CLOCK_MONOTONIC, one
clock for every process). Per core, over the steady part of the run (the first and last
``--trim`` of its calls left out), it splits the time into:

- **npu**: ``npu_ms`` per call, what the emulated NPU is meant to be busy;
- **late**: how much longer than ``npu_ms`` the calls took (only with one instance per
  core, where a call never queues behind another on its core), in two parts: calls less
  than 0.1 ms late (what every call costs around the emulated NPU: the adapter's and the
  emulator's checks, the copy of the outputs into shared memory) and calls 0.1 ms or more
  late (the calling thread woken after the deadline: the machine was busy);
- **between**: time when no call of the core was in flight: the engine's own work between
  two calls of an instance (take the next item, report the last) and any wait for input.
  With one instance per core, the part of it in gaps of ``WAIT_MS`` or more is shown apart
  (**waits**): the instance had no item queued and waited for the coordinator's refill.

    python tools/bench_call_gaps.py --npu-ms 1 -k 1 --items 3000 --repeats 3

Emulator figures: a board's NPU wait blocks in the driver, and its wake-up competes with
the board's own load, not this machine's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

from batchinfer.demo import make_npy_dataset, model_path
from batchinfer.engine import collector as collector_module
from batchinfer.engine.planning.config import RunConfig
from batchinfer.engine.runner import run
from batchinfer.options import OutputOptions, RuntimeOptions, SimOptions

# A gap between two calls of an instance this long is a wait for an item, not the engine's
# own work between calls (which takes about 0.02 ms here).
WAIT_MS = 0.25


@dataclass(frozen=True)
class CoreSplit:
    """One core's steady-state time, as fractions of its span: with one instance per core,
    npu + late + woken_late + between = 1."""

    core: int
    calls: int
    npu: float
    # None with several instances per core: calls queue on the core
    late: float | None  # calls less than 0.1 ms late
    woken_late: float | None  # calls 0.1 ms or more late
    between: float
    waits: float | None  # of ``between``, in gaps of WAIT_MS or more (one instance per core)
    gaps_waited: float | None  # of the gaps between calls, those of WAIT_MS or more
    call_p50_ms: float
    call_p99_ms: float
    late_calls: float | None  # calls that ended 0.1 ms or more late (one instance per core)


def split_core(
    core: int, calls: list[tuple[float, float]], npu_ms: float, k: int, trim: float
) -> CoreSplit:
    """The split of one core's calls ``(t0, t1)`` (seconds), steady part only."""
    calls = sorted(calls)
    cut = int(len(calls) * trim)
    steady = calls[cut : len(calls) - cut]
    start, end = steady[0][0], max(t1 for _, t1 in steady)
    span = end - start
    # Time with at least one call in flight: the union of the calls' intervals.
    in_flight, reach = 0.0, start
    for t0, t1 in steady:
        if t1 > reach:
            in_flight += t1 - max(t0, reach)
            reach = t1
    durations = np.array([t1 - t0 for t0, t1 in steady]) * 1e3
    npu = len(steady) * npu_ms / 1e3 / span
    over = (durations - npu_ms) / 1e3 / span  # each call's share of the span beyond npu_ms
    woken = durations >= npu_ms + 0.1
    times = np.array(steady)
    gaps = (times[1:, 0] - times[:-1, 1]) * 1e3  # one instance: from a call's end to the next
    waited = gaps >= WAIT_MS
    return CoreSplit(
        core=core,
        calls=len(steady),
        npu=npu,
        late=float(over[~woken].sum()) if k == 1 else None,
        woken_late=float(over[woken].sum()) if k == 1 else None,
        between=1 - in_flight / span,
        waits=float(gaps[waited].sum() / 1e3 / span) if k == 1 else None,
        gaps_waited=float(waited.mean()) if k == 1 else None,
        call_p50_ms=float(np.percentile(durations, 50)),
        call_p99_ms=float(np.percentile(durations, 99)),
        late_calls=float(woken.mean()) if k == 1 else None,
    )


def measure(
    dataset: Path, out: Path, npu_ms: float, k: int, trim: float
) -> tuple[list[CoreSplit], float]:
    """One run: the split of each core, and the machine's busy CPUs during it."""
    seen: dict[int, list[tuple[float, float]]] = defaultdict(list)
    original = collector_module.Collector.success

    def record(self, slot, core, instance, t0, t1, boxes=None):  # type: ignore[no-untyped-def]
        seen[core].append((t0, t1))
        original(self, slot, core, instance, t0, t1, boxes)

    config = RunConfig(
        dataset=dataset,
        model=Path(model_path("pool224")),
        runtime=RuntimeOptions(
            backend="sim",
            cores=(0, 1, 2),
            instances_per_core=k,
            sim=SimOptions(npu_ms=npu_ms, host_ms=0),
        ),
        output=OutputOptions(out=out, overwrite=True),
    )
    collector_module.Collector.success = record  # type: ignore[method-assign]
    try:
        cpu0, t0 = psutil.cpu_times(), time.monotonic()
        result = run(config)
        cpu1, wall = psutil.cpu_times(), time.monotonic() - t0
    finally:
        collector_module.Collector.success = original  # type: ignore[method-assign]
    if result.errors:
        raise SystemExit(f"{result.errors} error rows")
    busy = sum(getattr(cpu1, f) - getattr(cpu0, f) for f in ("user", "system", "nice"))
    return [split_core(c, seen[c], npu_ms, k, trim) for c in sorted(seen)], busy / wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--npu-ms", type=float, default=1.0)
    p.add_argument("-k", type=int, default=1, help="instances per core")
    p.add_argument("--items", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--trim", type=float, default=0.05, help="of each core's calls, each end")
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="call-gaps-"))
    dataset = work / f"npy224-{args.items}"
    if not dataset.is_dir():
        make_npy_dataset(dataset, args.items)
    runs = [
        measure(dataset, work / "out", args.npu_ms, args.k, args.trim) for _ in range(args.repeats)
    ]
    print(
        f"npu {args.npu_ms:g} ms, host 0 ms, -k {args.k}, {args.items} items, cores 0,1,2, "
        f"{args.repeats} runs; medians over runs and cores of the steady part "
        f"(first and last {args.trim:.0%} of each core's calls left out); emulator figures"
    )
    splits = [s for cores, _ in runs for s in cores]

    def med(values: list[float | None]) -> str:
        kept = [v for v in values if v is not None]
        return f"{statistics.median(kept):.3f}" if kept else "-"

    print(
        "| npu | late < 0.1 ms | late ≥ 0.1 ms | between (waits) | gaps that waited "
        "| call p50 ms | call p99 ms | calls ≥ 0.1 ms late | busy CPUs |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {med([s.npu for s in splits])} | {med([s.late for s in splits])} "
        f"| {med([s.woken_late for s in splits])} | {med([s.between for s in splits])} "
        f"({med([s.waits for s in splits])}) | {med([s.gaps_waited for s in splits])} "
        f"| {med([s.call_p50_ms for s in splits])} | {med([s.call_p99_ms for s in splits])} "
        f"| {med([s.late_calls for s in splits])} "
        f"| {statistics.median(b for _, b in runs):.2f} of {psutil.cpu_count()} |"
    )


if __name__ == "__main__":
    main()
