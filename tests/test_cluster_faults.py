"""Ray faults end cleanly: a lost GCS, a low open-files limit, a killed driver.

Each run is a ``batchinfer`` process (tests/counting_cli.py: the program, plus a ``rows N``
line per batch of rows) that starts its own ``--ray local:2`` cluster, so that a fault
cannot take the test session down with it (Ray ends a driver whose GCS is gone for 60 s).
A process scan finds what a test's runs left behind: every process that carries the test's
tag in its environment (Ray's processes inherit it) or has a file open in the test's own
Ray folder (``RAY_TMPDIR``: each Ray process logs there), since Ray's agents reuse the
memory that shows their environment.
"""

from __future__ import annotations

import contextlib
import os
import queue
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from batchinfer.results import read_run

pytest.importorskip("ray")

COUNTING_CLI = Path(__file__).with_name("counting_cli.py")
TAG = "BATCHINFER_TEST_RUN"
# Deadlines, not measurements: for a run's events, and for processes to end after a run.
WITHIN_S = 180.0
GONE_WITHIN_S = 30.0


class _Run:
    """A ``batchinfer run`` process (tests/counting_cli.py); its stdout lines are read as
    they come, so waiting for one is bounded and an exit is never missed."""

    def __init__(self, args: list[str], env: dict, stderr_path: Path, **popen) -> None:
        self.stderr_path = stderr_path
        with open(stderr_path, "w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(COUNTING_CLI), *args],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=env,
                **popen,
            )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stdout = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with contextlib.suppress(ValueError, OSError):  # closed by close()
            for line in self.process.stdout:
                self.lines.put(line)
        self.lines.put(None)

    def rows_reach(self, n: int) -> int:
        """Wait for a ``rows N`` line with N >= n; that N (the run is then mid-way)."""
        deadline = time.monotonic() + WITHIN_S
        while True:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(f"the run ended before {n} rows: {self.stderr()}")
            if line.startswith("rows ") and int(line.split()[1]) >= n:
                return int(line.split()[1])

    def wait(self) -> int:
        """Its exit code; what it printed on stdout since the lines already taken is then
        in ``stdout``."""
        code = self.process.wait(timeout=WITHIN_S)
        self._reader.join(timeout=GONE_WITHIN_S)  # to the pipe's end, written before the exit
        rest = []
        while not self.lines.empty():
            line = self.lines.get()
            if line is not None:
                rest.append(line)
        self.stdout = "".join(rest)
        return code

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


class _Processes:
    """What one test's runs started, found by a process scan (see the module docstring)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.tag = uuid.uuid4().hex
        # Short: Ray's socket paths (RAY_TMPDIR/ray/session_.../sockets/...) must fit 107 bytes.
        self.ray_dir = tempfile.mkdtemp(prefix="bi-ray-", dir="/tmp")
        self.env = {**os.environ, TAG: self.tag, "RAY_TMPDIR": self.ray_dir}
        self.runs: list[_Run] = []

    def run(self, args: list[str], **popen) -> _Run:
        stderr = self.tmp_path / f"stderr-{len(self.runs)}"
        self.runs.append(_Run(args, self.env, stderr, **popen))
        return self.runs[-1]

    def scan(self) -> list[psutil.Process]:
        """Live processes (a zombie is dead) of this test's runs."""
        found = []
        for proc in psutil.process_iter():
            if proc.pid == os.getpid():
                continue
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if proc.environ().get(TAG) == self.tag or any(
                    f.path.startswith(self.ray_dir) for f in proc.open_files()
                ):
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    def left_after(self, timeout_s: float = GONE_WITHIN_S) -> list[str]:
        """Wait until the scan finds nothing (scan, wait for those found to end, scan again),
        at most ``timeout_s``; what is still there then, described."""
        deadline = time.monotonic() + timeout_s
        while True:
            procs = self.scan()
            left = deadline - time.monotonic()
            if not procs or left <= 0:
                return [_describe(p) for p in procs]
            psutil.wait_procs(procs, timeout=left)

    def clean_up(self) -> None:
        for run in self.runs:
            run.close()
        for proc in self.scan():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        shutil.rmtree(self.ray_dir, ignore_errors=True)


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {' '.join(proc.cmdline())[:120]}"
    except psutil.Error:
        return str(proc.pid)


@pytest.fixture
def procs(tmp_path):
    found = _Processes(tmp_path)
    try:
        yield found
    finally:
        found.clean_up()


def _run_args(demo_kit, out: Path, *extra: str) -> list[str]:
    return ["run", str(demo_kit.dataset), "--model", str(demo_kit.models["digits"]),
            "--backend", "sim", "--sim-host-ms", "0", "--out", str(out), "--no-progress",
            "--ray", "local:2", *extra]  # fmt: skip


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_open_files_below_what_ray_needs_are_raised_or_refused(tmp_path):
    """The soft limit is raised to the hard one when that allows 1024; otherwise one
    clear error naming ulimit -n and a value that works."""
    code = (
        "import resource, sys\n"
        "from batchinfer.cluster.connect import check_open_files\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, int(sys.argv[1])))\n"
        "try:\n"
        "    check_open_files('local:2')\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    raised = subprocess.run([sys.executable, "-c", code, "4096"], capture_output=True, text=True)
    assert raised.returncode == 0, raised.stderr
    assert raised.stdout.split() == ["4096"]
    refused = subprocess.run([sys.executable, "-c", code, "64"], capture_output=True, text=True)
    assert refused.returncode == 0, refused.stderr
    first, limit = refused.stdout.strip().splitlines()
    assert first.startswith("RuntimeUnavailableError only 64 files may be open") and limit == "64"
    assert "ulimit -n 1024" in first


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_ray_local_with_ulimit_n_64_fails_at_once_with_one_clear_message(demo_kit, tmp_path, procs):
    """It used to wait for the cluster until the start-up timeout (300 s by default) while
    Ray's processes lacked descriptors; now nothing starts. The start-up timeout is short
    here, so that the old behaviour fails this test instead of stalling it."""

    def limit() -> None:  # what `ulimit -n 64` does: the soft and the hard limit
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    out = tmp_path / "o"
    run = procs.run(_run_args(demo_kit, out, "--startup-timeout-s", "20"), preexec_fn=limit)
    code = run.wait()
    lines = run.stderr().strip().splitlines()
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error: only 64 files may be open"), lines
    assert "--ray local:2" in lines[0] and "ulimit -n 1024" in lines[0]
    assert not out.exists()  # refused before OUT was claimed
    assert not procs.left_after()


@pytest.mark.slow
def test_a_gcs_killed_mid_run_ends_interrupted_with_its_rows_and_resumes_exactly_once(
    demo_kit, tmp_path, procs
):
    """kill -9 of the cluster's gcs_server: within seconds the driver writes the rows it
    has, marks the run interrupted, says how to resume and exits 3 (it used to wait 60 s,
    then Ray ended it with exit 1, the manifest still ``running`` and its rows lost); the
    resumed run, on a fresh cluster, gives every item exactly once."""
    out = tmp_path / "o"
    # 900 items at 100 ms on 6 cores: ~15 s of work, so the run is far from done when the
    # GCS dies after the first rows (the driver notices within ~6 s).
    run = procs.run(_run_args(demo_kit, out, "--limit", "900", "--sim-npu-ms", "100"))
    seen = run.rows_reach(30)
    (gcs,) = [p for p in psutil.Process(run.process.pid).children(recursive=True)
              if p.name() == "gcs_server"]  # fmt: skip
    gcs.send_signal(signal.SIGKILL)
    code = run.wait()
    lines = run.stderr().strip().splitlines()
    assert code == 3, lines
    assert "Traceback" not in run.stderr()
    error = lines[-1]
    assert error.startswith("error: the Ray cluster stopped answering: its GCS at "), error
    assert "the run is marked interrupted; resume it with: batchinfer run " in error
    manifest = read_run(out).manifest
    assert manifest.status == "interrupted"
    counts = manifest.raw["counts"]
    assert counts["rows_on_disk"] >= seen and counts["collected_not_written"] == 0
    done = read_run(out).predictions()["index"].to_pylist()
    assert len(done) == len(set(done)) == counts["rows_on_disk"] < 900
    assert not procs.left_after(), "the lost cluster's processes outlived its command"

    command = shlex.split(error.split("resume it with: ", 1)[1])
    assert command[0] == "batchinfer" and command[-1] == "--resume"
    again = procs.run(command[1:])
    assert again.wait() == 0, again.stderr()
    assert f"{len(done)} already done (resumed)" in again.stdout
    assert sorted(read_run(out).predictions()["index"].to_pylist()) == list(range(900))
    assert read_run(out).manifest.status == "complete"
    assert not procs.left_after()


@pytest.mark.slow
def test_a_killed_driver_leaves_no_ray_process_behind(demo_kit, tmp_path, procs):
    """kill -9 of a ``--ray local:2`` command mid-run: its keeper sees the pipe close and
    ends every process of the cluster (Ray's agents and idle workers used to stay)."""
    run = procs.run(_run_args(demo_kit, tmp_path / "o", "--sim-npu-ms", "20"))
    run.rows_reach(50)
    before = procs.scan()
    names = {p.name() for p in before}
    assert {"gcs_server", "raylet"} <= names, names  # the scan sees the cluster...
    titles = [p.cmdline()[0] for p in before]
    assert sum(t.startswith("ray::") for t in titles) >= 6, titles  # ...its actors, agents
    run.process.send_signal(signal.SIGKILL)
    run.process.wait()
    left = procs.left_after()
    assert not left, f"left behind: {left}"
