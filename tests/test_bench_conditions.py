"""Board conditions read from a fake sysfs tree, and what they make of a verdict."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from batchinfer.bench.conditions import condition_reasons, describe, npu_load
from batchinfer.hostinfo import conditions, parse_devfreq_load, parse_npu_load


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def board(tmp_path: Path) -> Path:
    """A fake RK3588 /sys: two CPU policies, a thermal zone, cooling devices, the NPU."""
    for policy, khz in (("policy0", 1800000), ("policy4", 2256000)):
        base = f"sys/devices/system/cpu/cpufreq/{policy}"
        write(tmp_path, f"{base}/scaling_governor", "performance\n")
        write(tmp_path, f"{base}/scaling_cur_freq", f"{khz}\n")
        write(tmp_path, f"{base}/scaling_max_freq", f"{khz}\n")
    write(tmp_path, "sys/class/thermal/thermal_zone0/temp", "48500\n")
    write(tmp_path, "sys/class/thermal/thermal_zone0/type", "soc-thermal\n")
    write(tmp_path, "sys/class/thermal/cooling_device0/type", "cpufreq-cpu4\n")
    write(tmp_path, "sys/class/thermal/cooling_device0/cur_state", "0\n")
    write(tmp_path, "sys/class/thermal/cooling_device0/max_state", "3\n")
    write(tmp_path, "sys/class/thermal/cooling_device1/type", "pwm-fan\n")
    write(tmp_path, "sys/class/thermal/cooling_device1/cur_state", "2\n")
    npu = "sys/class/devfreq/fdab0000.npu"
    write(tmp_path, f"{npu}/governor", "userspace\n")
    write(tmp_path, f"{npu}/cur_freq", "1000000000\n")
    write(tmp_path, f"{npu}/max_freq", "1000000000\n")
    write(tmp_path, f"{npu}/load", "63@1000000000Hz\n")
    write(
        tmp_path,
        "sys/kernel/debug/rknpu/load",
        "NPU load:  Core0:  25%, Core1:  50%, Core2: 100%,\n",
    )
    return tmp_path


def test_conditions_read_frequencies_temperatures_cooling_and_npu_load(board):
    c = conditions(board)
    assert c["cpufreq"]["policy4"] == {
        "governor": "performance",
        "cur_khz": 2256000,
        "max_khz": 2256000,
    }
    assert c["thermal"] == {"thermal_zone0": {"type": "soc-thermal", "temp_c": 48.5}}
    assert c["cooling"]["cooling_device0"] == {
        "type": "cpufreq-cpu4",
        "cur_state": 0,
        "max_state": 3,
    }
    assert c["npu"] == {
        "fdab0000.npu": {
            "governor": "userspace",
            "cur_hz": 1000000000,
            "max_hz": 1000000000,
            "load_pct": 63.0,
        }
    }
    assert c["npu_load"] == {0: 25.0, 1: 50.0, 2: 100.0}
    json.dumps(c)


def test_nothing_readable_is_an_empty_reading(tmp_path):
    assert conditions(tmp_path) == {}
    assert describe({}).startswith("not readable here")


@pytest.mark.parametrize(
    ("text", "loads"),
    [
        ("NPU load:  Core0:  0%, Core1:  5%, Core2:  0%,\n", {0: 0.0, 1: 5.0, 2: 0.0}),
        ("NPU load:  37%\n", {0: 37.0}),
        ("", None),
        ("garbage", None),
    ],
)
def test_the_rknpu_load_formats(text, loads):
    assert parse_npu_load(text) == loads


def test_the_devfreq_load_format():
    assert parse_devfreq_load("25@1000000000Hz") == 25.0
    assert parse_devfreq_load("n/a") is None


def test_steady_readings_give_no_reason(board):
    reading = conditions(board)
    assert condition_reasons([reading, copy.deepcopy(reading), reading]) == []
    assert condition_reasons([]) == []


def test_a_cpu_frequency_that_moved_while_measuring_makes_the_run_invalid(board):
    first = conditions(board)
    write(board, "sys/devices/system/cpu/cpufreq/policy4/scaling_cur_freq", "1800000\n")
    write(board, "sys/devices/system/cpu/cpufreq/policy4/scaling_governor", "schedutil\n")
    (reason,) = condition_reasons([first, conditions(board)])
    assert reason.startswith(
        "frequency changed: CPU policy4 1.80 GHz-2.26 GHz (governor schedutil)"
    )
    assert "performance" in reason


def test_an_npu_frequency_change_is_a_reason_too(board):
    first = conditions(board)
    write(board, "sys/class/devfreq/fdab0000.npu/cur_freq", "800000000\n")
    (reason,) = condition_reasons([first, conditions(board)])
    assert "NPU fdab0000.npu 800 MHz-1000 MHz (governor userspace)" in reason


def test_an_active_cooling_device_is_throttling_but_a_spinning_fan_is_not(board):
    assert condition_reasons([conditions(board)]) == []  # the fan at state 2 is fine
    write(board, "sys/class/thermal/cooling_device0/cur_state", "1\n")
    (reason,) = condition_reasons([conditions(board)])
    assert reason.startswith("throttling: cpufreq-cpu4 at state 1")


def test_a_lowered_frequency_ceiling_is_throttling(board):
    first = conditions(board)
    write(board, "sys/devices/system/cpu/cpufreq/policy4/scaling_max_freq", "1608000\n")
    write(board, "sys/devices/system/cpu/cpufreq/policy4/scaling_cur_freq", "1608000\n")
    reasons = condition_reasons([first, conditions(board)])
    assert [r.split(":")[0] for r in reasons] == ["throttling", "frequency changed"]
    assert "policy4 max 2.26 GHz -> 1.61 GHz" in reasons[0]


def test_npu_load_is_the_mean_of_the_driver_readings_per_core(board):
    first = conditions(board)
    write(board, "sys/kernel/debug/rknpu/load", "NPU load:  Core0:  75%, Core1:  50%, Core2: 100%,")
    loads, source = npu_load([first, conditions(board)])
    assert loads == {0: 0.5, 1: 0.5, 2: 1.0}
    assert source == "rknpu debugfs load"


def test_npu_load_falls_back_to_devfreq_for_the_whole_npu(board):
    (board / "sys/kernel/debug/rknpu/load").unlink()
    loads, source = npu_load([conditions(board)])
    assert loads == {-1: 0.63} and "whole NPU" in source
    (board / "sys/class/devfreq/fdab0000.npu/load").unlink()
    assert npu_load([conditions(board)]) == (None, None)


def test_describe_says_what_a_reading_holds(board):
    text = describe(conditions(board))
    assert "policy4 performance 2.26 GHz" in text
    assert "NPU fdab0000.npu userspace 1000 MHz, load 63 %" in text
    assert "NPU load core0 25 %, core1 50 %, core2 100 %" in text
    assert "temperatures 48-48 °C" in text
