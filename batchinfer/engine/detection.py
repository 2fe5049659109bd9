"""Letterbox geometry in shared memory: how a reader placed each item, for the decoder.

Each slot has a small row in the **geometry segment** beside its input region (see the
NOTE in slots.py) when the run's task letterboxes (``Task.placement``): the reader that
letterboxes an image writes where it went (original width and height after EXIF
orientation, scale, padding); the core worker that infers the slot reads it after the
runtime call and gives it to the task's decoder (batchinfer/tasks/base.py ``ItemDecoder``),
which maps its results back to the original image's pixels and sends them to the
coordinator in its ``done`` message: a few dozen bytes per box, never the raw outputs
(those reach the output slots only with ``--save-outputs``). A slot whose row is zero (a
.npy tensor, a benchmark's synthetic input) had no letterbox: the decoder gets None, and
its results stay in the input's pixels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from batchinfer.engine.slots import TensorLayout

if TYPE_CHECKING:
    from batchinfer.detect import Letterbox

#: One geometry row per slot: valid flag, source width, source height, scale, pad x, pad y.
GEOMETRY_LAYOUT = TensorLayout(((6,),), ("float64",))


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
