"""The ``batchinfer`` command line: bad invocations fail cleanly, good ones say what they did.

A bad invocation must end with exactly one ``error: `` line on stderr that names the problem
and the fix, the exit code of its kind (2 usage, 3 the run could not proceed), no traceback,
and nothing left behind (the autouse leak guard in conftest.py checks processes and /dev/shm;
the tests check that no output folder was made). Runs are in-process through click's
CliRunner; only ``python -m batchinfer`` needs a subprocess.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from dataset_files import digits_3_and_7
from PIL import Image

from batchinfer.cli import main

FAST_SIM = ["--backend", "sim", "--sim-npu-ms", "0.2", "--sim-host-ms", "0", "--no-progress"]


def invoke(*args: str | Path) -> Result:
    """Run ``batchinfer ARGS`` in-process and return click's Result (stderr kept apart)."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


def assert_error(result: Result, code: int, *needles: str) -> str:
    """Assert exit ``code`` and one clean ``error:`` line containing ``needles``; return it."""
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"uncaught {result.exception!r}"
    )
    assert "Traceback" not in result.output
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("error: ")
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line


def run_args(dataset: Path, model: Path, out: Path, *extra: str) -> list:
    return ["run", dataset, "--model", model, "--out", out, *FAST_SIM, *extra]


# ------------------------------------------------------------------------ bad datasets
@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "holds no items"),
        (
            lambda p: (p / "file.png").write_bytes(b"x") and p / "file.png",
            "is a file, not a folder",
        ),
    ],
    ids=["missing", "empty", "file"],
)
def test_a_bad_dataset_is_a_usage_error_that_says_what_to_pass(demo_kit, tmp_path, make, needle):
    dataset = make(tmp_path)
    out = tmp_path / "out"
    result = invoke(*run_args(dataset, demo_kit.models["digits"], out))
    line = assert_error(result, 2, str(dataset), needle, "folder of images")
    assert ".npy" in line
    assert not out.exists(), "a usage error must leave no output folder"


# -------------------------------------------------------------------------- bad models
def test_a_missing_model_is_a_usage_error(demo_kit, tmp_path):
    model = tmp_path / "nope.onnx"
    result = invoke(*run_args(demo_kit.dataset, model, tmp_path / "out"))
    assert_error(result, 2, str(model), "does not exist", ".rknn or .onnx")
    assert not (tmp_path / "out").exists()


def test_a_model_that_does_not_load_is_a_usage_error_that_says_to_replace_it(demo_kit, tmp_path):
    model = tmp_path / "x.onnx"
    model.write_bytes(bytes(range(256)) * 8)
    result = invoke(*run_args(demo_kit.dataset, model, tmp_path / "out"))
    # Found while planning (the model is read before any process starts), so it is 2, not 3.
    assert_error(result, 2, str(model), "not a valid ONNX model", "re-export or replace it")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------- cores
def test_an_unknown_core_is_refused_with_the_valid_ones(demo_kit, tmp_path):
    result = invoke(
        *run_args(demo_kit.dataset, demo_kit.models["digits"], tmp_path / "o"), "--cores", "0,5"
    )
    assert_error(result, 2, "--cores 0,5", "RK3588", "cores 0,1,2")


@pytest.mark.parametrize("backend", ["onnx", "sim"])
def test_an_unknown_core_is_refused_on_each_x86_backend(demo_kit, tmp_path, backend):
    # onnx lays its workers out as the 3 cores of an RK3588, so the same rule holds.
    args = ["run", demo_kit.dataset, "-m", demo_kit.models["digits"], "-o", tmp_path / "o"]
    result = invoke(*args, "--backend", backend, "--cores", "3")
    assert_error(result, 2, "--cores 3", "0,1,2")


def test_cores_that_are_not_numbers_are_a_click_usage_error(demo_kit, tmp_path):
    result = invoke(
        *run_args(demo_kit.dataset, demo_kit.models["digits"], tmp_path / "o"), "--cores", "a,b"
    )
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    # click's own usage-error format: a Usage line, a hint, then "Error: ...".
    assert result.stderr.strip().splitlines()[-1] == (
        "Error: Invalid value for '--cores': 'a,b' is not a comma-separated list of integers"
    )
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------- backend and faults
@pytest.mark.skipif(platform.machine() == "aarch64", reason="rknnlite may exist on a board")
def test_rknnlite_on_x86_is_refused_with_the_reason_and_the_alternatives(demo_kit, tmp_path):
    args = ["run", demo_kit.dataset, "-m", demo_kit.models["digits"], "-o", tmp_path / "o"]
    result = invoke(*args, "--backend", "rknnlite")
    line = assert_error(result, 2, "aarch64", platform.machine(), "--backend onnx", "--backend sim")
    assert line.count(". ") == 0, "one sentence"


def test_a_bad_sim_fault_lists_the_valid_forms(demo_kit, tmp_path):
    result = invoke(
        *run_args(demo_kit.dataset, demo_kit.models["digits"], tmp_path / "o"),
        "--sim-fault",
        "explode:core=1",
    )
    assert_error(result, 2, "'explode:core=1'", "KIND:core=C:call=N", "KIND:item=I", "crash")
    assert not (tmp_path / "o").exists()


def test_a_sim_fault_on_a_core_the_chip_lacks_is_a_usage_error(demo_kit, tmp_path):
    args = run_args(demo_kit.dataset, demo_kit.models["digits"], tmp_path / "o", "--limit", "5")
    result = invoke(*args, "--sim-fault", "crash:core=5:call=1")
    assert_error(result, 2, "core 5", "rk3588")


@pytest.mark.parametrize(
    ("option", "value", "limit"), [("--readers", "0", "5"), ("--limit", "-1", None)]
)
def test_nonsense_counts_are_usage_errors(demo_kit, tmp_path, option, value, limit):
    args = run_args(demo_kit.dataset, demo_kit.models["digits"], tmp_path / "o", option, value)
    result = invoke(*args, *(["--limit", limit] if limit else []))
    assert_error(result, 2, option)


# Waits out a 1 s timeout in a CLI process. Default tier: the same hang and message in
# process (test_engine.py::test_ready_cores_infer_while_another_core_is_still_starting).
@pytest.mark.slow
def test_a_worker_that_hangs_while_starting_is_timed_out_and_named(demo_kit, tmp_path):
    args = run_args(demo_kit.dataset, demo_kit.models["digits"], tmp_path / "o", "--limit", "20")
    argv = [sys.executable, "-m", "batchinfer", *map(str, args), "--cores", "0"]
    # Call 1 on core 0 is that worker's canary inference, made before it reports ready. Only
    # core 0, because ready cores would do the 20 items meanwhile and the run would end first.
    argv += ["--inference-timeout-s", "1", "--sim-fault", "hang:core=0:call=1"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # the run stops cleanly and leaves nothing behind
        proc.communicate(timeout=60)
        pytest.fail("a worker hanging at start-up held the run far beyond --inference-timeout-s 1")
    assert "core 0: the canary inference took longer than 1 s (the inference timeout)" in err


# ---------------------------------------------------------------------------- OUT folder
def test_run_prints_the_core_table_then_refuses_to_overwrite_then_overwrites(demo_kit, tmp_path):
    out = tmp_path / "out"
    args = run_args(demo_kit.dataset, demo_kit.models["digits"], out, "--limit", "200")

    first = invoke(*args)
    assert first.exit_code == 0, first.output
    lines = first.stdout.strip().splitlines()
    assert lines[0].split() == [
        "core", "items", "errors", "restarts", "recycles", "items/s", "util", "%", "NPU",
        "load", "%", "p50", "ms", "p99", "ms",
    ]  # fmt: skip
    table = {ln.split()[0]: ln.split() for ln in lines[1:-1]}
    assert set(table) == {"0", "1", "2", "all"}
    assert table["all"][1:4] == ["200", "0", "0"]
    assert sum(int(table[c][1]) for c in "012") == 200
    assert lines[-1] == f"complete: 200 succeeded, 0 errors; results in {out.resolve()}"
    task, said, started = first.stderr.splitlines()[:3]
    assert task == "task: classify (one output of 10 scores)"
    assert said == "labels: class folders are integers: label = folder name (10 classes)"
    assert started.startswith("started: 200 items on cores 0,1,2 (sim, 1 instance(s)")
    assert "error" not in first.stderr

    refused = invoke(*args)
    assert_error(refused, 2, str(out.resolve()), "--resume", "--overwrite")
    assert pq.read_table(out / "predictions").num_rows == 200, "refusal must not touch OUT"

    (out / "notes.txt").write_text("the user's, beside the results")
    again = invoke(*args, "--overwrite")
    assert again.exit_code == 0, again.output
    assert (out / "notes.txt").read_text() == "the user's, beside the results"
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["status"], manifest["counts"]["succeeded"]) == ("complete", 200)


def accuracy(out: Path) -> tuple[list, float]:
    rows = pq.read_table(out / "predictions", columns=["label", "pred"]).to_pylist()
    labels = sorted({r["label"] for r in rows})
    return labels, sum(r["label"] == r["pred"] for r in rows) / len(rows)


def test_a_mac_zip_s_leftovers_change_neither_the_labels_nor_the_accuracy(demo_kit, tmp_path):
    clean = digits_3_and_7(demo_kit.dataset, tmp_path / "clean", junk=False)
    unzipped = digits_3_and_7(demo_kit.dataset, tmp_path / "unzipped", junk=True)
    model = demo_kit.models["digits"]
    first = invoke(*run_args(clean, model, tmp_path / "out-clean"))
    second = invoke(*run_args(unzipped, model, tmp_path / "out-unzipped"))
    assert first.exit_code == second.exit_code == 0, first.output + second.output
    labels, top1 = accuracy(tmp_path / "out-clean")
    assert (labels, top1) == ([3, 7], 1.0)
    assert accuracy(tmp_path / "out-unzipped") == (labels, top1)
    # Said once, on the console, and recorded in the manifest.
    said = "labels: class folders are integers: label = folder name (2 classes)"
    assert second.stderr.count(said) == 1
    leftovers = [ln for ln in second.stderr.splitlines() if "other tools leave behind" in ln]
    assert leftovers == [
        "skipped what other tools leave behind (never items or classes): ._* 1, "
        "Thumbs.db 1, __MACOSX 1"
    ]
    dataset = json.loads((tmp_path / "out-unzipped" / "manifest.json").read_text())["dataset"]
    assert dataset["leftovers"] == {"._*": 1, "Thumbs.db": 1, "__MACOSX": 1}
    assert dataset["label_rule"] == "class folders are integers: label = folder name"
    assert dataset["classes"]["labels"] == {"3": 3, "7": 7}
    assert "other tools" not in first.stderr


def test_class_folders_mixing_numbers_and_names_are_warned_about(demo_kit, tmp_path):
    data = digits_3_and_7(demo_kit.dataset, tmp_path / "data", junk=False)
    (data / "old").mkdir()
    result = invoke(*run_args(data, demo_kit.models["digits"], tmp_path / "out", "--limit", "5"))
    assert result.exit_code == 0, result.output
    assert "labels: sorted class folder names -> 0..2 (3 classes)" in result.stderr
    (warning,) = [ln for ln in result.stderr.splitlines() if ln.startswith("warning: ")]
    assert "mix integer names with other names ('old' stand out)" in warning


def test_a_float_model_fed_raw_pixels_is_warned_about_unless_mean_and_std_are_given(
    demo_kit, tmp_path
):
    from models import nchw_float_model

    model = nchw_float_model(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        Image.new("RGB", (8, 8), (i, 2 * i, 3 * i)).save(data / f"{i}.png")
    args = ["run", data, "--model", model, "--backend", "onnx", "--no-progress"]
    raw = invoke(*args, "--out", tmp_path / "raw")
    assert raw.exit_code == 0, raw.output
    (warning,) = [ln for ln in raw.stderr.splitlines() if ln.startswith("warning: ")]
    assert "takes float32 input and no mean/std were given (--mean/--std, or" in warning
    assert "raw 0-255 pixel values are fed" in warning
    scaled = invoke(*args, "--out", tmp_path / "scaled", "--mean", "0", "--std", "255")
    assert scaled.exit_code == 0, scaled.output
    assert "warning" not in scaled.stderr
    # The demo's models take uint8 pixels (a .rknn's .config.json normalises inside).
    rknn_model = demo_kit.rknn["digits-rk3588"]
    rknn = invoke(*run_args(demo_kit.dataset, rknn_model, tmp_path / "rknn", "--limit", "3"))
    assert rknn.exit_code == 0, rknn.output
    assert "warning" not in rknn.stderr


@pytest.mark.parametrize("backend", ["sim", "onnx"])
def test_a_bare_rknn_on_an_x86_backend_is_a_usage_error_naming_the_missing_onnx(
    demo_kit, tmp_path, backend
):
    import shutil

    rknn = demo_kit.rknn["digits-rk3588"]
    bare = tmp_path / "bare" / rknn.name
    bare.parent.mkdir()
    shutil.copy(rknn, bare)
    out = tmp_path / "out"
    args = ["run", demo_kit.dataset, "--model", bare, "--out", out, "--backend", backend]
    result = invoke(*args, "--size", "8x8", "--color", "gray", "--no-progress")
    line = assert_error(
        result,
        2,
        f"--backend {backend} runs a .rknn from the .onnx",
        bare.with_suffix(".onnx").name,
    )
    assert str(bare) in line and "--backend toolkit" in line and "--backend rknnlite" in line
    assert "core" not in line and not out.exists()


def test_an_out_that_is_a_file_is_a_usage_error(demo_kit, tmp_path):
    out = tmp_path / "results"
    out.write_text("not a folder")
    result = invoke(*run_args(demo_kit.dataset, demo_kit.models["digits"], out))
    assert_error(result, 2, str(out), "--out")


# --------------------------------------------------------------------------------- demo
# Writes the whole kit (5 s); default tier: write_demo refuses and overwrites (test_demo.py).
@pytest.mark.slow
def test_demo_twice_refuses_the_second_time_naming_overwrite(tmp_path):
    target = tmp_path / "kit"
    first = invoke("demo", target)
    assert first.exit_code == 0, first.output
    assert first.stdout.startswith(f"wrote 1797 images to {target / 'dataset'}")
    assert "wrote 500 detection images" in first.stdout
    png = target / "dataset" / "0" / "0000.png"
    before = png.stat().st_mtime_ns

    second = invoke("demo", target)
    assert_error(second, 2, str(target), "--overwrite")
    assert png.stat().st_mtime_ns == before, "a refused demo must not rewrite the kit"


def test_demo_into_a_file_is_refused(tmp_path):
    target = tmp_path / "kit"
    target.write_text("x")
    assert_error(invoke("demo", target), 2, str(target), "not a folder")


# --------------------------------------------------------------------------------- info
@pytest.mark.parametrize(
    ("backend", "version"),
    [("sim", "API: 2.5.0 (batchinfer sim"), ("onnx", "API: 2.5.0 compatible (onnxruntime")],
)
def test_info_shows_inputs_outputs_runtime_and_version(demo_kit, backend, version):
    result = invoke("info", demo_kit.models["digits"], "--backend", backend)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"runtime: {backend}\n" in out
    assert "inputs:\n  image " in out and "uint8" in out and "[1, 8, 8, 1]" in out
    assert "outputs:\n  probs " in out and "float32" in out and "[1, 10]" in out
    assert version in out
    # Only the runtime's own lines, as a board prints them (W version, I RKNN); no error.
    assert all(line[:2] in ("W ", "I ") for line in result.stderr.splitlines()), result.stderr


def test_info_on_an_rknn_names_the_source_layout_as_the_source_models(demo_kit):
    """The runtime's NHWC shape next to a bare "layout nchw" read as a contradiction."""
    rknn = demo_kit.models["pool224"].with_name("pool224-rk3588.rknn")
    result = invoke("info", rknn, "--backend", "sim")
    assert result.exit_code == 0, result.output
    assert "  image            uint8    [1, 224, 224, 3]  (source model: nchw)\n" in result.stdout
    assert "layout nchw" not in result.stdout


def test_info_shows_an_onnx_input_in_its_own_layout_and_what_is_fed_apart(tmp_path):
    """An NCHW input showed as "[1, 8, 8, 3] layout nchw": the runtime's NHWC order under the
    model's layout's name (issue 40, item 19)."""
    from models import nchw_float_model

    result = invoke("info", nchw_float_model(tmp_path), "--backend", "onnx")
    assert result.exit_code == 0, result.output
    assert "  input            float32  [1, 3, 8, 8]  NCHW\n" in result.stdout
    (fed,) = [s for s in result.stdout.splitlines() if s.startswith("  input   ") and "fed" in s]
    assert fed.endswith("; fed as [1, 8, 8, 3] NHWC, the order RKNN runtimes take 4-D inputs in)")


def test_info_of_a_bare_rknn_names_its_advice_as_flags(tmp_path):
    """A .rknn with no .onnx beside it: info said "pass preprocess.size and
    preprocess.dtype" and "use runtime.backend onnx", the library's field names, to a
    command-line user (as issue 40, item 18 was for error rows)."""
    model = tmp_path / "bare.rknn"
    model.write_bytes(b"RKNN" + bytes(60))
    result = invoke("info", model)
    assert result.exit_code == 0, result.output
    assert "pass --size and --dtype" in result.stdout, result.stdout
    assert "preprocess." not in result.stdout and "runtime.backend" not in result.stdout


def test_info_of_a_missing_model_is_a_usage_error(tmp_path):
    model = tmp_path / "nope.onnx"
    assert_error(invoke("info", model), 2, str(model), "does not exist")


def test_info_of_a_model_that_does_not_load_fails(tmp_path):
    model = tmp_path / "x.onnx"
    model.write_bytes(b"\x00garbage" * 64)
    result = invoke("info", model)
    assert result.exit_code == 2


def test_info_of_a_model_onnx_runtime_refuses_says_so(tmp_path):
    # Its inputs read fine off the file; the runtime that would run it refuses the graph.
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"])],
        "unknown_op",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = tmp_path / "unknown_op.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), model)
    for backend in ("onnx", "sim"):
        result = invoke("info", model, "--backend", backend)
        assert_error(result, 2, str(model), "not a valid ONNX model", "NoSuchOp")


# ------------------------------------------------------------------------------ entry
def test_python_m_batchinfer_help_lists_the_commands():
    proc = subprocess.run(
        [sys.executable, "-m", "batchinfer", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage: ")
    for command in ("run", "demo", "info", "eval", "bench"):
        assert f"\n  {command} " in proc.stdout
    assert proc.stderr == ""


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_a_run_whose_stdout_reader_left_keeps_its_exit_code(demo_kit, tmp_path):
    """`batchinfer run ... | head -1`: the run completed, then click met EPIPE printing its
    summary and exited 1 ("some items are error rows") without a word."""
    data = digits_3_and_7(demo_kit.dataset, tmp_path / "data", junk=False)
    out = tmp_path / "out"
    argv = [
        sys.executable,
        "-m",
        "batchinfer",
        *map(str, run_args(data, demo_kit.models["digits"], out)),
    ]
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: every write is EPIPE
    try:
        proc = subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"


def test_run_imports_neither_the_evaluation_nor_the_benchmark_code():
    """Start-up: `batchinfer run` loads only its own command's module."""
    check = (
        "import json, sys; from batchinfer.cli import main; main.get_command(None, 'run'); "
        "print(json.dumps([m for m in sys.modules if m.startswith(('batchinfer.cli.', "
        "'batchinfer.evaluate', 'batchinfer.bench'))]))"
    )
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    assert "batchinfer.cli.run" in loaded
    assert not [m for m in loaded if m.startswith(("batchinfer.evaluate", "batchinfer.bench"))]
    assert "batchinfer.cli.eval" not in loaded and "batchinfer.cli.bench" not in loaded


def test_a_run_imports_neither_onnxruntime_nor_pyarrow_compute_in_the_coordinator(
    demo_kit, tmp_path
):
    """Start-up and the end of a run. pyarrow.compute (53 ms with what only it imports) was
    imported at the start (core stats) and at the first Parquet part (a null mask). ONNX
    Runtime (27 ms, and a session that loads every weight) was imported to read the model's
    input shape, which runtime/onnx_graph.py now reads off the file; the workers load it."""
    check = (
        "import sys\n"
        "from batchinfer.entry import main\n"
        "import batchinfer.entry as entry\n"
        "def report(code):\n"
        "    print([m for m in ('pyarrow.compute', 'onnxruntime') if m in sys.modules], code)\n"
        "    sys.stdout.flush()\n"
        "    raise SystemExit(code)\n"
        "entry._exit = report\n"
        "main()\n"
    )
    args = ["run", str(demo_kit.dataset), "--model", str(demo_kit.models["digits"])]
    args += ["--backend", "sim", "--limit", "40", "--out", str(tmp_path / "o"), "--no-progress"]
    proc = subprocess.run(
        [sys.executable, "-c", check, *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[] 0"
    assert pq.read_table(tmp_path / "o" / "predictions").num_rows == 40


# The short TMPDIR with the slow tier: the long one's run is the same run, checked alike.
@pytest.mark.parametrize("tmpdir_name", [pytest.param("tmp", marks=pytest.mark.slow), "t" * 120])
def test_a_run_leaves_nothing_in_tmpdir(demo_kit, tmp_path, tmpdir_name):
    """The program ends with os._exit (entry.py), which skips multiprocessing's own clean-up:
    its fork server's socket folder (pymp-*) was left in TMPDIR after every run. A TMPDIR too
    long for a UNIX socket's path failed the run ("AF_UNIX path too long", Python 3.11).
    The engine's own fork server talks over a socket pair: no path
    (engine/plumbing/fork_server.py)."""
    tmp = tmp_path / tmpdir_name
    tmp.mkdir()
    args = ["run", str(demo_kit.dataset), "--model", str(demo_kit.models["digits"])]
    args += ["--backend", "onnx", "--limit", "8", "--out", str(tmp_path / "o"), "--no-progress"]
    env = dict(os.environ, TMPDIR=str(tmp))
    proc = subprocess.run(
        [sys.executable, "-m", "batchinfer", *args], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    # ONNX Runtime keeps a session-id file (.ses) there by design; nothing else may stay.
    assert sorted(p.name for p in tmp.iterdir() if p.name != ".ses") == []


_PRINT_ARROW_POOL = """
import sys, types
cli = types.ModuleType("batchinfer.cli")  # stands in for the commands
def main():
    import pyarrow
    print(pyarrow.default_memory_pool().backend_name)
cli.main = main
sys.modules["batchinfer.cli"] = cli
from batchinfer.entry import main
main()
"""


@pytest.mark.parametrize(("chosen", "expected"), [(None, "system"), ("mimalloc", "mimalloc")])
def test_the_program_gives_arrow_malloc_unless_the_user_chose(chosen, expected):
    """Parquet's column writers allocate from Arrow's C++ default pool; its mimalloc kept
    ~22 MB of written parts in the coordinator (entry.py says why)."""
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen:
        env["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    proc = subprocess.run(
        [sys.executable, "-c", _PRINT_ARROW_POOL], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == expected


# ------------------------------------------------------- every config error before any worker
def _npy_dataset(tmp_path: Path, n: int = 4) -> Path:
    import numpy as np

    root = tmp_path / "npy"
    root.mkdir()
    for i in range(n):
        np.save(root / f"{i}.npy", np.zeros((1, 8, 8, 1), np.uint8))
    return root


@pytest.mark.parametrize(
    ("case", "needles"),
    [
        ("mean_on_npy", ("--mean/--std",)),
        ("size_on_fixed_model", ("--size 224x224", "fixed at 8x8")),
        ("resume_without_out", ("--resume needs --out",)),
        ("overwrite_and_resume", ("--overwrite and --resume",)),
        ("sim_fault_on_onnx", ("--sim-fault", "sim backend", "onnx")),
    ],
)
def test_a_configuration_error_exits_2_before_any_worker_starts(
    demo_kit, tmp_path, monkeypatch, case, needles
):
    import batchinfer.engine.loop as loop

    def no_engine(*args, **kwargs):
        raise AssertionError("a worker was started for a configuration error")

    monkeypatch.setattr(loop.Engine, "run", no_engine)
    digits = demo_kit.models["digits"]
    args = {
        "mean_on_npy": ["run", _npy_dataset(tmp_path), "-m", digits, "--dtype", "float32",
                        "--mean", "1", "--backend", "sim", "-o", tmp_path / "o"],
        "size_on_fixed_model": run_args(demo_kit.dataset, digits, tmp_path / "o", "--size", "224"),
        "resume_without_out": ["run", demo_kit.dataset, "-m", digits, "--resume"],
        "overwrite_and_resume": run_args(demo_kit.dataset, digits, tmp_path / "o",
                                         "--overwrite", "--resume"),
        "sim_fault_on_onnx": ["run", demo_kit.dataset, "-m", digits, "--backend", "onnx",
                              "--sim-fault", "crash:item=1", "-o", tmp_path / "o"],
    }[case]  # fmt: skip
    line = assert_error(invoke(*args), 2, *needles)
    assert len(line) < 300, f"one short line, not {len(line)} characters"
    assert not (tmp_path / "o").exists()


def test_failed_items_are_listed_with_their_reason_and_where_the_rest_are(demo_kit, tmp_path):
    data = tmp_path / "data"
    (data / "1").mkdir(parents=True)
    for png in sorted((demo_kit.dataset / "1").iterdir())[:5]:
        (data / "1" / png.name).write_bytes(png.read_bytes())
    (data / "1" / "broken.png").write_bytes(b"not a png")
    result = invoke(*run_args(data, demo_kit.models["digits"], tmp_path / "o"))
    assert result.exit_code == 1
    out = result.stdout
    assert "failed items (first 1 of 1):" in out
    assert "  1/broken.png: Cannot read 1/broken.png: it is not an image" in out
    assert f"every error row is in {(tmp_path / 'o').resolve() / 'predictions'}" in out


def test_an_interrupted_run_prints_the_full_command_to_resume_it(tmp_path):
    from batchinfer.cli.run import resume_command

    out = tmp_path / "runs" / "x"
    assert resume_command(["run", "data", "-m", "m.rknn", "--overwrite"], out) == (
        f"batchinfer run data -m m.rknn --out {out} --resume"
    )
    assert resume_command(["run", "d", "-m", "m", "-o", "o", "--resume"], out) == (
        "batchinfer run d -m m -o o --resume"
    )


def test_no_progress_bar_off_a_terminal(demo_kit, tmp_path):
    # CliRunner's stderr is not a terminal: a log file must not fill with bar redraws.
    args = run_args(demo_kit.dataset, demo_kit.models["digits"], tmp_path / "o", "--limit", "50")
    result = invoke(*[a for a in args if a != "--no-progress"])
    assert result.exit_code == 0
    assert "\r" not in result.stderr and "item/s" not in result.stderr


def test_an_unquoted_glob_is_one_sentence_that_says_to_quote_it(tmp_path):
    # A shell expands `run photos/*.jpg` into every file; click's own message listed all of
    # them as "unexpected extra arguments" (178 names for one demo class).
    files = [tmp_path / f"{n}.png" for n in range(40)]
    result = invoke("run", *files, "--model", tmp_path / "m.onnx", "--out", tmp_path / "o")
    assert result.exit_code == 2
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert error == [
        f"Error: run takes one DATASET, not 40 paths: the shell expanded a glob? Quote it (for "
        f"example '{tmp_path}/*.png') or pass a list file (a .txt with one path a line)."
    ]
    assert not (tmp_path / "o").exists()
    assert "39.png" not in result.output


def test_an_error_row_names_the_setting_as_the_cli_flag(demo_kit, tmp_path):
    """The failed items said "pass preprocess.dtype float32", the library's name, where the
    CLI's user types --dtype (issue 40, item 18); the row in the file keeps the field name."""
    data = tmp_path / "tensors"
    data.mkdir()
    np.save(data / "0.npy", np.zeros((1, 8, 8, 1), np.float32))  # the model takes uint8
    # A list's error rows are prefixed with their line (collector.py), which kept the
    # setting's reference only once it was no longer an f-string.
    listed = tmp_path / "list.txt"
    listed.write_text("tensors/0.npy\n")
    result = invoke(*run_args(listed, demo_kit.models["digits"], tmp_path / "o", "--cores", "0"))
    assert result.exit_code == 1, result.output
    (line,) = [s for s in result.output.splitlines() if s.startswith("  tensors/0.npy: ")]
    assert "or pass --dtype float32 to feed them as they are" in line
    assert "preprocess.dtype" not in result.output
    (error,) = pq.read_table(tmp_path / "o" / "predictions")["error"].to_pylist()
    assert "pass preprocess.dtype float32" in error


@pytest.mark.slow  # two runs: 3-10 s on a loaded machine
def test_run_says_which_task_it_picked_and_why(demo_kit, tmp_path):
    """`run` never said it; a model of two unknown outputs was stored raw without a word
    (issue 40, item 14)."""
    from models import two_output_model

    data = tmp_path / "d"
    data.mkdir()
    np.save(data / "x.npy", np.zeros((1, 4), np.float32))
    raw = invoke("run", data, "--model", two_output_model(tmp_path), "--backend", "onnx",
                 "--out", tmp_path / "raw", "--no-progress")  # fmt: skip
    assert raw.exit_code == 0, raw.output
    first = raw.stderr.splitlines()[0]
    assert first.startswith("task: raw (outputs [1, 4], [1, 1] are neither one score vector")
    assert first.endswith("; --task classify or detect overrides)")  # the CLI's flag
    digits = invoke(*run_args(demo_kit.dataset, demo_kit.models["digits"], tmp_path / "c",
                              "--limit", "4"))  # fmt: skip
    assert digits.stderr.splitlines()[0] == "task: classify (one output of 10 scores)"


def test_the_task_line_of_a_detector_names_its_head_and_where_that_was_read(tmp_path):
    from detect_models import colour_detector

    from batchinfer.options import DetectOptions
    from batchinfer.tasks import plan_task

    model = colour_detector(tmp_path)
    said = plan_task(DetectOptions(), model, (64, 64)).said()
    assert said.startswith("task: detect (YOLOv8 model-zoo head, 2 classes, strides 8/16/32: ")
    assert said.endswith(", recognised from the output shapes)")
    asked = plan_task(DetectOptions(task="detect"), model, (64, 64)).said()
    assert asked.render(lambda name: {"detect.task": "--task"}[name]).endswith(
        "asked for with --task)"
    )
