"""Diagnosis: what limited a run's throughput, named with the numbers that show it.

A pure function of what the run measured (:class:`Evidence`). The rules, in order:

1. ``npu``: the NPU cores were busy at least ``NPU_BUSY`` (95 %) of the time on average.
   NPU load comes from the rknpu driver (debugfs, usually root only) on a board, or from
   the emulator's time model (each call holds its core for npu_ms) under ``sim``.
2. When the runtime instances were inside ``inference()`` at least ``INSTANCES_BUSY``
   (90 %) of the time but the NPU was not saturated, the calls themselves limit:
   ``cpu`` if the machine was CPU-starved and the core workers were among the busy
   processes (the host side of each call waits for a CPU), else ``host``: the host side
   of each call (pre/post-processing inside the runtime) leaves the NPU idle, and more
   instances per core overlap it (``ceil(k / NPU load)`` fill the NPU when it is known).
3. When the instances were waiting for work, the pipeline feeding them limits:
   ``cpu`` when CPU-starved: more busy processes than CPUs on a machine at least
   ``MACHINE_BUSY`` busy, or at least ``MACHINE_QUEUED`` busy with ``RUN_QUEUE`` tasks or
   more runnable per CPU (one waiting for each CPU, on average: the machine then looks
   less than full only in the moments when every process sleeps at once, as the core
   workers do in their NPU waits; at npu 0.5 ms the emulator's run showed 4.5 tasks
   runnable on 2 CPUs 89.5 % busy, and was said to be limited by nothing). Busy
   processes: the mean number of tasks running or waiting for a CPU (procs_running, read
   at every window boundary) where readable, and at least ours using ``BUSY_PROCESS`` of
   a CPU plus other processes' load counted in whole CPUs.
   ``decode`` when the readers were saturated (each near 100 % of a CPU: ``SATURATED``)
   while inputs waited less than an inference for a core (the ready queue ran empty).
   ``coordinator`` when the coordinator was saturated.
4. Otherwise nothing was saturated: the most loaded of these is named, and the
   diagnosis says it was not saturated.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from batchinfer.messages import setting

BOUNDS = ("npu", "host", "decode", "coordinator", "cpu")
NPU_BUSY = 0.95
INSTANCES_BUSY = 0.90
SATURATED = 0.85  # of one CPU: a single-threaded process near its limit
BUSY_PROCESS = 0.5  # of one CPU: counts as a busy process
MACHINE_BUSY = 0.90  # of every CPU
MACHINE_QUEUED = 0.80  # of every CPU, with RUN_QUEUE runnable tasks per CPU
RUN_QUEUE = 2.0  # mean runnable tasks per CPU: one running and one waiting


@dataclass(frozen=True)
class Evidence:
    """What a run measured that tells what limited it (CPU use in CPUs, 1.0 = one CPU)."""

    cpus: int
    instances_per_core: int
    utilization: dict[int, float]  # per core: some instance inside inference()
    instances_busy: dict[int, float]  # per core: mean share of time each instance was inside
    npu_load: dict[int, float] | None  # per core 0..1 (key -1: the whole NPU); None unknown
    npu_load_source: str | None
    coordinator_cpu: float
    reader_cpu: list[float]
    worker_cpu: list[float]
    other_cpus: float
    machine_cpus: float  # busy CPUs in all (ours and others)
    wait_p50_ms: float | None  # input ready -> inference start
    latency_p50_ms: float | None
    runnable: float | None = None  # mean tasks running or waiting for a CPU
    read_p50_ms: float | None = None
    samples_per_s: float = 0.0
    backend: str = ""
    npu_load_unreadable: str | None = None  # why the board's own figure is missing


@dataclass(frozen=True)
class Diagnosis:
    bound: str  # one of BOUNDS
    summary: str  # one sentence with the numbers
    advice: str
    saturated: bool = True
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        fields = asdict(self)
        numbers = fields.pop("numbers")  # its figures stand beside the verdict's, not in a dict
        return {**fields, **numbers}


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _per_core(values: dict[int, float]) -> str:
    return ", ".join(
        f"{'NPU' if c < 0 else f'core {c}'} {_pct(v)}" for c, v in sorted(values.items())
    )


def busy_processes(e: Evidence) -> int:
    """Processes that wanted a CPU: the mean runnable tasks where known, and at least our
    processes using half a CPU or more plus other processes' load in whole CPUs."""
    ours = [e.coordinator_cpu, *e.reader_cpu, *e.worker_cpu]
    counted = sum(c >= BUSY_PROCESS for c in ours) + round(e.other_cpus)
    return max(counted, round(e.runnable)) if e.runnable is not None else counted


def diagnose(e: Evidence) -> Diagnosis:
    """What limited the run (see the module docstring for the rules)."""
    npu_load = e.npu_load or {}  # empty: unknown
    npu = _mean(npu_load.values()) if npu_load else None
    inst = _mean(e.instances_busy.values())
    util = _mean(e.utilization.values())
    readers = _mean(e.reader_cpu) if e.reader_cpu else None
    busy = busy_processes(e)
    queued = (
        e.runnable is not None
        and e.runnable >= RUN_QUEUE * e.cpus
        and e.machine_cpus >= MACHINE_QUEUED * e.cpus
    )
    starved = busy > e.cpus and (e.machine_cpus >= MACHINE_BUSY * e.cpus or queued)
    numbers: dict[str, Any] = {
        "npu_load": None if npu is None else round(npu, 4),
        "npu_load_per_core": (
            None if e.npu_load is None else {str(c): round(v, 4) for c, v in e.npu_load.items()}
        ),
        "npu_load_source": e.npu_load_source,
        "npu_load_unreadable": e.npu_load_unreadable,
        # batchinfer's busy time less the board's NPU load: the time calls spend off the NPU
        "outside_npu": None if npu is None else round(max(0.0, util - npu), 4),
        "utilization": round(util, 4),
        "instances_busy": round(inst, 4),
        "instances_per_core": e.instances_per_core,
        "coordinator_cpu": round(e.coordinator_cpu, 3),
        "reader_cpu": [round(c, 3) for c in e.reader_cpu],
        "worker_cpu": [round(c, 3) for c in e.worker_cpu],
        "other_cpus": round(e.other_cpus, 3),
        "machine_cpus": round(e.machine_cpus, 3),
        "cpus": e.cpus,
        "busy_processes": busy,
        "runnable": e.runnable,
        "wait_p50_ms": e.wait_p50_ms,
        "latency_p50_ms": e.latency_p50_ms,
        "read_p50_ms": e.read_p50_ms,
    }
    runnable = (
        "" if e.runnable is None else f"{e.runnable:.1f} tasks running or waiting for a CPU; "
    )
    cpu_text = (
        f"{busy} busy processes ({runnable}coordinator {e.coordinator_cpu:.2f}, readers "
        f"{_cpus(e.reader_cpu)}, workers {_cpus(e.worker_cpu)} CPUs; other processes "
        f"{e.other_cpus:.2f} CPUs) on {e.cpus} CPUs, {_pct(e.machine_cpus / e.cpus)} busy"
    )
    cpu_advice = (
        "fewer busy processes than CPUs: lower "
        + setting("runtime.readers")
        + " or "
        + setting("runtime.cores")
        + ", stop "
        "other work on the machine, or pin to the big cores with " + setting("runtime.cpu_affinity")
    )
    if npu is not None and npu >= NPU_BUSY:
        return Diagnosis(
            "npu",
            f"NPU-bound: the NPU was busy {_pct(npu)} of the time ({_per_core(npu_load)}; "
            f"{e.npu_load_source}).",
            "the NPU is the limit: only a lighter model (smaller input, int8, pruning) or "
            "more NPU cores go faster",
            numbers=numbers,
        )
    if inst >= INSTANCES_BUSY:
        if starved and e.worker_cpu and _mean(e.worker_cpu) >= BUSY_PROCESS:
            return Diagnosis(
                "cpu",
                f"CPU-starved: the instances were inside inference() {_pct(inst)} of the "
                f"time, waiting for CPU: {cpu_text}.",
                cpu_advice,
                numbers=numbers,
            )
        known = (
            f"but the NPU only {_pct(npu)} ({e.npu_load_source}): {_pct(max(0.0, util - npu))} "
            "of the time the cores were busy went outside the NPU (the host side of the calls)"
            if npu is not None
            else "and the NPU load could not be read (rknpu debugfs needs root), so NPU time "
            "cannot be told from host time"
        )
        k = e.instances_per_core
        if npu:
            suggest = max(k + 1, math.ceil(k / npu - 1e-9))
            advice = (
                "overlap the host side of the calls: " + setting("runtime.instances_per_core") + " "
                f"{suggest} (k / NPU load = {k}/{npu:.2f}); an instances sweep confirms it"
            )
        else:
            advice = (
                "try "
                + setting("runtime.instances_per_core")
                + f" {k + 1} or more; an instances sweep tells"
            )
        return Diagnosis(
            "host",
            f"host-bound per instance: each of the {k} instance(s) per core was inside "
            f"inference() {_pct(inst)} of the time {known}; latency p50 "
            f"{_ms(e.latency_p50_ms)} per call.",
            advice,
            numbers=numbers,
        )
    idle = f"the cores were busy only {_pct(util)} of the time ({_per_core(e.utilization)})"
    if npu is not None:
        idle += f", the NPU itself {_pct(npu)} ({e.npu_load_source})"
    if starved:
        return Diagnosis("cpu", f"CPU-starved: {idle}; {cpu_text}.", cpu_advice, numbers=numbers)
    queue_empty = (
        e.wait_p50_ms is not None
        and e.latency_p50_ms is not None
        and e.wait_p50_ms < e.latency_p50_ms
    )
    if readers is not None and readers >= SATURATED and queue_empty:
        return Diagnosis(
            "decode",
            f"decode-bound: {len(e.reader_cpu)} reader(s) used {_cpus(e.reader_cpu)} CPUs "
            f"(decode p50 {_ms(e.read_p50_ms)} per item) while {idle} and inputs waited "
            f"{_ms(e.wait_p50_ms)} (p50) for a core, less than one inference "
            f"({_ms(e.latency_p50_ms)}).",
            "decode faster: more "
            + setting("runtime.readers")
            + " where CPUs are free, "
            + setting("runtime.cpu_affinity")
            + " on the big cores, or smaller inputs (images stored near "
            "the model's input size)",
            numbers=numbers,
        )
    if e.coordinator_cpu >= SATURATED:
        return Diagnosis(
            "coordinator",
            f"coordinator-bound: the coordinator used {e.coordinator_cpu:.2f} CPUs (one "
            f"process, near its limit) while {idle}.",
            "the coordinator is the limit: more "
            + setting("runtime.slots")
            + " (larger batches of "
            "messages), or fewer CPU-hungry processes beside it; report it, it is the "
            "engine's to fix",
            numbers=numbers,
        )
    candidates = {
        "host": inst,
        "decode": readers if readers is not None else -1.0,
        "coordinator": e.coordinator_cpu,
        "cpu": e.machine_cpus / e.cpus,
    }
    bound = max(candidates, key=lambda b: candidates[b])
    return Diagnosis(
        bound,
        f"nothing was saturated: {idle}; the most loaded was {_LOADED[bound]} at "
        f"{_pct(candidates[bound])} (instances in inference() {_pct(inst)}, readers "
        f"{_cpus(e.reader_cpu)}, coordinator {e.coordinator_cpu:.2f} CPUs, machine "
        f"{_pct(e.machine_cpus / e.cpus)} busy).",
        "the pipeline waits on something none of these shows (few slots, a slow "
        "filesystem): look at the per-window plot, then try more "
        + setting("runtime.slots")
        + " or "
        + setting("runtime.readers"),
        saturated=False,
        numbers=numbers,
    )


_LOADED = {
    "host": "the instances' time inside inference()",
    "decode": "the readers",
    "coordinator": "the coordinator",
    "cpu": "the machine's CPUs",
}


def _cpus(values: list[float]) -> str:
    return "/".join(f"{v:.2f}" for v in values) if values else "none"


def _ms(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} ms"


def with_emulator_share(d: Diagnosis, call_cpu_ms: float | None, samples_per_s: float) -> Diagnosis:
    """``d``, for a CPU-starved run on the emulator, with the CPUs its own calls took.

    The emulator computes each call on this machine's CPU (ONNX Runtime, its checks, its
    wait for the deadline), which a board's NPU does without the CPU: at npu 0.5 ms on a
    2-CPU machine the calls alone took 0.9 CPUs. Said in the advice, so a CPU-starved
    emulated run is not read as what a board would do. ``call_cpu_ms``: one emulated
    call's CPU, timed alone (batchinfer.bench.limits); None on other backends.
    """
    if d.bound != "cpu" or not call_cpu_ms or samples_per_s <= 0:
        return d
    cpus = call_cpu_ms * samples_per_s / 1e3
    note = (
        f"; on the emulator its own calls took about {cpus:.2f} of these CPUs "
        f"({call_cpu_ms:.3f} ms of CPU per call, timed alone, × {samples_per_s:,.0f} "
        "calls/s), CPU a board's NPU does not use, so a board may not be CPU-starved here"
    )
    return replace(
        d,
        advice=d.advice + note,
        numbers={**d.numbers, "emulator_call_cpus": round(cpus, 3)},
    )
