"""What every box task shares (detect today; segment, pose and obb subclass it): the class
names, the ``detect.*`` settings (conf, iou, max_det, classes, agnostic NMS, pad colour),
the letterbox placement and mapping, the ``boxes`` struct columns, drawing and COCO export.

A box task's payload (what its decoder sends from the core worker) is a :class:`BoxRows`:
float32 rows (n, 6) x1, y1, x2, y2, score, class id in the original image's pixels, best
first; the image's width and height; NaN/inf candidates dropped. A subclass that adds
per-box parts (a mask, keypoints, an angle) extends :meth:`BoxTask.box_fields` and
:meth:`BoxTask.box_columns` and carries them in ``BoxRows.extra``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa

from batchinfer.errors import ConfigError
from batchinfer.messages import Message, setting
from batchinfer.tasks.base import Placement, Task

if TYPE_CHECKING:
    from PIL import Image

    from batchinfer.detect import DetectSettings, Letterbox
    from batchinfer.options import DetectOptions

#: The ranges the detection settings must be in (checked by :func:`check_detect_options`).
CONF_RANGE = (0.0, 1.0)
IOU_RANGE = (0.0, 1.0)
MAX_DET_RANGE = (1, 100_000)

#: One box of a detection row, in the original image's pixels (after EXIF orientation).
BOX_FIELDS = [
    pa.field("class_id", pa.int32()),
    pa.field("label", pa.string()),
    pa.field("score", pa.float32()),
    pa.field("x1", pa.float32()),
    pa.field("y1", pa.float32()),
    pa.field("x2", pa.float32()),
    pa.field("y2", pa.float32()),
]
BOX_TYPE = pa.struct(BOX_FIELDS)


class BoxRows(NamedTuple):
    """A box task's payload for one item (module docstring)."""

    rows: np.ndarray  # float32 (n, 6): x1, y1, x2, y2, score, class id
    width: int
    height: int
    nonfinite: int = 0
    extra: Any = None  # a subclass's per-box parts (masks, keypoints, angles)

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)


def check_detect_options(opts: DetectOptions) -> None:
    """ConfigError naming the setting when one is out of its range."""

    def between(name: str, value: float, low: float, high: float, open_low: bool) -> None:
        below = value <= low if open_low else value < low
        if not math.isfinite(value) or value > high or below:
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


def to_original(
    boxes: np.ndarray, placed: Letterbox | None, input_hw: tuple[int, int]
) -> tuple[np.ndarray, int, int]:
    """Canvas boxes (n, 4) mapped to the original image's pixels, and its width and height
    (no letterbox: a .npy tensor, a benchmark's input: the input's pixels, clipped)."""
    if placed is not None:
        from batchinfer.detect import boxes_to_original

        return boxes_to_original(boxes, placed), int(placed.src_w), int(placed.src_h)
    height, width = input_hw
    return np.clip(boxes, 0, [width, height, width, height]), int(width), int(height)


@dataclass(frozen=True)
class BoxTask(Task):
    """A task whose rows hold ``boxes`` (module docstring)."""

    detects = True

    settings: DetectSettings | None = None
    input_hw: tuple[int, int] | None = None
    names: tuple[str, ...] = ()  # class names by class id; () when none are known
    names_source: str | None = None
    category_ids: tuple[int, ...] = ()  # COCO category id per class (the dataset's COCO file)
    pad: tuple[int, int, int] = (114, 114, 114)

    @property
    def placement(self) -> Placement:
        return Placement("letterbox", self.pad)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Task:
        return cls(
            reason=str(record.get("description", "")),
            names=tuple(str(n) for n in record.get("names") or ()),
            names_source=record.get("names_source"),
            category_ids=tuple(int(c) for c in record.get("category_ids") or ()),
        )

    def record(self) -> dict[str, Any]:
        """The task record; with the head (a planned task, not one read from a record): its
        :meth:`head_record`, then the input size, the class names and their COCO ids."""
        out = super().record()
        head = self.head_record()
        if head is None:
            return out
        out.update(
            head,
            input_hw=list(self.input_hw or ()),
            names_source=self.names_source,
            names=list(self.names),
        )
        if self.category_ids:
            out["category_ids"] = list(self.category_ids)
        return out

    def head_record(self) -> dict[str, Any] | None:
        """The head and the settings it decodes with, as the record says them (None: no
        head, as in a task read back from a record)."""
        return None

    # -- sink ----------------------------------------------------------------------------
    def box_fields(self) -> list[pa.Field]:
        """The fields of one element of ``boxes`` (a subclass adds its parts)."""
        return list(BOX_FIELDS)

    def fields(self) -> list[pa.Field]:
        return [
            pa.field("boxes", pa.list_(pa.struct(self.box_fields()))),
            pa.field("n_boxes", pa.int32()),
            pa.field("width", pa.int32()),
            pa.field("height", pa.int32()),
        ]

    def figures(self, payload: BoxRows) -> Mapping[str, float]:
        return {
            "boxes": len(payload.rows),
            "nonfinite": payload.nonfinite,
            "nonfinite_items": payload.nonfinite > 0,
        }

    def box_columns(self, flat: np.ndarray, payloads: Sequence[BoxRows | None]) -> list[pa.Array]:
        """One array per :meth:`box_fields` over every box of a part (``flat``: their rows)."""
        class_ids = flat[:, 5].astype(np.int32)
        if self.names:
            names = np.array(list(self.names), dtype=object)
            known = (class_ids >= 0) & (class_ids < len(names))
            labels = pa.array(
                np.where(known, names[np.clip(class_ids, 0, len(names) - 1)], None),  # type: ignore[call-overload]
                type=pa.string(),
            )
        else:
            labels = pa.nulls(len(flat), pa.string())
        columns = [pa.array(class_ids, type=pa.int32()), labels]
        columns += [
            pa.array(np.ascontiguousarray(flat[:, i]), type=pa.float32()) for i in (4, 0, 1, 2, 3)
        ]
        return columns

    def arrays(self, payloads: Sequence[Any], bad: dict[int, str]) -> list[pa.Array]:
        """boxes, n_boxes, width, height: one struct array over every box of the part, cut
        into rows by offsets (no Python object per box but the label strings)."""
        from batchinfer.sink.storable import checked_array

        lengths = np.fromiter((0 if p is None else len(p.rows) for p in payloads), np.int64)
        offsets = np.zeros(len(payloads) + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        present = [p.rows for p in payloads if p is not None and len(p.rows)]
        flat = np.concatenate(present) if present else np.empty((0, 6), np.float32)
        fields = self.box_fields()
        boxes = pa.StructArray.from_arrays(self.box_columns(flat, payloads), fields=fields)
        mask = np.fromiter((p is None for p in payloads), bool, len(payloads))
        listed = pa.ListArray.from_arrays(
            pa.array(offsets),
            boxes,
            type=pa.list_(pa.struct(fields)),
            mask=pa.array(mask) if mask.any() else None,
        )
        n_boxes = pa.array(np.where(mask, 0, lengths).astype(np.int32), mask=mask)
        sizes = [
            checked_array([None if p is None else p[i] for p in payloads], n, pa.int32(), bad)
            for i, n in ((1, "width"), (2, "height"))
        ]
        return [listed, n_boxes, *sizes]

    # -- afterwards ----------------------------------------------------------------------
    def draw(self, canvas: Image.Image, row: Mapping[str, Any], **style: Any) -> Image.Image:
        from batchinfer.draw import draw_result

        return draw_result(canvas, row.get("boxes"), **style)


def said_with_head(task: BoxTask, head: Any, outputs: str, how: Message | str) -> Message:
    """The line a run of a box task with a recognised ``head`` starts with:
    ``task: NAME (HEAD: OUTPUTS, WHY)``; WHY names ``detect.task`` when it asked for the
    task, else it is ``how`` (how the task was recognised)."""
    why = Message(f"{head.describe()}: {outputs}, ")
    why += "asked for with " + setting("detect.task") if task.reason == "asked for" else how
    return "task: " + Message(task.name, " (", why, ")")


def int8_quant(
    outputs: Sequence[np.ndarray], known: Sequence[tuple[float, int] | None]
) -> tuple[tuple[bool, ...], tuple[tuple[float, int] | None, ...]]:
    """Which of a call's outputs the runtime returned as int8/uint8 (a decoder is made per
    such set), and their quantisation from the model's graph (``known``: the task's
    ``quant``); ValueError when the graph does not say an int8 output's."""
    key = tuple(o.dtype in (np.int8, np.uint8) for o in outputs)
    if not any(key):
        return key, ()
    if len(known) != len(outputs) or any(k and known[i] is None for i, k in enumerate(key)):
        raise ValueError(
            "the runtime returned int8 outputs whose quantisation the model does "
            "not say (no DequantizeLinear after them in its .onnx)"
        )
    return key, tuple(known[i] if k else None for i, k in enumerate(key))
