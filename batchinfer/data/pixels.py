"""Decoded pixels into a model input buffer: one copy in the spec's layout, colour order
and dtype, or ``(x - mean) / std`` computed straight into it for float inputs.
"""

from __future__ import annotations

import numpy as np

from batchinfer.data.input_spec import Preprocess


def write_pixels(pixels: np.ndarray, spec: Preprocess, out: np.ndarray) -> None:
    """Write pixels (H, W[, 3]) into out[0] in spec's layout, colour and dtype.

    ``pixels`` are uint8, or float32 0..255 (high bit depth, float inputs only); a gray
    (H, W) image for an rgb/bgr spec is broadcast to three channels without a copy.
    """
    src = pixels
    if src.ndim == 2 and spec.color != "gray":
        src = np.broadcast_to(src[..., None], (*src.shape, 3))
    if spec.color == "bgr":
        src = src[..., ::-1]
    if len(spec.shape) == 4:
        if spec.color == "gray":
            src = src[..., None] if spec.layout == "nhwc" else src[None]
        elif spec.layout == "nchw":
            src = src.transpose(2, 0, 1)
    dst = out[0]
    if spec.mean is None and spec.std is None:
        # uint8 into any accepted dtype is exact (validate_for refused int8 and bool);
        # float32 pixels only come for float inputs (float16 rounds, as it must).
        np.copyto(dst, src, casting="safe" if src.dtype == np.uint8 else "same_kind")
        return
    channel_axis = (-1 if spec.layout == "nhwc" else -3) if len(spec.shape) == 4 else None
    mean = _per_channel(spec.mean, channel_axis)
    std = _per_channel(spec.std, channel_axis)
    if dst.dtype == np.float16:
        # (x - mean) in float16 would lose up to 0.25 before the division: use float32.
        tmp = src.astype(np.float32)
        if mean is not None:
            np.subtract(tmp, mean, out=tmp)
        if std is not None:
            np.divide(tmp, std, out=tmp)
        np.copyto(dst, tmp, casting="same_kind")
        return
    if mean is not None:
        np.subtract(src, mean, out=dst, dtype=dst.dtype)
        if std is not None:
            np.divide(dst, std, out=dst)
    elif std is not None:  # (one of the two is set: both None returned above)
        np.divide(src, std, out=dst, dtype=dst.dtype)


def _per_channel(values: tuple[float, ...] | None, axis: int | None) -> np.ndarray | None:
    if values is None:
        return None
    array = np.asarray(values, dtype=np.float32)
    if axis is None:
        return array.reshape(())  # 3-D gray input: a single channel
    return array.reshape((-1, 1, 1)) if axis == -3 else array
