"""Liveness: no run hangs, stalls or gives up on good items, whatever children, the machine
or neighbouring runs do (frozen processes, poison items, kill -9, Ctrl-Z, /dev/shm)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
from runs import config, fast_sim

from batchinfer import run
from batchinfer.data.whole_file import HANGING_FILE_ENV
from batchinfer.engine import events as ev
from batchinfer.engine.plumbing import fork_server, janitor
from batchinfer.engine.slots import (
    SEGMENT_PREFIX,
    SHM_DIR,
    RunOwner,
    create_segment,
    free_space,
    segment_name,
    sweep_dead_segments,
)
from batchinfer.errors import RunFailedError, SharedMemoryError
from batchinfer.options import SimOptions
from batchinfer.results import read_predictions
from batchinfer.sink.manifest import PREDICTIONS_DIR
from batchinfer.sink.predictions import PART_GLOB

# Each run launches a fork server of its own, not the module's (tests/conftest.py):
OWN_FORK_SERVER = "it freezes and kills the fork server and counts a run's processes"


class _StopWorkerAfter:
    """SIGSTOPs core ``core``'s worker once it has done ``n`` rows: frozen, not dead.

    Its own rows, not the run's: on a loaded machine the other cores did the run's first
    rows while this one still started, and the observer raised KeyError on its pid."""

    def __init__(self, core: int, n: int) -> None:
        self.core, self.n, self.done, self.pids, self.stopped = core, n, 0, {}, []

    def notify(self, event) -> None:
        if isinstance(event, ev.ChildReady) and event.kind == "worker":
            self.pids[event.key] = event.pid
        elif isinstance(event, ev.RowsDone):
            self.done += sum(row.core == self.core for row in event.rows)
            if self.done >= self.n and not self.stopped:
                self.stopped.append(self.pids[self.core])
                os.kill(self.pids[self.core], signal.SIGSTOP)


@pytest.mark.slow  # waits out a timeout (2-5 s); moved for the default tier's 90 s
def test_a_frozen_worker_is_detected_and_its_items_done_elsewhere(demo_kit, tmp_path):
    """The timeout is what the test waits for after the freeze; at 1 s a loaded machine
    (parallel test workers) made healthy workers miss it too, and their items failed."""
    freezer = _StopWorkerAfter(core=1, n=10)
    timeout_s = 3.0
    cfg = config(
        dataset=demo_kit.dataset,
        model=demo_kit.models["digits"],
        backend="sim",
        sim=fast_sim(npu_ms=1.0),
        inference_timeout_s=timeout_s,
        limit=300,
        out=tmp_path / "o",
    )
    result = run(cfg, observers=[freezer])
    assert freezer.stopped
    table = read_predictions(result.out)
    assert sorted(table["index"].to_pylist()) == list(range(300))
    assert table["error"].null_count == 300
    killed = [w for w in result.warnings if w.startswith("core 1:")]
    hung = f"hung for more than {timeout_s:g} s"
    assert killed and ("frozen or stopped" in killed[0] or hung in killed[0])


class _StopServerAndKillWorker:
    """Once core ``core``'s worker has done ``n`` rows: ``server_signal`` to the fork server
    (SIGSTOP: frozen; SIGKILL: dead, and every child with it), then SIGKILL to that worker,
    so the run needs a restart its fork server cannot give."""

    def __init__(self, core: int, n: int, server_signal: signal.Signals) -> None:
        self.core, self.n, self.server_signal = core, n, server_signal
        self.done, self.pids, self.server = 0, {}, None

    def notify(self, event) -> None:
        if isinstance(event, ev.ChildReady) and event.kind == "worker":
            self.pids[event.key] = event.pid
        elif isinstance(event, ev.RowsDone) and self.server is None:
            self.done += sum(row.core == self.core for row in event.rows)
            if self.done >= self.n:
                self.server = fork_server.server_pid()
                os.kill(self.server, self.server_signal)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pids[self.core], signal.SIGKILL)


# The killed server with the slow tier: the stopped one's run takes the same way back (a
# fresh server, the worker started again), and test_fork_server.py's
# test_a_dead_server_takes_its_children_and_the_next_start_launches_another sees a killed
# server replaced and said.
@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
@pytest.mark.parametrize(
    ("server_signal", "said"),
    [
        (signal.SIGSTOP, "is stopped (SIGSTOP)"),
        pytest.param(signal.SIGKILL, "exited (exit code -9)", marks=pytest.mark.slow),
    ],
)
def test_a_frozen_or_dead_fork_server_does_not_keep_workers_from_restarting(
    demo_kit, tmp_path, caplog, server_signal, said
):
    """issue 27: with multiprocessing's fork server frozen, a killed worker's exit was never
    reported (only the server could tell it) and nothing could be started again."""
    stopper = _StopServerAndKillWorker(core=0, n=10, server_signal=server_signal)
    cfg = config(  # one core: the run cannot end unless its worker is started again
        dataset=demo_kit.dataset, model=demo_kit.models["digits"], backend="sim",
        sim=fast_sim(npu_ms=1.0), cores=(0,), limit=300, out=tmp_path / "o",
    )  # fmt: skip
    with caplog.at_level("WARNING", logger="batchinfer.engine.plumbing.fork_server"):
        result = run(cfg, observers=[stopper])
    assert stopper.server is not None
    table = read_predictions(result.out)
    assert sorted(table["index"].to_pylist()) == list(range(300))  # each item once
    assert table["error"].null_count == 300
    fresh = f"the fork server (pid {stopper.server}) {said}; children start from a fresh one"
    assert [r.getMessage() for r in caplog.records] == [fresh]  # said once
    assert any(w.startswith("core 0:") and "restarting it" in w for w in result.warnings)
    assert not psutil.pid_exists(stopper.server)  # the stopped one too: killed and reaped


def test_one_poison_item_costs_one_error_row_and_no_core(demo_kit, tmp_path):
    """`--cores 0 --max-attempts 3 --sim-fault crash:item=5` retired the only core, exit 3."""
    cfg = config(
        dataset=demo_kit.dataset,
        model=demo_kit.models["digits"],
        backend="sim",
        sim=fast_sim("crash:item=5"),
        cores=(0,),
        max_attempts=3,
        limit=40,
        out=tmp_path / "o",
    )
    result = run(cfg)
    assert (result.status, result.errors, result.succeeded) == ("complete", 1, 39)
    (row,) = [r for r in read_predictions(result.out).to_pylist() if r["error"] is not None]
    assert row["index"] == 5 and row["attempt"] == 3 and row["error"].count("crashed") == 3
    manifest = json.loads((result.out / "manifest.json").read_text())
    assert manifest["retired_cores"] == []
    assert any("blamed on the item" in w for w in result.warnings)


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
@pytest.mark.parametrize(
    ("fault", "npu_ms", "said"),
    [
        # A crash charged every item inside inference() then, so the poison item's
        # neighbours lost an attempt each (two such accidents made an error row); the host
        # time keeps the other two instances inside inference() when it crashes.
        ("crash:item=10", 1.0, "crashed"),
        # The watchdog knows which instance hung: only its item is charged when the worker is
        # killed. The NPU time keeps the run going well past the timeout (~10 calls a second).
        # Slow (two 1.5 s timeouts and two restarts: 6.5 s); the crash above is its sibling.
        pytest.param("hang:item=10", 100.0, "hung", marks=pytest.mark.slow),
    ],
)
def test_a_faulty_item_among_three_instances_charges_no_neighbour(
    demo_kit, tmp_path, fault, npu_ms, said
):
    """Issue 27: with -k 3, only the faulty item is charged; the items the core's other two
    instances were inferring go back uncharged."""
    cfg = config(
        dataset=demo_kit.dataset,
        model=demo_kit.models["digits"],
        backend="sim",
        sim=SimOptions(npu_ms=npu_ms, host_ms=5.0, faults=(fault,)),
        cores=(0,),
        instances_per_core=3,
        max_attempts=2,
        inference_timeout_s=1.5,
        limit=40,
        out=tmp_path / "o",
    )
    result = run(cfg)
    assert (result.status, result.errors, result.succeeded) == ("complete", 1, 39)
    rows = read_predictions(result.out).to_pylist()
    (row,) = [r for r in rows if r["error"] is not None]
    assert row["index"] == 10 and row["attempt"] == 2 and row["error"].count(said) == 2
    assert [r["index"] for r in rows if r["attempt"] != 1 and r["index"] != 10] == []


def test_shared_memory_is_reserved_when_created_so_a_shortage_fails_at_once():
    free = free_space()
    if free is None:
        pytest.skip("no /dev/shm here")
    name = segment_name("0bad5eed", "in")
    with pytest.raises(SharedMemoryError, match=r"runtime\.slots") as info:
        create_segment(name, free + (1 << 30))  # ftruncate alone would accept this
    assert info.value.exit_code == 3
    assert name not in os.listdir(SHM_DIR), "a refused segment leaves nothing behind"


def test_the_sweep_judges_runs_by_their_owner_lock_not_by_their_pid():
    # A live run whose pid looks dead from here (another PID namespace): its owner lock is
    # held, so its segments stay. A run whose pid is alive (ours) but whose lock nobody
    # holds is gone, so its segments go.
    # Swept in a folder of /dev/shm of its own: in /dev/shm itself, a run started by a test
    # on another xdist worker may sweep the gone run's segments first.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live_token, gone_token = "0a11be11", "0dead0ff"
    shm = Path(tempfile.mkdtemp(prefix="sweep-test-", dir=SHM_DIR))
    owner = RunOwner(live_token)  # holds the lock, named with our pid
    theirs = shm / f"{SEGMENT_PREFIX}-{dead.pid}-{live_token}-in"
    gone = [shm / segment_name(gone_token, role) for role in ("owner", "in")]
    try:
        # Move the live run's owner in, renamed as if it were the other namespace's pid.
        os.rename(Path(SHM_DIR) / owner.name, shm / theirs.name.replace("-in", "-owner"))
        theirs.write_bytes(b"\0" * 64)
        for path in gone:
            path.write_bytes(b"\0" * 64)
        swept = sweep_dead_segments(str(shm))
        assert theirs.exists(), "a live run's segment survives although its pid looks dead"
        assert all(p.name in swept and not p.exists() for p in gone)
    finally:
        os.close(owner._fd)
        shutil.rmtree(shm)


def test_a_sweep_while_a_run_makes_its_owner_does_not_take_that_run_for_gone(monkeypatch):
    # Another run's sweep (every run sweeps as it starts) at the instant this run's owner
    # segment exists but is not locked yet took the run for gone and unlinked its owner
    # (seen as a FileNotFoundError in RunOwner under two xdist workers).
    real, swept = fcntl.flock, []

    def sweep_first(fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_EX:
            swept.extend(sweep_dead_segments())  # the other run's sweep, now
        real(fd, operation)

    monkeypatch.setattr(fcntl, "flock", sweep_first)
    owner = RunOwner("0b0a1d")
    monkeypatch.undo()
    try:
        assert owner.name not in swept
        assert owner.name in os.listdir(SHM_DIR)
        assert owner.name not in sweep_dead_segments(), "a locked owner is a live run"
    finally:
        owner.close()
    assert owner.name not in os.listdir(SHM_DIR)
    assert not [n for n in os.listdir(SHM_DIR) if n.endswith(owner.name)], "hidden name left"


def _wchan(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return ""


def _cli(*args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "batchinfer", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


@pytest.mark.slow  # waits out a timeout (2-5 s); moved for the default tier's 90 s
def test_kill_9_of_the_coordinator_while_a_reader_is_blocked_leaves_nothing(demo_kit, tmp_path):
    data = tmp_path / "data"
    (data / "0").mkdir(parents=True)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (data / "0" / "blocks.png").symlink_to(fifo)
    # The reader is told to open it as a plain file (items are opened non-blocking, and a
    # FIFO is refused at once): open() blocks for ever, as on a dead network mount.
    env = {**os.environ, HANGING_FILE_ENV: os.path.realpath(fifo)}
    proc = _cli(
        str(data), "--model", str(demo_kit.models["digits"]), "--backend", "sim",
        "--out", str(tmp_path / "o"), "--readers", "1", "--no-progress", env=env,
    )  # fmt: skip
    for line in proc.stderr:
        if line.startswith("started:"):
            break
    deadline = time.monotonic() + 30
    # No event says "the reader is blocked in open()": the kernel says where it waits.
    # (Children are forked asynchronously: the reader may not exist yet at "started:".)
    family = _children(psutil.Process(proc.pid))
    while "wait_for_partner" not in [_wchan(p.pid) for p in family]:
        assert time.monotonic() < deadline, "no reader blocked on the FIFO"
        time.sleep(0.05)
        family = _children(psutil.Process(proc.pid))
    proc.kill()
    _, err = proc.communicate(timeout=30)
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"outlived the coordinator: {[p.cmdline() for p in alive]}"
    assert "Traceback" not in err and "leaked" not in err and "BrokenPipe" not in err
    assert not [n for n in os.listdir(SHM_DIR) if f"-{proc.pid}-" in n]


@pytest.mark.slow  # default tier: the policy with a scripted clock (test_scheduler.py)
def test_ctrl_z_longer_than_the_timeout_kills_nobody(demo_kit, tmp_path):
    out = tmp_path / "o"
    proc = _cli(
        str(demo_kit.dataset), "--model", str(demo_kit.models["digits"]), "--backend", "sim",
        "--sim-npu-ms", "2", "--sim-host-ms", "0", "--inference-timeout-s", "1",
        "--out", str(out), "--no-progress", "--limit", "900",
        start_new_session=True,
    )  # fmt: skip
    for line in proc.stderr:
        if line.startswith("started:"):
            break
    os.killpg(proc.pid, signal.SIGSTOP)  # what Ctrl-Z does to the foreground job
    time.sleep(3.0)  # the pause itself is what is tested: three times the timeout
    os.killpg(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "killed" not in err and "restarting" not in err
    stats = json.loads((out / "manifest.json").read_text())
    assert stats["counts"]["succeeded"] == 900


class _InterruptAfter:
    """Sends this process SIGINT (as a terminal's Ctrl-C would) once ``n`` rows are done,
    ``core_rows`` of them by core ``core``."""

    def __init__(self, n: int, core: int = 0, core_rows: int = 0) -> None:
        self.n, self.core, self.core_rows = n, core, core_rows
        self.done, self.by_core, self.sent = 0, 0, False

    def notify(self, event) -> None:
        if isinstance(event, ev.RowsDone):
            self.done += len(event.rows)
            self.by_core += sum(r.core == self.core for r in event.rows)
            if self.done >= self.n and self.by_core >= self.core_rows and not self.sent:
                self.sent = True
                os.kill(os.getpid(), signal.SIGINT)


def _interrupt_while_core_0_hangs(demo_kit, tmp_path, fault, interrupt, **settings):
    """Run with ``fault`` hanging a call on core 0 and Ctrl-C from ``interrupt``; check that
    core 0 was killed in the drain after it (said so, not counted as a restart)."""
    cfg = config(
        dataset=demo_kit.dataset,
        model=demo_kit.models["digits"],
        backend="sim",
        sim=fast_sim(fault, npu_ms=1.0),
        inference_timeout_s=1.0,
        out=tmp_path / "o",
        **settings,
    )
    result = run(cfg, observers=[interrupt])
    assert result.status == "interrupted"
    said = [w for w in result.warnings if w.startswith("core 0:")]
    assert said and said[-1].endswith("while the run was stopping; not restarted.")
    stats = {r["core"]: r for r in pq.read_table(result.out / "core_stats.parquet").to_pylist()}
    assert stats[0]["restarts"] == 0


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_finished_results_are_not_held_back_by_a_call_that_hangs(demo_kit, tmp_path):
    """CI: a worker held finished results for company while its next call hung, until the
    hung call was killed (the inference timeout) and they were inferred again: then the
    kill came before Ctrl-C, as a restart."""
    # The canary is call 1: items 1 and 2 finish quickly, with 4 more in the worker, so
    # their results wait for company; item 3 (call 4) never returns. Ctrl-C comes once
    # the two rows are in.
    _interrupt_while_core_0_hangs(
        demo_kit, tmp_path, "hang:core=0:call=4", _InterruptAfter(2, core=0, core_rows=2),
        cores=(0,), limit=60,
    )  # fmt: skip


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_a_worker_killed_while_the_run_drains_is_said_and_not_counted_as_a_restart(
    demo_kit, tmp_path
):
    """Soak: a hung worker killed during the drain after Ctrl-C showed up as a restart in
    core_stats, and nothing said it was killed."""
    # Core 0's 5th call hangs; the canary is its 1st, so its 4th item hangs. Cores start on
    # items as each comes up: a late core 0 could be short of 4 items when 40 rows are
    # done (CI saw it), so the interrupt also waits for its 3 rows.
    _interrupt_while_core_0_hangs(
        demo_kit, tmp_path, "hang:core=0:call=5", _InterruptAfter(40, core=0, core_rows=3),
        limit=400,
    )  # fmt: skip


# The server importing: with the slow tier (each moment costs a run killed and reaped).
_MOMENTS = [pytest.param("server importing", marks=pytest.mark.slow), "children starting"]


def _wait_for(moment: str, proc: subprocess.Popen) -> list[psutil.Process]:
    """Wait until the run's fork server is importing (it has forked nothing yet) or has
    forked children that are still starting; returns every process of the run then.

    No event says either: look at the processes (the server's children are the forked
    ones; none of them is ready in its first moments, as workers then still load the
    model).
    """
    me = psutil.Process(proc.pid)
    deadline = time.monotonic() + 60
    while True:
        family = _children(me)
        servers = [c for c in family if "fork_server_loop import serve" in _cmdline(c)]
        forked = [c for s in servers for c in _children(s)]
        if servers and (forked if moment == "children starting" else not forked):
            return family + forked
        assert proc.poll() is None and time.monotonic() < deadline, "no fork server started"
        time.sleep(0.002)


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
@pytest.mark.parametrize("moment", _MOMENTS)
def test_ctrl_c_while_children_are_still_starting_kills_none_of_them(demo_kit, tmp_path, moment):
    """Soak: a child died of a Ctrl-C that came while it was still importing (before it
    could ignore SIGINT), with a traceback and a 'crashed' worker. Children come from a fork
    server: a Ctrl-C must not kill it while it imports, nor a child it has just forked."""
    proc = _cli(
        str(demo_kit.dataset), "--model", str(demo_kit.models["digits"]), "--backend", "sim",
        "--out", str(tmp_path / "o"), "--no-progress",
        start_new_session=True,
    )  # fmt: skip
    _wait_for(moment, proc)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "crashed" not in err and "KeyboardInterrupt" not in err


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
@pytest.mark.parametrize("moment", _MOMENTS)
def test_kill_9_of_the_coordinator_while_children_start_leaves_nothing(demo_kit, tmp_path, moment):
    proc = _cli(
        str(demo_kit.dataset), "--model", str(demo_kit.models["digits"]), "--backend", "sim",
        "--out", str(tmp_path / "o"), "--no-progress",
    )  # fmt: skip
    family = _wait_for(moment, proc)
    proc.kill()
    proc.communicate(timeout=30)
    family += [c for p in family for c in _children(p)]  # forked since, if any
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"outlived the coordinator: {[p.cmdline() for p in alive]}"
    assert not [n for n in os.listdir(SHM_DIR) if f"-{proc.pid}-" in n]


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _is_janitor(process: psutil.Process) -> bool:
    """janitor.py's program ignores SIGINT, SIGTERM and SIGHUP (so does the fork server's)."""
    cmd = _cmdline(process)
    return "SIG_IGN" in cmd and "fork_server" not in cmd


class _StopTheJanitor:
    """SIGSTOPs this process's shared-memory janitor when the run starts."""

    def __init__(self) -> None:
        self.stopped: psutil.Process | None = None

    def notify(self, event) -> None:
        if isinstance(event, ev.Started):
            (janitor,) = [c for c in psutil.Process().children() if _is_janitor(c)]
            janitor.send_signal(signal.SIGSTOP)
            self.stopped = janitor


def test_a_janitor_that_does_not_exit_is_said_then_killed(caplog):
    """The bounded wait, for a janitor that does not exit while it could run (starved):
    stopped here, with the stopped case's shortcut off."""
    keeper = janitor.Janitor()
    keeper.proc.send_signal(signal.SIGSTOP)
    with caplog.at_level("WARNING", logger="batchinfer.engine.plumbing.janitor"):
        keeper.close(say_after_s=0.01, kill_after_s=0.05, kill_stopped=False)
    assert keeper.proc.returncode == -signal.SIGKILL  # killed and reaped
    said = [r.getMessage() for r in caplog.records]
    assert any("waiting for the shared-memory janitor" in m for m in said), said
    assert any("did not exit in 0.05 s; killed it" in m for m in said), said


def test_a_stopped_janitor_is_killed_at_once_and_said(caplog):
    """A stopped janitor cannot exit: the run's end does not wait for it (it once waited
    10 s, silently for the first 2)."""
    keeper = janitor.Janitor()
    keeper.proc.send_signal(signal.SIGSTOP)
    with caplog.at_level("WARNING", logger="batchinfer.engine.plumbing.janitor"):
        keeper.close(say_after_s=60.0, kill_after_s=120.0)
    assert keeper.proc.returncode == -signal.SIGKILL  # killed and reaped
    said = [r.getMessage() for r in caplog.records]
    assert any("is stopped (SIGSTOP), so it was killed at once" in m for m in said), said
    assert not any("waiting for" in m for m in said), said


def test_a_janitor_seen_stopped_only_after_the_first_look_is_killed_without_waiting(
    caplog, monkeypatch
):
    """A SIGSTOP takes effect when the stopped process is next scheduled: on a loaded
    machine the first look may still see it running (this once cost a run 120 s). Every
    look of the wait checks again; here the first look is made to miss the stop."""
    keeper = janitor.Janitor()
    keeper.proc.send_signal(signal.SIGSTOP)
    looks = []
    real = janitor._stopped

    def late(pid: int) -> bool:
        looks.append(pid)
        return len(looks) > 1 and real(pid)

    monkeypatch.setattr(janitor, "_stopped", late)
    with caplog.at_level("WARNING", logger="batchinfer.engine.plumbing.janitor"):
        keeper.close(say_after_s=5.0, kill_after_s=10.0)
    assert keeper.proc.returncode == -signal.SIGKILL
    said = [r.getMessage() for r in caplog.records]
    assert any("is stopped (SIGSTOP), so it was killed at once" in m for m in said), said
    assert not any("waiting for" in m for m in said), said


def test_a_stopped_janitor_does_not_keep_the_run_from_ending(demo_kit, tmp_path, caplog):
    stop = _StopTheJanitor()
    cfg = config(
        dataset=demo_kit.dataset, model=demo_kit.models["digits"], backend="sim",
        sim=fast_sim(), limit=50, out=tmp_path / "o",
    )  # fmt: skip
    with caplog.at_level("WARNING", logger="batchinfer.engine.plumbing.janitor"):
        result = run(cfg, observers=[stop])
    assert result.status == "complete" and result.succeeded == 50
    assert stop.stopped is not None and not stop.stopped.is_running()  # killed and reaped
    said = [r.getMessage() for r in caplog.records]
    assert any("janitor (pid" in m and "killed at once" in m for m in said), said
    assert not [n for n in os.listdir(SHM_DIR) if f"-{os.getpid()}-" in n]


@pytest.mark.slow
def test_the_command_ends_with_a_frozen_janitor_and_says_why_it_waits(demo_kit, tmp_path):
    proc = _cli(
        str(demo_kit.dataset), "--model", str(demo_kit.models["digits"]), "--backend", "sim",
        "--sim-npu-ms", "5", "--sim-host-ms", "0", "--limit", "600",
        "--out", str(tmp_path / "o"), "--no-progress",
    )  # fmt: skip
    for line in proc.stderr:
        if line.startswith("started:"):
            break
    (frozen,) = [c for c in _children(psutil.Process(proc.pid)) if _is_janitor(c)]
    frozen.send_signal(signal.SIGSTOP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert f"warning: the shared-memory janitor (pid {frozen.pid}) is stopped (SIGSTOP)" in err
    assert not frozen.is_running()


class _FreezeTheWholeRun:
    """Once ``n`` rows are done, SIGSTOPs every descendant of this process (the run's fork
    server, janitor, readers and workers); ``for_ever`` keeps freezing every one that
    appears since (fresh fork servers and their children), else the frozen ones are
    continued once the engine has killed one of them (the freeze outlived a timeout)."""

    def __init__(self, n: int, for_ever: bool) -> None:
        self.n, self.for_ever, self.done = n, for_ever, 0
        self.frozen: list[psutil.Process] = []
        self.thawed = False
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    def _freeze_all(self) -> None:
        for p in _children(psutil.Process()):
            if p not in self.frozen:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGSTOP)
                    self.frozen.append(p)

    def _keep_freezing(self) -> None:
        # No event says "a process was forked": look (the harness, not the engine, polls).
        while not self._stop.wait(0.005):
            self._freeze_all()

    def notify(self, event) -> None:
        if isinstance(event, ev.RowsDone) and not self.frozen:
            self.done += len(event.rows)
            if self.done >= self.n:
                self._freeze_all()
                if self.for_ever:
                    self._keeper = threading.Thread(target=self._keep_freezing, daemon=True)
                    self._keeper.start()
        elif isinstance(event, ev.Warned) and self._first_kill(str(event.message)):
            self.thawed = True
            for p in self.frozen:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGCONT)

    def _first_kill(self, said: str) -> bool:
        return bool(self.frozen) and not self.for_ever and not self.thawed and "killed" in said

    def close(self) -> None:
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join()


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_freezing_every_process_of_a_run_past_its_timeouts_loses_nothing(demo_kit, tmp_path):
    """issue 27: the run's whole tree (fork server and janitor too) frozen for longer than
    the inference and decode timeouts, then continued: what was frozen is killed and
    started again from a fresh fork server, and every item is done once."""
    freezer = _FreezeTheWholeRun(n=20, for_ever=False)
    cfg = config(
        dataset=demo_kit.dataset, model=demo_kit.models["digits"], backend="sim",
        sim=fast_sim(npu_ms=1.0), timeout_s=0.5, limit=200, out=tmp_path / "o",
    )  # fmt: skip
    try:
        result = run(cfg, observers=[freezer])
    finally:
        freezer.close()
    assert freezer.thawed
    table = read_predictions(result.out)
    assert sorted(table["index"].to_pylist()) == list(range(200))
    assert (result.status, result.errors) == ("complete", 0)
    assert not [p for p in freezer.frozen if p.is_running() and p.status() != "zombie"]


@pytest.mark.slow  # three start-up timeouts and back-offs per core before it is retired
def test_freezing_every_process_of_a_run_for_ever_ends_it_with_exit_3_then_resume_completes(
    demo_kit, tmp_path, caplog
):
    """issue 27: every process of the run frozen, and every one started since: each core is
    retired after its restarts, the run fails (exit 3, saying to resume) instead of
    hanging, frozen children are killed without waiting for them to stop (that wait was
    silent: 5 s, at the end), and --resume does the rest, each item once."""
    # The frozen janitor too: said after 2 s, killed after 10 s (janitor.py's defaults).
    freezer = _FreezeTheWholeRun(n=20, for_ever=True)
    settings = dict(
        dataset=demo_kit.dataset, model=demo_kit.models["digits"], backend="sim",
        sim=fast_sim(npu_ms=1.0), timeout_s=0.5, limit=200, out=tmp_path / "o",
    )  # fmt: skip
    with caplog.at_level("WARNING", logger="batchinfer.engine.plumbing.children"):
        try:
            # Cores retired ("resume the run") or readers past their death limit ("then
            # resume"): which limit trips first depends on the machine's timing.
            with pytest.raises(RunFailedError, match="resume") as info:
                run(config(startup_timeout_s=1.0, **settings), observers=[freezer])
        finally:
            freezer.close()
    assert info.value.exit_code == 3
    assert not [p for p in freezer.frozen if p.is_running() and p.status() != "zombie"]
    said = [r.getMessage() for r in caplog.records]
    assert [m for m in said if m.startswith("stopped (SIGSTOP) at the end of the run")], said
    assert not [m for m in said if m.startswith("waiting up to")], said
    written = read_predictions(tmp_path / "o")["index"].to_pylist()
    assert len(written) == len(set(written))  # each written row once
    result = run(config(resume=True, **settings))
    table = read_predictions(result.out)
    assert sorted(table["index"].to_pylist()) == list(range(200))
    assert result.status == "complete"


@pytest.mark.slow  # the minute of freezing, on the command
def test_the_command_outlives_a_minute_with_every_process_of_its_run_frozen(demo_kit, tmp_path):
    """issue 27, done when: every descendant of ``batchinfer run`` (fork server, janitor,
    readers, workers) frozen for 60 s once rows are written, then continued: the frozen
    children are replaced at the 20 s timeouts, and the run ends with every item once
    (before the minute is up, or after it)."""
    out = tmp_path / "o"
    proc = _cli(
        str(demo_kit.dataset), "--model", str(demo_kit.models["digits"]), "--backend", "sim",
        "--sim-npu-ms", "30", "--sim-host-ms", "0", "--inference-timeout-s", "20",
        "--decode-timeout-s", "20", "--part-rows", "10", "--out", str(out), "--no-progress",
    )  # fmt: skip
    deadline = time.monotonic() + 120
    # The first part on disk: rows flow (the command gives no event a test could await).
    while not list((out / PREDICTIONS_DIR).glob(PART_GLOB)):
        assert proc.poll() is None and time.monotonic() < deadline, "no rows written"
        time.sleep(0.05)
    family = _children(psutil.Process(proc.pid))
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGSTOP)
    time.sleep(60.0)  # the freeze itself is what is tested
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "is stopped (SIGSTOP); children start from a fresh one" in err  # not just waited
    total = json.loads((out / "manifest.json").read_text())["counts"]["succeeded"]
    assert sorted(read_predictions(out)["index"].to_pylist()) == list(range(total))
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive
