"""``batchinfer doctor`` against emulated boards (batchinfer.doctor.board): a healthy board
passes, each planted fault is one line naming it with its fix, x86 lists the backends."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchinfer.cli import main
from batchinfer.cli.options import flag_of
from batchinfer.doctor import FAIL, OK, WARN, BoardSpec, Machine, Report, build_board, run_doctor
from batchinfer.doctor import runtime as doctor_runtime

ASSETS = Path(__file__).resolve().parents[1] / "batchinfer/demo/assets"


def model(chip: str = "rk3588") -> Path:
    return ASSETS / f"digits-{chip}.rknn"  # converted by rknn-toolkit2 2.5.0


def doctor(tmp_path: Path, model_path: Path | None = None, **spec) -> Report:
    return run_doctor(build_board(tmp_path / "board", BoardSpec(**spec)), model_path)


def only_problem(report: Report, id: str, status: str = FAIL) -> str:
    """The one line that is not ✓, which must be check ``id``'s; returns it."""
    problems = [c for c in report.checks if c.status != OK]
    assert [(c.id, c.status) for c in problems] == [(id, status)], report.text()
    line = report.check(id).line(flag_of)
    assert "\n" not in line and "; fix: " in line
    return line


@pytest.mark.parametrize("chip", ["rk3588", "rk3576", "rk3566"])
def test_a_healthy_board_passes(tmp_path, chip):
    report = doctor(tmp_path, model(chip), chip=chip)
    assert report.blockers == 0 and all(c.status == OK for c in report.checks), report.text()
    assert report.check("soc").details["chip"] == chip
    assert report.text().endswith("No blockers: a run can go.")


def test_a_driver_too_old_is_a_blocker(tmp_path):
    report = doctor(tmp_path, driver="0.8.2")
    line = only_problem(report, "driver")
    assert line.startswith("✗ NPU driver: rknpu 0.8.2") and "kernel" in line
    assert report.blockers == 1


def test_the_driver_version_is_read_from_the_kernel_log_without_debugfs(tmp_path):
    report = doctor(tmp_path, debugfs=False, driver="0.9.8")
    assert report.check("driver").summary == "rknpu 0.9.8 (from the kernel log)"
    assert report.blockers == 0


def test_an_old_driver_on_a_multicore_chip_may_ignore_core_masks(tmp_path):
    line = only_problem(
        doctor(tmp_path, driver="0.9.3", kernel="5.10.160-rockchip"), "kernel", WARN
    )
    assert "core masks" in line and "0.9.6" in line


def test_kernel_61_with_a_driver_before_095_is_a_blocker(tmp_path):
    line = only_problem(doctor(tmp_path, driver="0.9.3", kernel="6.1.43-rk2312"), "kernel")
    assert "6.1.43" in line and "0.9.5" in line


def test_a_driver_that_cannot_be_read_is_said_to_be_unknown(tmp_path):
    board = build_board(tmp_path / "b", BoardSpec())
    (board.root / "sys/kernel/debug/rknpu/version").unlink()
    (board.root / "dev/kmsg").unlink()
    report = run_doctor(board)
    assert report.check("driver").status == WARN and "unknown" in report.check("driver").summary
    assert "unknown" in report.check("kernel").summary
    assert report.blockers == 0


def test_a_library_older_than_the_models_toolkit_is_a_blocker(tmp_path):
    line = only_problem(doctor(tmp_path, model(), librknnrt="2.3.2"), "librknnrt")
    assert "2.3.2 is older than rknn-toolkit2 2.5.0" in line and "digits-rk3588.rknn" in line
    assert ">= 2.5.0" in line.split("fix:")[1]


def test_the_library_is_fine_without_a_model_and_missing_is_a_blocker(tmp_path):
    assert doctor(tmp_path / "a", librknnrt="2.3.2").blockers == 0
    line = only_problem(doctor(tmp_path / "b", librknnrt=None), "librknnrt")
    assert "/usr/lib/librknnrt.so is missing" in line


def test_a_library_elsewhere_on_ld_library_path_is_named(tmp_path):
    board = build_board(tmp_path / "b", BoardSpec(librknnrt=None))
    lib = board.root / "opt/rknn/lib/librknnrt.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\0" * 100 + b"librknnrt version: 2.5.0 (x@y)\0")
    board = dataclasses.replace(board, env={"LD_LIBRARY_PATH": "/opt/rknn/lib"})
    line = only_problem(run_doctor(board), "librknnrt")
    assert "there is /opt/rknn/lib/librknnrt.so" in line and "ln -s" in line


def test_the_version_string_is_found_across_a_chunk_boundary(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor_runtime, "_CHUNK", 64)
    path = tmp_path / "librknnrt.so"
    path.write_bytes(b"\0" * 50 + b"librknnrt version: 2.3.2 (429f97ae6b@2025-04-09T09:09:27)\0")
    assert doctor_runtime.embedded_version(path) == "2.3.2 (429f97ae6b@2025-04-09T09:09:27)"


def test_a_missing_device_node_is_a_blocker(tmp_path):
    line = only_problem(doctor(tmp_path, device_node=False), "device")
    assert "no NPU device node" in line and "/dev/dri/renderD129" in line


def test_a_device_node_this_user_cannot_open_is_a_blocker_naming_the_group_fix(tmp_path):
    board = build_board(tmp_path / "b", BoardSpec())
    npu_node = board.root / "dev/dri/renderD129"

    def access(path: Path, mode: int) -> bool:  # the tests run as root, which passes any
        return Path(path) != npu_node

    line = only_problem(run_doctor(dataclasses.replace(board, access=access)), "device")
    assert "/dev/dri/renderD129 not readable and writable" in line and "usermod -aG render" in line


def test_a_device_node_without_the_udev_link_is_still_found(tmp_path):
    board = build_board(tmp_path / "b", BoardSpec())
    for link in (board.root / "dev/dri/by-path").iterdir():
        link.unlink()
    assert run_doctor(board).check("device").details["nodes"] == ["/dev/dri/renderD129"]


def test_a_powersave_governor_is_named_with_its_fix(tmp_path):
    line = only_problem(doctor(tmp_path, cpu_governor="powersave"), "governors", WARN)
    assert "CPU governor powersave" in line and "echo performance" in line


def test_an_unpinned_npu_clock_is_named(tmp_path):
    line = only_problem(doctor(tmp_path, npu_governor="simple_ondemand"), "governors", WARN)
    assert "fdab0000.npu: simple_ondemand" in line
    assert "/sys/class/devfreq/fdab0000.npu/governor" in line


def test_userspace_at_the_top_frequency_counts_as_pinned(tmp_path):
    board = build_board(tmp_path / "b", BoardSpec(npu_governor="userspace"))
    assert run_doctor(board).check("governors").status == OK
    (board.root / "sys/class/devfreq/fdab0000.npu/cur_freq").write_text("300000000\n")
    assert run_doctor(board).check("governors").status == WARN


def test_a_tiny_dev_shm_is_a_blocker_with_the_engines_own_fix(tmp_path):
    board = build_board(tmp_path / "b", BoardSpec())
    real = os.statvfs(board.root / "dev/shm")

    def tiny(path: str) -> os.statvfs_result:
        assert path == str(board.root / "dev/shm")
        fields = list(real)
        fields[0] = fields[1] = 4096  # f_bsize, f_frsize
        fields[4] = 64  # f_bavail: 256 KiB free
        return os.statvfs_result(fields)

    report = run_doctor(dataclasses.replace(board, statvfs=tiny))  # 640x640 RGB slots
    line = only_problem(report, "shm")
    assert "256.0 KiB free" in line and "--slots" in line and "--shm-size" in line


def test_too_little_memory_is_a_blocker(tmp_path):
    line = only_problem(doctor(tmp_path, mem_available_mib=200), "memory")
    assert "200 MiB available" in line


def test_a_low_open_files_limit_is_a_blocker(tmp_path):
    board = dataclasses.replace(build_board(tmp_path / "b", BoardSpec()), nofile=lambda: (32, 32))
    line = only_problem(run_doctor(board), "open_files")
    assert "ulimit -n" in line


def test_toolkit_lite2_missing_or_built_for_another_python(tmp_path):
    line = only_problem(doctor(tmp_path / "a", toolkit_lite2=None), "toolkit_lite2")
    assert "not installed" in line and "batchinfer[rk]" in line
    line = only_problem(doctor(tmp_path / "b", wheel_python=(3, 7)), "toolkit_lite2")
    assert "cp37-cp37" in line


def test_a_model_for_another_chip_is_a_blocker(tmp_path):
    line = only_problem(doctor(tmp_path, model("rk3588"), chip="rk3576"), "model")
    assert "target_platform='rk3576'" in line


@pytest.mark.parametrize("content", [b"", b"<html>404 Not Found</html>", b"RKN"])
def test_a_model_that_is_no_rknn_at_all_is_a_blocker(tmp_path, content):
    # An empty or truncated download was "✓ Model: no target platform to check" and "No
    # blockers: a run can go"; load_rknn then fails on the board.
    bad = tmp_path / "model.rknn"
    bad.write_bytes(content)
    line = only_problem(doctor(tmp_path, bad), "model")
    assert "model.rknn is not an RKNN model" in line and f"{len(content)} bytes" in line


def test_without_an_npu_it_lists_the_backends_and_passes(tmp_path):
    report = run_doctor(Machine(arch="x86_64"))
    ids = [c.id for c in report.checks]
    assert ids[:4] == ["backend_onnx", "backend_sim", "backend_toolkit", "backend_rknnlite"]
    assert report.check("backend_onnx").status == OK
    assert report.check("backend_rknnlite").status == WARN
    assert "aarch64" in report.check("backend_rknnlite").fix
    assert report.blockers == 0


def test_an_arm64_machine_that_is_not_a_rockchip_board_lists_the_backends(tmp_path):
    (tmp_path / "dev/shm").mkdir(parents=True)
    report = run_doctor(Machine(root=tmp_path, arch="aarch64"))  # no device tree
    assert report.check("backend_sim").status == OK and report.blockers == 0
    assert "no Rockchip NPU" in report.machine


def test_python_m_batchinfer_doctor_on_this_machine_exits_0():
    result = subprocess.run(
        [sys.executable, "-m", "batchinfer", "doctor"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    )
    assert result.returncode == 0, result.stderr
    assert "✓ backend onnx: available" in result.stdout
    assert result.stdout.rstrip().endswith("No blockers: a run can go.")


def test_the_cli_on_this_machine_exits_0_and_lists_the_backends():
    result = CliRunner().invoke(main, ["doctor"])
    assert result.exit_code == 0, result.output
    assert "✓ backend onnx: available" in result.output
    assert "backend sim" in result.output and "backend toolkit" in result.output


def test_json_round_trip_and_the_exit_code_counts_blockers():
    result = CliRunner().invoke(
        main, ["doctor", "--board", "rk3576", "--model", str(model("rk3588")), "--json"]
    )
    data = json.loads(result.output)
    report = Report.from_json(data)
    assert report.to_json() == data
    assert result.exit_code == report.blockers == data["blockers"] == 1
    assert [c.id for c in report.checks if c.status == FAIL] == ["model"]
    text = CliRunner().invoke(
        main, ["doctor", "--board", "rk3576", "--model", str(model("rk3588"))]
    )
    assert text.exit_code == 1
    shown = text.output.splitlines()[1:-1]  # less /dev/shm and memory, which change
    assert [c.line() for c in report.checks if c.id not in ("shm", "memory")] == [
        line for line in shown if not line.startswith(("✓ /dev/shm", "✓ Memory"))
    ]


def test_the_cli_on_an_emulated_board_passes():
    result = CliRunner().invoke(main, ["doctor", "--board", "rk3588"])
    assert result.exit_code == 0, result.output
    assert "✓ SoC: RK3588" in result.output
