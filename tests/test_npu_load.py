"""The NPU load where the board writes it: the driver's text, the sampler, the emulator's file."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import models as M  # tests/ is on sys.path under pytest (no tests/__init__.py)
import numpy as np
import pyarrow.parquet as pq
import pytest
from runs import config, fast_sim

from batchinfer import run
from batchinfer.cli.console import format_summary
from batchinfer.engine import events as ev
from batchinfer.engine.npu_watch import NpuLoadWatch, sampler_for
from batchinfer.runtime import constants as C
from batchinfer.runtime.npu_load import (
    NA,
    NpuLoad,
    NpuLoadSampler,
    board_load_file,
    format_load,
    parse_load,
)
from batchinfer.runtime.sim import RKNNLite
from batchinfer.runtime.sim_load import load_path
from batchinfer.sink.stats import CoreStatsRecorder


@pytest.mark.parametrize(
    ("text", "loads"),
    [
        # RK3588 as boards print it (airockchip/rknn-toolkit2#269, ajokela/rktop#5)
        ("NPU load:  Core0: 63%, Core1: 65%, Core2: 64%,\n", {0: 63.0, 1: 65.0, 2: 64.0}),
        ("NPU load:  Core0:  21%, Core1:  11%, Core2:  0%,", {0: 21.0, 1: 11.0, 2: 0.0}),
        ("NPU load:  Core0: 100%, Core1:  0%,\n", {0: 100.0, 1: 0.0}),  # RK3576
        # one-core NPUs (RK3566/RK3568, RV1126B: nicolargo/glances#3499)
        ("NPU load: 45%\n", {0: 45.0}),
        ("NPU load:  0%\n", {0: 0.0}),
        ("NPU load:  45%", {0: 45.0}),
        # odd spacing
        ("  NPU load:Core0:5%,Core1 : 7 % ,Core2:  9%,  \n\n", {0: 5.0, 1: 7.0, 2: 9.0}),
        # a figure no load can be (rockchip-linux/rknpu2#102) is left out
        ("NPU load:  Core0: 99%, Core1: 99%, Core2: 429496%,", {0: 99.0, 1: 99.0}),
        ("NPU load: 20000%", None),
        # garbage
        ("", None),
        (None, None),
        ("garbage", None),
        ("NPU load: ", None),
        ("NPU load:  Core0: 45%, Core1: ,", None),  # torn
        ("NPU load: abc%", None),
        ("RKNPU driver: v0.9.8\n", None),
        ("\x00\x00\x00", None),
    ],
)
def test_the_parser_reads_the_drivers_formats_and_refuses_the_rest(text, loads):
    assert parse_load(text) == loads


@pytest.mark.parametrize("percents", [[45], [0], [100], [45, 40, 0], [0, 100], [7, 8, 9]])
def test_the_written_text_is_the_drivers_and_reads_back(percents):
    text = format_load(percents)
    if len(percents) == 1:  # seq_printf(m, "%2.d%%", load) after "NPU load: "
        assert text == f"NPU load: {percents[0]:2d}%\n"
    else:
        assert text.startswith("NPU load:  Core0: ") and text.endswith("%,\n")
    assert parse_load(text) == {i: float(p) for i, p in enumerate(percents)}


def test_the_sampler_averages_per_core_and_counts_garbage(tmp_path: Path):
    texts = iter(
        [
            "NPU load:  Core0: 40%, Core1: 10%, Core2:  0%,\n",
            "garbage",
            "NPU load:  Core0: 60%, Core1: 30%, Core2:  0%,\n",
        ]
    )
    sampler = NpuLoadSampler(tmp_path / "load", read=lambda _: next(texts))
    for _ in range(3):
        assert sampler.sample()
    load = sampler.summary()
    assert load.per_core == pytest.approx({0: 0.5, 1: 0.2, 2: 0.0})
    assert load.max_per_core == pytest.approx({0: 0.6, 1: 0.3, 2: 0.0})
    assert load.samples == 2 and sampler.garbled == 1 and load.unreadable is None
    assert load.of((0, 1)) == pytest.approx({0: 0.5, 1: 0.2})
    assert load.to_json()["per_core"] == {"0": 0.5, "1": 0.2, "2": 0.0}


def test_an_unreadable_file_is_said_once_and_takes_no_thread(tmp_path: Path):
    calls = []

    def refuse(path: Path) -> str:
        calls.append(path)
        raise PermissionError(13, "Permission denied")

    sampler = NpuLoadSampler(tmp_path / "load", interval_s=0.01, read=refuse).start()
    sampler.stop()
    load = sampler.summary()
    assert len(calls) == 1  # one read at start, none after
    assert load.per_core is None and load.samples == 0
    assert load.unreadable is not None and "Permission denied" in load.unreadable
    assert NA in load.unreadable and "root" in load.unreadable
    assert load.unreadable.count("\n") == 0


def test_only_garbage_says_so_instead_of_a_figure(tmp_path: Path):
    (tmp_path / "load").write_text("something else\n")
    sampler = NpuLoadSampler(tmp_path / "load")
    sampler.start()
    sampler.stop()
    load = sampler.summary()
    assert load.per_core is None and "none in the driver's format" in (load.unreadable or "")


def test_the_sampler_thread_reads_until_stopped(tmp_path: Path):
    path = tmp_path / "load"
    path.write_text("NPU load: 30%\n")
    seen = threading.Event()

    def read(p: Path) -> str:
        text = p.read_text()
        if "70" in text:
            seen.set()
        return text

    sampler = NpuLoadSampler(path, interval_s=0.01, read=read).start()
    path.write_text("NPU load: 70%\n")
    assert seen.wait(10)
    sampler.stop()
    load = sampler.summary()
    assert load.samples >= 3  # the first read, at least one on the thread, the last
    assert 0.3 < load.per_core[0] < 0.7 and load.max_per_core[0] == pytest.approx(0.7)


def test_a_boards_file_is_debugfs_then_procfs(tmp_path: Path):
    assert board_load_file(tmp_path) == tmp_path / "sys/kernel/debug/rknpu/load"
    (tmp_path / "proc/rknpu").mkdir(parents=True)
    (tmp_path / "proc/rknpu/load").write_text("NPU load: 1%\n")
    assert board_load_file(tmp_path) == tmp_path / "proc/rknpu/load"
    (tmp_path / "sys/kernel/debug/rknpu").mkdir(parents=True)
    (tmp_path / "sys/kernel/debug/rknpu/load").write_text("NPU load: 2%\n")
    assert board_load_file(tmp_path) == tmp_path / "sys/kernel/debug/rknpu/load"


# ---------------------------------------------------------------- the emulator's file
@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return M.nhwc_uint8_model(tmp_path_factory.mktemp("loadmodel"))


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
@pytest.mark.parametrize(("chip", "cores"), [("rk3588", 3), ("rk3566", 1)])
def test_the_emulator_writes_the_drivers_text_from_its_busy_time(
    tmp_path: Path, model: Path, chip: str, cores: int
):
    state = tmp_path / "state"
    r = RKNNLite(chip=chip, state_dir=state, npu_ms=4, host_ms=4)
    r.load_rknn(str(model))
    mask = C.NPU_CORE_0 if cores > 1 else C.NPU_CORE_AUTO
    assert r.init_runtime(core_mask=mask) == 0
    path = load_path(state, chip)
    assert parse_load(path.read_text()) == {c: 0.0 for c in range(cores)}  # at init: idle
    x = np.zeros((1, 8, 8, 1), dtype=np.uint8)
    written = path.stat().st_mtime_ns
    deadline = time.monotonic() + 10
    # Calls until a window of the driver's second has closed under load.
    while path.stat().st_mtime_ns == written and time.monotonic() < deadline:
        assert r.inference(inputs=[x]) is not None
    r.release()
    text = path.read_text()
    loads = parse_load(text)
    assert loads is not None and text == format_load([int(loads[c]) for c in range(cores)])
    # One instance: host 4 ms then NPU 4 ms per call, so core 0 is held about half the
    # time (a loaded machine only stretches the host part: less, never more).
    assert 5 <= loads[0] <= 55
    assert all(loads[c] == 0 for c in range(1, cores))
    assert not [p for p in os.listdir(state) if p.startswith(".")]  # no temporary left


# ---------------------------------------------------------------- a run's watch
class _Backend:
    def __init__(self, name: str, state_dir: Path | None = None, chip: str = "rk3588") -> None:
        self.name, self.state_dir, self._chip = name, state_dir, chip

    def chip(self) -> str:
        return self._chip


def _started() -> ev.Started:
    return ev.Started(10, (0, 1, 2), "sim", 1, 0.0)


def test_the_watch_samples_the_emulated_board_from_cores_ready_until_stopped(tmp_path: Path):
    path = load_path(tmp_path, "rk3588")
    path.write_text(format_load([80, 20, 0]))
    watch = NpuLoadWatch(lambda: _Backend("sim", tmp_path))
    watch.notify(_started())
    assert watch.summary() is not None and watch.summary().per_core is None  # not yet
    watch.notify(ev.CoresReady(0.0))
    watch.stop()
    load = watch.summary()
    assert load is not None and load.unreadable is None and load.samples >= 2
    assert load.per_core == pytest.approx({0: 0.8, 1: 0.2, 2: 0.0})
    assert load.of((0, 1)) == pytest.approx({0: 0.8, 1: 0.2})


def test_a_board_whose_debugfs_is_not_readable_says_so_once(tmp_path: Path, caplog):
    sampler = sampler_for(_Backend("rknnlite"), root=tmp_path)
    assert sampler is not None and sampler.path == tmp_path / "sys/kernel/debug/rknpu/load"
    watch = NpuLoadWatch(lambda: _Backend("rknnlite"))
    watch.notify(_started())
    watch.sampler = sampler  # this machine's root is not a board's: read the folder's
    with caplog.at_level(logging.INFO, logger="batchinfer"):
        watch.notify(ev.CoresReady(0.0))
        watch.notify(ev.CoresReady(1.0))
        watch.stop()
    said = [r.getMessage() for r in caplog.records if "NPU load" in r.getMessage()]
    assert len(said) == 1 and "not readable" in said[0] and "root" in said[0]
    load = watch.summary()
    assert load is not None and load.per_core is None and load.unreadable == said[0]


def test_backends_without_an_npu_have_no_watch():
    for name in ("onnx", "toolkit"):
        assert sampler_for(_Backend(name)) is None
    watch = NpuLoadWatch(lambda: None)  # a cluster: its nodes' NPUs are not this machine's
    watch.notify(_started())
    watch.notify(ev.CoresReady(0.0))
    watch.stop()
    assert watch.summary() is None


def test_the_per_core_table_puts_the_boards_figure_beside_the_busy_time():
    rec = CoreStatsRecorder([0, 1], 1)
    rec.mark_dispatch(0.0)
    rec.record(0, 2.0, 5.0, True)
    rec.record(1, 2.0, 5.0, True)
    rec.set_busy(0, 1.8)
    rec.set_busy(1, 1.0)
    plain = format_summary(rec.table())
    assert "NPU load %" not in plain
    unread = format_summary(rec.table(), npu_load=True)
    header, *rows = unread.splitlines()
    assert header.split()[6:10] == ["util", "%", "NPU", "load"]
    assert all(row.split()[7] == NA for row in rows)
    rec.set_npu_load({0: 0.3})
    table = rec.table()
    assert table.column("npu_load").to_pylist() == [0.3, None, pytest.approx(0.3)]
    rows = format_summary(table, npu_load=True).splitlines()[1:]
    assert [r.split()[6:8] for r in rows] == [["90", "30"], ["50", NA], ["70", "30"]]


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_a_run_on_the_emulator_reports_the_boards_load_per_core(demo_kit, tmp_path: Path):
    # One core, all NPU time (10 ms a call, no host time): 150 calls hold core 0 for 1.5 s,
    # so a driver's window of a second closes under load while the run lasts. How busy
    # core 0 is depends on the host: the gaps between calls are host time, so a loaded
    # host shows less (0.27 at load 19). What holds whatever the load: core 0 is seen busy
    # and the idle cores never (a window the emulator closes reads 0 % for core 0 only when
    # it held a single 10 ms call: the run's 150 calls would take minutes).
    result = run(
        config(
            dataset=demo_kit.dataset,
            model=demo_kit.models["digits"],
            backend="sim",
            sim=fast_sim(npu_ms=10),
            cores=(0,),
            limit=150,
            out=tmp_path / "o",
        )
    )
    assert (result.status, result.errors) == ("complete", 0)
    load = result.npu_load
    assert load is not None and load.unreadable is None and load.samples >= 2
    assert load.per_core is not None and set(load.per_core) == {0, 1, 2}
    assert 0 < load.max_per_core[0] <= 1 and load.per_core[1] == load.per_core[2] == 0
    manifest = json.loads((result.out / "manifest.json").read_text())
    assert manifest["npu_load"]["per_core"]["0"] == pytest.approx(load.per_core[0], abs=1e-4)
    stats = pq.read_table(result.out / "core_stats.parquet").to_pylist()
    assert [r["npu_load"] for r in stats] == [pytest.approx(load.per_core[0])] * 2


def test_bench_takes_the_boards_figure_once_it_has_enough_readings():
    from batchinfer.bench.runner import BOARD_SAMPLES, _npu_loads

    class Fig:
        cores: tuple = ()  # no emulator time model

    board = NpuLoad("/sys/kernel/debug/rknpu/load", {0: 0.4, 1: 0.2, 2: 0.9}, BOARD_SAMPLES)
    loads, source = _npu_loads(Fig(), [], board, (0, 1))
    assert loads == {0: 0.4, 1: 0.2}  # only the measured cores
    assert source == f"/sys/kernel/debug/rknpu/load, {BOARD_SAMPLES} samples"
    few = NpuLoad(board.source, board.per_core, BOARD_SAMPLES - 1)
    assert _npu_loads(Fig(), [], few, (0, 1)) == (None, None)  # and no readings to fall to
    unread = NpuLoad(board.source, unreadable="not readable")
    assert _npu_loads(Fig(), [], unread, (0, 1)) == (None, None)
