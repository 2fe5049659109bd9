"""What the run cost the machine: CPU seconds by role, and the coordinator's peak memory.

Children report their own CPU seconds (every thread, user + system) with their messages; a
child that is restarted starts from zero, so each incarnation's last report is added when
it is gone. Start-up (imports, loading the model, the canary) is a fixed cost per process,
so it is counted apart: ``startup`` holds each child's CPU until it was ready, the fork
server's (its imports) and the coordinator's until the run started, and the roles hold
only what came after (what a run's CPU per item means). Its peak RSS is sampled while the
engine runs (every ``SAMPLE_EVERY_S``), so it is this run's peak, not the peak of whatever
process launched it (``ru_maxrss`` would carry that over). The core workers' own memory is
read here too, from the coordinator (:meth:`Usage.worker_memory_mb`; what it counts and why:
recycling.py).
"""

from __future__ import annotations

import psutil

from batchinfer.engine.plumbing.child import cpu_seconds
from batchinfer.engine.plumbing.children import Child
from batchinfer.engine.states import ChildState

SAMPLE_EVERY_S = 0.5


class Usage:
    """CPU by role and peak RSS for one engine run (see the module docstring)."""

    def __init__(self) -> None:
        self._me = psutil.Process()
        self._cpu0 = cpu_seconds()
        self._gone = {"readers": 0.0, "workers": 0.0, "startup": 0.0}
        self._run_cpu0: float | None = None
        self._counted: set[int] = set()
        self._next = 0.0
        self.peak_rss_mb = self._me.memory_info().rss / 2**20
        self._procs: dict[int, psutil.Process] = {}  # pid -> the live child's Process
        psutil.cpu_percent(percpu=True)  # the first call starts psutil's interval

    def sample(self, now: float) -> None:
        """Read the coordinator's RSS now and then (cheap: one read of /proc/self/statm)."""
        if now < self._next:
            return
        self._next = now + SAMPLE_EVERY_S
        self.peak_rss_mb = max(self.peak_rss_mb, self._me.memory_info().rss / 2**20)

    def workers_memory(self, workers: list[Child]) -> list[tuple[int, float]]:
        """(key, own memory in MB) of each of ``workers`` that is ready and not killed."""
        out = []
        for child in workers:
            pid = child.proc.pid
            if child.state == ChildState.READY and child.killed_for is None and pid is not None:
                mb = self.worker_memory_mb(pid)
                if mb is not None:
                    out.append((child.key, mb))
        return out

    def worker_memory_mb(self, pid: int) -> float | None:
        """A child's own memory in MB: RSS less shared pages (one read of its
        /proc/PID/statm); None when it cannot be read (it is gone)."""
        try:
            proc = self._procs.get(pid)
            if proc is None:
                proc = self._procs[pid] = psutil.Process(pid)
            info = proc.memory_info()
        except psutil.Error:
            self._procs.pop(pid, None)
            return None
        return max(0, info.rss - getattr(info, "shared", 0)) / 2**20

    def idle_cpus(self) -> float:
        """CPUs free since the last call (in CPUs, over the CPUs this process may use)."""
        usable = sorted(self._me.cpu_affinity() or [])
        percents = psutil.cpu_percent(percpu=True)
        return sum(100.0 - percents[c] for c in usable if c < len(percents)) / 100.0

    def child_gone(self, child: Child) -> None:
        """Add a child incarnation's last reported CPU seconds (once)."""
        if id(child) in self._counted:
            return
        self._counted.add(id(child))
        if child.proc.pid is not None:
            self._procs.pop(child.proc.pid, None)
        self._gone["readers" if child.kind == "reader" else "workers"] += (
            child.cpu_s - child.cpu_at_ready
        )
        self._gone["startup"] += child.cpu_at_ready

    def add_startup(self, cpu_s: float) -> None:
        """Add start-up CPU of a process that is no child (the fork server's imports)."""
        self._gone["startup"] += cpu_s

    def started(self) -> None:
        """The run proper starts: the coordinator's CPU from here on is the run's."""
        self._run_cpu0 = cpu_seconds()

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds of the coordinator, the readers and the core workers during the run,
        and of every process's start-up."""
        now = cpu_seconds()
        run0 = self._run_cpu0 if self._run_cpu0 is not None else now
        return {
            "coordinator": round(now - run0, 4),
            "readers": round(self._gone["readers"], 4),
            "workers": round(self._gone["workers"], 4),
            "startup": round(self._gone["startup"] + run0 - self._cpu0, 4),
        }
