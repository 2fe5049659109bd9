"""``batchinfer bench`` end to end on the emulator: one short run (INVALID: too short, by
design), its JSON, Parquet and plots; comparisons and usage errors. Longer runs (a sweep,
a dataset, Ctrl-C) are marked slow."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from dataset_files import digits_3_and_7

from batchinfer.bench.diagnosis import BOUNDS
from batchinfer.bench.options import BenchOptions
from batchinfer.bench.runner import BenchConfig, RepeatedDataset, bench
from batchinfer.cli import main
from batchinfer.data.folder import open_dataset
from batchinfer.demo import make_npy_dataset
from batchinfer.engine import events as ev
from batchinfer.options import RuntimeOptions, SimOptions

SIM = ["--backend", "sim", "--sim-npu-ms", "0.5", "--sim-host-ms", "0"]
SHORT = ["--duration", "0.75", "--warmup", "0.25", "--window", "0.25", "--max-duration", "0.75"]
KEYS = {"valid", "reasons", "diagnosis", "samples_per_s", "latency_ms", "cores", "windows",
        "config", "conditions", "versions"}  # fmt: skip


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


def one_error_line(result: Result, code: int, *needles: str) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ")
    for needle in needles:
        assert needle in line, line
    return line


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, request):
    """One short bench on the emulator (cores 0 and 2), with --json and --out."""
    from batchinfer.demo import model_path

    tmp = tmp_path_factory.mktemp("bench")
    result = invoke(
        "bench", "--model", model_path("pool224"), *SIM, "--cores", "0,2", *SHORT,
        "--min-samples", "10", "--json", tmp / "r.json", "--out", tmp / "out",
    )  # fmt: skip
    return tmp, result


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_a_short_run_is_invalid_as_too_short_and_says_so_in_text_and_json(short_run):
    tmp, result = short_run
    assert result.exit_code == 1, result.output
    assert "\nINVALID\n" in result.stdout
    assert "too short: measured" in result.stdout
    data = json.loads((tmp / "r.json").read_text())
    assert set(data) >= KEYS
    assert data["valid"] is False
    assert data["reasons"][0].startswith("too short: measured")
    assert "(raise --duration)" in data["reasons"][0]  # settings named as the flags typed
    assert data["label"].startswith("emulated NPU (batchinfer sim")


def test_the_json_figures_agree_with_each_other(short_run):
    tmp, _ = short_run
    d = json.loads((tmp / "r.json").read_text())
    windows = d["windows"]
    assert d["measured_s"] == pytest.approx(0.75) and len(windows) == 3
    assert sum(w["samples"] for w in windows) == d["samples"] > 0
    assert d["samples_per_s"] == pytest.approx(d["samples"] / d["measured_s"])
    cores = {c["core"]: c for c in d["cores"]}
    assert set(cores) == {0, 2}
    assert sum(c["samples_per_s"] for c in cores.values()) == pytest.approx(d["samples_per_s"])
    for c in cores.values():
        assert {"core", "samples_per_s", "p50_ms", "p99_ms", "utilization"} <= set(c)
        assert 0 < c["utilization"] <= 1 and 0 < c["npu_load"] <= 1
    lat = d["latency_ms"]
    order = [lat[k] for k in ("min", "p50", "p90", "p95", "p99", "p999", "max")]
    assert order == sorted(order) and lat["min"] >= 0.5  # the emulated NPU time per call
    assert d["diagnosis"]["bound"] in BOUNDS
    assert d["diagnosis"]["npu_load_source"].startswith("emulator time model")
    roles = sorted(p["role"] for p in d["cpu"]["processes"])
    assert roles == ["coordinator", "worker", "worker"]  # synthetic inputs: no readers
    assert d["config"]["source"] == {"kind": "synthetic"}
    assert d["config"]["cores"] == [0, 2] and d["backend"]["npu_ms"] == 0.5
    assert {"before", "after"} <= set(d["conditions"])
    assert d["versions"]["batchinfer"]


def test_out_holds_samples_windows_and_plots(short_run):
    tmp, _ = short_run
    d = json.loads((tmp / "r.json").read_text())
    out = tmp / "out"
    samples = pq.read_table(out / "samples.parquet")
    phases = samples["phase"].to_pylist()
    assert phases.count("measured") == d["samples"]
    assert "warmup" in phases
    t = samples["t_s"].to_numpy()
    measured = np.array([p == "measured" for p in phases])
    assert t[measured].min() >= 0 and t[measured].max() < d["measured_s"]
    windows = pq.read_table(out / "windows.parquet").to_pylist()
    totals = [w for w in windows if w["core"] is None]
    assert [w["samples"] for w in totals] == [w["samples"] for w in d["windows"]]
    for name in ("throughput.png", "latency.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "bench.json").read_text())["samples"] == d["samples"]


def test_compare_exit_codes_no_regression_regression_and_unreadable(short_run):
    tmp, _ = short_run
    a = tmp / "r.json"
    same = invoke("bench", "--compare", a, a)
    assert same.exit_code == 0 and "no regression" in same.stdout
    # The same run with steady windows, and at half its speed (a short run on a busy
    # machine can be noisier than a halving).
    steady = json.loads(a.read_text())
    for w in steady["windows"]:
        w["samples_per_s"] = steady["samples_per_s"]
    (tmp / "steady.json").write_text(json.dumps(steady))
    half = json.loads(json.dumps(steady))
    half["samples_per_s"] /= 2
    for w in half["windows"]:
        w["samples_per_s"] /= 2
    (tmp / "half.json").write_text(json.dumps(half))
    worse = invoke("bench", "--compare", tmp / "steady.json", tmp / "half.json")
    assert worse.exit_code == 1 and "REGRESSION: B (half.json) is 50.0% slower" in worse.stdout
    (tmp / "junk.json").write_text("{not json")
    one_error_line(invoke("bench", "--compare", a, tmp / "junk.json"), 2, "is not JSON")
    one_error_line(
        invoke("bench", "--compare", a, tmp / "missing.json"), 2, "cannot read", "missing.json"
    )


def test_an_out_folder_holding_other_files_is_refused_before_anything_runs(tmp_path):
    from batchinfer.demo import model_path

    (tmp_path / "notes.txt").write_text("mine")
    result = invoke("bench", "--model", model_path("pool224"), *SIM, "--out", tmp_path)
    one_error_line(result, 2, "is not empty and holds no bench result")
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--duration", "0"], ["--duration must be positive"]),
        (["--duration", "2", "--max-duration", "1"], ["--max-duration 1 s is shorter"]),
        (["--max-p99-ms", "5"], ["--max-p99-ms", "add --sweep"]),
        (["--cores", "0,7"], ["--cores 0,7 is not a list of distinct NPU cores"]),
    ],
)
def test_bad_settings_are_one_line_usage_errors(args, needles):
    from batchinfer.demo import model_path

    result = invoke("bench", "--model", model_path("pool224"), *SIM, *args)
    one_error_line(result, 2, *needles)


def test_bench_needs_a_model_unless_it_compares(tmp_path):
    one_error_line(invoke("bench"), 2, "needs --model")
    (tmp_path / "a.json").write_text("{}")
    one_error_line(
        invoke("bench", "--compare", tmp_path / "a.json", tmp_path / "a.json", "--model", "m"),
        2,
        "drop --model",
    )


def test_a_repeated_dataset_starts_again_from_its_first_item_with_new_indexes(tmp_path):
    make_npy_dataset(tmp_path / "npy", 3, shape=(1, 2, 2, 3))
    source = RepeatedDataset(open_dataset(tmp_path / "npy"))
    items = []
    for item in source:
        items.append(item)
        if len(items) == 7:
            source.finish()
    assert [i.index for i in items] == list(range(7))
    assert [i.id for i in items] == ["00000.npy", "00001.npy", "00002.npy"] * 2 + ["00000.npy"]
    assert source.total is None and source.passes == 2


def test_a_bench_dataset_skips_a_mac_zip_s_leftovers_and_refuses_a_bare_rknn_on_sim(
    demo_kit, tmp_path
):
    import shutil

    from batchinfer.bench.runner import prepare
    from batchinfer.errors import ConfigError

    data = digits_3_and_7(demo_kit.dataset, tmp_path / "unzipped", junk=True)
    config = BenchConfig(
        model=demo_kit.models["digits"],
        runtime=RuntimeOptions(backend="sim", cores=(0,)),
        dataset=data,
    )
    prepared = prepare(config)
    assert prepared.dataset is not None and len(prepared.dataset) == 40
    assert prepared.dataset.labels == {"3": 3, "7": 7}
    assert prepared.dataset.leftovers == {"._*": 1, "Thumbs.db": 1, "__MACOSX": 1}
    rknn = demo_kit.rknn["digits-rk3588"]
    bare = tmp_path / "bare" / rknn.name
    bare.parent.mkdir()
    shutil.copy(rknn, bare)
    with pytest.raises(ConfigError, match=r"no digits-rk3588\.onnx beside"):
        prepare(dataclasses.replace(config, model=bare))


# ------------------------------------------------------------------------------ slow
@pytest.mark.slow
def test_a_dataset_run_is_end_to_end_with_readers_and_repeats_the_dataset(tmp_path):
    from batchinfer.demo import model_path

    make_npy_dataset(tmp_path / "npy", 20)
    result = bench(
        BenchConfig(
            model=model_path("pool224"),
            runtime=RuntimeOptions(backend="sim", cores=(0,), readers=1, sim=SimOptions(0.5, 0)),
            bench=BenchOptions(duration_s=1, warmup_s=0.5, window_s=0.25, max_duration_s=1.5),
            dataset=tmp_path / "npy",
        )
    )
    d = result.to_json()
    assert d["config"]["source"]["kind"] == "dataset" and d["config"]["readers"] == 1
    assert d["samples"] > 20  # more than the dataset holds: it was read again
    assert [p["role"] for p in d["cpu"]["processes"]].count("reader") == 1
    assert d["diagnosis"]["read_p50_ms"] is not None
    lim = d["limits"]  # the decode limit from the dataset's files, with the emulator's call
    assert lim["decode_cpu_ms"] > 0 and lim["call_cpu_ms"] > 0
    assert lim["decode_per_s"] == pytest.approx(
        lim["cpus"] * 1e3 / (lim["decode_cpu_ms"] + lim["call_cpu_ms"]), rel=1e-3
    )


@pytest.mark.slow
def test_ctrl_c_while_measuring_keeps_the_whole_windows_and_is_invalid():
    from batchinfer.demo import model_path

    class Interrupt:
        """Sends this process SIGINT (Ctrl-C) 2 s after every core was up.

        Counted from CoresReady, where the warm-up starts, not from Started: on a loaded
        machine the core workers take a while to start, and 1.6 s after Started was
        once only 0.6 s into the measurement (one window instead of two or more)."""

        ready = float("inf")
        sent = False

        def notify(self, event: object) -> None:
            if isinstance(event, ev.CoresReady):
                self.ready = event.t
            elif isinstance(event, ev.RowsDone) and event.t > self.ready + 2.0 and not self.sent:
                self.sent = True
                os.kill(os.getpid(), signal.SIGINT)

    result = bench(
        BenchConfig(
            model=model_path("pool224"),
            runtime=RuntimeOptions(backend="sim", cores=(0,), sim=SimOptions(0.5, 0)),
            bench=BenchOptions(duration_s=10, warmup_s=0.5, window_s=0.5),
        ),
        observers=[Interrupt()],
    )
    assert result.interrupted and not result.valid
    measured = result.figures.measured_s
    assert 1.0 <= measured < 10 and measured % 0.5 == 0  # whole windows only
    assert result.verdict.reasons[0].startswith(f"too short: measured {measured:.1f} s of the 10 s")
    assert "interrupted by SIGINT" in result.verdict.reasons[0]


@pytest.mark.slow
def test_an_instances_sweep_runs_every_k_and_recommends_one_of_them(tmp_path):
    from batchinfer.demo import model_path

    result = invoke(
        "bench", "--model", model_path("pool224"), *SIM, "--cores", "0", "--sweep",
        "instances", *SHORT, "--min-samples", "10", "--json", tmp_path / "s.json",
        "--out", tmp_path / "out",
    )  # fmt: skip
    assert result.exit_code in (0, 1), result.output
    d = json.loads((tmp_path / "s.json").read_text())
    assert [e["instances_per_core"] for e in d["sweep"]] == [1, 2, 3, 4]
    assert d["sweep"][0]["relative"] == 1.0
    assert d["recommendation"]["name"] in {e["name"] for e in d["sweep"]}
    chosen = next(e for e in d["sweep"] if e["name"] == d["recommendation"]["name"])
    assert d["samples_per_s"] == chosen["samples_per_s"] == chosen["result"]["samples_per_s"]
    assert d["diagnosis"] == chosen["result"]["diagnosis"]
    assert (tmp_path / "out/sweep.png").is_file() and (
        tmp_path / "out/k4/samples.parquet"
    ).is_file()
    assert pq.read_table(tmp_path / "out/sweep.parquet").num_rows == 4


@pytest.mark.slow
def test_compare_peers_prints_the_four_rows_and_checks_top_1(tmp_path):
    import subprocess
    import sys

    tool = Path(__file__).resolve().parent.parent / "tools" / "compare_peers.py"
    proc = subprocess.run(
        [sys.executable, str(tool), "--items", "60", "--repeats", "1", "--cores", "0,1", "-k", "1",
         "--sim-npu-ms", "0.5", "--sim-host-ms", "0.5", "--json", str(tmp_path / "p.json")],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for row in ("batchinfer engine", "single-process loop", "thread pool", "multiprocessing.Pool"):
        assert row in proc.stdout
    assert "every peer gave the same top-1 as the engine on all 60 items" in proc.stdout
    result = json.loads((tmp_path / "p.json").read_text())
    assert set(result["mismatches"].values()) == {0}


def test_the_throughput_is_given_as_a_fraction_of_the_npu_limit(short_run):
    """Synthetic inputs: no decode limit; the emulated NPU limit is cores / npu ms."""
    tmp, result = short_run
    data = json.loads((tmp / "r.json").read_text())
    lim = data["limits"]
    assert lim["npu_per_s"] == 2 * 1000 / 0.5 and lim["decode_per_s"] is None
    assert lim["of_npu"] == round(data["samples_per_s"] / lim["npu_per_s"], 4)
    assert f"limits: {lim['of_npu']:.2f} of the emulated NPU limit (4,000/s" in result.stdout


@pytest.mark.slow
def test_a_decode_bound_bench_on_a_dataset_grows_a_reader_when_a_cpu_is_free(tmp_path, monkeypatch):
    """bench --dataset scales its readers as run does (engine/reader_scaling.py): one reader
    decoding 640x480 JPEGs for three cores at npu 0.5 ms starves them, so with a CPU free
    a second reader starts. (On a machine whose CPUs are all busy none does, by design.)"""
    from PIL import Image

    from batchinfer.demo import model_path
    from batchinfer.engine.plumbing.usage import Usage

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable CPUs (one reader at most on one)")
    rng = np.random.default_rng(0)
    (tmp_path / "jpg").mkdir()
    for i in range(40):
        pixels = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / "jpg" / f"{i:02d}.jpg", quality=90)
    monkeypatch.setattr(Usage, "idle_cpus", lambda self: 2.0)  # as on a quiet machine
    result = bench(
        BenchConfig(
            model=model_path("pool224"),
            runtime=RuntimeOptions(backend="sim", cores=(0, 1, 2), sim=SimOptions(0.5, 0)),
            bench=BenchOptions(duration_s=3, warmup_s=2, window_s=0.5, max_duration_s=4),
            dataset=tmp_path / "jpg",
        )
    )
    d = result.to_json()
    assert d["config"]["readers"] == 1  # where it started (half of 2 CPUs)
    assert [p["role"] for p in d["cpu"]["processes"]].count("reader") == 2
