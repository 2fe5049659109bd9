"""Ray faults end cleanly: a lost GCS, a low open-files limit, a killed driver.

Each run is a ``batchinfer`` process (tests/counting_cli.py: the program, plus a ``rows N``
line per batch of rows) that starts its own ``--ray local:2`` cluster, so that a fault
cannot take the test session down with it (Ray ends a driver whose GCS is gone for 60 s).
Every process of a run carries a tag in its environment (Ray's processes inherit it: the
keeper, GCS, raylets, agents and workers), so a process scan finds what a run left behind.
"""

from __future__ import annotations

import os
import resource
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from batchinfer.results import read_run

pytest.importorskip("ray")

COUNTING_CLI = Path(__file__).with_name("counting_cli.py")
TAG = "BATCHINFER_TEST_RUN"
GONE_WITHIN_S = 30.0  # a deadline for processes to end, not a measurement


def _tagged(tag: str) -> list[psutil.Process]:
    """Live processes (zombies are dead) whose environment carries ``TAG=tag``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TAG) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _left_after(tag: str, timeout_s: float = GONE_WITHIN_S) -> list[psutil.Process]:
    """Wait until no process carries ``tag`` (scan, wait for those found, scan again), at
    most ``timeout_s``; what is still there then."""
    deadline = time.monotonic() + timeout_s
    while True:
        procs = _tagged(tag)
        left = deadline - time.monotonic()
        if not procs or left <= 0:
            return procs
        psutil.wait_procs(procs, timeout=left)


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            continue
    return out


class _Run:
    """A ``batchinfer run`` process on a local cluster of its own, tagged."""

    def __init__(self, tmp_path: Path, args: list[str], tag: str, **popen) -> None:
        self.tag = tag
        self.stdout = ""
        self.stderr_path = tmp_path / f"stderr-{uuid.uuid4().hex[:6]}"
        env = {**os.environ, TAG: tag}
        with open(self.stderr_path, "w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(COUNTING_CLI), *args],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=env,
                **popen,
            )

    def rows_reach(self, n: int) -> int:
        """Read its ``rows N`` lines until N >= n; that N (the run is then mid-way)."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("rows ") and int(line.split()[1]) >= n:
                return int(line.split()[1])
        raise AssertionError(f"the run ended before {n} rows: {self.stderr()}")

    def wait(self, timeout_s: float = 180.0) -> int:
        """Its exit code; what it printed after the lines already read goes to ``stdout``."""
        assert self.process.stdout is not None
        self.stdout = self.process.stdout.read()
        self.process.stdout.close()
        return self.process.wait(timeout=timeout_s)

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def kill_leftovers(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        for proc in _tagged(self.tag):
            proc.kill()


def _run_args(demo_kit, out: Path, *extra: str) -> list[str]:
    return ["run", str(demo_kit.dataset), "--model", str(demo_kit.models["digits"]),
            "--backend", "sim", "--sim-host-ms", "0", "--out", str(out), "--no-progress",
            "--ray", "local:2", *extra]  # fmt: skip


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


def test_ray_local_with_ulimit_n_64_fails_at_once_with_one_clear_message(demo_kit, tmp_path):
    """It used to wait for the cluster until a timeout (300 s by default) while Ray's
    processes lacked descriptors; now nothing starts. Bounded here by a short start-up
    timeout, so that the old behaviour fails this test instead of stalling it."""
    tag = uuid.uuid4().hex

    def limit() -> None:  # what `ulimit -n 64` does: the soft and the hard limit
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    out = tmp_path / "o"
    run = _Run(tmp_path, _run_args(demo_kit, out, "--startup-timeout-s", "20"), tag,
               preexec_fn=limit)  # fmt: skip
    try:
        code = run.wait(timeout_s=120)
        lines = run.stderr().strip().splitlines()
        assert code == 2, lines
        assert len(lines) == 1 and lines[0].startswith("error: only 64 files may be open"), lines
        assert "--ray local:2" in lines[0] and "ulimit -n 1024" in lines[0]
        assert not out.exists()  # refused before OUT was claimed
        assert not _left_after(tag)
    finally:
        run.kill_leftovers()


@pytest.mark.slow
def test_a_gcs_killed_mid_run_ends_interrupted_with_its_rows_and_resumes_exactly_once(
    demo_kit, tmp_path
):
    """kill -9 of the cluster's gcs_server: within seconds the driver writes the rows it
    has, marks the run interrupted, says how to resume and exits 3 (it used to wait 60 s,
    then Ray ended it with exit 1, the manifest still ``running`` and its rows lost); the
    resumed run, on a fresh cluster, gives every item exactly once."""
    tag, out = uuid.uuid4().hex, tmp_path / "o"
    # 900 items at 100 ms on 6 cores: ~15 s of work, so the run is far from done when the
    # GCS dies after the first rows (the driver notices within ~6 s).
    args = _run_args(demo_kit, out, "--limit", "900", "--sim-npu-ms", "100")
    run = again = _Run(tmp_path, args, tag)
    try:
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
        assert not _left_after(tag), "the lost cluster's processes outlived its command"

        command = shlex.split(error.split("resume it with: ", 1)[1])
        assert command[0] == "batchinfer" and command[-1] == "--resume"
        again = _Run(tmp_path, command[1:], tag)
        assert again.wait() == 0, again.stderr()
        table = read_run(out).predictions()
        assert sorted(table["index"].to_pylist()) == list(range(900))
        assert read_run(out).manifest.status == "complete"
        assert f"{len(done)} already done (resumed)" in again.stdout
        assert not _left_after(tag)
    finally:
        run.kill_leftovers()
        again.kill_leftovers()


@pytest.mark.slow
def test_a_killed_driver_leaves_no_ray_process_behind(demo_kit, tmp_path):
    """kill -9 of a ``--ray local:2`` command mid-run: its keeper sees the pipe close and
    ends every process of the cluster (Ray's agents and idle workers used to stay)."""
    tag = uuid.uuid4().hex
    run = _Run(tmp_path, _run_args(demo_kit, tmp_path / "o", "--sim-npu-ms", "20"), tag)
    try:
        run.rows_reach(50)
        before = _tagged(tag)
        names = {p.name() for p in before}
        assert {"gcs_server", "raylet"} <= names, names  # the scan sees the cluster
        assert sum(p.cmdline()[0].startswith("ray::") for p in before) >= 6  # actors, agents
        run.process.send_signal(signal.SIGKILL)
        run.process.wait()
        left = _left_after(tag)
        assert not left, f"left behind: {_describe(left)}"
    finally:
        run.kill_leftovers()
