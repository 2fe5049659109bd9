"""Facts about this machine: CPU governor and frequencies, temperatures, the NPU.

Read from sysfs and procfs where readable; what cannot be read is left out, never
guessed. Every reader takes a ``root`` folder so tests feed it a fake /sys tree. The
manifest records :func:`host_facts`; benchmarks read them before and after a run.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

import psutil


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


def _thermal(root: Path) -> dict[str, dict]:
    zones = {}
    for zone in sorted((root / "sys/class/thermal").glob("thermal_zone*")):
        millideg = _read_int(zone / "temp")
        if millideg is None:
            continue
        zones[zone.name] = {"type": _read(zone / "type"), "temp_c": millideg / 1000}
    return zones


def _npu(root: Path) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    # RK3588's NPU devfreq node is fdab0000.npu; match any *npu* to cover other chips.
    for node in sorted((root / "sys/class/devfreq").glob("*npu*")):
        freq = {
            "governor": _read(node / "governor"),
            "cur_hz": _read_int(node / "cur_freq"),
            "max_hz": _read_int(node / "max_freq"),
        }
        freq = {k: v for k, v in freq.items() if v is not None}
        if freq:
            facts[node.name] = freq
    driver = _read(root / "sys/kernel/debug/rknpu/version")  # debugfs: usually root only
    if driver:
        facts["driver"] = driver
    return facts


def host_facts(root: Path = Path("/")) -> dict[str, Any]:
    """Facts about this machine for the manifest; what cannot be read is left out.

    Platform, CPU count, Python, board model, memory, cpufreq policies (governor and
    frequencies), thermal zone temperatures and NPU frequency/driver where readable.
    ``root`` is for tests (a fake /sys tree). Never raises.
    """
    facts: dict[str, Any] = {}
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
