"""What a run does with the model's outputs: classify, detect, or store them (raw).

``detect.task`` (``--task``) picks it; ``auto`` (the default) decides from the model's
output shapes, read off the model file before anything starts:

- ``detect`` when the outputs are a detection head batchinfer knows
  (:func:`batchinfer.detect.recognise`): readers then letterbox the images, and each core
  worker decodes its outputs into boxes next to the runtime call (engine/worker.py);
- ``classify`` for one output holding one score per class, (1, N): top-k per row;
- ``raw`` otherwise: the rows store the outputs (as ``--save-outputs`` does).

Ultralytics' ONNX exports say what they are in the model's metadata (``task``, ``names``,
``kpt_shape``, ...). A model whose metadata names another task (``pose``, ``segment``,
``obb``, ``classify``) is never taken for a detector, whatever its output shapes (a pose
model's (1, 56, 8400) has a detector's layout): ``auto`` stores its outputs (``raw``; a
classifier's one score vector is still ``classify``), and ``--task detect`` is a usage
error naming the model's own task. A model without that metadata (a ``.rknn``, or an ONNX
file from elsewhere) is judged by its output shapes alone, and its class count is then
inferred from them (``info`` says so).

A detection run's class names come from ``--labels`` (one name per line, line 1 is class 0),
else the dataset's own (a COCO file's categories, whose ids are kept for ``export coco``;
a data.yaml's ``names``) when they fit the head (a count that differs is said), else the
model's metadata ``names`` when they fit, else COCO's 80 names for an 80-class head, else
none (``label`` null); a labels file whose count differs from the head's classes is a
usage error (batchinfer.detect.class_names). One output of a row per cell fits two heads;
the class count of the labels or the metadata picks one, else ``detect.head`` (a warning
says how an undecided one was read). Anchors of an anchor-based head come
from ``detect.anchors``, else ``anchors`` in the model's ``<stem>.config.json`` (the
conversion settings beside it, runtime/conversion.py), else COCO's defaults.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchinfer.detect.class_names import (  # noqa: F401  (where names came from)
    NAMES_COCO80,
    NAMES_DATASET,
    NAMES_FROM_FILE,
    NAMES_METADATA,
    NAMES_NONE,
)
from batchinfer.engine.model_metadata import ModelMetadata, read_model_metadata
from batchinfer.errors import ConfigError, ModelError
from batchinfer.messages import Message, setting

if TYPE_CHECKING:
    from batchinfer.detect import DetectSettings, Head
    from batchinfer.options import DetectOptions

CLASSIFY, DETECT, RAW = "classify", "detect", "raw"


#: Ultralytics' tasks (metadata ``task``) that are not detection, as people say them.
OTHER_TASKS = {
    "pose": "pose (keypoint) model",
    "segment": "segmentation model",
    "obb": "oriented-box model",
    "classify": "classifier",
}

#: The ranges the detection settings must be in (checked by :func:`check_detect_options`).
CONF_RANGE = (0.0, 1.0)
IOU_RANGE = (0.0, 1.0)
MAX_DET_RANGE = (1, 100_000)


#: (group, key, value when unset) of the task record's keys added after runs were made.
_LATER_KEYS = (
    ("settings", "agnostic_nms", False),
    ("settings", "classes", None),
    ("head", "rows", False),
)


@dataclass(frozen=True)
class TaskPlan:
    """The task of a run, why, and for ``detect`` everything a core worker needs to decode
    (picklable: it travels to the workers inside their spec)."""

    task: str  # classify | detect | raw
    reason: str  # why this task, one phrase ("one output of 10 scores")
    head: Head | None = None
    settings: DetectSettings | None = None
    input_hw: tuple[int, int] | None = None
    names: tuple[str, ...] = ()  # class names by class id; () when none are known
    names_source: str | None = None
    category_ids: tuple[int, ...] = ()  # COCO category id per class (the dataset's COCO file)
    anchors_source: str | None = None  # option | config.json | default (anchor heads only)
    # Per output: (scale, zero point) when the graph quantises it, for runtimes that return
    # int8 outputs (every backend today returns float32; the decoder then ignores it).
    quant: tuple[tuple[float, int] | None, ...] = ()
    output_shapes: tuple[tuple[int, ...], ...] = field(default=())
    # The task the model's own metadata names (Ultralytics exports), None without one.
    model_task: str | None = None

    @property
    def detects(self) -> bool:
        return self.task == DETECT

    @property
    def classes_from_shape(self) -> bool:
        """A detector's class count read off its output shapes alone: no metadata said what
        the model is (a .rknn, an ONNX file without Ultralytics' metadata)."""
        return self.detects and self.model_task is None

    def describe(self) -> str:
        """One line for ``info`` and the manifest: "detect: YOLOv8 model-zoo head, 80 classes,
        strides 8/16/32"."""
        if self.head is not None and self.task == DETECT:
            return f"{DETECT}: {self.head.describe()}"
        return f"{self.task}: {self.reason}"

    def said(self) -> Message:
        """The line a run starts with: the task it picked and why ("task: detect (YOLOv8
        Ultralytics head, 80 classes, strides 8/16/32: output (1, 84, 8400), from the model's
        metadata)"), so a model stored raw, or taken for a detector, is never a surprise."""
        asked = self.reason == "asked for"
        if self.detects and self.head is not None:
            n = len(self.output_shapes)
            outputs = (
                f"{n} outputs"
                if n > 3
                else f"output{'s' if n > 1 else ''} {_shapes_text(self.output_shapes)}"
            )
            why = Message(f"{self.head.describe()}: {outputs}, ")
            if asked:
                why += "asked for with " + setting("detect.task")
            elif self.model_task == DETECT:
                why += "from the model's metadata (task: detect) and its output shapes"
            else:
                why += "recognised from the output shapes"
        elif asked:
            why = "asked for with " + setting("detect.task")
        else:
            why = Message(self.reason)
            if self.task == RAW:
                why += "; " + setting("detect.task") + " classify or detect overrides"
        return "task: " + Message(self.task, " (", why, ")")

    def to_json(self) -> dict[str, Any]:
        """The manifest's ``task`` record."""
        out: dict[str, Any] = {"task": self.task, "description": self.describe()}
        if self.detects and self.settings is not None and self.head is not None:
            s = self.settings
            out.update(
                head={
                    "family": self.head.family,
                    "num_classes": self.head.num_classes,
                    "strides": list(self.head.strides),
                    "num_anchors": self.head.num_anchors,
                    "rows": self.head.rows,
                },
                settings={
                    "conf": s.conf,
                    "iou": s.iou,
                    "max_det": s.max_det,
                    "agnostic_nms": s.agnostic,
                    "classes": None if s.classes is None else list(s.classes),
                    "anchors": (
                        None if s.anchors is None else [[list(p) for p in a] for a in s.anchors]
                    ),
                    "anchors_source": self.anchors_source,
                },
                input_hw=list(self.input_hw or ()),
                names_source=self.names_source,
                names=list(self.names),
            )
            if self.category_ids:
                out["category_ids"] = list(self.category_ids)
        return out

    def fingerprint(self) -> dict[str, Any] | None:
        """What of the task decides the rows (None for classify, so classification runs keep
        the fingerprint they had before tasks existed)."""
        if self.task == CLASSIFY:
            return None
        record = self.to_json()
        record.pop("description", None)
        # settings added later count only when set: runs started before them still resume
        for group, key, unset in _LATER_KEYS:
            if record.get(group, {}).get(key, unset) == unset:
                record.get(group, {}).pop(key, None)
        return record


class NotADetectorError(ConfigError):
    """``detect`` was asked of a model that is no detector batchinfer can decode.

    ``why`` says what the model is instead, without advice; the message adds the advice of
    ``run``/``bench`` (another ``{detect.task}``). A front end where that advice is wrong (a
    detection job, whose task is fixed) words its own from ``why`` and ``could_classify``.
    """

    def __init__(self, why: str, could_classify: bool) -> None:
        tasks = "classify or raw" if could_classify else "raw (its outputs stored in the rows)"
        super().__init__(
            setting("detect.task")
            + f" detect: {why} Use "
            + setting("detect.task")
            + f" {tasks} for this model.",
            "detect.task",
        )
        self.why = why
        self.could_classify = could_classify


def _static(shape: Sequence[int]) -> tuple[int, ...]:
    """A shape as the runtime reports it: a dynamic batch axis is 1."""
    dims = [int(d) for d in shape]
    if dims and dims[0] <= 0:
        dims[0] = 1
    return tuple(dims)


def _one_score_vector(shapes: Sequence[tuple[int, ...]]) -> bool:
    return len(shapes) == 1 and sum(d != 1 for d in shapes[0]) <= 1


def _shapes_text(shapes: Sequence[tuple[int, ...]]) -> str:
    return ", ".join(str(list(s)) for s in shapes) or "none"


def check_detect_options(opts: DetectOptions) -> None:
    """ConfigError naming the setting when one is out of its range."""

    def between(name: str, value: float, low: float, high: float, open_low: bool) -> None:
        below = value <= low if open_low else value < low
        bad = not math.isfinite(value) or value > high or below
        if bad:
            lowest = f"above {low:g}" if open_low else f"at least {low:g}"
            raise ConfigError(
                setting(f"detect.{name}")
                + f" must be {lowest} and at most {high:g}, not {value:g}.",
                f"detect.{name}",
            )

    between("conf", opts.conf, *CONF_RANGE, open_low=False)
    between("iou", opts.iou, *IOU_RANGE, open_low=True)
    between("max_det", opts.max_det, *MAX_DET_RANGE, open_low=False)
    pad = opts.pad_colour
    values = (pad,) if isinstance(pad, int) else tuple(pad)
    if len(values) not in (1, 3) or not all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in values
    ):
        raise ConfigError(
            setting("detect.pad_colour")
            + f" must be a grey level or r,g,b, each 0-255, not {pad!r}.",
            "detect.pad_colour",
        )


def pad_rgb(opts: DetectOptions) -> tuple[int, int, int]:
    """``detect.pad_colour`` as (r, g, b)."""
    pad = opts.pad_colour
    if isinstance(pad, int):
        return (pad, pad, pad)
    r, g, b = pad
    return (int(r), int(g), int(b))


def plan_task(
    opts: DetectOptions,
    model: Path,
    input_hw: tuple[int, int] | None,
    labels: Path | None = None,
    output_shapes: Sequence[Sequence[int]] | None = None,
    dataset: Path | str | None = None,
    batch: int = 1,
) -> TaskPlan:
    """The task of a run of ``model`` whose image input is ``input_hw`` (None: not an image).

    ``output_shapes`` default to the model file's (runtime/model_info.py); ``dataset`` (its
    path) may name the classes; ``batch``: a batch-N model's, whose outputs are judged per
    item (batch 1: engine/batching.py). Raises ConfigError (exit 2) for ``--task detect`` on outputs
    that are no known head, for a labels file that does not fit the head, and for settings
    out of range.
    """
    check_detect_options(opts)
    if output_shapes is None:
        output_shapes, quant = _model_outputs(model, opts.task)
    else:
        quant = ()
    shapes = tuple(_static(s) for s in output_shapes)
    if batch > 1:  # each item gets row j of a batch-N call's outputs
        shapes = tuple((1, *s[1:]) if s and s[0] == batch else s for s in shapes)
    meta = read_model_metadata(model)
    other = None if meta is None else OTHER_TASKS.get(meta.task or "")
    model_task = None if meta is None else meta.task
    head = None
    if opts.task in ("auto", DETECT) and input_hw is not None and shapes and other is None:
        head = _recognised(opts, input_hw, shapes, labels, meta)
    if opts.task == DETECT and head is None:
        could_classify = not shapes or _one_score_vector(shapes)
        if other is not None:
            assert meta is not None
            why = (
                f"{model.name} is an Ultralytics {other}, not a detector (its metadata in "
                f"{meta.file} says task: {meta.task}); batchinfer decodes detection heads only."
            )
        elif input_hw is None:
            why = (
                f"The input of {model.name} is not an image, and its outputs are "
                f"{_shapes_text(shapes)}."
            )
        else:
            from batchinfer.detect import explain_no_head

            why = explain_no_head(input_hw, shapes).rstrip(".") + "."
        raise NotADetectorError(why, could_classify)
    if head is not None:
        return _detect_plan(opts, model, input_hw, shapes, head, labels, quant, meta, dataset)  # type: ignore[arg-type]
    if opts.task == RAW or (opts.task == "auto" and shapes and not _one_score_vector(shapes)):
        if opts.task == RAW:
            reason = "asked for"
        elif other is not None:
            reason = (
                f"the model's metadata says task: {model_task} (an Ultralytics {other}), "
                f"which batchinfer does not decode; its outputs {_shapes_text(shapes)} are "
                "stored in the rows"
            )
        else:
            reason = (
                f"outputs {_shapes_text(shapes)} are neither one score vector nor a known "
                "detection head; they are stored in the rows"
            )
        return TaskPlan(RAW, reason, output_shapes=shapes, model_task=model_task)
    if shapes and _one_score_vector(shapes):
        reason = f"one output of {math.prod(shapes[0])} scores"
    elif opts.task == CLASSIFY:
        reason = "asked for"
    else:
        reason = "output shapes unknown (a .rknn without its .onnx): taken as a classifier"
    return TaskPlan(CLASSIFY, reason, output_shapes=shapes, model_task=model_task)


def _model_outputs(
    model: Path, task: str
) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[float, int] | None, ...]]:
    """The model's output shapes (and their quantisation, when the graph says it); () when
    they cannot be read (a bare .rknn), unless detection was asked for."""
    from batchinfer.runtime import describe_model

    try:
        info = describe_model(model)
    except ModelError as e:
        if task == DETECT:
            raise ConfigError(
                setting("detect.task")
                + " detect needs the model's output shapes, which cannot be read "
                f"({e}); put the .onnx it was converted from beside it.",
                "detect.task",
            ) from e
        return (), ()
    return tuple(tuple(o.shape) for o in info.outputs), _output_quant(info.onnx_path, info)


def _output_quant(onnx_path: Path, info: Any) -> tuple[tuple[float, int] | None, ...]:
    """Per output, (scale, zero point) when a QDQ graph quantises it; () when none is."""
    try:
        from batchinfer.runtime import graph

        data = Path(onnx_path).read_bytes()
        if not graph.mentions_quantisation(data):
            return ()
        _, outs = graph.native_types(data, [], [(o.name, o.dtype) for o in info.outputs])
    except Exception:  # quantisation parameters are a fallback for int8 outputs, never fatal
        return ()
    quant = tuple((n.scale, n.zero_point) if n.quantised else None for n in outs)
    return quant if any(quant) else ()


def _recognised(
    opts: DetectOptions,
    input_hw: tuple[int, int],
    shapes: tuple[tuple[int, ...], ...],
    labels: Path | None,
    meta: ModelMetadata | None,
) -> Head | None:
    """The head the outputs are: ``detect.head`` when it names one they fit, else the one
    the class count of the labels file or the metadata picks (a warning when none could)."""
    from batchinfer.detect.class_names import labels_file_names
    from batchinfer.detect.heads import choose, readings

    found = readings(input_hw, shapes)
    family = None if opts.head == "auto" else opts.head
    if family is not None and found and all(h.family != family for h in found):
        raise ConfigError(
            setting("detect.head")
            + f" {family} does not fit the model's outputs {_shapes_text(shapes)}, which are "
            f"a {' or a '.join(h.describe() for h in found)}; drop it or name that layout.",
            "detect.head",
        )
    count = None
    if len(found) > 1 and family is None:
        if labels is not None:
            count = len(labels_file_names(labels))
        elif meta is not None and meta.names is not None:
            count = len(meta.names)
    head, note = choose(found, count, family)
    if note:
        logging.getLogger("batchinfer").warning(note)
    return head


def _detect_plan(
    opts: DetectOptions,
    model: Path,
    input_hw: tuple[int, int],
    shapes: tuple[tuple[int, ...], ...],
    head: Head,
    labels: Path | None,
    quant: tuple[tuple[float, int] | None, ...],
    meta: ModelMetadata | None = None,
    dataset: Path | str | None = None,
) -> TaskPlan:
    from batchinfer.detect import DetectSettings
    from batchinfer.detect.class_names import class_names, dataset_classes

    named = class_names(
        head.num_classes,
        head.describe(),
        labels,
        None if meta is None else meta.names,
        dataset_classes(dataset) if labels is None else None,
    )
    if named.warning:
        logging.getLogger("batchinfer").warning(named.warning)
    wanted = None if opts.classes is None else tuple(int(c) for c in opts.classes)
    if wanted == ():  # `--classes ''` (an unset variable) would drop every box, silently
        raise ConfigError(
            setting("detect.classes")
            + " names no class, so no box would be kept; give class ids (e.g. 0,2), "
            "or leave it out to keep every class.",
            "detect.classes",
        )
    if wanted is not None and any(c >= head.num_classes for c in wanted):
        raise ConfigError(
            setting("detect.classes")
            + f" names class {max(wanted)}, but the model's head has {head.num_classes} "
            f"classes (0-{head.num_classes - 1}; {head.describe()}).",
            "detect.classes",
        )
    anchors, anchors_source = None, None
    if head.num_anchors > 1:
        from batchinfer.detect.anchors import head_anchors

        anchors, anchors_source = head_anchors(opts.anchors, model, head)
    settings = DetectSettings(
        conf=float(opts.conf),
        iou=float(opts.iou),
        max_det=int(opts.max_det),
        anchors=anchors,
        agnostic=bool(opts.agnostic_nms),
        classes=wanted,
    )
    return TaskPlan(
        DETECT,
        "asked for" if opts.task == DETECT else "the outputs are a known detection head",
        head=head,
        settings=settings,
        input_hw=(int(input_hw[0]), int(input_hw[1])),
        names=named.names,
        names_source=named.source,
        category_ids=named.category_ids,
        anchors_source=anchors_source,
        quant=quant,
        output_shapes=shapes,
        model_task=None if meta is None else meta.task,
    )
