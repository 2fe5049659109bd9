"""The measuring observer driven by scripted engine events and an injected clock (no
processes, no sleeping), and CPU accounting by role from fake process readings."""

from __future__ import annotations

import os

import pytest

from batchinfer.bench.cpu import CpuSampler, cpu_use
from batchinfer.bench.measure import BenchObserver
from batchinfer.bench.options import BenchOptions
from batchinfer.engine import events as ev
from batchinfer.sink.rows import Row

OPTS = BenchOptions(duration_s=3, warmup_s=1, min_samples=10, max_duration_s=10, window_s=1)


class Machine:
    """A fake clock and fake CPU counters that tests move forward by hand."""

    def __init__(self) -> None:
        self.t = 100.0
        self.cpu = {os.getpid(): 1.0}
        self.tree = 1.0
        self.busy = 10.0
        self.steal = 0.0
        self.snapshots: list[float] = []

    def read_machine(self) -> tuple[float, float]:
        self.snapshots.append(self.t)
        return self.busy, self.steal

    def sampler(self) -> CpuSampler:
        return CpuSampler(
            clock=lambda: self.t,
            read_process=lambda pid: self.cpu.get(pid),
            read_tree=lambda: self.tree,
            read_machine=self.read_machine,
            read_peak_rss=lambda pid: 50.0,
            read_runnable=lambda: 3,
        )


def row(t_done: float, core: int = 0, error: str | None = None) -> Row:
    return Row(
        index=0, id="synthetic/0", id_bytes=None, label=None, label_name=None, core=core,
        instance=0, attempt=1, latency_ms=None if error else 10.0, read_ms=None,
        wait_ms=None if error else 1.0, error=error, t_done=t_done,
    )  # fmt: skip


class Run:
    """Feeds an observer rows at ``rate(t)`` per second, one event every 10 ms."""

    def __init__(self, opts: BenchOptions = OPTS) -> None:
        self.m = Machine()
        self.finished = 0
        self.probes = 0
        self.obs = BenchObserver(opts, self.m.sampler(), self._probe, self._finish)

    def _probe(self) -> dict:
        self.probes += 1
        return {"npu_load": {0: 50.0}}

    def _finish(self) -> None:
        self.finished += 1

    def start(self) -> None:
        self.obs.notify(ev.ChildReady("worker", 0, 4242))
        self.m.cpu[4242] = 0.0
        self.obs.notify(ev.Started(None, (0,), "sim", 1, self.m.t))
        self.obs.notify(ev.CoresReady(self.m.t))

    def advance(self, until: float, rate, step: float = 0.01) -> None:
        """Move the clock to ``until``; rows complete evenly at ``rate(t)`` per second."""
        owed = 0.0
        while self.m.t < until - 1e-9 and self.obs.phase != "done":
            t0, t1 = self.m.t, self.m.t + step
            owed += rate(t0) * step
            done = int(owed + 1e-9)
            owed -= done
            rows = [row(t0 + (i + 1) * step / (done + 1)) for i in range(done)]
            self.m.t = t1
            self.m.cpu[4242] += 0.3 * step  # the worker uses 0.3 CPUs
            self.m.cpu[os.getpid()] += 0.5 * step
            self.m.tree += 0.8 * step
            self.m.busy += 1.5 * step  # others: 1.5 - 0.8 = 0.7 CPUs
            self.obs.notify(ev.RowsDone(rows, t1))


def test_warm_up_is_excluded_and_the_run_stops_after_its_duration_when_stable():
    r = Run()
    r.start()
    r.advance(120.0, rate=lambda t: 100.0)
    obs = r.obs
    assert obs.phase == "done" and r.finished == 1
    assert (obs.t_start, obs.t_end) == (101.0, 104.0)
    assert obs.counts[:3] == [100, 100, 100]
    # The decision waited for the grace after the third boundary, not longer.
    assert 104.05 <= obs.cpu_end.t < 104.07
    assert obs.cpu_start.t == pytest.approx(101.0, abs=0.011)
    # Rows keep being logged after the end (the drain), but windows stop counting.
    assert r.probes == 1 + 3  # at the start, then at each boundary


def test_warm_up_counts_from_when_every_core_is_up_not_from_the_first_items():
    """On one board items flow while core workers start (Started); the warm-up is the
    steady run's ramp, so it starts at CoresReady."""
    r = Run()
    r.obs.notify(ev.ChildReady("worker", 0, 4242))
    r.m.cpu[4242] = 0.0
    r.obs.notify(ev.Started(None, (0,), "sim", 1, r.m.t))
    r.advance(101.5, rate=lambda t: 50.0)  # one core up of two, for 1.5 s
    assert r.obs.phase == "starting" and r.obs.t_start is None
    r.obs.notify(ev.CoresReady(r.m.t))
    r.advance(120.0, rate=lambda t: 100.0)
    assert (r.obs.t_start, r.obs.t_end) == pytest.approx((102.5, 105.5))
    assert r.obs.counts[:3] == [100, 100, 100]


def test_unstable_windows_extend_the_run_until_the_last_three_agree():
    r = Run()
    r.start()
    r.advance(120.0, rate=lambda t: 40.0 if 103.0 <= t < 104.0 else 100.0)
    assert r.obs.t_end == 107.0  # windows 100 100 40 | 100 | 100 | 100: stable at the sixth
    assert r.obs.counts[:6] == [100, 100, 40, 100, 100, 100]


def test_the_run_stops_at_max_duration_however_unstable():
    r = Run(BenchOptions(duration_s=3, warmup_s=0, min_samples=10, max_duration_s=5))
    r.start()
    r.advance(120.0, rate=lambda t: 100.0 if int(t) % 2 else 30.0)
    assert (r.obs.t_start, r.obs.t_end) == (100.0, 105.0)
    assert r.finished == 1


def test_too_few_samples_extend_the_run():
    r = Run(BenchOptions(duration_s=3, warmup_s=0, min_samples=450, max_duration_s=10))
    r.start()
    r.advance(120.0, rate=lambda t: 100.0)
    assert r.obs.t_end == 105.0  # 300 samples after 3 s, 500 after 5


def test_a_stop_request_keeps_the_whole_windows_measured_so_far():
    r = Run()
    r.start()
    r.advance(103.7, rate=lambda t: 100.0)
    r.obs.notify(ev.Stopping("interrupted by SIGINT"))
    assert r.obs.phase == "done" and r.finished == 1
    assert r.obs.stopped == "interrupted by SIGINT"
    assert (r.obs.t_start, r.obs.t_end) == (101.0, 103.0)


def test_a_stop_during_the_warm_up_measures_nothing():
    r = Run()
    r.start()
    r.advance(100.5, rate=lambda t: 100.0)
    r.obs.notify(ev.Stopping("interrupted by SIGTERM"))
    assert r.obs.t_end is None and r.obs.cpu_start is None and r.finished == 1


def test_errors_are_kept_apart_from_samples():
    r = Run()
    r.start()
    r.obs.notify(ev.RowsDone([row(101.5, error="inference() returned None")], 101.5))
    assert r.obs.error_times == [101.5]
    assert r.obs.first_errors == [(101.5, "inference() returned None")]
    assert len(r.obs.log) == 0


def test_errors_while_measuring_are_kept_after_those_of_the_warm_up():
    # A dataset with broken files fails from the first item: the three kept were all the
    # warm-up's, so the verdict said "errors: 7320 ..." without naming one.
    r = Run()
    r.start()
    warm = [row(100.1 + i / 10, error=f"warm {i}") for i in range(4)]
    r.obs.notify(ev.RowsDone(warm, 100.5))
    r.advance(101.2, rate=lambda t: 100.0)
    r.obs.notify(ev.RowsDone([row(101.5, error="Cannot read bad.jpg")], 101.5))
    assert r.obs.t_start == 101.0
    kept = [(t, e) for t, e in r.obs.first_errors if t >= r.obs.t_start]
    assert kept == [(101.5, "Cannot read bad.jpg")]


def test_rows_that_arrive_late_still_count_in_their_window():
    r = Run()
    r.start()
    r.advance(101.5, rate=lambda t: 0.0)
    # A call that ended at 101.99 reports at 102.03, after the boundary but within the grace.
    r.obs.notify(ev.RowsDone([row(101.99)], 102.03))
    r.obs.notify(ev.Dispatched(0, 1, 102.06))
    assert r.obs.closed == 1 and r.obs.counts == [1]


def test_cpu_use_by_role_and_other_load_over_the_measured_interval():
    r = Run()
    r.start()
    r.advance(102.0, rate=lambda t: 100.0)
    r.m.cpu[5151] = 7.0  # a reader that appears mid-run: its start-up CPU does not count
    r.obs.notify(ev.ChildReady("reader", 0, 5151))
    r.advance(120.0, rate=lambda t: 100.0)
    obs = r.obs
    use = cpu_use(obs.cpu, obs.cpu_start, obs.cpu_end, cpus=2, runnable=obs.runnable)
    by_role = {(p.role, p.key): p for p in use.processes}
    assert by_role[("worker", 0)].cpu == pytest.approx(0.3, rel=1e-6)
    assert by_role[("coordinator", 0)].cpu == pytest.approx(0.5, rel=1e-6)
    assert by_role[("reader", 0)].cpu == 0.0
    assert by_role[("worker", 0)].peak_rss_mb == 50.0
    assert (use.ours, use.others, use.machine) == pytest.approx((0.8, 0.7, 1.5), rel=1e-6)
    assert use.runnable == 3


def test_restarts_and_retired_cores_while_measuring_are_recorded_but_not_before():
    r = Run()
    r.start()
    r.obs.notify(ev.Restarted(0, "worker process crashed", 0.25))  # during the warm-up
    r.advance(101.5, rate=lambda t: 100.0)
    r.obs.notify(ev.Restarted(0, "worker process crashed (exit code -9)", 0.25))
    r.obs.notify(ev.CoreRetired(0, "3 crashes in a row"))
    r.obs.notify(ev.Recycling(1, 900.0, "over reliability.max_worker_rss_mb (500 MB)"))
    assert r.obs.failures == [
        "core 0 restarted (worker process crashed (exit code -9))",
        "core 0 retired (3 crashes in a row)",
        "core 1 recycled (over reliability.max_worker_rss_mb (500 MB))",
    ]
