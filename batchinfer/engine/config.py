"""RunConfig: one run of the main job (a dataset folder through the engine into a run folder)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchinfer.options import (
    DetectOptions,
    OutputOptions,
    PreprocessOptions,
    ReliabilityOptions,
    RuntimeOptions,
    SimOptions,
)

__all__ = [
    "DetectOptions",
    "OutputOptions",
    "PreprocessOptions",
    "ReliabilityOptions",
    "RunConfig",
    "RuntimeOptions",
    "SimOptions",
]


@dataclass(frozen=True)
class RunConfig:
    """One run: what to run on, and the option groups (see batchinfer.options).

    Paths may be relative to the current folder; planning resolves them.
    """

    dataset: Path
    model: Path
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    preprocess: PreprocessOptions = field(default_factory=PreprocessOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    reliability: ReliabilityOptions = field(default_factory=ReliabilityOptions)
    detect: DetectOptions = field(default_factory=DetectOptions)  # the task (engine/task.py)
    limit: int | None = None  # only the first N items of the dataset
    labels: Path | None = None  # a class map file (see batchinfer.data.classes)
    image_root: Path | None = None  # where a list's / COCO file's relative paths start
    command: str | None = None  # the command line, for the manifest

    def to_json(self) -> dict[str, Any]:
        """The config as plain JSON values, for the manifest."""

        def plain(value: Any) -> Any:
            if isinstance(value, Path):
                return str(value)
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            return value

        return plain(dataclasses.asdict(self))
