"""``detect``: YOLO detection heads decoded into boxes in the core workers.

Recognised when the outputs are a detection head batchinfer knows
(:func:`batchinfer.detect.recognise`): readers then letterbox the images, and each core
worker decodes its outputs into boxes next to the runtime call (engine/board/worker.py).

Ultralytics' ONNX exports say what they are in the model's metadata (``task``, ``names``,
``kpt_shape``, ...). A model whose metadata names another task (``pose``, ``segment``,
``obb``, ``classify``) is never taken for a detector, whatever its output shapes (a pose
model's (1, 56, 8400) has a detector's layout), and ``--task detect`` is then a usage
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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from batchinfer.errors import ConfigError
from batchinfer.messages import Message, setting
from batchinfer.tasks.base import ItemDecode, ModelFacts, shapes_text
from batchinfer.tasks.boxes import (
    BoxRows,
    BoxTask,
    int8_quant,
    pad_rgb,
    said_with_head,
    to_original,
)

if TYPE_CHECKING:
    from batchinfer.detect import Head, Letterbox
    from batchinfer.options import DetectOptions

#: Ultralytics' tasks (metadata ``task``) that are not detection, as people say them.
OTHER_TASKS = {
    "pose": "pose (keypoint) model",
    "segment": "segmentation model",
    "obb": "oriented-box model",
    "classify": "classifier",
}

#: (group, key, value when unset) of the task record's keys added after runs were made.
_LATER_KEYS = (
    ("settings", "agnostic_nms", False),
    ("settings", "classes", None),
    ("head", "rows", False),
)


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


@dataclass(frozen=True)
class Detect(BoxTask):
    """A YOLO detection head (module docstring)."""

    scorer = "batchinfer.evaluate.scorers.instances:InstancesScorer"
    exports = {"coco": "batchinfer.export:export_coco"}  # noqa: RUF012 (a ClassVar)

    name = "detect"

    head: Head | None = None
    anchors_source: str | None = None  # option | config.json | default (anchor heads only)
    # Per output: (scale, zero point) when the graph quantises it, for runtimes that return
    # int8 outputs (every backend today returns float32; the decoder then ignores it).
    quant: tuple[tuple[float, int] | None, ...] = ()

    @property
    def classes_from_shape(self) -> bool:
        """The class count read off the output shapes alone: no metadata said what the
        model is (a .rknn, an ONNX file without Ultralytics' metadata)."""
        return self.model_task is None

    @classmethod
    def recognise(cls, facts: ModelFacts, options: DetectOptions, asked: bool) -> Detect | None:
        meta = facts.meta
        other = None if meta is None else OTHER_TASKS.get(meta.task or "")
        head = None
        if facts.input_hw is not None and facts.output_shapes and other is None:
            head = _recognised(options, facts)
        if head is not None:
            return _planned(options, facts, head, asked)
        if not asked:
            return None
        if other is not None:
            assert meta is not None
            why = (
                f"{facts.model.name} is an Ultralytics {other}, not a detector (its metadata "
                f"in {meta.file} says task: {meta.task}); batchinfer decodes detection heads "
                "only."
            )
        elif facts.input_hw is None:
            why = (
                f"The input of {facts.model.name} is not an image, and its outputs are "
                f"{facts.shapes_text}."
            )
        else:
            from batchinfer.detect import explain_no_head

            why = explain_no_head(facts.input_hw, facts.output_shapes).rstrip(".") + "."
        raise NotADetectorError(why, not facts.output_shapes or facts.one_score_vector)

    def describe(self) -> str:
        """ "detect: YOLOv8 model-zoo head, 80 classes, strides 8/16/32"."""
        if self.head is None:
            return super().describe()
        return f"{self.name}: {self.head.describe()}"

    def info_lines(self) -> list[str]:
        from batchinfer.detect.class_names import NAMES_COCO80, NAMES_METADATA

        line = f"task:    {self.describe()}"
        if self.head is None or self.input_hw is None:
            return [line]
        h, w = self.input_hw
        line += f" (its outputs fit that layout for a {h}x{w} input)"
        names = {
            NAMES_COCO80: "COCO's 80 (built in)",
            NAMES_METADATA: "from the model's metadata (names)",
        }.get(self.names_source or "", "none built in")
        lines = [line]
        if self.classes_from_shape:
            lines.append(
                f"  {self.head.num_classes} classes inferred from the output shapes (no "
                "metadata in the model says its task or classes)"
            )
        return [
            *lines,
            f"  class names: {names}; --labels FILE gives them (one per line)",
            "  run letterboxes images and writes boxes (--task classify|raw overrides)",
        ]

    def said(self) -> Message:
        if self.head is None:
            return super().said()
        n = len(self.output_shapes)
        outputs = (
            f"{n} outputs"
            if n > 3
            else f"output{'s' if n > 1 else ''} {shapes_text(self.output_shapes)}"
        )
        how = (
            "from the model's metadata (task: detect) and its output shapes"
            if self.model_task == self.name
            else "recognised from the output shapes"
        )
        return said_with_head(self, self.head, outputs, how)

    def head_record(self) -> dict[str, Any] | None:
        if self.settings is None or self.head is None:
            return None
        s = self.settings
        return dict(
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
        )

    def fingerprint(self) -> dict[str, Any] | None:
        record = super().fingerprint()
        assert record is not None
        # settings added later count only when set: runs started before them still resume
        for group, key, unset in _LATER_KEYS:
            if record.get(group, {}).get(key, unset) == unset:
                record.get(group, {}).pop(key, None)
        return record

    def decoder(self) -> ItemDecode:
        return _HeadDecoder(self)


class _HeadDecoder:
    """One instance's decoder: outputs in, :class:`BoxRows` in original pixels out (one
    :class:`batchinfer.detect.Decoder` per set of int8 outputs, each keeping its buffers)."""

    def __init__(self, task: Detect) -> None:
        assert task.head is not None and task.settings is not None and task.input_hw
        self.task = task
        self.head, self.settings = task.head, task.settings
        self.input_hw = task.input_hw
        self._decoders: dict[tuple[bool, ...], Any] = {}

    def _decoder(self, outputs: Sequence[np.ndarray]) -> Any:
        from batchinfer.detect import Decoder

        key, quant = int8_quant(outputs, self.task.quant)
        decoder = self._decoders.get(key)
        if decoder is None:
            decoder = self._decoders[key] = Decoder(self.head, self.input_hw, self.settings, quant)
        return decoder

    def __call__(self, outputs: Sequence[np.ndarray], placed: Letterbox | None) -> BoxRows:
        found = self._decoder(outputs)(outputs)
        boxes, width, height = to_original(found.boxes, placed, self.input_hw)
        rows = np.empty((len(found.scores), 6), np.float32)
        rows[:, :4] = boxes
        rows[:, 4] = found.scores
        rows[:, 5] = found.class_ids
        return BoxRows(rows, width, height, int(found.nonfinite))


def _recognised(opts: DetectOptions, facts: ModelFacts) -> Head | None:
    """The head the outputs are: ``detect.head`` when it names one they fit, else the one
    the class count of the labels file or the metadata picks (a warning when none could)."""
    from batchinfer.detect.class_names import labels_file_names
    from batchinfer.detect.heads import choose, readings

    assert facts.input_hw is not None
    found = readings(facts.input_hw, facts.output_shapes)
    family = None if opts.head == "auto" else opts.head
    if family is not None and found and all(h.family != family for h in found):
        raise ConfigError(
            setting("detect.head")
            + f" {family} does not fit the model's outputs {facts.shapes_text}, which are "
            f"a {' or a '.join(h.describe() for h in found)}; drop it or name that layout.",
            "detect.head",
        )
    count = None
    meta = facts.meta
    if len(found) > 1 and family is None:
        if facts.labels is not None:
            count = len(labels_file_names(facts.labels))
        elif meta is not None and meta.names is not None:
            count = len(meta.names)
    head, note = choose(found, count, family)
    if note:
        logging.getLogger("batchinfer").warning(note)
    return head


def box_plan(
    opts: DetectOptions, facts: ModelFacts, num_classes: int, description: str
) -> dict[str, Any]:
    """What every box task plans alike (segment, pose and obb too): class names, the
    ``detect.classes`` check, the pad colour, as keyword arguments of a BoxTask (with
    ``classes``: the wanted class ids or None)."""
    from batchinfer.detect.class_names import class_names, dataset_classes

    meta = facts.meta
    named = class_names(
        num_classes,
        description,
        facts.labels,
        None if meta is None else meta.names,
        dataset_classes(facts.dataset) if facts.labels is None else None,
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
    if wanted is not None and any(c >= num_classes for c in wanted):
        raise ConfigError(
            setting("detect.classes")
            + f" names class {max(wanted)}, but the model's head has {num_classes} "
            f"classes (0-{num_classes - 1}; {description}).",
            "detect.classes",
        )
    assert facts.input_hw is not None
    return {
        "output_shapes": facts.output_shapes,
        "model_task": facts.model_task,
        "input_hw": facts.input_hw,
        "names": named.names,
        "names_source": named.source,
        "category_ids": named.category_ids,
        "pad": pad_rgb(opts),
        "classes": wanted,
    }


def _planned(opts: DetectOptions, facts: ModelFacts, head: Head, asked: bool) -> Detect:
    from batchinfer.detect import DetectSettings

    common = box_plan(opts, facts, head.num_classes, head.describe())
    anchors, anchors_source = None, None
    if head.num_anchors > 1:
        from batchinfer.detect.anchors import head_anchors

        anchors, anchors_source = head_anchors(opts.anchors, facts.model, head)
    settings = DetectSettings(
        conf=float(opts.conf),
        iou=float(opts.iou),
        max_det=int(opts.max_det),
        anchors=anchors,
        agnostic=bool(opts.agnostic_nms),
        classes=common.pop("classes"),
    )
    return Detect(
        reason="asked for" if asked else "the outputs are a known detection head",
        settings=settings,
        quant=facts.quant,
        head=head,
        anchors_source=anchors_source,
        **common,
    )
