"""Facts about this machine: CPU governor and frequencies, temperatures, the NPU.

Read from sysfs and procfs where readable; what cannot be read is left out, never
guessed. Every reader takes a ``root`` folder so tests feed it a fake /sys tree. The
manifest records :func:`host_facts`; benchmarks read :func:`conditions` (what can change
while a run lasts: frequencies, temperatures, throttling, NPU load) before, during and
after a run.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from batchinfer.runtime.npu_load import BOARD_FILES, parse_load


def _read(path: Path) -> str | None:
    """The stripped text of a small sysfs/procfs file, or None when unreadable."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip().strip("\x00")
    except (OSError, ValueError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _cpufreq(root: Path) -> dict[str, dict]:
    policies = {}
    base = root / "sys/devices/system/cpu/cpufreq"
    for policy in sorted(base.glob("policy*")):
        facts = {
            "cpus": _read(policy / "affected_cpus"),
            "governor": _read(policy / "scaling_governor"),
            "cur_khz": _read_int(policy / "scaling_cur_freq"),
            "min_khz": _read_int(policy / "scaling_min_freq"),
            "max_khz": _read_int(policy / "scaling_max_freq"),
            "hw_max_khz": _read_int(policy / "cpuinfo_max_freq"),
        }
        facts = {k: v for k, v in facts.items() if v is not None}
        if facts:
            policies[policy.name] = facts
    return policies


def _thermal_class(
    root: Path, pattern: str, number: str, facts: Callable[[Path, int], dict]
) -> dict[str, dict]:
    """``facts(node, value)`` by name of each thermal-class node matching ``pattern`` whose
    file ``number`` holds a number (the others are left out)."""
    found = {}
    for node in sorted((root / "sys/class/thermal").glob(pattern)):
        value = _read_int(node / number)
        if value is not None:
            found[node.name] = facts(node, value)
    return found


def _thermal(root: Path) -> dict[str, dict]:
    def zone(node: Path, millideg: int) -> dict:
        return {"type": _read(node / "type"), "temp_c": millideg / 1000}

    return _thermal_class(root, "thermal_zone*", "temp", zone)


def _npu(root: Path) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    # RK3588's NPU devfreq node is fdab0000.npu; match any *npu* to cover other chips.
    for node in sorted((root / "sys/class/devfreq").glob("*npu*")):
        freq = {
            "governor": _read(node / "governor"),
            "cur_hz": _read_int(node / "cur_freq"),
            "min_hz": _read_int(node / "min_freq"),
            "max_hz": _read_int(node / "max_freq"),
            "load_pct": parse_devfreq_load(_read(node / "load")),
        }
        freq = {k: v for k, v in freq.items() if v is not None}
        if freq:
            facts[node.name] = freq
    driver = _read(root / "sys/kernel/debug/rknpu/version")  # debugfs: usually root only
    if driver:
        facts["driver"] = driver
    return facts


# The rknpu driver's debugfs load file (its format and parser: batchinfer.runtime.npu_load).
# Usually readable by root only.
NPU_LOAD_FILE = BOARD_FILES[0]


def parse_npu_load(text: str | None) -> dict[int, float] | None:
    """Per-core NPU load in percent from the driver's load text (one-core NPUs: core 0)."""
    return parse_load(text)


def parse_devfreq_load(text: str | None) -> float | None:
    """The load in percent of a Rockchip devfreq ``load`` file ("25@1000000000Hz")."""
    if not text:
        return None
    head = text.split("@", 1)[0].strip()
    try:
        return float(head)
    except ValueError:
        return None


def npu_load(root: Path = Path("/")) -> dict[int, float] | None:
    """Per-core NPU load in percent as the rknpu driver reports it; None when unreadable."""
    return parse_npu_load(_read(root / NPU_LOAD_FILE))


def _cooling(root: Path) -> dict[str, dict]:
    def device(node: Path, state: int) -> dict:
        return {
            "type": _read(node / "type"),
            "cur_state": state,
            "max_state": _read_int(node / "max_state"),
        }

    return _thermal_class(root, "cooling_device*", "cur_state", device)


def conditions(root: Path = Path("/")) -> dict[str, Any]:
    """What can change while a run lasts, where readable (missing keys: not readable).

    ``cpufreq`` (per policy: governor, cur/min/max kHz), ``thermal`` (zone temperatures),
    ``cooling`` (thermal cooling devices: ``cur_state`` above 0 is throttling),
    ``npu`` (devfreq nodes: governor, cur/max Hz, load) and ``npu_load`` (per-core load
    in percent from the driver's debugfs file). Cheap enough to read once a second.
    Never raises.
    """
    probes = {
        "cpufreq": lambda: _cpufreq(root),
        "thermal": lambda: _thermal(root),
        "cooling": lambda: _cooling(root),
        "npu": lambda: {k: v for k, v in _npu(root).items() if k != "driver"},
        "npu_load": lambda: npu_load(root),
    }
    return _gather(probes)


def host_facts(root: Path = Path("/")) -> dict[str, Any]:
    """Facts about this machine for the manifest; what cannot be read is left out.

    Platform, CPU count, Python, board model, memory, cpufreq policies (governor and
    frequencies), thermal zone temperatures and NPU frequency/driver where readable.
    ``root`` is for tests (a fake /sys tree). Never raises.
    """
    probes = {
        "platform": platform.platform,
        "machine": platform.machine,
        "node": platform.node,
        "python": lambda: sys.version.split()[0],
        "cpu_count": os.cpu_count,
        "cpus_usable": lambda: len(os.sched_getaffinity(0)),
        "board": lambda: _read(root / "proc/device-tree/model"),
        "memory_total_bytes": _memory_total,
        "cpufreq": lambda: _cpufreq(root),
        "thermal": lambda: _thermal(root),
        "npu": lambda: _npu(root),
    }
    return _gather(probes)


def _gather(probes: dict[str, Any]) -> dict[str, Any]:
    """Each probe's value under its key; a probe that fails or finds nothing is left out."""
    facts: dict[str, Any] = {}
    for key, probe in probes.items():
        try:
            value = probe()
        except Exception:  # a fact we cannot read is simply not recorded
            continue
        if value not in (None, {}, ""):
            facts[key] = value
    return facts


def _memory_total() -> int:
    return int(psutil.virtual_memory().total)
