"""A benchmark's result, and its JSON (the file ``--json`` writes and ``--compare`` reads).

JSON keys (docs/guide/bench.md lists them): ``valid``, ``reasons``, ``diagnosis``
(``bound`` one of npu/host/decode/coordinator/cpu, with the numbers), ``samples_per_s``,
``latency_ms`` (min, mean, p50, p90, p95, p99, p999, max), ``cores`` (per core: core,
samples_per_s, p50_ms, p99_ms, utilization, ...), ``windows``, ``stability``, ``cpu``
(by role), ``postprocess`` (detectors: decoding's CPU per item and share), ``config``,
``conditions`` (``before``, ``after``), ``versions``, ``label``, ``limits`` (the NPU and
decode limits in items/s and ``of_npu`` / ``of_decode``: samples_per_s as a fraction of each).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchinfer.bench.cpu import CpuUse
from batchinfer.bench.diagnosis import Diagnosis
from batchinfer.bench.figures import Figures
from batchinfer.bench.limits import Limits
from batchinfer.bench.verdict import Verdict
from batchinfer.bench.windows import Samples
from batchinfer.errors import UsageError, render_fields
from batchinfer.sink.atomic import write_bytes_atomically

#: Marks a file as a batchinfer bench result (and its format's version).
KIND = "batchinfer-bench"
FORMAT = 1


def _same(field_name: str) -> str:
    return field_name


@dataclass
class BenchResult:
    """One measured run (``samples`` holds every completion, warm-up and drain included)."""

    label: str
    backend: dict[str, Any]
    verdict: Verdict
    diagnosis: Diagnosis
    figures: Figures
    cpu: CpuUse | None
    other_cpus_start: float | None
    errors: int
    config: dict[str, Any]
    versions: dict[str, Any]
    conditions: dict[str, Any] = field(default_factory=dict)
    samples: Samples = field(default_factory=Samples.empty)
    t_started: float | None = None
    t_start: float | None = None
    t_end: float | None = None
    stopped: str | None = None
    interrupted: bool = False  # by a signal: a sweep stops too
    # A detector's decoding in the core workers (runner.postprocess_share); None otherwise.
    postprocess: dict[str, Any] | None = None
    # What samples_per_s is judged against (bench.limits); None when not measured.
    limits: Limits | None = None

    @property
    def valid(self) -> bool:
        return self.verdict.valid

    @property
    def cores(self) -> list[int]:
        return list(self.config["cores"])

    @property
    def instances_per_core(self) -> int:
        return int(self.config["instances_per_core"])

    def to_json(self, render: Callable[[str], str] = _same) -> dict[str, Any]:
        """Plain JSON values; settings in messages named by ``render`` (e.g. CLI flags)."""
        f = self.figures
        diagnosis = self.diagnosis.to_json()
        for key in ("summary", "advice"):
            diagnosis[key] = render_fields(diagnosis[key], render)
        cpu = self.cpu.to_json() if self.cpu is not None else None
        if cpu is not None:
            cpu["others_during_warmup"] = (
                None if self.other_cpus_start is None else round(self.other_cpus_start, 4)
            )
        return {
            "kind": KIND,
            "format": FORMAT,
            "label": self.label,
            "valid": self.valid,
            "reasons": [render_fields(r, render) for r in self.verdict.reasons],
            "diagnosis": diagnosis,
            "samples_per_s": f.samples_per_s,
            "samples": f.samples,
            "errors": self.errors,
            "measured_s": f.measured_s,
            "latency_ms": f.latency_ms,
            "cores": [c.to_json() for c in f.cores],
            "windows": [w.to_json() for w in f.windows],
            "stability": self.verdict.stability.to_json(),
            "cpu": cpu,
            **({"postprocess": self.postprocess} if self.postprocess is not None else {}),
            **({"limits": self._limits_json()} if self.limits is not None else {}),
            "backend": self.backend,
            "config": self.config,
            "conditions": self.conditions,
            "versions": self.versions,
            "stopped": self.stopped,
        }

    def _limits_json(self) -> dict[str, Any]:
        assert self.limits is not None
        fractions = self.limits.fractions(self.figures.samples_per_s)
        return {
            **self.limits.to_json(),
            **{f"of_{k}": None if v is None else round(v, 4) for k, v in fractions.items()},
        }


def write_json(data: dict[str, Any], path: Path) -> None:
    """Write ``data`` to ``path`` atomically (a reader never sees half a file)."""
    text = json.dumps(data, indent=2, default=str) + "\n"
    write_bytes_atomically(text.encode(), Path(path))


def read_json(path: Path) -> dict[str, Any]:
    """A bench result (or sweep) read back; UsageError (exit 2) when it is not one."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise UsageError(
            f"cannot read {path}: {e.strerror or e}; pass a bench --json file."
        ) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(
            f"{path} is not JSON ({e}); pass a file written by bench --json."
        ) from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise UsageError(f"{path} is not a batchinfer bench result; pass a bench --json file.")
    return data
