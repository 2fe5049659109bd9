"""Board conditions around and during a measurement, and what they make of the verdict.

The readings come from :func:`batchinfer.hostinfo.conditions` (a root folder, so tests
feed a fake sysfs tree): before the run, at the start of the measurement, at every window
boundary, at its end, and after the run. Only readings taken while measuring can make a
run INVALID:

- throttling: a thermal cooling device (not a fan) at a state above 0, or a CPU policy's
  or the NPU's highest allowed frequency lowered;
- a frequency change: a CPU policy's or the NPU's current frequency differed between
  readings (a governor ramping: set it to ``performance`` before measuring).

What cannot be read (no cpufreq in a VM, debugfs without root) is reported as unreadable,
never guessed, and never makes a run INVALID.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchinfer.hostinfo import conditions

Probe = Callable[[], dict[str, Any]]


def probe(root: Path = Path("/")) -> Probe:
    """A reader of the conditions under ``root``."""
    return lambda: conditions(root)


def _cooling_active(reading: dict) -> dict[str, int]:
    return {
        name: dev["cur_state"]
        for name, dev in reading.get("cooling", {}).items()
        if "fan" not in str(dev.get("type") or "").lower() and dev.get("cur_state", 0) > 0
    }


def _ghz(khz: float) -> str:
    return f"{khz / 1e6:.2f} GHz"


def _mhz(hz: float) -> str:
    return f"{hz / 1e6:.0f} MHz"


def _npu_nodes(reading: dict) -> dict[str, dict]:
    return {k: v for k, v in reading.get("npu", {}).items() if isinstance(v, dict)}


def condition_reasons(readings: list[dict[str, Any]]) -> list[str]:
    """Why the readings taken while measuring make a run INVALID (empty: they do not)."""
    if not readings:
        return []
    reasons = []
    hot: dict[str, tuple[str, int]] = {}
    for reading in readings:
        for name, state in _cooling_active(reading).items():
            kind = str(reading["cooling"][name].get("type") or name)
            hot[name] = (kind, max(state, hot.get(name, ("", 0))[1]))
    lowered = []
    changed = []
    groups = (
        ("cpufreq", "max_khz", "cur_khz", lambda name: f"CPU {name}", _ghz),
        ("npu", "max_hz", "cur_hz", lambda name: f"NPU {name}", _mhz),
    )
    for group, max_key, cur_key, what, fmt in groups:
        series: dict[str, list[dict]] = {}
        for reading in readings:
            for name, node in reading.get(group, {}).items():
                if isinstance(node, dict):
                    series.setdefault(name, []).append(node)
        for name, seen in sorted(series.items()):
            maxes = [s[max_key] for s in seen if max_key in s]
            if maxes and min(maxes) < maxes[0]:
                lowered.append(f"{what(name)} max {fmt(maxes[0])} -> {fmt(min(maxes))}")
            curs = [s[cur_key] for s in seen if cur_key in s]
            if len(set(curs)) > 1:
                governor = seen[-1].get("governor", "?")
                changed.append(
                    f"{what(name)} {fmt(min(curs))}-{fmt(max(curs))} (governor {governor})"
                )
    if hot or lowered:
        parts = [f"{kind} at state {state}" for kind, state in hot.values()] + lowered
        reasons.append(
            f"throttling: {'; '.join(parts)} while measuring; cool the board (heatsink, fan) "
            "and run again."
        )
    if changed:
        reasons.append(
            f"frequency changed: {'; '.join(changed)} while measuring; fix the frequencies "
            "first (e.g. set the cpufreq and NPU devfreq governors to performance)."
        )
    return reasons


def npu_load(readings: list[dict[str, Any]]) -> tuple[dict[int, float] | None, str | None]:
    """Mean NPU load per core (0..1) over readings, and where it came from (None: unreadable).

    The driver's per-core debugfs figures when readable; else a devfreq node's load, which
    is one figure for the whole NPU.
    """
    per_core: dict[int, list[float]] = {}
    for reading in readings:
        for core, pct in (reading.get("npu_load") or {}).items():
            per_core.setdefault(int(core), []).append(pct / 100)
    if per_core:
        return {c: sum(v) / len(v) for c, v in per_core.items()}, "rknpu debugfs load"
    whole = [
        node["load_pct"] / 100
        for reading in readings
        for node in _npu_nodes(reading).values()
        if node.get("load_pct") is not None
    ]
    if whole:
        return {-1: sum(whole) / len(whole)}, "NPU devfreq load (whole NPU)"
    return None, None


def describe(reading: dict[str, Any] | None) -> str:
    """One line of the conditions in a reading, for the terminal."""
    if not reading:
        return "not readable here (no cpufreq, thermal or NPU files under /sys)"
    parts = []
    for policy, p in reading.get("cpufreq", {}).items():
        freq = _ghz(p["cur_khz"]) if "cur_khz" in p else "?"
        parts.append(f"{policy} {p.get('governor', '?')} {freq}")
    for node, n in _npu_nodes(reading).items():
        freq = f"{n['cur_hz'] / 1e6:.0f} MHz" if "cur_hz" in n else "?"
        load = f", load {n['load_pct']:g} %" if n.get("load_pct") is not None else ""
        parts.append(f"NPU {node} {n.get('governor', '?')} {freq}{load}")
    if reading.get("npu_load"):
        loads = ", ".join(f"core{c} {p:g} %" for c, p in sorted(reading["npu_load"].items()))
        parts.append(f"NPU load {loads}")
    temps = [z["temp_c"] for z in reading.get("thermal", {}).values()]
    if temps:
        parts.append(f"temperatures {min(temps):.0f}-{max(temps):.0f} °C")
    hot = _cooling_active(reading)
    if hot:
        parts.append(f"throttling ({len(hot)} cooling devices active)")
    return "; ".join(parts) or "not readable here"
