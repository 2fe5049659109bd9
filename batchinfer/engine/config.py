"""RunConfig: everything one run needs, validated once, before anything starts."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SimOptions:
    """Settings of the NPU emulator (``--backend sim``); None means the emulator's default."""

    npu_ms: float | None = None
    host_ms: float | None = None
    chip: str | None = None
    faults: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunConfig:
    """One run of the engine. Paths may be relative; :func:`batchinfer.run` resolves them."""

    dataset: Path
    model: Path
    backend: str = "auto"
    cores: tuple[int, ...] | None = None  # None: every core of the chip
    instances_per_core: int = 1
    out: Path | None = None  # None: a new timestamped folder under runs/
    overwrite: bool = False
    resume: bool = False
    limit: int | None = None
    # Preprocessing overrides; None: from the model's input.
    size: tuple[int, int] | None = None
    color: str | None = None
    layout: str | None = None
    dtype: str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    topk: int = 5
    save_outputs: bool = False
    part_rows: int = 8192  # rows per Parquet part: a crash loses at most the part being filled
    slots: int | None = None  # None: enough to keep every instance and reader busy
    readers: int | None = None  # None: from the CPU count
    cpu_affinity: str = "auto"
    sim: SimOptions = field(default_factory=SimOptions)
    timeout_s: float = 60.0
    max_attempts: int = 2
    canary: bool = True
    progress: bool = False
    command: str | None = None  # the command line, for the manifest

    def to_json(self) -> dict[str, Any]:
        """The config as plain JSON values, for the manifest."""
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, Path):
                d[k] = str(v)
        return d
