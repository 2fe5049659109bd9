"""What runs on the nodes: core actors, node hosts and read tasks (plain code; nodes.py and
reads.py make Ray actors and tasks of them, so importing this module needs no Ray).

Protocol (the driver's side: pool.py; node hosts: nodes.py; read tasks: reads.py):
  NodeHost, one per node    begin(model_files) -> the node's per-run backend
                              model_files: {file name: bytes} of the model and the files a
                              runtime reads beside it; a node that has no identical copy
                              at the model's path gets one in a private temp folder
                            end()      undo begin (the emulator's board folder and the
                              model's copy go)
  CoreActor, one per        start(shape, dtype) -> info | {"init_failed": reason}
  runtime instance            the instance is made and runs the canary, a
                              batch-N model's a full batch of N (info: its first row's
                              outputs; reason: a runtime/adapter.py CoreReason); called
                              again after Ray restarted the actor (a new process: a new
                              instance)
                            infer(indexes, *inputs)
                              -> [CallResult(t0, t1, before_return_s, error, outputs,
                                  decoded)]
                              one call, a few items, inferred in order: a batch-N model's
                              packed N to a runtime call (the last may be short: padded),
                              a failed call's items called again alone, each item its own
                              result (engine/batching.py's NOTE, infer_packed); error None:
                              outputs are the model's outputs (batch 1); else one
                              sentence. When the run's task decodes in the workers the actor
                              decodes too (decoded: a tasks.Decoded, as a core worker's;
                              outputs None unless the run saves them, --save-outputs); a
                              letterboxing task's inputs come as (tensor, geometry).
                              t0, t1:
                              inside inference(), on the node's monotonic clock (shared by
                              the node's actors, not the driver's); before_return_s: how
                              long before the call returned the item was done.
  read task                 read_items(items, preprocess, kind) -> (meta, *arrays)
                              items: [(index, path, id, locator)]; locator: None, or
                              where the item is inside the file at path (data/dataset.py
                              Locator: a tar shard's member, a video's frame); a worker
                              process keeps its last shard open across tasks
                              meta: [(read_ms, error)] per item; an array per item (None for
                              an error), each its own object, so each goes to whichever
                              node infers it. Letterboxed (detection) items are
                              (array, geometry row) objects: the geometry travels with it.
  node check task           dataset_visible(paths) -> None or what is missing
A node's actors get its host's backend, so every instance of a node shares the node's
emulated board (the sim's state folder) and no two nodes share one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from batchinfer.data.dataset import Locator
from batchinfer.data.preprocess import Preprocess, load_into
from batchinfer.data.shard_reading import ShardFiles
from batchinfer.engine.batching import (
    Call,
    Packer,
    batch_shapes,
    infer_packed,
    unbatchable_outputs,
)
from batchinfer.engine.canary import canary_input
from batchinfer.engine.detection import write_geometry
from batchinfer.errors import BatchinferError, InferenceError, InputError
from batchinfer.messages import Message
from batchinfer.runtime.adapter import CoreError, CoreReason, RuntimeAdapter
from batchinfer.runtime.backends import Backend
from batchinfer.runtime.rknn_log import quiet_instance_logs
from batchinfer.tasks import Decoded, ItemDecoder, Task


class CallResult(NamedTuple):
    """One item of a core actor's ``infer`` call (the module docstring's protocol)."""

    t0: float
    t1: float
    before_return_s: float
    error: str | None
    outputs: list[np.ndarray] | None
    decoded: Decoded | None


class NodeHost:
    """The per-run set-up of one node (the backend's for_run/end_run), for as long as the run."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.run_backend: Backend | None = None
        self.model_copy: str | None = None

    def begin(self, model_files: dict[str, bytes]) -> Backend:
        backend = self.backend
        if not _same_files(backend.model.parent, model_files):
            self.model_copy = tempfile.mkdtemp(prefix="batchinfer-model-")
            for name, data in model_files.items():
                (Path(self.model_copy) / name).write_bytes(data)
            backend = dataclasses.replace(backend, model=Path(self.model_copy) / backend.model.name)
        backend.sweep()
        self.run_backend = backend.for_run()
        return self.run_backend

    def end(self) -> None:
        if self.run_backend is not None:
            self.run_backend.end_run()
            self.run_backend = None
        if self.model_copy is not None:
            shutil.rmtree(self.model_copy, ignore_errors=True)
            self.model_copy = None


def model_files(model: Path) -> dict[str, bytes]:
    """The model file and the files a runtime reads beside it (a .rknn's .onnx and
    .config.json), by name: what a node without the model gets."""
    model = Path(model)
    names = [model.name]
    if model.suffix.lower() == ".rknn":
        names += [model.stem + ".onnx", model.stem + ".config.json"]
    return {n: (model.parent / n).read_bytes() for n in names if (model.parent / n).is_file()}


def _same_files(folder: Path, files: dict[str, bytes]) -> bool:
    """True when ``folder`` holds every one of ``files`` with the same bytes."""
    for name, data in files.items():
        digest = hashlib.sha256()
        try:
            with open(folder / name, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
        except OSError:
            return False
        if digest.digest() != hashlib.sha256(data).digest():
            return False
    return True


class CoreActor:
    """One runtime instance on one NPU core of one node."""

    def __init__(
        self,
        backend: Backend,
        core: int,
        input_layout: str,
        task: Task | None = None,
        save_outputs: bool = False,
        batch: int = 1,
    ) -> None:
        self.backend = backend
        self.core = core
        self.input_layout = input_layout
        self.batch = batch  # the model's batch N (engine/batching.py): items per runtime call
        self.packer: Packer | None = None  # a batch-N model's batch buffers (start() makes them)
        self.adapter: RuntimeAdapter | None = None
        self.decode = ItemDecoder(task) if task is not None else None
        # A decoding task's outputs travel back beside its payload only when they are saved
        # (as a core worker copies them to its slots: engine/board/worker.py).
        self.keep_outputs = self.decode is None or save_outputs

    def start(self, shape: tuple[int, ...], dtype: str) -> dict[str, Any]:
        """Make the instance and infer the canary; what the pool needs to know."""
        if self.adapter is None:
            quiet_instance_logs()  # as in a core worker: no start-up lines per actor
            try:
                self.adapter = self.backend.instance(self.core)
            except (BatchinferError, OSError) as e:
                return {"init_failed": _reason(e)}
        n = self.batch
        # A batch-N model's canary is a full batch of N items, as on a board (its first
        # row stands for every item: the pool and the collector see batch-1 outputs).
        call_shape = batch_shapes([shape], n)[0] if n > 1 else shape
        try:
            outs = self.adapter.infer(
                [canary_input(call_shape, dtype)],
                data_format=self.input_layout,
                reuse_outputs=False,
            )
        except InferenceError as e:
            return {"init_failed": _reason(e).after("the canary inference failed: ")}
        if n > 1:
            unsplittable = unbatchable_outputs(outs, n)
            if unsplittable is not None:
                return {"init_failed": CoreReason.of(unsplittable)}
            outs = [o[:1] for o in outs]
            self.packer = Packer([shape], [dtype], n)
        return {
            "sdk_version": self.adapter.sdk_version(),
            "outputs": [(tuple(o.shape), str(o.dtype)) for o in outs],
            "canary": [np.asarray(o) for o in outs],
            "pid": os.getpid(),
        }

    def infer(self, indexes: list[int], *inputs: np.ndarray) -> list[CallResult]:
        """Infer the inputs in calls of the model's batch (see the module docstring)."""
        assert self.adapter is not None, "start() comes first"
        calls = _ActorCalls(self, self.adapter)
        items = []
        for index, x in zip(indexes, inputs, strict=True):
            geometry = np.zeros(6)
            if isinstance(x, tuple):  # a letterboxed item (read_items)
                x, geometry = x
            items.append(_Item(index, x, geometry))
        for k in range(0, len(items), self.batch):
            infer_packed(calls, items[k : k + self.batch])
        end = time.monotonic()
        return [r._replace(before_return_s=end - r.t1) for r in calls.results]

    def stop(self) -> None:
        if self.adapter is not None:
            self.adapter.release()
            self.adapter = None


@dataclasses.dataclass(frozen=True)
class _Item:
    """One item of an ``infer`` call."""

    index: int
    tensor: np.ndarray
    geometry: np.ndarray


class _ActorCalls:
    """The runtime calls of one ``infer`` (engine/batching.py's BatchRuntime): a batch-N
    model's items packed N to a call, a batch-1 model's inferred one by one; the results
    in the items' order."""

    def __init__(self, actor: CoreActor, adapter: RuntimeAdapter) -> None:
        self.actor, self.adapter = actor, adapter
        self.row_error = adapter.row_error  # a None: with the runtime's own E line
        # In the items' order: a failed call's items are called again alone, in order.
        self.results: list[CallResult] = []

    def pack(self, items: Sequence[_Item]) -> list[np.ndarray]:
        self.adapter.set_current_items([item.index for item in items])
        if self.actor.packer is None:  # batch 1: the item is the call
            return [items[0].tensor]
        return self.actor.packer.pack([[item.tensor] for item in items])

    def begin(self, items: Sequence[_Item], t0: float) -> None:
        """Nothing to watch here: the driver times the actor's calls (pool.py)."""

    def infer(self, items: Sequence[_Item], batch: list[np.ndarray]) -> list[np.ndarray]:
        return self.adapter.infer(batch, data_format=self.actor.input_layout, reuse_outputs=False)

    def end(self, items: Sequence[_Item], t1: float) -> None:
        """Nothing to stop watching (begin)."""

    def done(self, call: Call[_Item]) -> None:
        actor = self.actor
        for j, item in enumerate(call.items):
            error, decoded = call.error, None
            outs = None if error is not None else call.rows(j) if actor.packer else call.outputs
            if actor.decode is not None and outs is not None:
                try:
                    decoded = actor.decode(outs, item.geometry)
                    outs = outs if actor.keep_outputs else None
                except Exception as e:
                    error = f"decoding the outputs failed: {type(e).__name__}: {e}"
            self.results.append(CallResult(call.t0, call.t1, 0.0, error, outs, decoded))


def _reason(e: BaseException) -> CoreReason:
    """Why the instance could not start, as a core worker says it (engine/board/worker.py)."""
    if isinstance(e, CoreError):
        return e.reason
    return CoreReason.of(e.message if isinstance(e, BatchinferError) else str(e))


#: The shards this (Ray worker) process has open, reused by its read tasks.
_SHARDS = ShardFiles()


def read_items(
    items: list[tuple[int, str, str, Locator | None]], preprocess: Preprocess, kind: str
) -> tuple:
    """Decode ``items`` ((index, path, id, locator)): (meta, *arrays); see the module
    docstring."""
    meta, arrays = [], []
    for _index, path, item_id, locator in items:
        t0 = time.perf_counter()
        out = np.empty(preprocess.shape, np.dtype(preprocess.dtype))
        error: Message | str | None = None
        item: np.ndarray | tuple[np.ndarray, np.ndarray] = out
        try:
            name = item_id if locator is not None else None  # files: named by their path
            placed = load_into(
                path, preprocess, out, kind, name=name, member=locator, shards=_SHARDS
            )
            if preprocess.resize == "letterbox":
                geometry = np.zeros(6)
                write_geometry(geometry, placed)
                item = (out, geometry)
        except InputError as e:
            error = e.message  # settings as references: each front end names them its way
        except Exception as e:  # a decoder bug must not kill the run: it is this item's error
            error = f"cannot read {name or path}: {type(e).__name__}: {e}"
        meta.append(((time.perf_counter() - t0) * 1e3, error))
        arrays.append(None if error is not None else item)
    return (meta, *arrays)


def dataset_visible(paths: list[str]) -> str | None:
    """None when every path is a readable file on this node; else the first that is not."""
    for path in paths:
        if not os.access(path, os.R_OK):
            return path
    return None
