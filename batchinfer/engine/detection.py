"""Detection inside the engine: per-item geometry in shared memory, decoding in the workers.

Each slot has a small row in the **geometry segment** beside its input region (see the
NOTE in slots.py): the reader that letterboxes an image writes where it went (original
width and height after EXIF orientation, scale, padding); the core worker that infers the
slot reads it after the runtime call, decodes the outputs into boxes
(:class:`batchinfer.detect.Decoder`), maps them back to the original image's pixels and
sends them to the coordinator in its ``done`` message: a few dozen bytes per box, never the
raw outputs (those reach the output slots only with ``--save-outputs``). A slot whose row is
zero (a .npy tensor, a benchmark's synthetic input) had no letterbox: its boxes stay in the
input's pixels, and the input's size is the image's.

What travels per item, :data:`Boxes`: ``(rows, width, height, nonfinite, cpu_s)`` where
``rows`` is float32 (n, 6) = x1, y1, x2, y2, score, class id, by score, best first.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from batchinfer.engine.slots import TensorLayout

if TYPE_CHECKING:
    from batchinfer.detect import Letterbox
    from batchinfer.engine.task import TaskPlan

#: One geometry row per slot: valid flag, source width, source height, scale, pad x, pad y.
GEOMETRY_LAYOUT = TensorLayout(((6,),), ("float64",))

#: (rows (n, 6) float32, original width, original height, NaN/inf candidates, CPU seconds).
Boxes = tuple[np.ndarray, int, int, int, float]


def write_geometry(row: np.ndarray, placed: Letterbox | None) -> None:
    """Record where the slot's image went (None: no letterbox, the row is cleared)."""
    if placed is None:
        row[:] = 0.0
        return
    row[:] = (1.0, placed.src_w, placed.src_h, placed.scale, placed.pad_x, placed.pad_y)


def read_geometry(row: np.ndarray) -> Letterbox | None:
    """The geometry a reader wrote for the slot, or None."""
    if row[0] != 1.0:
        return None
    from batchinfer.detect import Letterbox

    return Letterbox(
        src_w=int(row[1]),
        src_h=int(row[2]),
        scale=float(row[3]),
        pad_x=float(row[4]),
        pad_y=float(row[5]),
    )


class ItemDecoder:
    """One instance's decoder: outputs in, boxes in the original image's pixels out.

    One per runtime instance (instances are threads; a Decoder may keep scratch buffers).
    Its CPU time is measured with the thread's clock, so a benchmark can say how much of a
    core worker's CPU per item goes to post-processing.
    """

    def __init__(self, task: TaskPlan) -> None:
        from batchinfer.detect import Decoder, boxes_to_original

        assert task.head is not None and task.settings is not None and task.input_hw
        self._to_original = boxes_to_original
        self.task = task
        self.input_hw = task.input_hw
        self._decoders: dict[tuple[bool, ...], Decoder] = {}
        self._make = lambda quant: Decoder(task.head, task.input_hw, task.settings, quant)

    def _decoder(self, outputs: Sequence[np.ndarray]):
        # Quantisation parameters only for outputs the runtime returns as int8/uint8.
        key = tuple(o.dtype in (np.int8, np.uint8) for o in outputs)
        decoder = self._decoders.get(key)
        if decoder is None:
            quant = ()
            if any(key):
                known = self.task.quant
                if len(known) != len(outputs) or any(
                    k and known[i] is None for i, k in enumerate(key)
                ):
                    raise ValueError(
                        "the runtime returned int8 outputs whose quantisation the model does "
                        "not say (no DequantizeLinear after them in its .onnx)"
                    )
                quant = tuple(known[i] if k else None for i, k in enumerate(key))
            decoder = self._decoders[key] = self._make(quant)
        return decoder

    def __call__(self, outputs: Sequence[np.ndarray], geometry: np.ndarray) -> Boxes:
        """Decode one item's outputs; ``geometry``: its row of the geometry segment."""
        c0 = time.thread_time()
        found = self._decoder(outputs)(outputs)
        placed = read_geometry(geometry)
        boxes = found.boxes
        if placed is not None:
            width, height = placed.src_w, placed.src_h
            boxes = self._to_original(boxes, placed)
        else:
            height, width = self.input_hw
            boxes = np.clip(boxes, 0, [width, height, width, height])
        rows = np.empty((len(found.scores), 6), np.float32)
        rows[:, :4] = boxes
        rows[:, 4] = found.scores
        rows[:, 5] = found.class_ids
        return rows, int(width), int(height), int(found.nonfinite), time.thread_time() - c0
