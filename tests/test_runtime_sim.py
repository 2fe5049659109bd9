"""The sim runtime beyond the contract: settings, time model, shared cores, faults."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import models as M  # tests/ is on sys.path under pytest (no tests/__init__.py)
import numpy as np
import psutil
import pytest

from batchinfer.errors import UsageError
from batchinfer.runtime import constants as C
from batchinfer.runtime import sim as sim_module
from batchinfer.runtime.sim import RKNNLite
from batchinfer.runtime.sim_settings import Fault, SimSettings, parse_fault

X = np.zeros((1, 8, 8, 1), dtype=np.uint8)
_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30

CHILD = """
import json, sys, time
import numpy as np
from batchinfer.runtime.sim import RKNNLite

cfg = json.loads(sys.argv[1])
r = RKNNLite(**cfg["sim"])
r.load_rknn(cfg["model"])
print("ready", r.init_runtime(core_mask=cfg["mask"]), flush=True)
if cfg.get("wait_go"):
    sys.stdin.readline()
if cfg.get("hold"):  # reserve the core as a call would, say until when, and go
    print("held", r._reserve(time.monotonic())[1], flush=True)
    sys.exit()
x = np.zeros((1, 8, 8, 1), dtype=np.uint8)
t0 = time.monotonic()
for i in range(cfg["calls"]):
    r.set_current_item(i)
    print("call", i, flush=True)
    out = r.inference(inputs=[x])
    print("done", i, out is not None, flush=True)
print("span", t0, time.monotonic(), flush=True)
r.release()
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return M.nhwc_uint8_model(tmp_path_factory.mktemp("simmodel"))


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def spawn(tmp_path: Path, model: Path, state: Path) -> Iterator:
    """Start a child process running CHILD; every child is killed and reaped at teardown."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    procs: list[subprocess.Popen] = []

    def start(faults: str = "", calls: int = 3, mask: int = C.NPU_CORE_0, **sim: object):
        sim = {"faults": faults, "state_dir": str(state), "npu_ms": 0, "host_ms": 0, **sim}
        cfg = {"model": str(model), "mask": mask, "calls": calls, "sim": sim}
        cfg["wait_go"] = bool(sim.pop("wait_go", False))
        cfg["hold"] = bool(sim.pop("hold", False))
        proc = subprocess.Popen(
            [sys.executable, str(script), json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def sim(state: Path, model: Path, mask: int = C.NPU_CORE_0, **kw: object) -> RKNNLite:
    kw = {"npu_ms": 0, "host_ms": 0, "faults": "", "state_dir": state, **kw}
    r = RKNNLite(**kw)
    assert r.load_rknn(str(model)) == 0
    assert r.init_runtime(core_mask=mask) == 0
    return r


def run_threads(runtimes: list[RKNNLite], calls: int) -> float:
    """Seconds for every runtime to make ``calls`` inference calls, one thread each."""
    barrier = threading.Barrier(len(runtimes) + 1)
    failures: list[int] = []

    def loop(r: RKNNLite) -> None:
        barrier.wait()
        for _ in range(calls):
            if r.inference(inputs=[X], reuse_outputs=True) is None:
                failures.append(1)

    threads = [threading.Thread(target=loop, args=(r,)) for r in runtimes]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    for r in runtimes:
        r.release()
    assert not failures
    return elapsed


# ---------------------------------------------------------------- settings and fault specs
@pytest.mark.parametrize(
    ("spec", "fault"),
    [
        ("crash:core=1:call=5", Fault("crash", core=1, call=5)),
        ("hang:core=0:call=1", Fault("hang", core=0, call=1)),
        ("none:item=7", Fault("none", item=7)),
        ("crash:item=0", Fault("crash", item=0)),
        ("init:core=2", Fault("init", core=2)),
        ("init:core=2:call=3", Fault("init", core=2, call=3)),
        ("leak:mb=4", Fault("leak", mb=4.0)),
        ("leak:core=1:mb=0.5", Fault("leak", core=1, mb=0.5)),
    ],
)
def test_parse_fault_accepts_the_documented_forms(spec: str, fault: Fault) -> None:
    assert parse_fault(spec) == fault
    assert str(fault) == spec


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "boom:core=0:call=1",
        "crash",
        "crash:core=0",
        "crash:call=3",
        "crash:core=0:call=0",
        "init:item=3",
        "none:core=0:call=1:item=2",
        "crash:core=x:call=1",
        "crash:call=1:core=0",
        "CRASH:item=1",
        "leak",
        "leak:core=1",
        "leak:core=1:call=2:mb=4",
        "leak:item=3:mb=4",
        "crash:core=0:call=1:mb=4",
    ],
)
def test_parse_fault_rejects_everything_else(spec: str) -> None:
    with pytest.raises(UsageError, match=r"KIND:core=C:call=N"):
        parse_fault(spec)


def _own_memory_mb() -> float:
    """This process's memory as the engine watches a worker's (engine/plumbing/usage.py)."""
    info = psutil.Process().memory_info()
    return (info.rss - info.shared) / 2**20


def test_a_leak_fault_keeps_memory_per_call_on_its_core_only(model: Path, state: Path) -> None:
    leaky = sim(state, model, C.NPU_CORE_1, faults="leak:core=1:mb=8")
    clean = sim(state, model, C.NPU_CORE_0, faults="leak:core=1:mb=8")
    try:
        # Earlier tests in this process may have left freed pages that are still resident;
        # malloc would hand them to the leak and RSS would not grow: give them back first.
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        before = _own_memory_mb()
        for _ in range(3):
            assert clean.inference(inputs=[X]) is not None
        assert _own_memory_mb() - before < 8  # core 0 does not leak
        for _ in range(4):
            assert leaky.inference(inputs=[X]) is not None
        assert _own_memory_mb() - before >= 4 * 8 * 0.9  # resident, not merely reserved
    finally:
        leaky.release()
        clean.release()
        sim_module._LEAKED.clear()  # this is the test process: give it back


def test_settings_come_from_env_and_overrides_win(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BATCHINFER_SIM_CHIP", "rk3576")
    monkeypatch.setenv("BATCHINFER_SIM_NPU_MS", "3.5")
    monkeypatch.setenv("BATCHINFER_SIM_HOST_MS", "1")
    monkeypatch.setenv("BATCHINFER_SIM_FAULTS", "none:item=2; init:core=1")
    monkeypatch.setenv("BATCHINFER_SIM_STATE", str(tmp_path))
    s = SimSettings.from_env()
    assert (s.chip, s.npu_ms, s.host_ms, s.state_dir) == ("rk3576", 3.5, 1.0, tmp_path)
    assert s.faults == (Fault("none", item=2), Fault("init", core=1))
    s = SimSettings.from_env(chip="rk3588", npu_ms=0, faults="", state_dir=None)
    assert (s.chip, s.npu_ms, s.faults, s.state_dir) == ("rk3588", 0.0, (), tmp_path)


def test_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CHIP", "NPU_MS", "HOST_MS", "FAULTS", "STATE"):
        monkeypatch.delenv(f"BATCHINFER_SIM_{name}", raising=False)
    s = SimSettings.from_env()
    assert (s.chip, s.npu_ms, s.host_ms, s.faults) == ("rk3588", 2.0, 4.0, ())
    assert s.state_dir == Path(tempfile.gettempdir()) / f"batchinfer-sim-{os.getuid()}"
    assert not str(s.state_dir).startswith("/dev/shm")


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"chip": "rk9999"}, "rk3588"),
        ({"npu_ms": "fast"}, "milliseconds"),
        ({"host_ms": -1}, "milliseconds"),
        ({"chip": "rk3576", "faults": "crash:core=2:call=1"}, "core below 2"),
        ({"faults": "crash:core=0"}, "KIND:core=C:call=N"),
    ],
)
def test_bad_settings_raise_usage_errors(overrides: dict, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        SimSettings.from_env(**overrides)


def test_board_file_is_per_chip_in_state_dir(state: Path, model: Path) -> None:
    r = sim(state, model, chip="rk3576")
    assert (state / "rk3576.board").is_file()
    r.release()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux-only")
def test_timer_slack_is_tightened(state: Path, model: Path) -> None:
    prctl = ctypes.CDLL(None).prctl
    result: list[tuple[int, int]] = []

    def init_in_fresh_thread() -> None:
        prctl(_PR_SET_TIMERSLACK, 50_000, 0, 0, 0)  # the default; threads inherit it
        before = prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
        r = sim(state, model)
        result.append((before, prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)))
        r.release()

    t = threading.Thread(target=init_in_fresh_thread)
    t.start()
    t.join()
    assert result[0][0] == 50_000
    assert result[0][1] == 1  # 1 ns after init_runtime


# ---------------------------------------------------------------- time model
# Wall-clock rates are bounded from above only (the emulator never beats its model: each call
# waits for an absolute deadline); how close it comes is measured by tools/bench_sim.py,
# not asserted, as a loaded machine slows any call. Which core a call holds, and from when
# to when, is read from the board's reservations (_reserve), which do not depend on load.
@pytest.mark.parametrize(("k", "host_ms", "npu_ms", "calls"), [(1, 10, 5, 20), (2, 10, 5, 20)])
def test_throughput_never_beats_the_time_model(
    state: Path, model: Path, k: int, host_ms: float, npu_ms: float, calls: int
) -> None:
    runtimes = [sim(state, model, host_ms=host_ms, npu_ms=npu_ms) for _ in range(k)]
    rate = k * calls / run_threads(runtimes, calls)
    bound = min(k / (host_ms + npu_ms), 1 / npu_ms) * 1000
    assert rate <= 1.02 * bound


# A reservation no test waits out (under the board's 60 s staleness): it only fills the board.
LONG_MS = 30_000.0


def _hold(runtime: RKNNLite) -> float:
    """Reserve ``runtime``'s core(s) as a call would, without waiting; the end of the hold."""
    fired, end = runtime._reserve(time.monotonic())
    assert fired is None
    return end


def test_a_core_is_held_exclusively(state: Path, model: Path) -> None:
    # Host time alone would allow 300 calls/s; the core caps it at 1/npu_ms = 200.
    runtimes = [sim(state, model, host_ms=5, npu_ms=5) for _ in range(3)]
    rate = 3 * 15 / run_threads(runtimes, 15)
    assert rate <= 1.02 * 200
    first, second = sim(state, model, npu_ms=LONG_MS), sim(state, model, npu_ms=5)
    end = _hold(first)
    assert _hold(second) == pytest.approx(end + 0.005)  # queued behind the long hold
    first.release(), second.release()


def test_different_cores_run_in_parallel(state: Path, model: Path) -> None:
    on_0 = sim(state, model, mask=C.NPU_CORE_0, npu_ms=LONG_MS)
    on_1 = sim(state, model, mask=C.NPU_CORE_1, npu_ms=10)
    long = _hold(on_0)
    assert _hold(on_1) < long - 20  # not queued behind core 0's long hold
    on_0.release(), on_1.release()


def test_a_call_frozen_in_its_reservation_holds_up_its_own_core_only(
    state: Path, model: Path
) -> None:
    # A core worker stopped (SIGSTOP) while a call of it was reserving its core: the one
    # chip-wide lock then stalled every core's calls until the watchdog killed the frozen
    # worker, and the healthy cores' items were killed as hung (a soak's freeze in CI).
    # On a board a frozen process holds up no other core.
    frozen, same_core = sim(state, model, mask=C.NPU_CORE_2), sim(state, model, mask=C.NPU_CORE_2)
    other_core = sim(state, model, mask=C.NPU_CORE_0)
    inside, thaw = threading.Event(), threading.Event()
    board = frozen._board
    assert board is not None
    reserve = board.hold

    def stop_inside(core: int, start: float, end: float) -> None:
        inside.set()
        thaw.wait()
        reserve(core, start, end)

    board.hold = stop_inside  # type: ignore[method-assign]
    threads = [threading.Thread(target=_hold, args=(r,)) for r in (frozen, same_core, other_core)]
    try:
        threads[0].start()
        assert inside.wait(10)
        threads[1].start()
        threads[2].start()
        threads[2].join(10)
        assert not threads[2].is_alive(), "core 0 waited for the frozen call on core 2"
        assert threads[1].is_alive()  # core 2's own calls do wait for it
    finally:
        thaw.set()
        for t in threads:
            t.join(10)
    for r in (frozen, same_core, other_core):
        r.release()


def test_a_runtime_is_created_while_another_holds_the_boards_set_up_lock(
    state: Path, model: Path
) -> None:
    # A worker frozen while creating its runtime held the board's lock: every other core's
    # worker restart then waited for it. Once the board is set up, creating one takes no lock.
    first = sim(state, model)
    board = first._board
    assert board is not None
    made: list[RKNNLite] = []
    with board.locked():
        t = threading.Thread(target=lambda: made.append(sim(state, model, mask=C.NPU_CORE_1)))
        t.start()
        t.join(10)
        assert made, "creating a runtime waited for the board's lock"
    t.join(10)
    for r in (first, *made):
        r.release()


def test_auto_takes_the_core_that_frees_first(state: Path, model: Path) -> None:
    held = [sim(state, model, mask=mask, npu_ms=LONG_MS) for mask in (C.NPU_CORE_0, C.NPU_CORE_2)]
    ends = [_hold(r) for r in held]
    auto = sim(state, model, mask=C.NPU_CORE_AUTO, npu_ms=10)
    assert _hold(auto) < min(ends) - 20  # took core 1, the free one
    assert auto._board.busy_until(1, time.monotonic()) < min(ends) - 20
    for r in [*held, auto]:
        r.release()


def test_a_multi_core_mask_splits_the_npu_time(state: Path, model: Path) -> None:
    r = sim(state, model, mask=C.NPU_CORE_0_1_2, npu_ms=15)
    before = time.monotonic()
    end = _hold(r)
    # 15 ms / 3 cores, held on all three from a common start; on one core 15 ms.
    assert before + 0.005 <= end <= time.monotonic() + 0.005
    assert [r._board.busy_until(c, before) for c in range(3)] == [end] * 3
    r.release()


def test_the_emulated_calls_take_the_multi_core_split_time(state: Path, model: Path) -> None:
    elapsed = run_threads([sim(state, model, mask=C.NPU_CORE_0_1_2, npu_ms=15)], 10)
    assert elapsed >= 0.045  # 10 x 15 ms / 3 cores: never less


def test_two_processes_sharing_a_core_serialise(spawn, state: Path, model: Path) -> None:
    # Another process holds core 1 (the board is shared through a file): a call here on
    # core 1 is queued behind that hold, one on core 0 is not.
    other = spawn(mask=C.NPU_CORE_1, npu_ms=LONG_MS, hold=True)
    out, err = other.communicate(timeout=60)
    assert other.returncode == 0, err
    held_until = float(out.splitlines()[-1].split()[1])
    on_1, on_0 = sim(state, model, mask=C.NPU_CORE_1, npu_ms=10), sim(state, model, npu_ms=10)
    assert _hold(on_1) == pytest.approx(held_until + 0.010)
    assert _hold(on_0) < held_until - 20
    on_1.release(), on_0.release()


# ---------------------------------------------------------------- faults
def test_none_fault_fires_once_at_the_nth_call(
    state: Path, model: Path, capfd: pytest.CaptureFixture
) -> None:
    r = sim(state, model, faults="none:core=0:call=2")
    results = [r.inference(inputs=[X]) is not None for _ in range(4)]
    assert results == [True, False, True, True]
    assert "E RKNN:" in capfd.readouterr().err
    r.release()


def test_call_counts_are_per_core(state: Path, model: Path) -> None:
    on_0 = sim(state, model, mask=C.NPU_CORE_0, faults="none:core=1:call=2")
    on_1 = sim(state, model, mask=C.NPU_CORE_1, faults="none:core=1:call=2")
    assert [on_0.inference(inputs=[X]) is not None for _ in range(3)] == [True] * 3
    assert [on_1.inference(inputs=[X]) is not None for _ in range(3)] == [True, False, True]


def test_item_fault_fires_every_time_for_that_item(state: Path, model: Path) -> None:
    r = sim(state, model, faults="none:item=3")
    r.set_current_item(3)
    assert r.inference(inputs=[X]) is None
    assert r.inference(inputs=[X]) is None
    r.set_current_item(2)
    assert r.inference(inputs=[X]) is not None
    r.set_current_item(None)
    assert r.inference(inputs=[X]) is not None


def test_init_fault_on_a_core_fails_every_init_there(state: Path, model: Path) -> None:
    r = RKNNLite(faults="init:core=1", state_dir=state, npu_ms=0, host_ms=0)
    r.load_rknn(str(model))
    assert r.init_runtime(core_mask=C.NPU_CORE_1) == -1
    assert r.init_runtime(core_mask=C.NPU_CORE_1) == -1
    assert r.init_runtime(core_mask=C.NPU_CORE_0_1) == -1
    assert r.init_runtime(core_mask=C.NPU_CORE_0) == 0
    assert r.init_runtime(core_mask=C.NPU_CORE_AUTO) == 0
    r.release()


def test_a_device_that_refuses_keeps_a_runtime_as_the_wheel_does(
    state: Path, model: Path, tmp_path: Path
) -> None:
    # The device refuses in the wheel's build_graph step: rknn_runtime is kept, unusable.
    r = RKNNLite(faults="init:core=1", state_dir=state, npu_ms=0, host_ms=0)
    r.load_rknn(str(model))
    assert r.init_runtime(core_mask=C.NPU_CORE_1) == -1
    with pytest.raises(Exception, match="RKNN_ERR_DEVICE_UNAVAILABLE"):
        r.rknn_runtime.get_tensor_attr(0)
    assert r.inference(inputs=[X]) is None
    r.release()
    assert r.rknn_runtime is None
    # No runtime can be made at all (as without librknnrt): rknn_runtime stays None.
    blocked = tmp_path / "file"
    blocked.write_text("")
    r = RKNNLite(state_dir=blocked / "state", npu_ms=0, host_ms=0)
    r.load_rknn(str(model))
    assert r.init_runtime() == -1
    assert r.rknn_runtime is None


def test_init_fault_with_call_fails_only_the_nth_init(state: Path, model: Path) -> None:
    r = RKNNLite(faults="init:core=0:call=2", state_dir=state, npu_ms=0, host_ms=0)
    r.load_rknn(str(model))
    assert [r.init_runtime(core_mask=C.NPU_CORE_0) for _ in range(3)] == [0, -1, 0]
    r.release()


def test_crash_fault_kills_the_process(spawn) -> None:
    proc = spawn(faults="crash:core=0:call=2", calls=3)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -9
    assert "done 0 True" in out and "call 1" in out and "done 1" not in out


def test_hang_fault_never_returns(spawn) -> None:
    proc = spawn(faults="hang:core=0:call=1", calls=1)
    assert proc.stdout.readline().startswith("ready")
    assert proc.stdout.readline().strip() == "call 0"
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    proc.kill()


def test_call_fault_fires_once_per_state_dir_across_processes(spawn) -> None:
    first = spawn(faults="crash:core=0:call=2", calls=3)
    first.communicate(timeout=30)
    assert first.returncode == -9
    again = spawn(faults="crash:core=0:call=2", calls=3)  # a restarted worker
    out, err = again.communicate(timeout=30)
    assert again.returncode == 0, err
    assert out.count("True") == 3


def test_item_crash_fires_in_every_process(spawn) -> None:
    for _ in range(2):
        proc = spawn(faults="crash:item=1", calls=3)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == -9
        assert "done 0 True" in out and "done 1" not in out
