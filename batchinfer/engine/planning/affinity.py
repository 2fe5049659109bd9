"""CPU affinity: which CPUs our processes run on (RK3588: CPUs 4-7 are the big A76 cores);
each child pins itself to them first thing (engine/plumbing/child.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil

from batchinfer.errors import UsageError
from batchinfer.messages import setting


def _max_freqs() -> dict[int, int]:
    freqs = {}
    for cpu_dir in Path("/sys/devices/system/cpu").glob("cpu[0-9]*"):
        with contextlib.suppress(OSError, ValueError):
            freqs[int(cpu_dir.name[3:])] = int(
                (cpu_dir / "cpufreq" / "cpuinfo_max_freq").read_text().strip()
            )
    return freqs


def big_cores() -> tuple[int, ...] | None:
    """The fastest CPUs when the CPUs differ in maximum frequency (big.LITTLE), else None."""
    freqs = _max_freqs()
    if len(set(freqs.values())) < 2:
        return None
    top = max(freqs.values())
    return tuple(sorted(c for c, f in freqs.items() if f == top))


def resolve_affinity(value: str) -> tuple[int, ...] | None:
    """Turn ``--cpu-affinity`` (auto | none | a list like 4-7 or 4,5,6,7) into CPUs or None.

    ``auto`` pins to the big cores on a big.LITTLE CPU (RK3588: 4-7) and does nothing on a
    homogeneous CPU, where the kernel's scheduler already does well.
    """
    value = value.strip().lower()
    if value == "none":
        return None
    if value == "auto":
        return big_cores()
    cpus: set[int] = set()
    try:
        for part in value.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise UsageError(
            setting("runtime.cpu_affinity") + f" {value!r} is not a CPU list; "
            "give e.g. 4-7 or 4,5,6,7, or auto, or none."
        ) from None
    available = set(range(psutil.cpu_count() or 1))
    if not cpus or not cpus <= available:
        raise UsageError(
            setting("runtime.cpu_affinity") + f" {value!r} names CPUs this machine does not have "
            f"(it has 0-{max(available)}); give CPUs in that range, or auto."
        )
    return tuple(sorted(cpus))
