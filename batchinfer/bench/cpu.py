"""CPU use by role (coordinator, readers, core workers), other load, peak memory.

Sampled with psutil at the start and the end of an interval, never per item: a
:class:`CpuSnapshot` holds each tracked process's CPU seconds, the CPU seconds of our
whole process tree, and the machine's busy seconds. Between two snapshots:

- a process's CPU use is its CPU seconds over the interval, in CPUs (1.0 = one CPU);
- "other load" is the machine's busy CPU time (steal included: a hypervisor's other
  guests take our CPUs too) minus our process tree's, in CPUs;
- the machine is "busy" by the total of both;
- "runnable" is the mean number of tasks running or waiting for a CPU (procs_running of
  /proc/stat), read at every window boundary: above the CPU count, processes wait for CPUs.

Our tree's CPU time counts every live descendant and every reaped one (a worker that was
restarted), so a restart does not show up as other load.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

ROLES = ("coordinator", "reader", "worker")


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of one process (not its children); None when it is gone."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return t.user + t.system


def tree_cpu_s() -> float:
    """CPU seconds of this process and every descendant, live or reaped."""
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue  # exited meanwhile: its parent's children_* times will hold it
        total += t.user + t.system + t.children_user + t.children_system
    return total


def machine_busy_s() -> tuple[float, float]:
    """(busy CPU seconds of the machine so far, of which stolen by the hypervisor)."""
    t = psutil.cpu_times()
    steal = getattr(t, "steal", 0.0)
    # guest time is already inside user; idle and iowait are not busy.
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    return busy + steal, steal


def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def peak_rss_mb(pid: int) -> float | None:
    """A process's peak resident memory in MB (Linux VmHWM), else its current RSS."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    if pid == os.getpid():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
        return None


def runnable_tasks() -> int | None:
    """Tasks running or ready to run on the machine right now (/proc/stat procs_running)."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("procs_running"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def reset_peak_rss() -> None:
    """Start this process's peak-RSS count again (Linux: "5" to clear_refs), so that each run
    of a sweep reports its own peak; does nothing where the kernel does not offer it."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


@dataclass(frozen=True)
class CpuSnapshot:
    t: float
    processes: dict[int, float]  # pid -> CPU seconds
    tree_s: float
    machine_s: float
    steal_s: float
    rss_peaks: dict[int, float | None] = field(default_factory=dict)  # MB, when asked for


@dataclass(frozen=True)
class Tracked:
    role: str  # coordinator | reader | worker
    key: int  # reader number or NPU core (0 for the coordinator)
    pid: int


@dataclass
class CpuSampler:
    """Knows the pids of each role and takes snapshots (readers injectable for tests)."""

    clock: Callable[[], float]
    read_process: Callable[[int], float | None] = process_cpu_s
    read_tree: Callable[[], float] = tree_cpu_s
    read_machine: Callable[[], tuple[float, float]] = machine_busy_s
    read_peak_rss: Callable[[int], float | None] = peak_rss_mb
    read_runnable: Callable[[], int | None] = runnable_tasks
    tracked: list[Tracked] = field(default_factory=list)
    #: CPU seconds of processes first seen after a snapshot was taken (a restarted child),
    #: read when they were announced: the base their use is counted from.
    late_base: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.track("coordinator", 0, os.getpid())

    def track(self, role: str, key: int, pid: int, late: bool = False) -> None:
        """Account ``pid`` to ``role`` from now on (``late``: after the start snapshot)."""
        self.tracked.append(Tracked(role, key, pid))
        if late:
            self.late_base[pid] = self.read_process(pid) or 0.0

    def snapshot(self, memory: bool = False) -> CpuSnapshot:
        """CPU seconds of every tracked process, our tree and the machine (``memory``: and
        each process's peak RSS, read while the processes are still alive)."""
        machine, steal = self.read_machine()
        processes = {}
        for t in self.tracked:
            value = self.read_process(t.pid)
            if value is not None:
                processes[t.pid] = value
        rss = {pid: self.read_peak_rss(pid) for pid in processes} if memory else {}
        return CpuSnapshot(self.clock(), processes, self.read_tree(), machine, steal, rss)


@dataclass(frozen=True)
class ProcessUse:
    role: str
    key: int
    pid: int
    cpu: float  # CPUs used on average (1.0 = one CPU all the time)
    peak_rss_mb: float | None = None

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "cpu": round(self.cpu, 4),
            "peak_rss_mb": None if self.peak_rss_mb is None else round(self.peak_rss_mb, 1),
        }


@dataclass(frozen=True)
class CpuUse:
    """CPU use over one interval, by role, and around it."""

    seconds: float
    cpus: int
    processes: list[ProcessUse]
    ours: float  # CPUs used by our whole process tree
    others: float  # CPUs used by every other process (steal included)
    steal: float
    machine: float  # CPUs busy in all
    runnable: float | None = None  # mean tasks running or ready to run, sampled

    def role(self, role: str) -> list[ProcessUse]:
        return [p for p in self.processes if p.role == role]

    def to_json(self) -> dict:
        return {
            "seconds": round(self.seconds, 4),
            "cpus": self.cpus,
            "ours": round(self.ours, 4),
            "others": round(self.others, 4),
            "steal": round(self.steal, 4),
            "machine": round(self.machine, 4),
            "runnable": None if self.runnable is None else round(self.runnable, 2),
            "processes": [p.to_json() for p in self.processes],
        }


def cpu_use(
    sampler: CpuSampler,
    start: CpuSnapshot,
    end: CpuSnapshot,
    cpus: int,
    runnable: Sequence[int | None] | None = None,
) -> CpuUse:
    """Each tracked process's CPU use between two snapshots, and the machine's."""
    seconds = max(end.t - start.t, 1e-9)
    uses = []
    seen = set()
    for t in sampler.tracked:
        if t.pid in seen or t.pid not in end.processes:
            continue
        seen.add(t.pid)
        base = start.processes.get(t.pid, sampler.late_base.get(t.pid))
        if base is None:
            continue
        uses.append(
            ProcessUse(
                t.role,
                t.key,
                t.pid,
                max(0.0, end.processes[t.pid] - base) / seconds,
                end.rss_peaks.get(t.pid),
            )
        )
    ours = max(0.0, end.tree_s - start.tree_s) / seconds
    machine = max(0.0, end.machine_s - start.machine_s) / seconds
    steal = max(0.0, end.steal_s - start.steal_s) / seconds
    read = [r for r in runnable or [] if r is not None]  # None: a reading that failed
    return CpuUse(
        seconds,
        cpus,
        uses,
        ours,
        max(0.0, machine - ours),
        steal,
        machine,
        sum(read) / len(read) if read else None,
    )
