"""Instance masks from a YOLO prototype, straight to COCO RLE in the original image's pixels.

What a mask is (Ultralytics' ``process_mask`` and the model zoo's ``yolov8_seg.py``): the
logits coefficients · prototype, bilinearly upsampled (``align_corners=False``, edges
clamped), above 0 (sigmoid above 0.5), cropped to the instance's box. Here a pixel of the
ORIGINAL image is in the mask when

1. its centre lies in the box (in original pixels): x1 <= x + 0.5 < x2, y1 <= y + 0.5 < y2;
2. the logits, bilinearly interpolated at the place its centre falls on the prototype grid
   (through the letterbox: canvas = pad + original x resize ratio; prototype = canvas x
   Wp / W_in), are > 0.

Ultralytics crops at prototype resolution, upsamples to the canvas, thresholds, and its
``scale_image`` resizes the unpadded canvas to the original; the zoo upsamples, crops on
the canvas and resizes. Sampling the prototype once at each original pixel gives the same
masks up to about a pixel along their edges. Logits are interpolated rather than
sigmoids (as current Ultralytics does): the sign is what counts, and it needs no exp.
(The zoo's yolov5_seg.py multiplies the coefficients by the object score first: a positive
factor, which changes no logit's sign, so no mask.)

How, at a cost of the boxes' windows on the prototype and their columns in the original,
never the image's area:

- only the prototype window under each box (plus one sample for interpolation) is
  multiplied by the coefficients, (M,) . (M, h, w), into one table for all boxes: a row
  per prototype column, the window's rows between columns of zeros;
- along an original column (its logits interpolated along x between a near and a far
  prototype column) the logit is linear between two prototype rows, so it can cross 0
  only in a *cell* whose four samples do not all have the same sign: a few per column,
  about the mask's outline. The zeros around a window make the column's top and bottom
  such cells (a column in at its first row rises from the zero before it);
- each column is evaluated only at the cells of its prototype column, in row order, and
  each crossing's row solved for (one division): the RLE's *toggles* (rle.py) come out
  in column-major order, positions x·H + y, with no sort. Runs of 0s outside the box
  are counted, never made.

The per-box work is the window sum; the cells, crossings, runs and strings of all boxes
are vectorised together. Boxes go in groups of at most ``_MAX_BUFFER`` values (a box's
bound: its columns x window rows, the crossings of a mask that flips in every cell), so
300 boxes over a large photo stay within tens of MB; an image whose masks flip more than
``_MAX_FLIPS`` times (noise: an RLE as big as the image per instance) is refused with an
InferenceError, which the caller turns into that item's error row.

Entry points: :func:`proto_map` (the geometry, once per image) and :func:`mask_rles`
(the ``counts`` strings); ``seg_decode.SegmentDecoder`` calls both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from batchinfer.detect.letterbox import Letterbox
from batchinfer.detect.rle import strings_from_counts, strings_of_toggles
from batchinfer.errors import InferenceError

# Non-finite logits (a NaN in an output) count as outside, finitely, so crossings stay
# paired and each column's runs stay inside it.
_BIG = np.float32(1e30)
#: Values (float32) of column logits made at once: 16 MiB, and about as much again in
#: temporaries.
_MAX_BUFFER = 1 << 22
#: Value changes (RLE runs) of one image's masks at most: 128 MiB of positions.
_MAX_FLIPS = 1 << 24


@dataclass(frozen=True)
class ProtoMap:
    """Where original pixel centres fall on the prototype grid, per axis: the bilinear
    sample position (``align_corners=False``: sample k sits at k + 0.5) of pixel i is
    ``a * i + b``."""

    ax: float
    bx: float
    ay: float
    by: float
    height: int  # the original image
    width: int
    proto_hw: tuple[int, int]


def proto_map(
    lb: Letterbox | None, input_hw: tuple[int, int], proto_hw: tuple[int, int]
) -> ProtoMap:
    """The map for an image letterboxed by ``lb`` (None: the image is the model input)."""
    in_h, in_w = input_hw
    ph, pw = proto_hw
    if lb is None:
        src_w, src_h, kx, ky, pad_x, pad_y = in_w, in_h, 1.0, 1.0, 0.0, 0.0
    else:
        new_w, new_h = lb.resized
        src_w, src_h, pad_x, pad_y = lb.src_w, lb.src_h, lb.pad_x, lb.pad_y
        kx, ky = new_w / src_w, new_h / src_h  # the resize actually made, per axis
    fx, fy = pw / in_w, ph / in_h
    return ProtoMap(
        kx * fx, (pad_x + 0.5 * kx) * fx - 0.5, ky * fy, (pad_y + 0.5 * ky) * fy - 0.5,
        int(src_h), int(src_w), (int(ph), int(pw)),
    )  # fmt: skip


def pixel_ranges(boxes: np.ndarray, height: int, width: int) -> np.ndarray:
    """(n, 4) int64 xa, ya, xb, yb: the pixels whose centres lie in each box (x1 y1 x2 y2,
    original pixels), clipped to the image; empty where xb <= xa or yb <= ya."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    with np.errstate(invalid="ignore"):
        r = np.ceil(np.nan_to_num(b, nan=0.0) - 0.5)
    r[:, 0::2] = np.clip(r[:, 0::2], 0, width)
    r[:, 1::2] = np.clip(r[:, 1::2], 0, height)
    return r.astype(np.int64)


def mask_rles(
    proto: np.ndarray,
    coefs: np.ndarray,
    boxes: np.ndarray,
    pmap: ProtoMap,
    quant: tuple[float, int] | None = None,
) -> list[str]:
    """Each instance's COCO compressed RLE ``counts`` in the original image (pmap.height
    x pmap.width).

    ``proto`` is the prototype output, (M, Hp, Wp) or (1, M, Hp, Wp), float or int8/uint8
    with ``quant`` = (scale, zero point) (only the windows under the boxes are converted);
    ``coefs`` (n, M) the kept instances' coefficients; ``boxes`` (n, 4) their boxes in
    original pixels.
    """
    m, ph, pw = proto.shape[-3:]
    proto = proto.reshape(m, ph, pw)
    coefs = np.asarray(coefs, np.float32).reshape(-1, m)
    n = len(coefs)
    size = pmap.height * pmap.width
    win = _windows(pixel_ranges(boxes, pmap.height, pmap.width), pmap)
    if not win.live.size:
        return strings_from_counts([np.array([size])] * n)
    # boxes in groups whose buffers stay under _MAX_BUFFER values together: 300 boxes
    # (max_det) over a large photo would need GBs. A box's bound: its columns x window
    # rows (the crossings of a mask that flips in every cell) and its window.
    h = win.r1 - win.r0
    work = win.nx * h + (win.c1 - win.c0) * (int(h[win.live].max()) + 2)
    work = work[win.live]
    group = (np.cumsum(work) - work) // _MAX_BUFFER
    cuts = np.flatnonzero(np.diff(group)) + 1
    where, owner, flips = [], [], 0
    for part in np.split(win.live, cuts):
        pos, box = _group_toggles(proto, coefs, part, win, pmap, quant)
        where.append(pos)
        owner.append(box)
        flips += pos.size
        if flips > _MAX_FLIPS:
            # smooth masks flip about twice a column; noise up to once a pixel, and its RLE
            # would be as big as the image for each instance
            raise InferenceError(
                f"The masks of this image change value more than {_MAX_FLIPS:,} times "
                f"({win.live.size} instances in a {pmap.width}x{pmap.height} image): the "
                "prototype or coefficients look like noise, not a segmentation model's output."
            )
    per_mask = np.bincount(np.concatenate(owner), minlength=n)
    return strings_of_toggles(np.concatenate(where), per_mask, size)


@dataclass(frozen=True)
class _Windows:
    """Per box (original pixels, prototype samples): the pixel ranges, how many columns,
    which boxes have any, and the prototype window under each (rows r0:r1, columns
    c0:c1, one sample beyond the last pixel for the interpolation)."""

    xa: np.ndarray
    ya: np.ndarray
    yb: np.ndarray
    nx: np.ndarray  # columns (0 for an empty box)
    live: np.ndarray  # the boxes with pixels, in order
    r0: np.ndarray
    r1: np.ndarray
    c0: np.ndarray
    c1: np.ndarray


def _windows(ranges: np.ndarray, pmap: ProtoMap) -> _Windows:
    ph, pw = pmap.proto_hw
    xa, ya, xb, yb = ranges.T
    nx = np.where((xb > xa) & (yb > ya), xb - xa, 0)
    # the same expressions as each column's and row's sample position (_columns, _rows)
    sy0 = np.clip(pmap.ay * ya + pmap.by, 0, ph - 1)
    sy1 = np.clip(pmap.ay * (yb - 1) + pmap.by, 0, ph - 1)
    sx0 = np.clip(pmap.ax * xa + pmap.bx, 0, pw - 1)
    sx1 = np.clip(pmap.ax * (xb - 1) + pmap.bx, 0, pw - 1)
    r0 = np.floor(sy0).astype(np.int64)
    r1 = np.minimum(np.floor(sy1).astype(np.int64) + 2, ph)
    c0 = np.floor(sx0).astype(np.int64)
    c1 = np.minimum(np.floor(sx1).astype(np.int64) + 1, pw - 1) + 1
    return _Windows(xa, ya, yb, nx, np.flatnonzero(nx), r0, r1, c0, c1)


@dataclass(frozen=True)
class _Columns:
    """Every column of a group's boxes, one box after another: its box (in the group),
    x, the table row of its near prototype column, and its weight on the far one."""

    box: np.ndarray
    x: np.ndarray
    row: np.ndarray
    fx: np.ndarray  # float32


@dataclass(frozen=True)
class _Cells:
    """The cells (two neighbouring table columns of a table row) where a column's logit
    may change sign, per table row in column order. A column's logit at a cell's upper
    and lower row is ``d0 x fx + n0`` and ``d1 x fx + n1`` (float32, as the interpolation
    along x: (far - near) x weight + near); ``j`` is its upper row in the window."""

    n0: np.ndarray
    d0: np.ndarray
    n1: np.ndarray
    d1: np.ndarray
    j: np.ndarray  # float64
    start: np.ndarray  # each table row's first cell
    count: np.ndarray  # and how many


def _group_toggles(
    proto: np.ndarray,
    coefs: np.ndarray,
    live: np.ndarray,
    win: _Windows,
    pmap: ProtoMap,
    quant: tuple[float, int] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """The flips of boxes ``live`` (in order, none empty): column-major positions, each
    box's sorted, and the box of each."""
    table, first = _table(proto, coefs, live, win, quant)
    cols = _columns(live, win, first, pmap)
    cells = _cells(table)
    # every column against each cell of its table row, a column's cells in row order
    count = cells.count.take(cols.row)
    col = np.repeat(np.arange(cols.x.size), count)
    cell = np.arange(col.size)
    cell += np.repeat(cells.start.take(cols.row) - (np.cumsum(count) - count), count)
    fx = np.repeat(cols.fx, count)
    v0 = cells.d0.take(cell) * fx + cells.n0.take(cell)
    v1 = cells.d1.take(cell) * fx + cells.n1.take(cell)
    hit = np.flatnonzero((v0 > 0) != (v1 > 0))
    col, cell = col.take(hit), cell.take(hit)
    a, b = v0.take(hit).astype(np.float64), v1.take(hit).astype(np.float64)
    box = cols.box.take(col)
    s = win.r0[live].take(box) + cells.j.take(cell) + a / (a - b)  # sample position of the 0
    t = (s - pmap.by) / pmap.ay  # ... as a pixel row
    # rising: the first row past the 0 is in; falling: the first row at or past it is out
    row = np.where(b > 0, np.floor(t) + 1, np.ceil(t))
    row = np.clip(row, win.ya[live].take(box), win.yb[live].take(box)).astype(np.int64)
    pos = cols.x.take(col) * pmap.height + row
    owner = live.take(box)
    keep = _odd_runs(owner * (pmap.height * pmap.width + 1) + pos)
    return pos.take(keep), owner.take(keep)


def _table(
    proto: np.ndarray,
    coefs: np.ndarray,
    live: np.ndarray,
    win: _Windows,
    quant: tuple[float, int] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Every box's window of logits, transposed (a row per prototype column, a column per
    prototype row, between columns of zeros) and stacked, with a row of zeros at the end;
    and the table row where each box's window starts. Only the windows are multiplied by
    the coefficients: (M,) . (M, h, w) per box."""
    c0, c1, r0, r1 = win.c0[live], win.c1[live], win.r0[live], win.r1[live]
    # (a column clamped at the prototype's right edge has weight 0 on its far sample,
    # whatever row follows)
    rows = c1 - c0
    first = np.cumsum(rows) - rows
    # zeros around each window: out, where the column's top and bottom flips are found
    table = np.zeros((int(rows.sum()) + 1, int((r1 - r0).max()) + 2), np.float32)
    for i, g, a, b, y0, y1 in zip(
        live.tolist(), first.tolist(), c0.tolist(), c1.tolist(), r0.tolist(), r1.tolist(),
        strict=True,
    ):  # fmt: skip
        # einsum reads the strided window in place (copying it for a matrix product costs
        # as much again); into a view of the table it writes more slowly than a copy
        out = np.einsum(
            "m,mhw->wh", coefs[i], proto[:, y0:y1, a:b], dtype=np.float32, casting="unsafe"
        )
        if quant is not None:  # dequantise after the sum: it is linear
            out -= np.float32(quant[1]) * coefs[i].sum(dtype=np.float32)
        table[g : g + b - a, 1 : y1 - y0 + 1] = out
    if quant is not None:
        table *= np.float32(quant[0])
    if not np.isfinite(table).all():
        np.nan_to_num(table, copy=False, nan=-_BIG, posinf=_BIG, neginf=-_BIG)
    return table, first


def _columns(live: np.ndarray, win: _Windows, first: np.ndarray, pmap: ProtoMap) -> _Columns:
    nx = win.nx[live]
    box = np.repeat(np.arange(live.size), nx)
    x = np.arange(box.size) + np.repeat(win.xa[live] - (np.cumsum(nx) - nx), nx)
    sx = np.clip(pmap.ax * x + pmap.bx, 0, pmap.proto_hw[1] - 1)
    k0 = np.floor(sx).astype(np.int64)
    row = k0 + np.repeat(first - win.c0[live], nx)
    return _Columns(box, x, row, (sx - k0).astype(np.float32))


def _cells(table: np.ndarray) -> _Cells:
    """The cells of each table row (but the last) where a column's logit may change sign.

    Between two prototype rows it is linear, so only where the four samples around
    (near and far column, upper and lower row) do not all have the same sign: about a
    mask's outline. The zeros before and after each window make the column's top and
    bottom such cells too: a column in at its first row rises from the zero before it (at
    window row -1, so its flip clips to the box's top), one in at its last row falls to
    the zero after it (at row h, past the box's bottom)."""
    width = table.shape[1]
    inside = table > 0
    near = inside[:-1]
    mixed = near[:, 1:] != near[:, :-1]  # down one row in the near column
    mixed |= inside[1:, 1:] != inside[1:, :-1]  # ... in the far one
    mixed |= inside[1:, :-1] != near[:, :-1]  # across, at the upper row
    row, j = np.divmod(np.flatnonzero(mixed), width - 1)
    at = row * width + j  # each cell's upper near sample
    flat = table.ravel()
    n0, n1 = flat.take(at), flat.take(at + 1)
    d0, d1 = flat.take(at + width) - n0, flat.take(at + width + 1) - n1
    count = np.bincount(row, minlength=table.shape[0])
    return _Cells(n0, d0, n1, d1, j - 1.0, np.cumsum(count) - count, count)


def _odd_runs(keys: np.ndarray) -> np.ndarray:
    """Where to keep ``keys`` (box x (H W + 1) + position, made in order): one of each
    run of equal keys of odd length; two flips at one place (a column's end and the next
    column's start, a crossing clipped to the box's top) are no flip."""
    step = np.diff(keys)
    if (step < 0).any():  # crossings out of order: rounding in extreme logits
        order = np.argsort(keys, kind="stable")
        return order[_odd_runs(keys[order])]
    if step.all():
        return np.arange(keys.size)
    starts = np.flatnonzero(np.concatenate(([True], step != 0)))
    runs = np.diff(starts, append=keys.size)
    return starts[runs % 2 == 1]
