"""The library API for data in memory: :func:`infer` and :func:`infer_iter`.

    table = batchinfer.infer("digits.onnx", images, cores=(0, 1, 2))  # a pyarrow Table
    with batchinfer.infer_iter("digits.onnx", frames()) as stream:   # pyarrow RecordBatches
        for batch in stream:
            ...

The same engine as ``run`` (the coordinator, one worker process per NPU core, shared-memory
slots), the same option groups (batchinfer.options), and rows with the columns of a run's
predictions (batchinfer.sink.predictions: ``index``, ``id``, ``error``, ``pred``/``topk_*``
or ``boxes``, ``out_output0`` ... when outputs are kept), but no run folder: the rows come
back to the caller. An item that fails is a row with its ``error``; bad arguments raise a
:class:`~batchinfer.errors.UsageError` before any process starts.

What can be given:
- arrays: a list of numpy arrays, or one array whose first axis indexes the items, each of
  the model's input shape (with or without its batch axis of 1) and a dtype that casts to
  the input's without loss of kind (float64 to float32, not float to uint8). They are fed
  as they are, like ``.npy`` tensors: no resize, no mean/std. Any other iterable of arrays
  is read lazily, as slots free up (a stream).
- paths: a list of image or ``.npy`` file paths, decoded by reader processes with the
  run's preprocessing, as a dataset's items are.

Threads: the engine runs in a thread of its own and hands each batch of rows to a queue,
from which the caller's thread takes them. A stream of arrays is read in the engine's
thread; it waits while more than a few slots' worth of rows wait for the caller, so a slow
caller bounds memory. Closing the stream (leaving a ``for`` or ``with`` early, ``close()``,
an exception in the caller, garbage collection) stops the engine at once and waits for it:
its processes and shared-memory segments are gone when ``close`` returns. Ctrl-C reaches
the caller's thread as KeyboardInterrupt, which closes the stream the same way.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, ParamSpec

import numpy as np
import pyarrow as pa

from batchinfer.array_items import ArrayItems, check_array, several_inputs
from batchinfer.data.listed import PathList, open_listed
from batchinfer.data.sources import frames_of_videos
from batchinfer.engine.board.instance_probe import settle_instances
from batchinfer.engine.events import Observer
from batchinfer.engine.loop import Engine
from batchinfer.engine.planning.config import RunConfig
from batchinfer.engine.planning.interface import EnginePlan, EngineResult
from batchinfer.engine.planning.plan import plan_inference
from batchinfer.engine.sources import DatasetSource, ItemSource
from batchinfer.errors import ModelError, RunInterrupted, UsageError
from batchinfer.options import (
    DetectOptions,
    OutputOptions,
    PreprocessOptions,
    ReliabilityOptions,
    RuntimeOptions,
)
from batchinfer.options_video import video_settings
from batchinfer.runtime import describe_model
from batchinfer.sink.predictions import PredictionWriter
from batchinfer.sink.rows import Row

log = logging.getLogger("batchinfer")

_NOTHING = object()

#: Rows a stream of arrays lets wait for the caller, beyond the slots, before it waits.
WAITING_ROWS = 256

_P = ParamSpec("_P")


def infer_iter(
    model: str | os.PathLike[str],
    data: Any,
    *,
    cores: Sequence[int] | None = None,
    runtime: RuntimeOptions | None = None,
    preprocess: PreprocessOptions | None = None,
    output: OutputOptions | None = None,
    reliability: ReliabilityOptions | None = None,
    detect: DetectOptions | None = None,
    labels: str | os.PathLike[str] | None = None,
    observers: Sequence[Observer] = (),
) -> InferStream:
    """:func:`infer` as a stream: small ``pyarrow.RecordBatch`` objects of rows in the order the
    items finish (sort by ``index`` for input order). Close it, or use it in a ``with``,
    when not reading it to the end (see the module docstring)."""
    runtime = runtime or RuntimeOptions()
    if cores is not None:
        cores = tuple(cores)
        if runtime.cores is not None and tuple(runtime.cores) != cores:
            raise UsageError(
                f"cores={cores} and runtime.cores={tuple(runtime.cores)} disagree; give one."
            )
        runtime = dataclasses.replace(runtime, cores=cores)
    output = output or OutputOptions()
    if output.out is not None or output.resume or output.overwrite:
        raise UsageError(
            "infer returns its rows and writes no run folder, so output.out, resume and "
            "overwrite do not apply; use batchinfer.run to write a run folder."
        )
    path = Path(model).expanduser().resolve()
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist; pass the path of a .rknn or .onnx.")
    config = RunConfig(
        dataset=Path("."),
        model=path,
        runtime=runtime,
        preprocess=preprocess or PreprocessOptions(),
        output=output,
        reliability=reliability or ReliabilityOptions(),
        detect=detect or DetectOptions(),
        labels=None if labels is None else Path(labels),
    )
    items, paths = _given(data)
    if paths is not None:
        plan, source, meta = _plan_paths(config, paths)
    else:
        plan, source = _plan_arrays(config, items)
        meta = None
    plan = settle_instances(plan)  # -k auto: measured now, before the engine is made
    sink = _BatchSink(plan, output.topk, meta)
    return InferStream(plan, source, sink, observers)


def _gathered(
    stream: Callable[_P, InferStream],
) -> Callable[[Callable[[InferStream], pa.Table]], Callable[_P, pa.Table]]:
    """Make a function of the opened stream into one taking ``stream``'s arguments.

    ``infer`` takes what ``infer_iter`` takes, so its options are written once, on
    infer_iter: mypy sees them through the ParamSpec, help() and inspect through
    ``__signature__`` (infer_iter's, with the gathering function's return type).
    """

    def wrap(gather: Callable[[InferStream], pa.Table]) -> Callable[_P, pa.Table]:
        def call(*args: _P.args, **kwargs: _P.kwargs) -> pa.Table:
            with stream(*args, **kwargs) as opened:
                return gather(opened)

        call.__name__ = call.__qualname__ = gather.__name__
        call.__doc__ = gather.__doc__
        returns = inspect.signature(gather).return_annotation
        call.__annotations__ = {**stream.__annotations__, "return": returns}
        # A function object takes any attribute; mypy knows only the declared ones.
        call.__signature__ = inspect.signature(stream).replace(  # type: ignore[attr-defined]
            return_annotation=returns
        )
        return call

    return wrap


@_gathered(infer_iter)
def infer(stream: InferStream) -> pa.Table:
    """Run ``model`` over ``data`` (arrays or file paths, see the module docstring) on the
    NPU cores; the rows, one per item, in input order (``index``).

    ``cores`` is short for ``runtime.cores``; ``output`` gives ``topk`` and
    ``save_outputs`` (a folder's settings, ``out``, ``resume``, ``overwrite``, are refused:
    use :func:`batchinfer.run`). Raises a BatchinferError when the run cannot start or
    fails as a whole (every core lost); an item's failure is its row's ``error``.
    """
    # Called with infer_iter's arguments (see _gathered); here, the stream they opened.
    table = pa.Table.from_batches(list(stream), schema=stream.schema)
    return table.sort_by("index")


# --------------------------------------------------------------------------- arguments


def _given(data: Any) -> tuple[Any, list[str] | None]:
    """(arrays, None) or (None, paths): what ``data`` is, refused when it is neither."""
    if isinstance(data, (str, bytes, os.PathLike)):
        raise UsageError(
            f"data is one path ({os.fsdecode(data)!r}); pass a list of file paths, or use "
            "batchinfer.run for a dataset folder or list file."
        )
    if isinstance(data, np.ndarray):
        if data.ndim < 1 or not len(data):
            raise UsageError(
                f"data is an array of shape {data.shape}; infer takes one whose first axis "
                "indexes the items (at least one), or a list of arrays."
            )
        return data, None
    if isinstance(data, dict):
        raise several_inputs()
    if not isinstance(data, Iterable):
        raise UsageError(
            f"data is a {type(data).__name__}; pass a list of numpy arrays, one stacked "
            "array, an iterable of arrays, or a list of file paths."
        )
    if not isinstance(data, Sequence):  # a stream: its first element says what it holds
        stream = iter(data)
        first = next(stream, _NOTHING)
        if first is _NOTHING:
            raise UsageError("data holds no items; give at least one.")
        if isinstance(first, (str, os.PathLike)):
            return None, _paths([first, *stream])
        _kind_of(first, 0)
        return itertools.chain([first], stream), None
    if not len(data):
        raise UsageError("data holds no items; give at least one.")
    if isinstance(data[0], (str, os.PathLike)):
        return None, _paths(data)
    for i, value in enumerate(data):
        _kind_of(value, i)
    return data, None


def _kind_of(value: Any, i: int) -> None:
    """UsageError unless ``value`` (item ``i`` of a list of arrays) is a numpy array."""
    if isinstance(value, dict):
        raise several_inputs()
    if not isinstance(value, np.ndarray):
        raise UsageError(
            f"item {i} of data is a {type(value).__name__}; give numpy arrays, or file "
            "paths, all of one kind."
        )


def _paths(values: Iterable[Any]) -> list[str]:
    paths = []
    for i, value in enumerate(values):
        if not isinstance(value, (str, os.PathLike)):
            raise UsageError(
                f"item {i} of data is a {type(value).__name__} among file paths; give paths "
                "or arrays, all of one kind."
            )
        paths.append(os.path.abspath(os.fsdecode(value)))
    return paths


# --------------------------------------------------------------------------- planning
def _plan_paths(config: RunConfig, paths: list[str]) -> tuple[EnginePlan, ItemSource, Any]:
    """Paths are a dataset named by a list, planned as ``run`` plans one
    (engine/planning/plan.py)."""
    entries = PathList("paths", f"the {len(paths)} paths given", Path.cwd(), paths, "path")
    video = video_settings(config.preprocess)
    planned = plan_inference(
        config, lambda labels: frames_of_videos(open_listed(entries, labels_file=labels), video)
    )
    assert planned.dataset is not None  # opened by the function above
    return planned.engine, DatasetSource(planned.dataset), planned.dataset.meta_type


def _plan_arrays(config: RunConfig, arrays: Any) -> tuple[EnginePlan, ItemSource]:
    """Arrays are fed as they are: checked against the model's input (all of them, unless
    they come as a stream) before anything starts."""
    try:
        several = len(describe_model(config.model).inputs) > 1
    except ModelError:
        several = False  # a bare .rknn: model_input reads its shape off the settings
    if several:
        raise several_inputs()
    engine = plan_inference(config, several_inputs=False).engine
    if engine.letterboxes:
        assert engine.task is not None
        raise UsageError(
            f"a {engine.task.name} model's results are mapped back onto the original image, "
            "which arrays do not have; pass the images' file paths, or detect.task 'raw' for "
            "the raw outputs."
        )
    engine.preprocess.validate_for("npy")  # arrays are tensors as they are, like .npy
    slot_shape, slot_dtype = tuple(engine.preprocess.shape), np.dtype(engine.preprocess.dtype)
    if isinstance(arrays, np.ndarray):
        check_array(0, arrays[0], slot_shape, slot_dtype)
        total: int | None = len(arrays)
    elif isinstance(arrays, Sequence):
        for i, array in enumerate(arrays):
            check_array(i, array, slot_shape, slot_dtype)
        total = len(arrays)
    else:
        total = None
    source = ArrayItems(arrays, total, slot_shape, slot_dtype, engine.slots + WAITING_ROWS)
    return engine, source


# --------------------------------------------------------------------------- rows
class _BatchSink:
    """Turns each batch of rows the engine writes into a RecordBatch for the caller, with
    the columns of a run's predictions (a PredictionWriter without a folder)."""

    def __init__(self, plan: EnginePlan, topk: int, meta: Any) -> None:
        self.plan, self.topk, self.meta = plan, topk, meta
        self.writer: PredictionWriter | None = None
        self.emit: Any = None  # set by InferStream: takes each RecordBatch

    def open(self, outputs: list[tuple[tuple[int, ...], str]]) -> None:
        plan = self.plan
        self.writer = PredictionWriter(
            None,
            topk=self.topk,
            save_outputs=[(f"output{i}", shape) for i, (shape, _) in enumerate(outputs)]
            if plan.save_outputs
            else None,
            rows_per_part=1 << 62,  # never a part: take_table after each batch
            flush_interval_s=float("inf"),
            max_buffer_bytes=1 << 62,
            task=plan.task if plan.task is not None else "classify",
            meta=self.meta,
        )

    @property
    def schema(self) -> pa.Schema | None:
        return None if self.writer is None else self.writer.schema

    def write(self, rows: list[Row]) -> None:
        assert self.writer is not None, "open() comes before the first row"
        self.writer.write(rows)
        for batch in self.writer.take_table().combine_chunks().to_batches():
            self.emit(batch)

    def close(self) -> None:
        pass


class InferStream:
    """The rows of :func:`infer_iter` as they come: an iterator of RecordBatches, and a
    context manager that closes it (see the module docstring)."""

    def __init__(
        self,
        plan: EnginePlan,
        source: ItemSource,
        sink: _BatchSink,
        observers: Sequence[Observer] = (),
    ) -> None:
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._source = source
        self._sink = sink
        self._engine = Engine(plan, source, sink, observers)
        #: How the engine's run ended (status, counts, warnings), once the stream has.
        self.result: EngineResult | None = None
        self._closing = False
        self._done = False
        # Nothing the engine's thread holds may refer to the stream: a stream the caller
        # dropped must be garbage, so that __del__ closes it.
        sink.emit = _emitter(self._queue, source)
        self._thread = threading.Thread(
            target=_drive, args=(self._engine, self._queue), name="batchinfer-infer", daemon=True
        )
        self._thread.start()

    @property
    def schema(self) -> pa.Schema | None:
        """The rows' schema, once the first core is up (None before)."""
        return self._sink.schema

    def __iter__(self) -> InferStream:
        return self

    def __next__(self) -> pa.RecordBatch:
        if self._done:
            raise StopIteration
        try:
            kind, value = self._queue.get()
        except BaseException:  # KeyboardInterrupt while waiting: stop the engine first
            self.close()
            raise
        if kind == "rows":
            if isinstance(self._source, ArrayItems):
                self._source.rows_taken(value.num_rows)
            return value
        self._done = True
        self._thread.join()
        if kind == "raised":
            raise value
        self.result = result = value
        for warning in result.warnings:
            log.warning("%s", warning)
        if result.status == "failed" and result.error is not None:
            raise result.error
        if result.status == "interrupted" and not self._closing:
            raise RunInterrupted("the run was stopped before every item had its row.")
        raise StopIteration

    def close(self) -> None:
        """Stop the engine at once and wait for it (its processes and segments go)."""
        if self._closing:
            return
        self._closing = True
        if self._thread.is_alive():
            if isinstance(self._source, ArrayItems):
                self._source.close()
            self._engine.request_stop("the caller closed the stream")
            self._engine.request_stop("the caller closed the stream")  # the second: at once
            self._thread.join()
        self._done = True

    def __enter__(self) -> InferStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closing", True):
            self.close()


def _emitter(rows: queue.Queue[tuple[str, Any]], source: ItemSource) -> Any:
    """What the sink calls with each RecordBatch (in the engine's thread)."""

    def emit(batch: pa.RecordBatch) -> None:
        if isinstance(source, ArrayItems):
            source.rows_queued(batch.num_rows)
        rows.put(("rows", batch))

    return emit


def _drive(engine: Engine, rows: queue.Queue[tuple[str, Any]]) -> None:
    """The engine's thread: run, then say how it ended."""
    try:
        rows.put(("end", engine.run()))
    except BaseException as exc:  # handed to the caller's thread, raised there
        rows.put(("raised", exc))
