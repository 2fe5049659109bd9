"""Children come from a fork server: immune to Ctrl-C from their first instruction, and the
server goes with the pool that used it (engine/plumbing/fork_server.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from batchinfer.engine.plumbing import fork_server
from batchinfer.engine.plumbing.children import ChildPool, Exited, Message

# Each run launches a fork server of its own, not the module's (tests/conftest.py):
OWN_FORK_SERVER = "its tests are the server's: launched, frozen, killed, replaced"


def _report_signals(spec, tasks, results) -> None:
    # The first instruction of the child: nothing has set its handlers yet.
    handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGHUP)]
    runtimes = [m for m in sys.modules if m.split(".")[0] in ("onnxruntime", "rknnlite")]
    env = {k: os.environ.get(k) for k in ("PYTHONPATH", "PYTHONSAFEPATH", "HOME")}
    results.send(("signals", handlers, [spec, os.getppid()], runtimes, env))
    tasks.recv()


def _first_message(pool: ChildPool, deadline_s: float = 30.0) -> tuple:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for event in pool.poll(0.1):
            if isinstance(event, Message):
                return event.body
    raise AssertionError("the child said nothing")


def test_children_ignore_sigint_and_sighup_from_their_first_instruction_and_hold_no_runtime():
    # This process has Python's own SIGINT handler, as a library caller without the
    # command's signal router does: a spawned child would start with it too. (Set here: a
    # test run started in the background of a shell inherits SIGINT ignored.)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    pool = ChildPool(time.monotonic)
    try:
        pool.start("worker", 0, _report_signals, "spec", 30.0, "starting")
        _, handlers, (spec, ppid), runtimes, env = _first_message(pool)
        assert handlers == [signal.SIG_IGN, signal.SIG_IGN]
        assert runtimes == []  # forked from a server that never imported a runtime
        # The child has the coordinator's environment (the server is launched with it).
        assert env == {k: os.environ.get(k) for k in ("PYTHONPATH", "PYTHONSAFEPATH", "HOME")}
        assert spec == "spec" and ppid == pool.parent_pid == fork_server.server_pid()
    finally:
        pool.close(hard=True, join_timeout_s=5.0)
        signal.signal(signal.SIGINT, previous)


def _report_frozen(spec, tasks, results) -> None:
    import gc

    results.send(("frozen", gc.get_freeze_count()))
    tasks.recv()


def test_children_start_with_the_servers_objects_frozen():
    """A child's collections scan only what it made: a core worker's start-up collection
    took 16-23 ms with the server's modules in view (fork_server_frozen.py)."""
    pool = ChildPool(time.monotonic)
    try:
        pool.start("worker", 0, _report_frozen, "spec", 30.0, "starting")
        _, frozen = _first_message(pool)
        assert frozen > 10_000  # numpy's and our modules' objects, at least
    finally:
        pool.close(hard=True, join_timeout_s=5.0)


def _report_interpreter_options(spec, tasks, results) -> None:
    results.send(("options", list(sys.warnoptions)))
    tasks.recv()


def test_children_run_with_the_coordinators_interpreter_options(monkeypatch):
    """`python -W error ...` and `-X dev` reach the workers, as with multiprocessing's spawn:
    the server was launched with a bare `python -c`, and its children saw neither."""
    assert fork_server.server_pid() is None, "a server is still held: this test needs its own"
    monkeypatch.setattr(sys, "warnoptions", [*sys.warnoptions, "error::ResourceWarning"])
    pool = ChildPool(time.monotonic)
    try:
        pool.start("worker", 0, _report_interpreter_options, "spec", 30.0, "starting")
        _, warnoptions = _first_message(pool)
        assert "error::ResourceWarning" in warnoptions
    finally:
        pool.close(hard=True, join_timeout_s=5.0)


_SETTINGS = (
    "import sys, faulthandler; f = sys.flags; print((f.dev_mode, f.optimize, "
    "f.dont_write_bytecode, f.no_user_site, faulthandler.is_enabled(), sys.warnoptions))"
)


def test_interpreter_options_start_a_python_with_the_same_settings():
    options = ["-X", "dev", "-X", "faulthandler", "-O", "-B", "-s", "-W", "error::ResourceWarning"]
    given = subprocess.run(
        [sys.executable, *options, "-c", _SETTINGS], capture_output=True, text=True, check=True
    ).stdout
    passed_on = subprocess.run(
        [
            sys.executable,
            *options,
            "-c",
            "from batchinfer.engine.plumbing.fork_server import interpreter_options; "
            "print('\\n'.join(interpreter_options()))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    again = subprocess.run(
        [sys.executable, *passed_on, "-c", _SETTINGS], capture_output=True, text=True, check=True
    ).stdout
    assert again == given
    assert given.startswith("(True, 1, 1, 1, True, [")  # the options took effect at all


def test_the_fork_server_goes_when_the_last_user_is_done_and_its_cpu_is_counted():
    first, second = ChildPool(time.monotonic), ChildPool(time.monotonic)
    first.open()
    second.start("reader", 0, _report_signals, "spec", 30.0, "starting")
    _first_message(second)  # the server has imported and forked
    server = psutil.Process(fork_server.server_pid())
    first.close(hard=True, join_timeout_s=5.0)
    assert server.is_running() and fork_server.server_pid() == server.pid  # still used
    second.close(hard=True, join_timeout_s=5.0)
    assert fork_server.server_pid() is None
    assert not psutil.pid_exists(server.pid)  # stopped and reaped, not a zombie
    assert first.server_cpu_s > 0.05 and second.server_cpu_s >= first.server_cpu_s  # imports


def test_a_server_held_for_a_block_is_stopped_at_its_end_even_on_an_error():
    with pytest.raises(RuntimeError), fork_server.running():
        pool = ChildPool(time.monotonic)
        pool.start("reader", 0, _report_signals, "spec", 30.0, "starting")
        _first_message(pool)
        pool.close(hard=True, join_timeout_s=5.0)
        server = psutil.Process(fork_server.server_pid())  # the block still holds it
        raise RuntimeError("planning failed")
    assert fork_server.server_pid() is None and not psutil.pid_exists(server.pid)


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_a_folder_that_shadows_our_modules_is_not_imported_by_the_server(demo_kit, tmp_path):
    """The server is started as ``python -c``, whose path began with the current folder:
    a folder holding a ``batchinfer`` of its own had it imported by the server."""
    marker = tmp_path / "imported"
    fake = tmp_path / "cwd" / "batchinfer"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    # Nor a module of the standard library's name that the server imports first.
    (fake.parent / "signal.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    # As the `batchinfer` command starts: its own folder, not the current one, on the path.
    entry = "import sys; del sys.path[0]; from batchinfer.entry import main; main()"
    args = [str(demo_kit.dataset), "--model", str(demo_kit.models["digits"])]
    args += ["--backend", "sim", "--limit", "50", "--out", str(tmp_path / "o")]
    proc = subprocess.run(
        [sys.executable, "-c", entry, "run", *args, "--no-progress"],
        cwd=fake.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), "the fork server imported the current folder's modules"


def _wait_for_exit(pool: ChildPool, child, deadline_s: float = 30.0) -> Exited:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for event in pool.poll(0.1):
            if isinstance(event, Exited) and event.child is child:
                return event
    raise AssertionError("the child's exit was never reported")


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_a_childs_death_is_seen_with_its_server_frozen_and_the_next_start_uses_a_fresh_one(
    caplog,
):
    """multiprocessing's server reported a child's exit only through itself: with the
    server stopped, a killed worker was never seen gone and the run waited for ever."""
    pool = ChildPool(time.monotonic)
    try:
        child = pool.start("worker", 0, _report_signals, "spec", 30.0, "starting")
        _first_message(pool)
        frozen = fork_server.server_pid()
        os.kill(frozen, signal.SIGSTOP)
        pool.kill(child, "killed by the test")
        exited = _wait_for_exit(pool, child)
        assert exited.exitcode is None  # only the frozen server could have told it
        again = pool.start("worker", 0, _report_signals, "spec", 30.0, "starting")
        _, _, (_, ppid), _, _ = _first_message(pool)
        assert ppid == fork_server.server_pid() != frozen
        assert again.proc.pid is not None
        said = [r.getMessage() for r in caplog.records if "fork server" in r.getMessage()]
        assert said == [f"the fork server (pid {frozen}) is stopped (SIGSTOP); children start "
                        "from a fresh one"]  # fmt: skip
    finally:
        pool.close(hard=True, join_timeout_s=5.0)
    assert not psutil.pid_exists(frozen), "the stopped server is stopped for good at the end"


def test_a_start_a_frozen_server_never_serves_is_given_up_when_the_child_is_killed(
    monkeypatch,
):
    """The server froze with the start queued: no child, no pid, nothing to kill. Killing it
    (what the watchdog does at the start-up deadline) reports it gone at once."""
    pool = ChildPool(time.monotonic)
    try:
        pool.open()
        server = fork_server._current
        os.kill(server.pid, signal.SIGSTOP)
        # As if it froze a moment after the check that it could serve.
        monkeypatch.setattr(server, "unresponsive", lambda: None)
        child = pool.start("worker", 0, _report_signals, "spec", 30.0, "starting")
        assert pool.poll(0.2) == [] and child.proc.pid is None
        pool.kill(child, "did not start in time")
        assert [type(e) for e in pool.poll(30.0)] == [Exited]
        monkeypatch.undo()
        assert fork_server.serving_pid() != server.pid  # retired: starts go elsewhere
        os.kill(server.pid, signal.SIGCONT)  # the child it forks now finds nobody and exits
        pool.start("reader", 0, _report_signals, "spec", 30.0, "starting")
        _first_message(pool)
    finally:
        pool.close(hard=True, join_timeout_s=5.0)


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_a_dead_server_takes_its_children_and_the_next_start_launches_another(caplog):
    # The fast sibling of test_liveness.py's run with its server killed (slow tier).
    pool = ChildPool(time.monotonic)
    try:
        child = pool.start("worker", 0, _report_signals, "spec", 30.0, "starting")
        _first_message(pool)
        dead = fork_server.server_pid()
        os.kill(dead, signal.SIGKILL)
        # The kill is asynchronous: its child can be seen gone while the server is still
        # exiting (not yet a zombie), when the next start would find it "exited" without
        # a code, or refusing the start. Wait for its death; WNOWAIT leaves it to its Popen.
        os.waitid(os.P_PID, dead, os.WEXITED | os.WNOWAIT)
        _wait_for_exit(pool, child)  # PR_SET_PDEATHSIG
        with caplog.at_level("WARNING", logger="batchinfer.engine.plumbing.fork_server"):
            pool.start("worker", 0, _report_signals, "spec", 30.0, "starting")
        _, _, (_, ppid), _, _ = _first_message(pool)
        assert ppid == fork_server.server_pid() != dead
        said = f"the fork server (pid {dead}) exited (exit code -9); children start from a fresh"
        said += " one"
        assert [r.getMessage() for r in caplog.records] == [said]  # said once
    finally:
        pool.close(hard=True, join_timeout_s=5.0)


def _exit_with(spec, tasks, results) -> None:
    results.send(("ready",))
    if spec == "raise":
        raise RuntimeError("boom")
    sys.exit(spec)


@pytest.mark.parametrize(("spec", "code"), [(0, 0), (3, 3), ("raise", 1)])
def test_a_childs_exit_code_comes_back(spec, code, capfd):
    pool = ChildPool(time.monotonic)
    try:
        child = pool.start("worker", 0, _exit_with, spec, 30.0, "starting")
        assert _wait_for_exit(pool, child).exitcode == code
    finally:
        pool.close(hard=True, join_timeout_s=5.0)
    assert ("RuntimeError: boom" in capfd.readouterr().err) == (spec == "raise")


def test_the_servers_socket_needs_no_path_however_long_tmpdir_is(monkeypatch, tmp_path):
    """multiprocessing's server listened on a socket file in TMPDIR: a TMPDIR longer than
    a UNIX socket's path (107 bytes) failed the run ("AF_UNIX path too long")."""
    long = tmp_path / ("t" * 120)
    long.mkdir()
    monkeypatch.setenv("TMPDIR", str(long))
    monkeypatch.setattr("tempfile.tempdir", None)
    pool = ChildPool(time.monotonic)
    try:
        pool.start("reader", 0, _report_signals, "spec", 30.0, "starting")
        _first_message(pool)
    finally:
        pool.close(hard=True, join_timeout_s=5.0)
    assert list(long.iterdir()) == []
