"""Building RunConfigs for tests from flat keywords (``backend="sim", cores=(0, 1), ...``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from batchinfer.engine import RunConfig
from batchinfer.options import (
    DetectOptions,
    OutputOptions,
    PreprocessOptions,
    ReliabilityOptions,
    RuntimeOptions,
    SimOptions,
)

_GROUPS = {
    "runtime": RuntimeOptions,
    "preprocess": PreprocessOptions,
    "output": OutputOptions,
    "reliability": ReliabilityOptions,
    "detect": DetectOptions,
}


def config(dataset: Path, model: Path, limit: int | None = None, **flat) -> RunConfig:
    """A RunConfig; each keyword goes to the option group that has a field of its name.

    ``sim=SimOptions(...)`` sets the emulator's options; ``timeout_s`` sets both the
    inference and the decode timeout.
    """
    if "timeout_s" in flat:
        t = flat.pop("timeout_s")
        flat.update(inference_timeout_s=t, decode_timeout_s=t)
    values: dict[str, dict] = {name: {} for name in _GROUPS}
    for key, value in flat.items():
        for name, cls in _GROUPS.items():
            if key in {f.name for f in dataclasses.fields(cls)}:
                values[name][key] = value
                break
        else:
            raise TypeError(f"no option group has a setting {key!r}")
    groups = {name: cls(**values[name]) for name, cls in _GROUPS.items()}
    return RunConfig(dataset=dataset, model=model, limit=limit, **groups)


def fast_sim(*faults: str, npu_ms: float = 0.2) -> SimOptions:
    """The emulator with a short NPU time and no host time, and ``faults``."""
    return SimOptions(npu_ms=npu_ms, host_ms=0.0, faults=tuple(faults))


def exit_code(result) -> int:
    """The exit code ``batchinfer run`` gives for a RunResult."""
    if result.status == "interrupted":
        return 130
    return 1 if result.errors else 0
