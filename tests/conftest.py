"""Shared fixtures: the leak guard every test runs under, and a demo kit made once per session;
and the default run's parallelism (pytest-xdist, when it is installed)."""

from __future__ import annotations

import ast
import contextlib
import fcntl
import importlib.util
import os
import pickle
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from batchinfer.demo import write_demo
from batchinfer.engine.slots import SEGMENT_PREFIX, SHM_DIR

# Bytecode caches (__pycache__, git-ignored) are written during the tests even where
# PYTHONDONTWRITEBYTECODE is set, as it is on the project's machines and in CI: without
# them every process a test starts (the CLI, the fork server, the core workers and readers
# they fork, Ray's workers) compiles the package from source again, and every xdist worker
# rewrites every test module's asserts again. The default tier took 107-120 s with the
# variable set and 90 s without it (2026-12-06, 2-CPU VM). Set here, at the controller's
# start, so the workers and every child inherit it. The installed product is unaffected:
# pip compiles a (non-editable) install's bytecode when it installs it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


# Test files that need a package of the dev extra which the toolkit's environment (tools/
# toolkit-env.sh: rknn-toolkit2's own packages) does not have: not collected there, and
# said in the run's header, as `pytest.importorskip` would say it per file. Found from the
# files' own module-level imports, followed through the helper modules of tests/ they
# import (a list kept by hand went stale as tests were added).
_DEV_ONLY = ("hypothesis", "pycocotools", "sybil")
_ABSENT = [m for m in _DEV_ONLY if importlib.util.find_spec(m) is None]
_TESTS = Path(__file__).resolve().parent


def _imports(path: Path, seen: set[Path]) -> set[str]:
    """Top names a tests/ module imports at module level, its tests/ helpers' included."""
    if path in seen or not path.is_file():
        return set()
    seen.add(path)
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found = [node.module]
        else:
            continue
        for name in found:
            top = name.split(".")[0]
            names.add(top)
            names |= _imports(_TESTS / f"{top}.py", seen)
    return names


# What a test needs through a module it loads by path (not an import statement).
_BY_PATH = {"test_docs_runner.py": {"sybil"}}  # tools/docs_runner.py


def _needs_absent(path: Path) -> list[str]:
    needs = _imports(path, set()) | _BY_PATH.get(path.name, set())
    return sorted(set(_ABSENT) & needs) if _ABSENT else []


collect_ignore_glob = [
    p.name for p in sorted(_TESTS.glob("test_*.py")) if _ABSENT and _needs_absent(p)
]


def pytest_report_header() -> list[str]:
    if not collect_ignore_glob:
        return []
    return [f"not collected, {', '.join(_ABSENT)} not installed: {', '.join(collect_ignore_glob)}"]


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads -n
def pytest_cmdline_main(config: pytest.Config) -> None:
    """`pytest` with no paths (the README's test command, .ci/run's tiers) runs on one
    pytest-xdist worker per CPU (at most 4), when xdist is installed and no -n was given.

    Not in pyproject's addopts: an environment without xdist (the toolkit's, tools/
    toolkit-env.sh) would refuse the option. Whole files go to one worker (loadfile), so a
    module's fixtures are made once. Each worker is its own session: its own demo kit and
    leak guard. `pytest -n 0` or `-p no:xdist` runs in one process (for a debugger).
    """
    if (
        config.pluginmanager.hasplugin("xdist")
        and config.getoption("numprocesses", None) is None
        and config.args_source == pytest.Config.ArgsSource.TESTPATHS
        and not os.environ.get("PYTEST_XDIST_WORKER")
    ):
        cpus = min(len(os.sched_getaffinity(0)), 4)
        if cpus > 1:
            config.option.numprocesses = cpus
            config.option.dist = "loadfile"


def _our_segments() -> set[str]:
    """Segments made by this test process, or by a coordinator that is dead (a subprocess).

    Segments of other live processes (another test session running at the same time) are
    theirs to clean up, not ours.
    """
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(SEGMENT_PREFIX + "-")]
    except OSError:
        return set()
    ours = set()
    for name in names:
        pid = name.split("-")[1]
        if pid.isdigit() and (int(pid) == os.getpid() or not psutil.pid_exists(int(pid))):
            ours.add(name)
    return ours


def _children() -> dict[int, str]:
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        # multiprocessing's resource tracker lives as long as the test session, by design.
        if "resource_tracker" not in cmd:
            out[p.pid] = cmd
    return out


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail a test that leaves a child process or one of our /dev/shm segments behind."""
    yield from guard_leaks()


def _server_mark() -> str:
    """The line of a fork server's command that names it (fork_server._PROGRAM's import)."""
    from batchinfer.engine.plumbing import fork_server, fork_server_loop

    mark = f"from {fork_server_loop.__name__} import {fork_server_loop.serve.__name__}"
    assert mark in fork_server._PROGRAM, "the fork server's program no longer says this"
    return mark


_SERVER_MARK = _server_mark()


def _held_server(cmd: str) -> bool:
    """Whether a child with command line ``cmd`` is a fork server warm_fork_server holds (the
    current one or one it retired): it outlives tests, modules and Ray clusters by design,
    and the hold's end (the session's) stops every one of them."""
    return bool(_HOLDING) and _SERVER_MARK in cmd


def guard_leaks(spare_descendants: bool = False) -> Iterator[None]:
    """The leak guard's body, for a fixture to yield from.

    ``spare_descendants``: the descendants of children that were there before the test are
    not counted (a module's Ray cluster: its raylets and workers outlive each test by
    design, and ``local_ray_cluster`` checks them when it stops).
    """
    segments_before = _our_segments()
    children_before = set(_children())
    yield
    spared: set[int] = set()
    if spare_descendants:
        for pid in children_before:
            with contextlib.suppress(psutil.Error):
                spared |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
    leaked_children = {
        pid: cmd
        for pid, cmd in _children().items()
        if pid not in children_before | spared and not _held_server(cmd)
    }
    for pid in list(leaked_children):
        try:  # give a child that is exiting right now a moment to be reaped
            psutil.Process(pid).wait(timeout=2)
            del leaked_children[pid]
        except psutil.TimeoutExpired:
            psutil.Process(pid).kill()
        except psutil.Error:
            del leaked_children[pid]
    leaked_segments = _our_segments() - segments_before
    # A dead coordinator's segments may be another test's, in another xdist worker or
    # session (a kill -9 test), until that run's janitor removes them: give it a moment.
    deadline = time.monotonic() + 2
    while leaked_segments and time.monotonic() < deadline:
        time.sleep(0.05)
        leaked_segments &= _our_segments()
    for name in leaked_segments:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, name))
    assert not leaked_children, f"test left processes behind: {leaked_children}"
    assert not leaked_segments, f"test left shared-memory segments behind: {leaked_segments}"


def local_ray_cluster(cores: tuple[int, ...] = (0, 1, 2)) -> Iterator[object]:
    """Two simulated Ray nodes on this machine, node0 (the head) and node1, each declaring
    ``cores``, with this process connected: for a module fixture to yield from. Once it is
    stopped, not one process of it may be left."""
    import ray

    from batchinfer.cluster.local import start_local_cluster, stop_local_cluster

    before = set(_children())
    local = start_local_cluster(2, cores)
    ray.init(address=local.address, log_to_driver=False)
    try:
        yield local
    finally:
        ray.shutdown()
        stop_local_cluster(local)
        now = _children()
        left = [
            psutil.Process(p)
            for p in set(now) - before
            if psutil.pid_exists(p) and not _held_server(now[p])
        ]
        _, alive = psutil.wait_procs(left, timeout=10)
        for p in alive:
            p.kill()
        assert not alive, f"the Ray cluster left processes behind: {alive}"


#: Whether warm_fork_server holds a fork server now (one True, or empty).
_HOLDING: list[bool] = []
#: Whether the module running now launches a server per run (OWN_FORK_SERVER: one True).
_OWN: list[bool] = []


def _launch_context() -> tuple[dict[str, str], list[str], list[str]]:
    """What a fork server takes from this process at launch: its environment (but the name
    of the test pytest is running), sys.path and the modules it imports (PRELOAD)."""
    from batchinfer.engine.plumbing import fork_server

    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    return env, list(sys.path), list(fork_server.PRELOAD)


def _let_go() -> None:
    """End the hold: the server stops once the runs using it, if any, release it too."""
    from batchinfer.engine.plumbing import fork_server

    if _HOLDING:
        _HOLDING.clear()
        fork_server.release()


@pytest.fixture(autouse=True, scope="session")
def warm_fork_server() -> Iterator[None]:
    """One fork server for a test session's runs (an xdist worker's), not one per run.

    A run launches the server that forks its children (engine/plumbing/fork_server.py) and
    stops it when it ends, unless another user holds it: held here, it is launched at the
    session's first run and each run's children are forked from it at once. That launch (an
    interpreter importing numpy, Pillow and the child modules) was most of a short run's
    time: 10 digits through the CLI took 2.1-3.3 s a run with a fresh server, 0.9-1.4 s
    with this one, on the shared 2-CPU VM at a load average of 15-25 (2026-12-07). Each run
    still goes through acquire and release. A run in another environment, sys.path or
    PRELOAD than the server's gets a fresh one, held in turn (the stale one stops), as its
    run would launch without the hold. A module whose runs need a server of their own (it
    freezes, kills or counts the server) says so with ``OWN_FORK_SERVER = "why"``
    (``own_fork_server``). The hold begins at the first acquire, so a session that runs
    nothing launches no server, and ends with the session.
    """
    from batchinfer.engine.plumbing import fork_server

    acquire, launched_in = fork_server.acquire, []

    def acquire_and_hold() -> None:
        # The server copies the environment and sys.path at launch and its children read
        # them (BATCHINFER_SIM_* settings, plugins), and it imports PRELOAD: a test that
        # changed any gets a server launched for it, as its run would without the hold.
        if not _OWN:
            now = _launch_context()
            if _HOLDING and launched_in != [now]:
                _let_go()  # the last user: the stale server stops
            if not _HOLDING:
                acquire()
                _HOLDING.append(True)
                launched_in[:] = [now]
        acquire()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fork_server, "acquire", acquire_and_hold)
        try:
            yield
        finally:
            _let_go()


@pytest.fixture(autouse=True, scope="module")
def own_fork_server(request: pytest.FixtureRequest, warm_fork_server: None) -> Iterator[None]:
    """A module with ``OWN_FORK_SERVER`` runs without the session's server: the hold ends
    before its first test, and each of its runs launches and stops a server of its own, as a
    user's run does."""
    if not getattr(request.module, "OWN_FORK_SERVER", None):
        yield
        return
    _let_go()
    _OWN.append(True)
    try:
        yield
    finally:
        _OWN.clear()


@pytest.fixture(scope="session")
def demo_kit(tmp_path_factory):
    """The demo kit (1,797 digit PNGs and the three models), written once per session.

    Under pytest-xdist, once for all the workers (each is a session): the first writes it in
    their common temporary folder under a lock, the others wait and read what it wrote. No
    test changes the kit.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return write_demo(Path(tmp_path_factory.mktemp("demo")) / "kit")
    shared = tmp_path_factory.getbasetemp().parent
    with open(shared / "demo.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        written = shared / "demo.pickle"
        if written.exists():
            return pickle.loads(written.read_bytes())
        kit = write_demo(shared / "demo" / "kit")
        written.write_bytes(pickle.dumps(kit))
        return kit
