"""What segment, pose and obb share beyond :class:`~batchinfer.tasks.boxes.BoxTask`: a head
recognised from the output shapes (and the model's metadata), refused in one line when
asked for and not fitting, decoded in the core worker by its decoder in batchinfer/detect/
into a :class:`BoxRows` whose ``extra`` holds the task's per-box parts (masks, keypoints,
rotated boxes), and a task record naming the head and the settings.

A subclass gives ``name``, its head's recogniser (:meth:`HeadTask.find_head`), the decoder
(:meth:`HeadTask.make_decoder`) and what one decoded image's parts are
(:meth:`HeadTask.parts`), plus its extra box fields and columns.

``detect.classes`` is applied after the decoder's class-aware NMS: boxes of one class never
suppress another's, so the kept boxes are those a filter before NMS keeps, but for the
``max_det`` cap, which counts every class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from batchinfer.errors import ConfigError
from batchinfer.messages import Message, setting
from batchinfer.tasks.base import ItemDecode, ModelFacts, shapes_text
from batchinfer.tasks.boxes import BoxRows, BoxTask, int8_quant, said_with_head

if TYPE_CHECKING:
    from batchinfer.detect import Letterbox
    from batchinfer.options import DetectOptions

#: Ultralytics' tasks (metadata ``task``) as people say them, for refusals.
SAID = {
    "detect": "detector",
    "pose": "pose (keypoint) model",
    "segment": "segmentation model",
    "obb": "oriented-box model",
    "classify": "classifier",
}


class Parts(NamedTuple):
    """One image decoded: boxes (n, 4) x1 y1 x2 y2 in original pixels, scores, class ids,
    the task's per-box parts (indexable by a boolean array, or a list), the image's size."""

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    extra: Any
    width: int
    height: int
    nonfinite: int


@dataclass(frozen=True)
class HeadTask(BoxTask):
    """A box task decoded by one of batchinfer/detect/'s head decoders (module docstring)."""

    head: Any = None  # the recognised head (SegHead, PoseHead, ObbHead); None from a record
    # Per output: (scale, zero point) when the graph quantises it (int8 outputs)
    quant: tuple[tuple[float, int] | None, ...] = ()
    classes: tuple[int, ...] | None = None  # detect.classes (None: every class)

    exports = {"coco": "batchinfer.export:export_coco"}  # noqa: RUF012 (a ClassVar)

    # -- what a subclass gives -------------------------------------------------------------
    @classmethod
    def find_head(cls, facts: ModelFacts, input_hw: tuple[int, int], asked: bool) -> Any:
        """The head the outputs are (None: not this task's), for an image input of
        ``input_hw`` (the facts' own, known to be there)."""
        raise NotImplementedError

    @classmethod
    def no_head(cls, facts: ModelFacts) -> str:
        """Why the outputs are no head of this task, one sentence (for ``--task NAME``)."""
        return f"The outputs {facts.shapes_text} are no {cls.name} head batchinfer knows."

    @classmethod
    def make_settings(cls, opts: DetectOptions, head: Any) -> Any:
        from batchinfer.detect import DetectSettings

        if opts.agnostic_nms:
            raise ConfigError(
                setting("detect.agnostic_nms")
                + f" is not available for {cls.name} runs (its NMS is class-aware); "
                "leave it out.",
                "detect.agnostic_nms",
            )
        return DetectSettings(conf=float(opts.conf), iou=float(opts.iou), max_det=int(opts.max_det))

    def make_decoder(self, quant: tuple[tuple[float, int] | None, ...]) -> Any:
        raise NotImplementedError

    def parts(self, found: Any, placed: Letterbox | None) -> Parts:
        raise NotImplementedError

    # -- planning --------------------------------------------------------------------------
    @classmethod
    def recognise(cls, facts: ModelFacts, options: DetectOptions, asked: bool) -> HeadTask | None:
        said = facts.model_task
        other = said if said in SAID and said != cls.name else None
        head = None
        if facts.input_hw is not None and facts.output_shapes and other is None:
            head = cls.find_head(facts, facts.input_hw, asked)
        if head is not None:
            return cls.planned(options, facts, head, asked)
        if not asked:
            return None
        if other is not None:
            assert facts.meta is not None
            why = (
                f"{facts.model.name} is an Ultralytics {SAID[other]} (its metadata in "
                f"{facts.meta.file} says task: {other})."
            )
            advice = other
        elif facts.input_hw is None:
            why = f"The input of {facts.model.name} is not an image."
            advice = "raw"
        else:
            why = cls.no_head(facts)
            advice = "raw"
        raise ConfigError(
            setting("detect.task") + f" {cls.name}: {why} Use " + setting("detect.task")
            + f" {advice} for this model.",
            "detect.task",
        )  # fmt: skip

    @classmethod
    def planned(cls, opts: DetectOptions, facts: ModelFacts, head: Any, asked: bool) -> HeadTask:
        from batchinfer.tasks.detect import box_plan

        common = box_plan(opts, facts, head.num_classes, head.describe())
        if facts.model_task == cls.name:
            reason = f"from the model's metadata (task: {cls.name}) and its output shapes"
        else:
            reason = "recognised from the output shapes"
        return cls(
            reason="asked for" if asked else reason,
            settings=cls.make_settings(opts, head),
            quant=facts.quant,
            head=head,
            **common,
        )

    def describe(self) -> str:
        if self.head is None:
            return super().describe()
        return f"{self.name}: {self.head.describe()}"

    def info_lines(self) -> list[str]:
        if self.head is None or self.input_hw is None:
            return super().info_lines()
        h, w = self.input_hw
        return [
            f"task:    {self.describe()} (its outputs fit that layout for a {h}x{w} input)",
            f"  run letterboxes images and writes boxes with their {self.parts_said()}",
        ]

    def parts_said(self) -> str:
        return "parts"

    def said(self) -> Message:
        if self.head is None:
            return super().said()
        n = len(self.output_shapes)
        outputs = f"{n} outputs" if n > 3 else f"outputs {shapes_text(self.output_shapes)}"
        return said_with_head(self, self.head, outputs, Message(self.reason))

    def head_record(self) -> dict[str, Any] | None:
        if self.settings is None or self.head is None:
            return None
        s = self.settings
        return dict(
            head={k: _plain(v) for k, v in vars(self.head).items()},
            settings={
                k: _plain(getattr(s, k))
                for k in ("conf", "iou", "max_det", "nms", "agnostic")
                if hasattr(s, k)
            },
            classes=None if self.classes is None else list(self.classes),
        )

    # -- worker side -----------------------------------------------------------------------
    def decoder(self) -> ItemDecode:
        return _Decoders(self)


def _plain(value: Any) -> Any:
    """A head's or settings' value as JSON has it (tuples as lists)."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def subset(extra: Any, keep: np.ndarray) -> Any:
    """The per-box parts of the boxes ``keep`` (a boolean array) says."""
    if isinstance(extra, list):
        return [e for e, k in zip(extra, keep, strict=True) if k]
    return extra[keep]


class _Decoders:
    """One runtime instance's decoder: one of the task's decoders per set of int8 outputs
    (each keeps its buffers), the ``detect.classes`` filter, a :class:`BoxRows` out."""

    def __init__(self, task: HeadTask) -> None:
        assert task.head is not None and task.settings is not None and task.input_hw
        self.task = task
        self._made: dict[tuple[bool, ...], Callable[..., Any]] = {}

    def _decoder(self, outputs: Sequence[np.ndarray]) -> Callable[..., Any]:
        key, quant = int8_quant(outputs, self.task.quant)
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = self.task.make_decoder(quant)
        return made

    def __call__(self, outputs: Sequence[np.ndarray], placed: Letterbox | None) -> BoxRows:
        p = self.task.parts(self._decoder(outputs)(outputs, placed), placed)
        boxes, scores, class_ids, extra = p.boxes, p.scores, p.class_ids, p.extra
        if self.task.classes is not None:
            keep = np.isin(class_ids, self.task.classes)
            boxes, scores, class_ids = boxes[keep], scores[keep], class_ids[keep]
            extra = subset(extra, keep)
        rows = np.empty((len(scores), 6), np.float32)
        rows[:, :4] = boxes
        rows[:, 4] = scores
        rows[:, 5] = class_ids
        return BoxRows(rows, int(p.width), int(p.height), int(p.nonfinite), extra)


def flat_extras(payloads: Sequence[BoxRows | None]) -> list[Any]:
    """The ``extra`` of every payload holding boxes, in the order of :meth:`BoxTask.arrays`'
    flat rows."""
    return [p.extra for p in payloads if p is not None and len(p.rows)]
