"""COCO compressed RLE (the ``counts`` string pycocotools reads), in numpy.

A mask's RLE is the image flattened column-major (x outer, y inner: Fortran order), then
the lengths of its runs, alternately of 0s and 1s, starting with 0s (a first run of
length 0 when the first pixel is 1); there is no empty run at the end. pycocotools'
string form (``rleToString`` in its maskApi.c): from the fourth count on, the count minus
the count two before it; each value then written 5 bits at a time, low bits first, as the
character 48 + chunk, with bit 0x20 set while more chunks follow (the last chunk's bit
0x10 carries the sign).

Masks here are made from boxes, and most of an image is 0: the encoders take the
positions where the value flips, in the column-major order (*toggles*), and never make
the dense image. :func:`encode` (a dense mask) serves tests and drawings.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def strings_from_counts(counts: Sequence[np.ndarray]) -> list[str]:
    """The pycocotools ``counts`` string of each run-length array, all encoded at once."""
    if not counts:
        return []
    lengths = np.fromiter((len(c) for c in counts), np.int64, len(counts))
    return _strings(np.concatenate([np.asarray(c, np.int64) for c in counts]), lengths)


def strings_of_toggles(toggles: np.ndarray, per_mask: np.ndarray, size: int) -> list[str]:
    """The ``counts`` strings of several masks of ``size`` pixels from their flip positions:
    ``toggles`` holds each mask's (sorted, distinct) in turn, ``per_mask`` how many each."""
    n = len(per_mask)
    if not n:
        return []
    # each mask's bounds are 0, its toggles, size; its counts their differences, but for an
    # empty last run (a flip at size)
    per_mask = np.asarray(per_mask, np.int64)
    ends = np.cumsum(per_mask + 2) - 1  # where each mask's `size` goes
    bounds = np.empty(int(ends[-1]) + 1, np.int64)
    bounds[ends - per_mask - 1] = 0
    bounds[ends] = size
    inner = np.ones(bounds.size, bool)
    inner[ends] = inner[ends - per_mask - 1] = False
    bounds[inner] = toggles
    diffs = np.diff(bounds)
    keep = np.ones(diffs.size, bool)
    keep[ends[:-1]] = False  # from one mask's size to the next mask's 0
    keep[ends - 1] &= diffs[ends - 1] > 0  # an empty last run
    keep[ends - per_mask - 1] = True  # but a first run of 0s is always written
    lengths = per_mask + 1 - (diffs[ends - 1] == 0) * (per_mask > 0)
    return _strings(diffs[keep], lengths)


def _strings(values: np.ndarray, lengths: np.ndarray) -> list[str]:
    """Encode the run lengths ``values``, ``lengths[i]`` of them for mask i (each >= 1),
    in turn."""
    values = np.asarray(values, np.int64)
    if not values.size:
        return [""] * len(lengths)
    starts = np.cumsum(lengths) - lengths
    # from the fourth count of each mask on: minus the count two before
    early = np.zeros(values.size, bool)  # a mask's first three counts
    for k in range(3):
        early[starts + np.minimum(k, lengths - 1)] = True
    delta = values.copy()
    delta[2:] -= np.where(early[2:], 0, values[:-2])
    # chunks per value: the fewest n with -2^(5n-1) <= delta < 2^(5n-1) (two's complement),
    # from the bit length of delta (or of ~delta when negative); exact in float64 below 2^53
    magnitude = delta ^ (delta >> 63)
    used = np.frexp(magnitude.astype(np.float64))[1] // 5 + 1
    # characters: a value's chunks in turn, low bits first (an arithmetic shift, as in C),
    # 0x20 on all but its last. Most values take one chunk: each further chunk is made
    # only for the values that have it.
    at = np.cumsum(used) - used
    chars = np.empty(int(at[-1] + used[-1]), np.uint8)
    which = np.arange(delta.size)
    for k in range(int(used.max())):
        if k:
            which = which[used.take(which) > k]
        chunk = ((delta.take(which) >> (5 * k)) & 0x1F).astype(np.uint8)
        chunk |= (used.take(which) > k + 1).view(np.uint8) << 5
        chunk += 48
        chars[at.take(which) + k] = chunk
    text = chars.tobytes().decode("ascii")
    per_mask = np.add.reduceat(used, starts)
    ends = np.cumsum(per_mask)
    bounds = zip((ends - per_mask).tolist(), ends.tolist(), strict=True)
    return [text[a:b] for a, b in bounds]


def string_from_counts(counts: np.ndarray) -> str:
    """The pycocotools ``counts`` string of one run-length array."""
    return strings_from_counts([counts])[0]


def counts_from_toggles(toggles: np.ndarray, size: int) -> np.ndarray:
    """Run lengths from the sorted, distinct positions where the value flips (0 first).

    ``size`` is the image's pixel count; a flip at ``size`` (the mask ends with 1s) ends
    the last run.
    """
    toggles = np.asarray(toggles, np.int64)
    if toggles.size and toggles[-1] == size:
        bounds = np.concatenate(([0], toggles))
    else:
        bounds = np.concatenate(([0], toggles, [size]))
    return np.diff(bounds)


def cancel_pairs(positions: np.ndarray) -> np.ndarray:
    """Sorted positions where the value flips an odd number of times (two flips at one
    place, such as a column's end and the next column's start, are no flip)."""
    p = np.sort(np.asarray(positions, np.int64))
    if p.size < 2:
        return p
    starts = np.flatnonzero(np.concatenate(([True], p[1:] != p[:-1])))
    runs = np.diff(np.concatenate((starts, [p.size])))
    return p[starts[runs % 2 == 1]]


def encode(mask: np.ndarray) -> str:
    """The ``counts`` string of a dense (height, width) mask (nonzero = in the mask)."""
    flat = np.asarray(mask).astype(bool).ravel(order="F")
    toggles = np.flatnonzero(np.diff(flat.astype(np.int8), prepend=0, append=0))
    return string_from_counts(counts_from_toggles(toggles, flat.size))


def encode_region(region: np.ndarray, x0: int, y0: int, height: int, width: int) -> str:
    """The ``counts`` string of a (height, width) image that is 0 except ``region`` (a
    (h, w) mask) at column ``x0``, row ``y0``: the zeros around it are counted, not made."""
    region = np.asarray(region).astype(np.int8)
    h, w = region.shape
    if x0 < 0 or y0 < 0 or x0 + w > width or y0 + h > height:
        raise ValueError(f"A {w}x{h} region at ({x0}, {y0}) does not fit {width}x{height}.")
    padded = np.zeros((w, h + 2), np.int8)
    padded[:, 1:-1] = region.T
    col, row = np.nonzero(np.diff(padded, axis=1))  # column-major order
    toggles = cancel_pairs((x0 + col) * height + y0 + row)
    return string_from_counts(counts_from_toggles(toggles, height * width))


def counts_from_string(counts: str) -> np.ndarray:
    """The run lengths of a ``counts`` string (pycocotools' ``rleFrString``)."""
    out: list[int] = []
    x = k = 0
    for ch in counts.encode("ascii"):
        c = ch - 48
        x |= (c & 0x1F) << (5 * k)
        k += 1
        if c & 0x20:
            continue
        if c & 0x10:
            x |= -1 << (5 * k)
        if len(out) > 2:
            x += out[-2]
        out.append(x)
        x = k = 0
    return np.asarray(out, np.int64)


def decode(counts: str, height: int, width: int) -> np.ndarray:
    """The dense (height, width) bool mask of a ``counts`` string."""
    runs = counts_from_string(counts)
    if int(runs.sum()) != height * width:
        raise ValueError(f"The runs cover {int(runs.sum())} pixels, not {height}x{width}.")
    values = np.arange(len(runs)) % 2 == 1
    return np.repeat(values, runs).reshape(width, height).T


def area(counts: str) -> int:
    """How many pixels a ``counts`` string has in its mask."""
    return int(counts_from_string(counts)[1::2].sum())
