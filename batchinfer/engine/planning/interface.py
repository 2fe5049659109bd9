"""What the engine takes (EnginePlan) and gives back (EngineResult)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchinfer.data.feeds import Feed
from batchinfer.data.preprocess import Preprocess
from batchinfer.engine.slots import TensorLayout
from batchinfer.errors import BatchinferError
from batchinfer.messages import Message
from batchinfer.options import ReliabilityOptions
from batchinfer.runtime.backends import Backend
from batchinfer.sink.stats import CoreStatsRecorder
from batchinfer.tasks import Task


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
    # What is done with the outputs (batchinfer/tasks); None: classify, as before tasks.
    task: Task | None = None
    # Copy the raw outputs into the output slots for the rows even when the worker decodes
    # them (--save-outputs); tasks that decode in the coordinator always copy them.
    save_outputs: bool = False
    # One per model input, in the model's order, when the model's inputs are fed separately
    # (several inputs, .npz items, manifest columns: batchinfer.data.feeds); empty: the
    # model's one input is fed by the item, with ``preprocess``.
    feeds: tuple[Feed, ...] = ()
    # -k auto (engine/planning/instances.py): instances_per_core is chosen by a measurement when the
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
        """Rows hold detection boxes (what evaluate/'s detection pipeline reads)."""
        return self.task is not None and self.task.detects

    @property
    def worker_task(self) -> Task | None:
        """The task the core workers decode with (Task.decodes_in_worker), else None."""
        return self.task if self.task is not None and self.task.decodes_in_worker else None

    @property
    def letterboxes(self) -> bool:
        """Readers letterbox and record each item's geometry (Task.placement)."""
        return self.task is not None and self.task.placement.letterboxes

    @property
    def copies_outputs(self) -> bool:
        """The workers copy the raw outputs to the output slots (the rows read them)."""
        return self.worker_task is None or self.save_outputs

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
        from batchinfer.tasks.classify import Classify

        return self.task is None or isinstance(self.task, Classify)


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
    # Tasks decoding in the workers: items decoded, CPU seconds the core workers spent
    # decoding (boxes, NMS, mapping back), and the task's figures (Task.figures: boxes,
    # NaN/inf candidates dropped).
    detect: dict[str, float] = field(default_factory=dict)
