"""What the engine takes (EnginePlan) and gives back (EngineResult)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchinfer.data.feeds import Feed
from batchinfer.data.preprocess import Preprocess
from batchinfer.engine.slots import TensorLayout
from batchinfer.engine.task import TaskPlan
from batchinfer.errors import BatchinferError
from batchinfer.messages import Message
from batchinfer.options import ReliabilityOptions
from batchinfer.runtime.backends import Backend
from batchinfer.sink.stats import CoreStatsRecorder


@dataclass(frozen=True)
class EnginePlan:
    """What the engine needs: validated settings (see plan.py), no paths to check."""

    backend: Backend
    cores: tuple[int, ...]
    instances_per_core: int
    preprocess: Preprocess
    slots: int
    readers: int  # to start with
    cpus: tuple[int, ...] | None
    reliability: ReliabilityOptions
    topk: int
    max_readers: int = 0  # more than ``readers``: grown while running (reader_scaling.py)
    # Items wait until every core is up (eval: its per-core metrics compare cores, and a
    # core that started first would take the first items, often a class of their own).
    cores_start_together: bool = False
    # What is done with the outputs (engine/task.py); None: classify, as before tasks.
    task: TaskPlan | None = None
    # Copy the raw outputs into the output slots for the rows even when the worker decodes
    # them (a detection run with --save-outputs); classify and raw always copy them.
    save_outputs: bool = False
    # One per model input, in the model's order, when the model's inputs are fed separately
    # (several inputs, .npz items, manifest columns: batchinfer.data.feeds); empty: the
    # model's one input is fed by the item, with ``preprocess``.
    feeds: tuple[Feed, ...] = ()
    # -k auto (engine/instances.py): instances_per_core is chosen by a measurement when the
    # run starts (settle_instances; until then it is the most auto may choose), and
    # instances_choice then records the choice and why, for the manifest.
    instances_auto: bool = False
    instances_choice: dict[str, Any] | None = None
    # A model built for a batch of N (a static batch axis N > 1, engine/batching.py): each
    # slot holds one item (``preprocess.shape`` has batch 1) and a core worker's instance
    # packs up to N of them into each runtime call. 1: one item per call.
    batch: int = 1

    @property
    def detects(self) -> bool:
        return self.task is not None and self.task.detects

    @property
    def item_lanes(self) -> int:
        """Items one core works on at once: instances × batch (the scheduler's queue depth,
        the status board's rows and the refills scale with it, engine/batching.py)."""
        return self.instances_per_core * self.batch

    @property
    def input_layout(self) -> TensorLayout:
        """The tensors of one input slot: one per model input."""
        if not self.feeds:
            return TensorLayout((self.preprocess.shape,), (self.preprocess.dtype,))
        return TensorLayout(tuple(f.shape for f in self.feeds), tuple(f.dtype for f in self.feeds))

    @property
    def data_format(self) -> str | tuple[str, ...]:
        """RKNNLite's ``data_format``: the one input's layout, or one per input."""
        if not self.feeds:
            return self.preprocess.layout
        return tuple(f.data_format for f in self.feeds)

    @property
    def classifies(self) -> bool:
        """Rows get top-1 and top-k (not for a detection run's boxes, nor a raw run's outputs)."""
        return self.task is None or self.task.task == "classify"


@dataclass
class EngineResult:
    """How a run ended and what it did."""

    status: str  # complete | interrupted | failed
    error: BatchinferError | None
    counts: dict[str, int]
    stats: CoreStatsRecorder
    # Messages (batchinfer.messages): str, naming settings by field, renderable per front end.
    warnings: list[Message]
    sdk_versions: dict[int, str | None]
    retired_cores: list[int]
    backend: dict[str, Any] = field(default_factory=dict)
    collect_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds by role
    peak_rss_mb: float = 0.0  # the coordinator's, while the engine ran
    # Detection runs: items decoded, CPU seconds the core workers spent decoding (boxes,
    # NMS, mapping back), NaN/inf candidates dropped (engine/detection.py).
    detect: dict[str, float] = field(default_factory=dict)
