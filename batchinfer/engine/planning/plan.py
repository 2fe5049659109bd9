"""Planning: a RunConfig checked against the machine, the model, the dataset and OUT.

Planning only reads. It finds every configuration error (exit 2) before any process,
shared-memory segment or file exists. OUT is looked at here and taken when the run begins,
both by its owner (:class:`batchinfer.sink.output_folder.OutputFolder`); running is
:class:`Engine`.
Errors name settings with ``setting("runtime.cores")``; each front end renders them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchinfer.bounds import check_value
from batchinfer.data.dataset import Dataset
from batchinfer.data.feeds import (
    FROM_COLUMN,
    FROM_ITEM,
    check_first_item,
    is_image_shape,
    parse_input_map,
    plan_feeds,
)
from batchinfer.data.fingerprint import files_sha256
from batchinfer.data.preprocess import (
    Preprocess,
    parse_background,
    preprocess_for,
    raw_pixels_warning,
)
from batchinfer.data.sources import is_folder, open_source
from batchinfer.data.video.dataset import VideoDataset
from batchinfer.engine.batching import split_batch
from batchinfer.engine.planning.affinity import resolve_affinity
from batchinfer.engine.planning.config import RunConfig
from batchinfer.engine.planning.instances import default_slots, is_auto, planned_instances
from batchinfer.engine.planning.interface import EnginePlan
from batchinfer.engine.planning.plan_records import engine_preprocess_record
from batchinfer.engine.slots import SHM_DIR, TensorLayout, free_space
from batchinfer.errors import ConfigError, ModelError, UsageError
from batchinfer.messages import setting
from batchinfer.options import ITEMS, RuntimeOptions, check_group
from batchinfer.options_video import video_settings
from batchinfer.runtime import describe_model
from batchinfer.runtime.backends import Backend, make_backend
from batchinfer.sink.fingerprint import run_fingerprint
from batchinfer.sink.manifest import model_sha256
from batchinfer.sink.output_folder import OutputFolder
from batchinfer.tasks import Task, plan_task


@dataclass(frozen=True)
class RunPlan:
    """A validated run: the engine's plan, the dataset, OUT (looked at, not yet taken), the
    fingerprint."""

    config: RunConfig
    engine: EnginePlan
    model: Path
    dataset: Dataset
    out: OutputFolder
    fingerprint: dict
    model_sha256: str

    @property
    def backend(self) -> Backend:
        return self.engine.backend

    def preprocess_json(self) -> dict:
        return engine_preprocess_record(self.engine)


def _out_path(out: Path | None) -> Path:
    if out is not None:
        return Path(os.path.abspath(Path(out).expanduser()))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, n = Path("runs") / stamp, 1
    while path.exists():
        n += 1
        path = Path("runs") / f"{stamp}-{n}"
    return Path(os.path.abspath(path))


def check_cores(runtime: RuntimeOptions, backend: Backend) -> tuple[int, ...]:
    """The cores to use: ``runtime.cores`` checked against the backend's chip."""
    valid = backend.cores()
    if runtime.cores is None:
        return valid
    cores = tuple(runtime.cores)
    if not cores or len(set(cores)) != len(cores) or any(c not in valid for c in cores):
        listed = ",".join(str(c) for c in valid)
        given = ",".join(str(c) for c in cores) or "(empty)"
        raise ConfigError(
            setting("runtime.cores") + f" {given} is not a list of distinct NPU cores of "
            f"{backend.chip().upper()}, which has cores {listed}; pass e.g. {listed}.",
            "runtime.cores",
        )
    return cores


def check_settings(config: RunConfig) -> None:
    """ConfigError (exit 2) for a setting outside its range or not finite (the ranges are
    declared with the option groups, see batchinfer.options); reads nothing else."""
    for f in dataclasses.fields(config):  # every option group, named as its field
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            check_group(value, f.name)
    check_value(ITEMS, config.limit, "limit")


def check_slots_fit(slots: int, inputs: Preprocess | TensorLayout, given: bool) -> None:
    """ConfigError when ``runtime.slots`` given by the user cannot hold the model's inputs
    in /dev/shm (a default that does not fit fails when the segment is made, exit 3)."""
    free = free_space()
    if not given or free is None:
        return
    error = slots_fit_error(slots, inputs, free)
    if error is not None:
        raise error


def slots_fit_error(
    slots: int, inputs: Preprocess | TensorLayout, free: int, shm_dir: str = SHM_DIR
) -> ConfigError | None:
    """The ConfigError saying ``slots`` slots of ``inputs`` do not fit the ``free`` bytes of
    ``shm_dir``; None when they fit (also ``batchinfer doctor``'s /dev/shm check)."""
    if isinstance(inputs, Preprocess):
        inputs = TensorLayout((inputs.shape,), (inputs.dtype,))
    per_slot = inputs.nbytes
    if slots * per_slot <= free:
        return None
    most = free // per_slot
    fix = f"give at most {most}, or" if most >= 2 else "that is not even 2 slots:"
    return ConfigError(
        setting("runtime.slots") + f" {slots} needs {slots * per_slot / 2**20:.1f} MiB of shared "
        f"memory for the model's inputs ({per_slot / 2**10:.1f} KiB each) but {shm_dir} "
        f"has {free / 2**20:.1f} MiB free; {fix} make {shm_dir} bigger (docker: "
        "--shm-size).",
        "runtime.slots",
    )


def model_input(
    model: Path, config: RunConfig, several: bool = False
) -> tuple[tuple[int, ...], str]:
    """The model's one input: (shape in the runtime's view, dtype).

    ``several``: a model with several inputs is allowed (a run feeds each, see
    :func:`plan_input_feeds`); its first image input is returned, else its first input.
    """
    pre = config.preprocess
    try:
        info = describe_model(model)
    except ModelError:
        if model.suffix.lower() != ".rknn" or pre.size is None:
            raise
        # A bare .rknn on a board: shapes cannot be read off it, so the settings say them.
        channels = 1 if pre.color == "gray" else 3
        return (1, *pre.size, channels), pre.dtype or "uint8"
    if len(info.inputs) != 1 and not several:
        raise UsageError(
            f"model {model} has {len(info.inputs)} inputs; only run and eval feed several "
            "(see " + setting("preprocess.inputs") + "), so use a model with one input here."
        )
    images = [t for t in info.inputs if is_image_shape(t.shape)]
    if len(info.inputs) > 1 and not images:
        # No image input: the plan's own preprocessing stands for a flat tensor; the feeds
        # say what each input takes (plan_input_feeds).
        first = info.inputs[0]
        return (1, math.prod(d for d in first.shape[1:] if d > 0)), first.dtype
    first = images[0] if images else info.inputs[0]
    return first.shape, first.dtype


def plan_input_feeds(
    config: RunConfig, model: Path, engine: EnginePlan, dataset: Dataset
) -> EnginePlan:
    """``engine`` with a feed for each model input (batchinfer.data.feeds) when the model
    has several inputs, the dataset is ``.npz`` files or {preprocess.inputs} is given;
    unchanged otherwise (one input fed by the item, as always)."""
    mapping = parse_input_map(config.preprocess.inputs)
    try:
        info = describe_model(model)
    except ModelError:
        if mapping or dataset.kind == "npz":
            raise UsageError(
                f"the input names of {model} cannot be read without its .onnx beside it, so "
                + setting("preprocess.inputs")
                + " and .npz datasets cannot be matched to them; put the "
                ".onnx it was converted from beside it."
            ) from None
        return engine
    if engine.letterboxes and (len(info.inputs) > 1 or mapping):
        assert engine.task is not None
        raise UsageError(
            f"{model} is run as a {engine.task.name} model, which takes one image input; drop "
            + setting("preprocess.inputs")
            + " or pass "
            + setting("detect.task")
            + " raw."
        )

    def image_preprocess(tensor: Any) -> Preprocess:
        return input_preprocess(config, tensor.shape, tensor.dtype)

    feeds = plan_feeds(info.inputs, mapping, dataset.kind, image_preprocess, model=str(model))
    if not feeds:
        return engine
    if any(f.source == FROM_COLUMN for f in feeds):  # a manifest's columns: its first row
        check_first_item(feeds, next(iter(dataset), None), str(dataset.root))
    images = [f.preprocess for f in feeds if f.preprocess is not None]
    if images:  # what the manifest's "preprocess" record and decoding switches show
        engine = dataclasses.replace(engine, preprocess=images[0])
    layout = TensorLayout(tuple(f.shape for f in feeds), tuple(f.dtype for f in feeds))
    check_slots_fit(engine.slots, layout, given=config.runtime.slots is not None)
    # Inputs fed apart take whole tensors, a batch-N model's too: not packed (batching.py).
    return dataclasses.replace(engine, feeds=feeds, batch=1)


def input_preprocess(config: RunConfig, shape: tuple[int, ...], dtype: str) -> Preprocess:
    """The preprocessing of a model input of ``shape``/``dtype`` with the run's options."""
    pre = config.preprocess
    return preprocess_for(
        shape,
        dtype,
        size=pre.size,
        color=pre.color,
        layout=pre.layout,
        dtype_override=pre.dtype,
        mean=pre.mean,
        std=pre.std,
        exif_orientation=pre.exif_orientation,
        background=parse_background(pre.background),
        max_pixels=None if pre.max_pixels == "none" else int(pre.max_pixels),  # its one word
        jpeg_draft=pre.jpeg_draft,
        max_item_bytes=None if pre.max_item_bytes == "none" else pre.max_item_bytes,
    )


def _check_size(shape: tuple[int, ...], preprocess: Preprocess, asked: tuple[int, int] | None):
    """A fixed-size model input cannot take another size (the runtime would refuse it)."""
    if asked is None or len(shape) not in (3, 4):
        return
    hw: tuple[int, ...]
    if len(shape) == 4:
        hw = shape[1:3] if preprocess.layout == "nhwc" or shape[3] in (1, 3) else shape[2:4]
    else:
        hw = shape[1:3]
    if all(d > 0 for d in hw) and tuple(hw) != tuple(asked):
        raise ConfigError(
            setting("preprocess.size")
            + f" {asked[0]}x{asked[1]} does not fit the model, whose input "
            f"is fixed at {hw[0]}x{hw[1]}; drop "
            + setting("preprocess.size")
            + " (inputs are resized to the model's size anyway).",
            "preprocess.size",
        )


def plan_engine(
    config: RunConfig,
    backend: Backend,
    shape: tuple[int, ...],
    dtype: str,
    kind: str,
    task: Task | None = None,
) -> EnginePlan:
    """The engine's part of a plan (shared by run, bench and eval); ``task`` defaults to
    the one the model's outputs and ``config.detect`` give (batchinfer/tasks)."""
    rt, pre, out = config.runtime, config.preprocess, config.output
    check_settings(config)
    cores = check_cores(rt, backend)
    batch, shape = split_batch(shape)  # a batch-N model: one item per slot (batching.py)
    preprocess = input_preprocess(config, shape, dtype)
    _check_size(shape, preprocess, pre.size)
    if task is None:
        model = Path(config.model).expanduser().resolve()
        input_hw = preprocess.size if preprocess.is_image else None
        task = plan_task(
            config.detect, model, input_hw, config.labels, dataset=config.dataset, batch=batch
        )
    placement = task.placement
    if placement.letterboxes:
        preprocess = dataclasses.replace(preprocess, resize="letterbox", pad=placement.pad)
    if kind:
        preprocess.validate_for(kind)
    warning = raw_pixels_warning(preprocess, kind, Path(config.model).name)
    if warning:
        logging.getLogger("batchinfer").warning(warning)
    cpus = resolve_affinity(rt.cpu_affinity)
    if rt.readers is not None:
        readers = max_readers = rt.readers
    else:  # start with half the CPUs we may use; the run grows or shrinks it
        usable = len(cpus) if cpus else len(os.sched_getaffinity(0))
        readers, max_readers = max(1, usable // 2), max(1, usable)
    # Instances per core are decided here, once: the slots and the plan use this. -k auto:
    # sized for the most it may choose; settle_instances (at start) sizes it down.
    k = planned_instances(rt.instances_per_core)
    lanes = k * batch  # items a core works on at once (EnginePlan.item_lanes)
    slots = rt.slots if rt.slots is not None else default_slots(len(cores), lanes, max_readers)
    check_slots_fit(slots, preprocess, given=rt.slots is not None)
    return EnginePlan(
        backend=backend,
        cores=cores,
        instances_per_core=k,
        instances_auto=is_auto(rt.instances_per_core),
        preprocess=preprocess,
        slots=slots,
        readers=readers,
        max_readers=max_readers,
        cpus=cpus,
        reliability=config.reliability,
        topk=out.topk,
        task=task,
        save_outputs=out.save_outputs or task.keeps_outputs,
        batch=batch,
    )


def runtime_files(model: Path) -> dict[str, str]:
    """sha256 of the files a runtime reads beside a .rknn (its .onnx, conversion settings)."""
    if model.suffix.lower() != ".rknn":
        return {}
    beside = [model.with_suffix(".onnx"), model.with_name(model.stem + ".config.json")]
    return {p.name: model_sha256(p) for p in beside if p.is_file()}


def plan_run(
    config: RunConfig,
    listing: Callable[[int], None] | None = None,
    *,
    files_here: bool = True,
) -> RunPlan:
    """Check ``config`` against the machine, model, dataset and OUT; changes nothing.

    Raises a UsageError (exit 2) for anything wrong with the invocation, including an OUT
    this run may not use and a resume whose settings differ from the run's. ``listing``
    is called with the number of entries listed so far while a big dataset is listed.
    ``files_here`` as for :func:`plan_inference`.
    """
    out = config.output
    # OUT first (a held one before anything else): refused before any slow check.
    dataset_folder = Path(config.dataset) if is_folder(config.dataset) else None
    folder = OutputFolder.look(
        _out_path(out.out), out, dataset=dataset_folder, command=config.command
    )
    check_settings(config)
    planned = plan_inference(
        config,
        lambda labels: open_source(
            config.dataset,
            labels_file=labels,
            image_root=config.image_root,
            progress=listing,
            video=video_settings(config.preprocess),
        ),
        files_here=files_here,
    )
    model, engine, dataset = planned.model, planned.engine, planned.dataset
    assert dataset is not None  # opened by the function above
    backend = engine.backend
    sha = model_sha256(model)
    fingerprint = run_fingerprint(
        model_sha256=sha,
        runtime_files=runtime_files(model),
        backend=backend.name,
        preprocess=engine_preprocess_record(engine),
        topk=out.topk,
        save_outputs=engine.save_outputs,
        dataset_root=dataset.location,
        dataset_items=len(dataset),
        dataset_listing_sha256=dataset.listing_sha256,
        class_map={k: v for k, v in dataset.class_map.to_json().items() if k != "file"},
        resume_check=out.resume_check,
        dataset_files_sha256=(
            files_sha256(dataset, out.resume_check)
            if dataset.stat_files or out.resume_check == "content"
            else None
        ),
        task=engine.task.fingerprint() if engine.task is not None else None,
        video=dataset.fingerprint_record() if isinstance(dataset, VideoDataset) else None,
    )
    folder.accept(fingerprint)  # a --resume: the same run, its parts intact
    return RunPlan(
        config=config,
        engine=engine,
        model=model,
        dataset=dataset,
        out=folder,
        fingerprint=fingerprint,
        model_sha256=sha,
    )


@dataclass(frozen=True)
class InferencePlan:
    """What :func:`plan_inference` found: the model, the engine's plan, the dataset."""

    model: Path
    engine: EnginePlan
    dataset: Dataset | None
    shape: tuple[int, ...]  # the model's (first image) input, in the runtime's view
    dtype: str


#: Opens the dataset given the labels file to read (None: the task reads none).
OpenDataset = Callable[[Path | None], Dataset]


def plan_inference(
    config: RunConfig,
    dataset: Dataset | OpenDataset | None = None,
    *,
    model: Path | None = None,
    several_inputs: bool = True,
    files_here: bool = True,
) -> InferencePlan:
    """The planning path of run, infer, bench and eval: the backend, the model's input,
    the engine's plan, then the dataset and what feeds each model input. Reads only.

    ``model``: the model file (default: ``config.model``, resolved). ``dataset``: None (the
    caller feeds tensors itself), one already open, or a function that opens it with the
    labels file the task reads (a detector's labels file names the head's classes, not
    the dataset's class folders: batchinfer/tasks). ``several_inputs`` False: a model with
    several inputs is refused and no input is fed apart (bench, arrays). ``files_here``
    False: the dataset's files are read elsewhere (a Ray cluster's nodes, ``--ray-data
    shared``), so a list's first files are not looked for on this machine.
    """
    model = Path(config.model).expanduser().resolve() if model is None else model
    if not model.is_file():
        raise ModelError(
            f"model file {model} does not exist; pass the path of a .rknn or .onnx file."
        )
    backend = make_backend(model, config.runtime)
    shape, dtype = model_input(model, config, several=several_inputs)
    engine = plan_engine(config, backend, shape, dtype, "")
    if callable(dataset):
        dataset = dataset(None if engine.detects else config.labels)
    if dataset is not None:
        if files_here:
            dataset.check_found()
        if several_inputs:
            engine = plan_input_feeds(config, model, engine, dataset)
        for feed_preprocess, kind in _validations(engine, dataset.kind):
            feed_preprocess.validate_for(kind)
            # plan_engine could not say it: the dataset's kind was not known to it.
            warning = raw_pixels_warning(feed_preprocess, kind, model.name)
            if warning:
                logging.getLogger("batchinfer").warning(warning)
    return InferencePlan(model, engine, dataset, tuple(shape), str(dtype))


def _validations(engine: EnginePlan, kind: str) -> list[tuple[Preprocess, str]]:
    """(preprocessing, kind of what it is given) to check for each input images may feed."""
    if not engine.feeds:
        return [(engine.preprocess, kind)]
    # Only the item itself is known to be an image here; a column's value may be an image
    # or a tensor, and an image that its input cannot take is that item's error row.
    return [(f.preprocess, kind) for f in engine.feeds if f.preprocess and f.source == FROM_ITEM]
