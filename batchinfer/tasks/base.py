"""The Task protocol: one object owns every step that depends on what a model's outputs mean.

A task module subclasses :class:`Task` (box tasks: :class:`batchinfer.tasks.boxes.BoxTask`)
and is registered in ``batchinfer/tasks/__init__.py`` (one line), or given as a plug-in
(``--task file.py:Class``, ``--task package.module:Class``, entry-point group
``batchinfer.tasks``: batchinfer/tasks/plugin.py). The engine, the sink, ``info``, the
report and ``export`` call the task; none of them branches on its name.
"""

from __future__ import annotations

import math
import pickle
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa

from batchinfer.messages import Message, setting

if TYPE_CHECKING:
    from PIL import Image

    from batchinfer.detect import Letterbox
    from batchinfer.engine.planning.model_metadata import ModelMetadata
    from batchinfer.options import DetectOptions
    from batchinfer.sink.rows import Row


@dataclass(frozen=True)
class ModelFacts:
    """What a task is recognised from, read off the model before anything starts."""

    model: Path
    input_hw: tuple[int, int] | None  # the image input's (height, width); None: not an image
    output_shapes: tuple[tuple[int, ...], ...]  # () when unknown (a .rknn without its .onnx)
    # Per output: (scale, zero point) when the graph quantises it (int8 outputs); () if none.
    quant: tuple[tuple[float, int] | None, ...] = ()
    meta: ModelMetadata | None = None  # an Ultralytics export's own metadata
    labels: Path | None = None  # --labels
    dataset: Path | str | None = None  # the dataset's path (it may name the classes)

    @property
    def model_task(self) -> str | None:
        """The task the model's metadata names ("detect", "pose", ...), None without one."""
        return None if self.meta is None else self.meta.task

    @property
    def one_score_vector(self) -> bool:
        """One output with one axis longer than 1: a classifier's scores."""
        s = self.output_shapes
        return len(s) == 1 and sum(d != 1 for d in s[0]) <= 1

    @property
    def shapes_text(self) -> str:
        return shapes_text(self.output_shapes)

    @property
    def scores(self) -> int:
        """Values in the first output (0 when the shapes are unknown)."""
        return math.prod(self.output_shapes[0]) if self.output_shapes else 0


def shapes_text(shapes: Sequence[Sequence[int]]) -> str:
    """Shapes as a message says them: "[1, 84, 8400], [1, 32, 160, 160]"."""
    return ", ".join(str(list(s)) for s in shapes) or "none"


@dataclass(frozen=True)
class Placement:
    """How readers fit an image to the model's input: ``stretch`` (the preprocess settings'
    resize) or ``letterbox`` (keep aspect, centre, pad with ``pad``; the reader writes each
    item's geometry for the decoder: engine/detection.py)."""

    resize: str = "stretch"
    pad: tuple[int, int, int] = (114, 114, 114)

    @property
    def letterboxes(self) -> bool:
        return self.resize == "letterbox"


#: What a task's decoder is: (one item's outputs, its letterbox geometry or None) -> payload.
ItemDecode = Callable[[Sequence[np.ndarray], "Letterbox | None"], Any]


@dataclass(frozen=True, slots=True)
class Decoded:
    """One item decoded in a core worker: the task's payload and the decode's CPU seconds
    (measured with the thread's clock: bench's post-processing CPU per item)."""

    payload: Any
    cpu_s: float


@dataclass(frozen=True)
class Task(ABC):
    """A run's task: what the model's outputs mean, planned for one model.

    PROTOCOL (tasks), written down once here; docs/design.md quotes it:

        class attributes
          name                 "detect"; a plug-in's is its own ("embeddings")
          keeps_outputs        rows store the raw outputs too (raw)
          decodes_in_worker    decode() runs in the core worker, beside each runtime
                               instance, on that instance's decode thread (False: the
                               coordinator fills the rows in batches: collect())
        planning (the coordinator, before anything starts)
          recognise(facts, options, asked) -> Task | None
                               classmethod. facts: ModelFacts (output shapes, input
                               size, metadata, labels); options: DetectOptions. asked:
                               --task named this task: refuse with one ConfigError line
                               instead of returning None. Auto tries the task the
                               model's metadata names, then the registry's order
                               (batchinfer/tasks/__init__.py)
          placement            Placement: stretch, or letterbox with its pad colour
          describe(), said()   one line for the manifest; the run's task line;
                               info_lines(): what info says of it
          record()             the manifest's task record; fingerprint() is what of it
                               decides the rows (None: none does), for --resume;
                               from_record(record) (classmethod) makes the task again
                               from it, for what reads a finished run (export, report)
        worker side (the task object travels in the worker's spec: picklable; a
        plug-in's class is imported again there by its reference, never pickled code)
          decoder() -> ItemDecode, made once per runtime instance, called with
                               (outputs, Letterbox or None) on the decode thread;
                               returns a small picklable payload. Raising makes that
                               item an error row, never the worker's death
        coordinator and sink side
          collect(rows, topk)  decodes_in_worker False: fill a batch of rows from
                               their outputs (classify's one vectorised top-k)
          figures(payload)     numbers summed over the run for the manifest
          fields()             the task's Arrow columns (part_metadata(): the parts'
                               schema metadata naming the task)
          arrays(payloads, bad) one array per field over a part's rows (None: an error
                               row, nulls); a value a field cannot store puts its row
                               in bad (row -> why): that item's error row
        the run's items afterwards
          draw(canvas, row)    a predictions row drawn (the report, export draw)
          exports              its standard formats: {name: "module:function"}
          scorer               eval's scorer, "module:Class" (None: no job names it)
    """

    name: ClassVar[str] = ""
    keeps_outputs: ClassVar[bool] = False
    decodes_in_worker: ClassVar[bool] = True
    #: Rows hold detection boxes (evaluate/'s detection pipeline reads them).
    detects: ClassVar[bool] = False

    reason: str = "asked for"  # why this task, one phrase ("one output of 10 scores")
    output_shapes: tuple[tuple[int, ...], ...] = field(default=())
    model_task: str | None = None  # the task the model's own metadata names

    # -- planning ------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def recognise(cls, facts: ModelFacts, options: DetectOptions, asked: bool) -> Task | None:
        """This task planned for the model, or None when it is not this task's."""

    @property
    def placement(self) -> Placement:
        return Placement()

    @property
    def plugin(self) -> bool:
        """A user's task (plugin.py), not one of batchinfer's."""
        return "_batchinfer_reference" in type(self).__dict__

    def describe(self) -> str:
        return f"{self.name}: {self.reason}"

    def info_lines(self) -> list[str]:
        """What ``info`` says of the task ``auto`` picks for the model."""
        return [f"task:    {self.describe()}"]

    def said(self) -> Message:
        """The line a run starts with: the task it picked and why."""
        why = "asked for with " + setting("detect.task") if self.reason == "asked for" else None
        return "task: " + Message(self.name, " (", why or Message(self.reason), ")")

    def record(self) -> dict[str, Any]:
        """The manifest's ``task`` record (JSON); a plug-in's names where it came from."""
        out: dict[str, Any] = {"task": self.name, "description": self.describe()}
        ref = type(self).__dict__.get("_batchinfer_reference")
        if ref is not None:
            out["reference"] = ref
        return out

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Task:
        """The task again from its manifest record, enough to store and draw rows (not to
        decode: what the record does not keep, such as a head's layout, is left unset)."""
        return cls(reason=str(record.get("description", "")))

    def to_json(self) -> dict[str, Any]:  # the name callers had before tasks/ existed
        return self.record()

    def fingerprint(self) -> dict[str, Any] | None:
        """What of the task decides the rows: the record without its description."""
        out = self.record()
        out.pop("description", None)
        return out

    # -- worker side ---------------------------------------------------------------------
    def decoder(self) -> ItemDecode:
        """One runtime instance's decoder (it may keep scratch buffers: one per instance)."""
        return self.decode

    def decode(self, outputs: Sequence[np.ndarray], placed: Letterbox | None) -> Any:
        """One item's payload (the default :meth:`decoder`); plug-ins write this."""
        raise NotImplementedError(f"task {self.name} does not decode in the core workers")

    # -- coordinator and sink side ---------------------------------------------------------
    def collect(self, rows: Sequence[Row], topk: int) -> None:
        """Fill rows from their outputs in the coordinator (decodes_in_worker False)."""
        return None

    def figures(self, payload: Any) -> Mapping[str, float]:
        return {}

    def fields(self) -> list[pa.Field]:
        return []

    def part_metadata(self) -> dict[bytes, bytes]:
        return {b"batchinfer.task": self.name.encode()}

    def arrays(self, payloads: Sequence[Any], bad: dict[int, str]) -> list[pa.Array]:
        """Default: each payload is a mapping field name -> value, stored by Arrow's
        conversion; a value a field cannot hold nulls that row and names it in ``bad``."""
        from batchinfer.sink.storable import checked_array

        out = []
        for f in self.fields():
            values = [None if p is None else _get(p, f.name) for p in payloads]
            out.append(checked_array(values, f.name, f.type, bad))
        return out

    def columns(self) -> Any:
        """A part's buffer of this task's columns (sink/predictions.py): rows in, arrays out."""
        return PayloadColumns(self)

    # -- afterwards ----------------------------------------------------------------------
    def draw(self, canvas: Image.Image, row: Mapping[str, Any], **style: Any) -> Image.Image:
        """``canvas`` with the row's results drawn (default: unchanged: nothing to draw)."""
        return canvas

    #: Its standard export formats, name -> "module:function" (``function(run_dir, dest)``,
    #: as ``batchinfer export NAME`` calls it): references, so tasks never import export.
    exports: ClassVar[Mapping[str, str]] = {}

    #: eval's scorer for this task, as "module:Class" (a class of batchinfer/evaluate/
    #: scoring.py's ``Scorer`` protocol, imported by eval when a job names the task: a
    #: reference, so tasks never import eval), or None: no evaluation job can name it.
    scorer: ClassVar[str | None] = None


def _get(payload: Any, name: str) -> Any:
    try:
        return payload[name]
    except (KeyError, TypeError, IndexError):
        return None


class PayloadColumns:
    """A part's payloads buffered for :meth:`Task.arrays` (rows of a worker-decoded task)."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.payloads: list[Any] = []

    def add(self, rows: Sequence[Row], ok: Sequence[bool]) -> int:
        """Buffer rows (``ok`` False: an error row); returns the bytes they add (about)."""
        added = [r.payload if good else None for r, good in zip(rows, ok, strict=True)]
        self.payloads.extend(added)
        return sum(_nbytes(p) for p in added)

    def arrays(self, bad: dict[int, str]) -> list[pa.Array]:
        return self.task.arrays(self.payloads, bad)


def _nbytes(payload: Any) -> int:
    return int(getattr(payload, "nbytes", 0) or 0)


class ItemDecoder:
    """The core worker's side of a task: one per runtime instance, it reads the item's
    letterbox geometry (engine/detection.py), calls the task's decoder and times it."""

    def __init__(self, task: Task) -> None:
        from batchinfer.engine.detection import read_geometry

        self._read = read_geometry
        self._decode = task.decoder()
        # A plug-in's payload must travel back in the Done message: one that cannot be
        # pickled would kill the worker's sender, so it is tried here (that item's error).
        self._check = task.plugin

    def __call__(self, outputs: Sequence[np.ndarray], geometry: np.ndarray | None) -> Decoded:
        c0 = time.thread_time()
        placed = None if geometry is None else self._read(geometry)
        payload = self._decode(outputs, placed)
        if self._check:
            try:
                pickle.dumps(payload)
            except Exception as e:
                raise TypeError(
                    f"the task's decode returned a {type(payload).__name__} that cannot be "
                    f"sent back from the core worker ({e})"
                ) from None
        return Decoded(payload, time.thread_time() - c0)
