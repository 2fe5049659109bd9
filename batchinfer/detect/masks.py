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

How, at a cost of the boxes' width x prototype rows rather than their area:

- only the prototype window under each box (plus one sample for interpolation) is
  multiplied by the coefficients: (M,) · (M, h, w);
- each window is interpolated along x at every original column of the box: a column's
  logit is then piecewise linear in y between prototype rows;
- the rows where each column's logit crosses 0 are solved for (one division per
  crossing), and those rows, with the box's top and bottom, are the column's run
  boundaries: the RLE's *toggles* (rle.py), in column-major positions x·H + y. Runs of 0s
  outside the box are counted, never made.

The per-box work is a few numpy calls (the window sum, the interpolation into one flat
buffer, a column's rows contiguous); the crossings, runs and strings of all boxes are
vectorised together. Boxes go in groups of at most ``_MAX_BUFFER`` column values, so 300
boxes over a large photo stay within tens of MB; an image whose masks flip more than
``_MAX_FLIPS`` times (noise: an RLE as big as the image per instance) is refused with an
InferenceError, which the caller turns into that item's error row.

Entry points: :func:`proto_map` (the geometry, once per image) and :func:`mask_rles`
(the ``counts`` strings); ``seg_decode.SegmentDecoder`` calls both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from batchinfer.detect.letterbox import Letterbox
from batchinfer.detect.rle import cancel_pairs, strings_from_counts, strings_of_toggles
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
    height, width = pmap.height, pmap.width
    ranges = pixel_ranges(boxes, height, width)
    xa, ya, xb, yb = ranges.T
    nx = np.where((xb > xa) & (yb > ya), xb - xa, 0)
    live = np.flatnonzero(nx)
    if not live.size:
        return strings_from_counts([np.array([height * width])] * n)
    # rows of the prototype window under each box
    sy0 = np.clip(pmap.ay * ya + pmap.by, 0, ph - 1)
    sy1 = np.clip(pmap.ay * (yb - 1) + pmap.by, 0, ph - 1)
    r0 = np.floor(sy0).astype(np.int64)
    r1 = np.minimum(np.floor(sy1).astype(np.int64) + 2, ph)
    # boxes in groups whose buffers (a value per column and prototype row) stay under
    # _MAX_BUFFER values together: 300 boxes (max_det) over a large photo would need GBs
    size = height * width
    work = (nx * (r1 - r0))[live]
    group = (np.cumsum(work) - work) // _MAX_BUFFER
    cuts = np.flatnonzero(np.diff(group)) + 1
    parts, flips = [], 0
    for part in np.split(live, cuts):
        parts.append(_group_keys(proto, coefs, part, ranges, r0, r1, pmap, quant))
        flips += parts[-1].size
        if flips > _MAX_FLIPS:
            # smooth masks flip about twice a column; noise up to once a pixel, and its RLE
            # would be as big as the image for each instance
            raise InferenceError(
                f"The masks of this image change value more than {_MAX_FLIPS:,} times "
                f"({len(live)} instances in a {width}x{height} image): the prototype or "
                "coefficients look like noise, not a segmentation model's output."
            )
    keys = np.concatenate(parts)  # each group's keys sorted, the groups in box order
    owner, where = np.divmod(keys, size + 1)
    return strings_of_toggles(where, np.bincount(owner, minlength=n), size)


def _group_keys(
    proto: np.ndarray,
    coefs: np.ndarray,
    live: np.ndarray,
    ranges: np.ndarray,
    r0: np.ndarray,
    r1: np.ndarray,
    pmap: ProtoMap,
    quant: tuple[float, int] | None,
) -> np.ndarray:
    """The flips of boxes ``live`` (sorted, none empty) as sorted keys box x (H W + 1) +
    column-major position."""
    pw = proto.shape[2]
    xa, xb = ranges[:, 0], ranges[:, 2]
    nx = xb - xa
    # every live box's columns, one after another
    counts_x = nx[live]
    col_box = np.repeat(live, counts_x)
    starts = np.cumsum(counts_x) - counts_x
    x = xa[col_box] + np.arange(col_box.size) - np.repeat(starts, counts_x)
    sx = np.clip(pmap.ax * x + pmap.bx, 0, pw - 1)
    k0 = np.floor(sx).astype(np.int64)
    k1 = np.minimum(k0 + 1, pw - 1)
    fx = (sx - k0).astype(np.float32)
    # each column's logits at its box's window rows, interpolated along x, one column
    # after another (a column's rows contiguous) in one flat buffer. The loop is per box,
    # and short: a few numpy calls each.
    ends = starts + counts_x
    c0 = k0[starts]
    c1 = k1[ends - 1] + 1
    box_of = np.repeat(np.arange(live.size), counts_x)
    near_at, far_at = k0 - c0[box_of], k1 - c0[box_of]  # in each box's window
    h = (r1 - r0)[live]
    col_h = np.repeat(h, counts_x)
    col_start = np.cumsum(col_h) - col_h
    flat = np.empty(int(col_h.sum()), np.float32)
    weight = fx[:, None]
    for i, a, b, w0, w1, y0, y1, f0, f1 in zip(
        live.tolist(), starts.tolist(), ends.tolist(), c0.tolist(), c1.tolist(),
        r0[live].tolist(), r1[live].tolist(), col_start[starts].tolist(),
        (col_start[starts] + counts_x * h).tolist(), strict=True,
    ):  # fmt: skip
        # (columns, rows): einsum reads the strided window in place (copying it for a
        # matrix product costs as much again)
        logits = np.einsum(
            "m,mhw->wh", coefs[i], proto[:, y0:y1, w0:w1], dtype=np.float32, casting="unsafe"
        )
        if quant is not None:  # dequantise after the sum: it is linear
            logits -= np.float32(quant[1]) * coefs[i].sum(dtype=np.float32)
        near = logits[near_at[a:b]]
        out = flat[f0:f1].reshape(b - a, y1 - y0)
        np.subtract(logits[far_at[a:b]], near, out=out)
        out *= weight[a:b]
        out += near
    if quant is not None:
        flat *= np.float32(quant[0])
    if not np.isfinite(flat).all():
        np.nan_to_num(flat, copy=False, nan=-_BIG, posinf=_BIG, neginf=-_BIG)
    toggles = _toggles(flat, col_start, col_h, col_box, x, r0, ranges, pmap)
    # one sort for all: key = box x (H W + 1) + position
    return cancel_pairs(col_box[toggles[0]] * (pmap.height * pmap.width + 1) + toggles[1])


def _toggles(
    flat: np.ndarray,
    col_start: np.ndarray,
    col_h: np.ndarray,
    col_box: np.ndarray,
    x: np.ndarray,
    r0: np.ndarray,
    ranges: np.ndarray,
    pmap: ProtoMap,
) -> tuple[np.ndarray, np.ndarray]:
    """(column index, column-major position) of every flip: box tops where the column
    starts inside, box bottoms where it ends inside, and each 0 crossing between."""
    ya, yb = ranges[col_box, 1], ranges[col_box, 3]
    inside = flat > 0
    at = np.flatnonzero(inside[:-1] != inside[1:])
    col = np.searchsorted(col_start, at, side="right") - 1
    seg = at - col_start[col]
    within = seg < col_h[col] - 1  # not from a column's last row to the next column
    at, col, seg = at[within], col[within], seg[within]
    v0 = flat[at].astype(np.float64)
    v1 = flat[at + 1].astype(np.float64)
    s = r0[col_box[col]] + seg + v0 / (v0 - v1)  # sample position of the 0
    t = (s - pmap.by) / pmap.ay  # ... as a pixel row
    # rising: the first row past the 0 is in; falling: the first row at or past it is out
    row = np.where(v1 > 0, np.floor(t) + 1, np.ceil(t))
    row = np.clip(row, ya[col], yb[col]).astype(np.int64)
    top = np.flatnonzero(inside[col_start])
    bottom = np.flatnonzero(inside[col_start + col_h - 1])
    column = np.concatenate((top, col, bottom))
    rows = np.concatenate((ya[top], row, yb[bottom]))
    return column, x[column] * pmap.height + rows
