"""Reliability: worker crashes, hangs, None results, bad inputs, interruptions, resume.

Every case is driven by the emulator's fault injection (``--sim-fault``), so each failure
happens at a known call or item, and every test checks that each item ends in exactly one row.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
from held_start import hold_children
from runs import config, exit_code, fast_sim

from batchinfer import run
from batchinfer.data.whole_file import HANGING_FILE_ENV
from batchinfer.engine import events as ev
from batchinfer.engine.slots import SEGMENT_PREFIX, check_free_space, sweep_dead_segments
from batchinfer.errors import NoCoreError, OutputWriteError, RunFailedError, SharedMemoryError
from batchinfer.results import read_predictions


def _run_digits(demo_kit, *faults: str, npu_ms: float = 0.2, **settings):
    """Run the demo digits on the emulator (fast timing) with ``faults`` injected."""
    return run(
        config(
            dataset=demo_kit.dataset,
            model=demo_kit.models["digits"],
            backend="sim",
            sim=fast_sim(*faults, npu_ms=npu_ms),
            **settings,
        )
    )


def _exactly_once(out: Path, n: int):
    table = read_predictions(out)
    assert sorted(table["index"].to_pylist()) == list(range(n))
    return table


def _core_stats(out: Path) -> dict:
    return {r["core"]: r for r in pq.read_table(out / "core_stats.parquet").to_pylist()}


def test_crash_hang_and_none_are_survived_without_losing_an_item(demo_kit, tmp_path):
    # Early calls: each core's share of the 600 items depends on the machine's load, and on a
    # loaded one a core that started late did fewer than 80 calls (its fault never fired).
    # Which item each fault meets depends on the load too: the item in flight when core 1
    # crashes can be the one retried into core 2's hang. Each fault fires once, so four
    # attempts are enough for an item to meet all three and still succeed.
    result = _run_digits(
        demo_kit,
        "crash:core=1:call=12",
        "hang:core=2:call=16",
        "none:core=0:call=8",
        timeout_s=1.0,
        max_attempts=4,
        limit=600,
        out=tmp_path / "o",
    )
    assert (result.status, exit_code(result), result.errors) == ("complete", 0, 0)
    table = _exactly_once(result.out, 600)
    assert table["error"].null_count == 600
    stats = _core_stats(result.out)
    assert stats[1]["restarts"] >= 1 and stats[2]["restarts"] >= 1
    assert stats[None]["restarts"] >= 2
    assert max(table["attempt"].to_pylist()) >= 2  # the None and the crashed item were retried
    assert any("hung for more than 1 s" in w for w in result.warnings)
    assert any("core 1: worker process crashed" in w for w in result.warnings)


# Three worker restarts; default tier: a poison item on one core (test_liveness.py), retries on
# other cores (the next test).
@pytest.mark.slow
def test_an_item_that_kills_every_worker_becomes_one_error_row(demo_kit, tmp_path):
    result = _run_digits(demo_kit, "crash:item=100", limit=300, out=tmp_path / "o")
    assert (result.status, exit_code(result), result.errors) == ("complete", 1, 1)
    table = _exactly_once(result.out, 300)
    errors = [r for r in table.to_pylist() if r["error"] is not None]
    assert [r["index"] for r in errors] == [100]
    message = errors[0]["error"]
    cores = {int(part.split(":")[0].split()[-1]) for part in message.split("; ")}
    assert len(cores) == 2, message  # two attempts, on two different cores
    assert "crashed" in message
    assert errors[0]["attempt"] == 2 and errors[0]["pred"] is None


def test_inference_returning_none_every_time_is_an_error_row_after_retries(demo_kit, tmp_path):
    result = _run_digits(demo_kit, "none:item=7", limit=50, max_attempts=3, out=tmp_path / "o")
    assert exit_code(result) == 1
    table = _exactly_once(result.out, 50)
    (row,) = [r for r in table.to_pylist() if r["error"] is not None]
    assert row["index"] == 7 and row["attempt"] == 3
    assert row["error"].count("returned None") == 3
    # Each attempt says why, in the runtime's own words (its E line).
    assert row["error"].count("returned None: E RKNN: failed to submit!") == 3, row["error"]
    assert len({part.split(":")[0] for part in row["error"].split("; ")}) == 3  # three cores


def test_broken_files_become_error_rows_naming_the_file(demo_kit, tmp_path):
    data = tmp_path / "data"
    good = sorted(demo_kit.dataset.glob("3/*.png"))[:20]
    (data / "3").mkdir(parents=True)
    for path in good:
        shutil.copy(path, data / "3" / path.name)
    (data / "3" / "empty.png").write_bytes(b"")
    (data / "3" / "text.png").write_text("not an image")
    png = good[0].read_bytes()
    (data / "3" / "truncated.png").write_bytes(png[: len(png) // 2])
    result = run(
        config(
            dataset=data,
            model=demo_kit.models["digits"],
            backend="sim",
            sim=fast_sim(),
            out=tmp_path / "o",
        )
    )
    assert (exit_code(result), result.errors, result.succeeded) == (1, 3, 20)
    table = _exactly_once(result.out, 23)
    errors = {r["id"]: r for r in table.to_pylist() if r["error"] is not None}
    assert set(errors) == {"3/empty.png", "3/text.png", "3/truncated.png"}
    for name, row in errors.items():
        assert name in row["error"]
        assert row["core"] is None and row["attempt"] == 0  # not retried
    assert "empty" in errors["3/empty.png"]["error"]
    manifest = json.loads((result.out / "manifest.json").read_text())
    assert manifest["counts"]["input_errors"] == 3


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_a_core_that_cannot_start_is_retired_and_the_run_goes_on(demo_kit, tmp_path):
    # Slow enough that the run is still going when core 1 fails (a run done by the cores
    # that were up first does not wait for the others).
    result = _run_digits(demo_kit, "init:core=1", npu_ms=20, limit=100, out=tmp_path / "o")
    assert exit_code(result) == 0
    assert any(w.startswith("core 1 retired") for w in result.warnings)
    table = _exactly_once(result.out, 100)
    assert set(table["core"].to_pylist()) <= {0, 2}  # both, unless one started late
    manifest = json.loads((result.out / "manifest.json").read_text())
    assert manifest["retired_cores"] == [1]


def test_no_core_starting_is_a_run_failure(demo_kit, tmp_path):
    with pytest.raises(NoCoreError, match="no NPU core could be started") as info:
        _run_digits(demo_kit, "init:core=0", "init:core=1", cores=(0, 1), out=tmp_path / "o")
    assert info.value.exit_code == 3
    # The same failure on every core is said once, without advice to leave a core out.
    assert str(info.value).startswith(
        "no NPU core could be started: NPU cores 0, 1 could not be initialised "
        "(init_runtime returned -1); check the sim faults"
    )
    assert "leave core" not in str(info.value)
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "no NPU core could be started" in manifest["error"]
    assert "runtime.cores" in manifest["warnings"][0] and "{" not in manifest["warnings"][0]


class _Said:
    """Records what the console would print: the engine's Warned events."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def notify(self, event: object) -> None:
        if isinstance(event, ev.Warned):
            self.lines.append(event.message)


def test_every_core_failing_alike_is_said_once_not_once_per_core(demo_kit, tmp_path):
    said = _Said()
    faults = ("init:core=0", "init:core=1", "init:core=2")
    with pytest.raises(NoCoreError) as info:
        run(
            config(
                dataset=demo_kit.dataset,
                model=demo_kit.models["digits"],
                backend="sim",
                sim=fast_sim(*faults),
                out=tmp_path / "o",
            ),
            observers=[said],
        )
    assert str(info.value).count("could not be initialised") == 1
    assert "NPU cores 0, 1, 2 could not be initialised" in str(info.value)
    assert not [line for line in said.lines if "retired" in line], said.lines
    # The manifest still records each core's retirement.
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert sum("retired" in w for w in manifest["warnings"]) == 3


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_cores_that_fail_alike_at_start_are_said_in_one_line(demo_kit, tmp_path):
    said = _Said()
    # Slow enough that core 1 alone is still busy when the others have failed (a run done
    # before a core finishes starting does not wait for it).
    result = run(
        config(
            dataset=demo_kit.dataset,
            model=demo_kit.models["digits"],
            backend="sim",
            sim=fast_sim("init:core=0", "init:core=2", npu_ms=20),
            limit=60,
            out=tmp_path / "o",
        ),
        observers=[said],
    )
    assert exit_code(result) == 0
    retired = [line for line in said.lines if "retired" in line]
    assert retired == [
        "cores 0, 2 retired: NPU cores 0, 2 could not be initialised (init_runtime returned "
        "-1); leave cores 0, 2 out of runtime.cores, or check the sim faults "
        "(runtime.sim.faults, BATCHINFER_SIM_FAULTS) and the E lines above."
    ]
    assert retired[0].settings == ("runtime.cores",)  # a reference each front end renders
    recorded = [w for w in result.warnings if "retired" in w]  # one per core in the record
    assert sorted(w.split(":")[0] for w in recorded) == ["core 0 retired", "core 2 retired"]
    _exactly_once(result.out, 60)


@pytest.mark.slow  # waits out a timeout (2-5 s); moved for the default tier's 90 s
def test_a_none_or_hang_on_the_canary_is_retried_before_a_core_is_retired(demo_kit, tmp_path):
    # Each fault fires once, at the first call on its core: the canary.
    result = _run_digits(
        demo_kit,
        "none:core=1:call=1",
        "hang:core=2:call=1",
        # The hang must be seen before cores 0 and 1 finish alone (200 x 50 ms / 2 = 5 s),
        # and no 50 ms call of a loaded machine's may pass for one (the default tier
        # failed with 1 s and 100 x 20 ms under load).
        npu_ms=50,
        timeout_s=2.0,
        limit=200,
        out=tmp_path / "o",
    )
    assert (result.status, exit_code(result)) == ("complete", 0)
    assert not [w for w in result.warnings if "retired" in w], result.warnings
    manifest = json.loads((result.out / "manifest.json").read_text())
    assert manifest["retired_cores"] == []
    assert any("core 2: the canary inference took longer than 2 s" in w for w in result.warnings)
    assert _core_stats(result.out)[2]["restarts"] == 1  # the hang: killed and restarted
    _exactly_once(result.out, 200)


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_a_canary_that_keeps_returning_none_retires_its_core(demo_kit, tmp_path):
    faults = [f"none:core=1:call={n}" for n in (1, 2, 3)]
    result = _run_digits(demo_kit, *faults, npu_ms=20, limit=60, out=tmp_path / "o")
    assert exit_code(result) == 0
    (retired,) = [w for w in result.warnings if "retired" in w]
    assert retired.startswith("core 1 retired: the canary inference failed: Inference returned")
    assert retired.endswith("(3 tries).")
    _exactly_once(result.out, 60)


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_canary_names_a_core_whose_outputs_differ(demo_kit, tmp_path):
    # Slow enough that core 2 is up before cores 0 and 1 have done the 20 items alone (a
    # core that did no item is not judged).
    result = _run_digits(demo_kit, "skew:core=2", npu_ms=100, limit=20, out=tmp_path / "o")
    canary = [w for w in result.warnings if "canary" in w]
    assert len(canary) == 1 and canary[0].startswith("core 2 ")


def test_full_disk_while_writing_is_a_clear_error_and_the_run_resumes(
    demo_kit, tmp_path, monkeypatch
):
    import batchinfer.sink.predictions as predictions

    real_write = predictions.write_table_atomically
    calls = {"n": 0}

    def write_until_full(table, path, **options):
        calls["n"] += 1
        if calls["n"] > 2:
            raise predictions.write_error(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        real_write(table, path, **options)

    monkeypatch.setattr(predictions, "write_table_atomically", write_until_full)
    cfg = config(
        dataset=demo_kit.dataset,
        model=demo_kit.models["digits"],
        backend="sim",
        sim=fast_sim(),
        limit=400,
        part_rows=50,
        out=tmp_path / "o",
    )
    with pytest.raises(OutputWriteError, match=r"output\.resume") as info:
        run(cfg)
    assert info.value.exit_code == 3
    assert "No space left on device" in str(info.value)
    # The manifest counts what is on disk, not what was collected before the disk filled.
    counts = json.loads((tmp_path / "o" / "manifest.json").read_text())["counts"]
    assert counts["written"] == counts["rows_on_disk"] == read_predictions(tmp_path / "o").num_rows
    assert counts["rows_on_disk"] == 100 and counts["collected_not_written"] > 0
    monkeypatch.setattr(predictions, "write_table_atomically", real_write)
    resumed = dataclasses.replace(cfg.output, resume=True)
    result = run(dataclasses.replace(cfg, output=resumed))
    assert exit_code(result) == 0
    assert result.skipped == 100  # the two parts that made it to disk
    _exactly_once(result.out, 400)


def test_segments_of_dead_coordinators_are_swept(tmp_path):
    # In a folder of its own: in /dev/shm, a run started by a test on another xdist worker
    # swept the dead segment first, and this sweep found nothing (a CI failure).
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    name = f"{SEGMENT_PREFIX}-{dead.pid}-0badc0de-in"
    path = tmp_path / name
    path.write_bytes(b"\0" * 64)
    alive = tmp_path / f"{SEGMENT_PREFIX}-{os.getpid()}-0badc0de-in"
    alive.write_bytes(b"\0" * 64)
    swept = sweep_dead_segments(str(tmp_path))
    assert name in swept and not path.exists()
    assert alive.exists()  # a live coordinator's segment is never touched


def test_shm_space_is_checked_with_numbers_and_a_remedy():
    with pytest.raises(SharedMemoryError) as info:
        check_free_space(1 << 60)
    message = str(info.value)
    assert "MiB" in message and "runtime.slots" in message and "--shm-size" in message
    assert info.value.exit_code == 3


@pytest.mark.parametrize("limit", [32, 40])
def test_too_low_an_open_file_limit_is_one_sentence_exit_3_and_a_failed_manifest(
    demo_kit, tmp_path, limit
):
    out = tmp_path / "o"
    argv = [
        sys.executable, "-m", "batchinfer", "run", str(demo_kit.dataset), "--limit", "50",
        "--model", str(demo_kit.models["digits"]), "--backend", "sim", "--sim-npu-ms", "0.2",
        "--readers", "2", "--out", str(out), "--no-progress",
    ]  # fmt: skip
    script = f"ulimit -n {limit} && exec {subprocess.list2cmdline(argv)}"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert f"the limit on open files is {limit} (ulimit -n)" in lines[0]
    assert "needs about 47" in lines[0]  # 3 core workers and 2 readers
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "ulimit -n" in manifest["error"]
    assert not [p for p in Path("/dev/shm").iterdir() if f"-{manifest['pid']}-" in p.name]


def test_running_out_of_open_files_later_is_one_sentence_and_leaves_nothing(
    demo_kit, tmp_path, monkeypatch
):
    from batchinfer.engine.plumbing.children import ChildPool

    real = ChildPool.start
    started = []

    def third_child_out_of_files(self, *args, **kwargs):
        if len(started) == 2:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        started.append(real(self, *args, **kwargs))
        return started[-1]

    monkeypatch.setattr(ChildPool, "start", third_child_out_of_files)
    with pytest.raises(RunFailedError, match="ran out of open files") as info:
        _run_digits(demo_kit, limit=20, out=tmp_path / "o")
    assert info.value.exit_code == 3
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    # A child still starting when the run failed is killed at once; one its fork server had
    # not forked yet has no pid (and never runs: it finds its life pipe closed). The leak
    # guard (conftest.py) checks no process of ours is left either way.
    assert all(c.proc.pid is None or not psutil.pid_exists(c.proc.pid) for c in started)
    assert not [p for p in Path("/dev/shm").iterdir() if f"-{os.getpid()}-" in p.name]


# ------------------------------------------------------------------ interruptions (CLI)
def _start_cli(demo_kit, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "batchinfer", "run", str(demo_kit.dataset),
        "--model", str(demo_kit.models["digits"]), "--backend", "sim",
        "--sim-npu-ms", "3", "--sim-host-ms", "0", "--cores", "0",
        "--out", str(out), "--no-progress", "--part-rows", "40", *extra,
    ]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_started(proc: subprocess.Popen) -> None:
    for line in proc.stderr:
        if line.startswith("started:"):
            return
    raise AssertionError(f"the run never started (exit {proc.wait()})")


def _wait_for_first_part(out: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not list((out / "predictions").glob("part-*.parquet")):
        assert proc.poll() is None and time.monotonic() < deadline, "no part was written"
        time.sleep(0.02)


def _resume_and_check(demo_kit, out: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "batchinfer",
            "run",
            str(demo_kit.dataset),
            "--model",
            str(demo_kit.models["digits"]),
            "--backend",
            "sim",
            "--sim-npu-ms",
            "0.2",
            "--sim-host-ms",
            "0",
            "--out",
            str(out),
            "--resume",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "already done (resumed)" in done.stdout
    _exactly_once(out, 1797)
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"


@pytest.mark.slow  # 2.5 s; default-tier sibling: test_output_safety.py's SIGHUP stop and resume
def test_sigint_finishes_in_flight_items_then_resume_completes(demo_kit, tmp_path):
    out = tmp_path / "o"
    proc = _start_cli(demo_kit, out)
    _wait_for_started(proc)
    _wait_for_first_part(out, proc)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    written = read_predictions(out).num_rows
    assert 40 <= written < 1797
    assert manifest["counts"]["written"] == written
    _resume_and_check(demo_kit, out)


@pytest.mark.slow  # default tier: SIGINT then resume; kill -9 leaves nothing (test_liveness.py)
def test_sigkill_of_the_coordinator_then_resume_completes(demo_kit, tmp_path):
    out = tmp_path / "o"
    proc = _start_cli(demo_kit, out)
    _wait_for_started(proc)
    _wait_for_first_part(out, proc)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children
    proc.kill()
    proc.communicate(timeout=30)
    # Workers, readers and the resource tracker notice the coordinator is gone and exit.
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive
    assert not [n for n in os.listdir("/dev/shm") if f"-{proc.pid}-" in n]
    _resume_and_check(demo_kit, out)


def test_a_second_sigint_stops_at_once_and_still_releases_shared_memory(demo_kit, tmp_path):
    out = tmp_path / "o"
    hang = ["--inference-timeout-s", "30", "--sim-fault", "hang:core=0:call=5"]
    proc = _start_cli(demo_kit, out, *hang)
    # The hang keeps an item in flight, so the first SIGINT alone would wait for it.
    for line in proc.stderr:
        if "this call never returns" in line:
            break
    proc.send_signal(signal.SIGINT)
    for line in proc.stderr:
        if "press Ctrl-C again" in line:
            break
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"
    # no_leaks checks that no segment of the (now dead) coordinator and no child is left


def test_emulator_state_of_runs_that_are_gone_is_swept(tmp_path):
    import tempfile

    from batchinfer.options import SimOptions
    from batchinfer.runtime.backends import SimBackend, sweep_sim_states

    old = tempfile.tempdir
    tempfile.tempdir = str(tmp_path)
    try:
        live = SimBackend(Path("m.onnx"), SimOptions()).for_run()  # holds its owner lock
        dead = SimBackend(Path("m.onnx"), SimOptions()).for_run()
        os.close(dead._owner_fd)  # as if its coordinator had died: nobody holds the lock
        per_user = tmp_path / "batchinfer-sim-0"  # the emulator's default board: never swept
        per_user.mkdir()
        swept = sweep_sim_states(tmp_path)
        assert swept == [Path(dead.state_dir)]
        assert Path(live.state_dir).exists() and per_user.exists()
        live.end_run()
        assert not Path(live.state_dir).exists()
    finally:
        tempfile.tempdir = old


class _KillReaderAfter:
    """An observer that SIGKILLs reader 0 once ``n`` rows are done, as the OOM killer would."""

    def __init__(self, n: int) -> None:
        self.n, self.done, self.readers, self.killed = n, 0, {}, []

    def notify(self, event) -> None:
        from batchinfer.engine import events as ev

        if isinstance(event, ev.ChildReady) and event.kind == "reader":
            self.readers[event.key] = event.pid
        elif isinstance(event, ev.RowsDone):
            self.done += len(event.rows)
            if self.done >= self.n and not self.killed:
                self.killed.append(self.readers[0])
                os.kill(self.readers[0], signal.SIGKILL)


def test_a_reader_that_dies_is_replaced_and_nothing_is_lost(demo_kit, tmp_path):
    killer = _KillReaderAfter(100)
    cfg = config(
        dataset=demo_kit.dataset,
        model=demo_kit.models["digits"],
        backend="sim",
        sim=fast_sim(),
        limit=400,
        out=tmp_path / "o",
    )
    result = run(cfg, observers=[killer])
    assert killer.killed
    assert any(w.startswith("reader 0 died (exit code -9)") for w in result.warnings)
    table = _exactly_once(result.out, 400)
    # The item it was decoding, if any, was charged one attempt and read again.
    assert table["error"].null_count == 400
    assert exit_code(result) == 0


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_a_decode_timeout_shorter_than_the_readers_start_up_has_no_false_hangs(
    demo_kit, tmp_path, monkeypatch
):
    """A reader's clock starts when it is ready and has started the item, never when the item
    was sent to a process still importing: 0.3 s turned valid 8x8 PNGs into error rows.
    Every child's start is held (tests/held_start.py) for 2.5 s, more than twice the 1 s
    decode timeout, while the run sends the readers their items; 1 s is ample for the decode
    of an 8x8 PNG on a loaded machine (0.3 s was not, at a load average of 17)."""
    cfg = config(
        dataset=demo_kit.dataset,
        model=demo_kit.models["digits"],
        limit=300,
        backend="sim",
        sim=fast_sim(),
        decode_timeout_s=1.0,
        readers=2,
        out=tmp_path / "o",
    )
    with hold_children(monkeypatch, tmp_path) as release:
        timer = threading.Timer(2.5, release.set)  # the fault's length, not a wait for it
        timer.start()
        try:
            result = run(cfg)
        finally:
            timer.cancel()
    assert exit_code(result) == 0
    assert read_predictions(result.out)["error"].null_count == 300


# Seven FIFOs: more than MAX_READER_DEATHS / max_attempts, 14 s of timeouts waited out; one
# in the default tier (the limit's accounting is tested in test_scheduler.py). The FIFO blocks
# for ever; the 1 s decode timeout is ample for the other items' 8x8 PNGs on a loaded
# machine (at 0.5 s one of 30 was stuck now and then at a load average of 17), and they are
# 10, as few as it takes to see the run go on around the hung one.
@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
@pytest.mark.parametrize("fifos", [1, pytest.param(7, marks=pytest.mark.slow)])
def test_a_file_that_blocks_on_open_becomes_an_error_row_and_costs_no_reader_limit(
    demo_kit, tmp_path, fifos, monkeypatch
):
    data = tmp_path / "data"
    (data / "3").mkdir(parents=True)
    for path in sorted(demo_kit.dataset.glob("3/*.png"))[:10]:
        shutil.copy(path, data / "3" / path.name)
    # A FIFO nobody writes to, behind an image name, which the readers are told to open as
    # a plain file (HANGING_FILE_ENV, for tests): open() blocks for ever, like a file on a
    # dead network mount. (Unasked, a reader refuses a FIFO at once: not a regular file.)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    monkeypatch.setenv(HANGING_FILE_ENV, os.path.realpath(fifo))
    for i in range(fifos):
        (data / "3" / f"hang-{i}.png").symlink_to(fifo)
    cfg = config(
        dataset=data,
        model=demo_kit.models["digits"],
        backend="sim",
        sim=fast_sim(),
        decode_timeout_s=1.0,
        out=tmp_path / "o",
    )
    result = run(cfg)
    assert exit_code(result) == 1
    table = _exactly_once(result.out, 10 + fifos)
    errors = [r for r in table.to_pylist() if r["error"] is not None]
    assert sorted(r["id"] for r in errors) == [f"3/hang-{i}.png" for i in range(fifos)]
    for row in errors:
        assert row["core"] is None
        assert row["error"].count("was stuck for more than 1 s") == 2  # max_attempts
