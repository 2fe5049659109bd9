"""The preprocessing spec for a model's input: :func:`preprocess_for` reads the input's
shape and dtype as the model reports them (dynamic dimensions, NHWC or NCHW) and applies
the run's overrides; :func:`raw_pixels_warning` says when images would reach a float input
unnormalised.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from batchinfer.data.input_spec import DEFAULT_MAX_PIXELS, LAYOUTS, Preprocess
from batchinfer.errors import UsageError
from batchinfer.messages import setting


def raw_pixels_warning(preprocess: Preprocess, kind: str, model: str) -> str | None:
    """The warning for images fed to a float input as raw 0..255 values, or None.

    A float input with no mean/std (given, or applied inside a .rknn by its .config.json,
    which makes its input uint8) gets the pixels unscaled; most float models were trained
    on 0..1 or standardised values, and then predict garbage without an error.
    """
    floating = np.dtype(preprocess.dtype).kind == "f"
    if kind != "images" or not floating or preprocess.mean is not None:
        return None
    if preprocess.std is not None:
        return None
    return (
        f"{model} takes {preprocess.dtype} input and no mean/std were given ("
        + setting("preprocess.mean")
        + "/"
        + setting("preprocess.std")
        + ", or mean_values/std_values in the .config.json beside a .rknn), so raw 0-255 "
        "pixel values are fed; give the normalisation the model was trained with, unless it "
        "expects 0-255."
    )


def preprocess_for(
    shape: Sequence[int | str | None],
    dtype: str | np.dtype,
    *,
    size: tuple[int, int] | None = None,
    color: str | None = None,
    layout: str | None = None,
    dtype_override: str | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    exif_orientation: bool = True,
    background: tuple[int, int, int] | str | None = (255, 255, 255),
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    jpeg_draft: bool = True,
    resize: str = "stretch",
    max_item_bytes: int | str | None = "auto",
    pad: tuple[int, int, int] = (114, 114, 114),
) -> Preprocess:
    """Return the Preprocess for a model input of ``shape``/``dtype``, with overrides.

    ``shape`` is the input shape as the model reports it; a dimension that is not a
    positive int (None, -1, a symbolic name) is dynamic: a dynamic batch becomes 1,
    a dynamic height/width needs ``size``. For 4-D shapes the channel axis is found from
    the shape: last if it is 1 or 3 (NHWC, the default and what RKNN reports), else axis
    1 if that is 1 or 3 (NCHW, as ONNX models usually are). ``layout`` picks the buffer
    layout (default: the model's); ``size`` = (height, width) overrides the model's;
    ``color`` defaults to gray for 1 channel, rgb for 3. ``mean``/``std`` are refused for
    a model whose own input is an integer type: it takes raw pixels and normalises inside.
    The decoding switches (and ``resize``/``pad``) are Preprocess's. Raises UsageError for
    combinations that cannot work.
    """
    if mean is not None or std is not None:
        _check_normalisation(dtype, dtype_override)
    dims: list[int | None] = [_static(d) for d in shape]
    if not dims:
        raise UsageError("The model input is a scalar; batchinfer feeds tensors of rank 1 or more.")
    if dims[0] is None:
        dims[0] = 1
    if layout is not None and layout not in LAYOUTS:
        raise UsageError(f"Unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}.")

    rank = len(dims)
    new_shape: tuple[int | None, ...]
    if rank == 4:
        model_layout = _channel_layout(dims, layout)
        if model_layout == "nhwc":
            n, h, w, c = dims
        else:
            n, c, h, w = dims
        h, w = _image_size(shape, h, w, size)
        if c is None:
            raise UsageError(f"The model input {tuple(shape)} has a dynamic channel count.")
        out_layout = layout or model_layout
        new_shape = (n, h, w, c) if out_layout == "nhwc" else (n, c, h, w)
        default_color = "gray" if c == 1 else "rgb"
    elif rank == 3:
        if layout == "nchw":
            raise UsageError(
                f"The model input {tuple(shape)} is a 3-D gray image with no channel axis; "
                + setting("preprocess.layout")
                + " applies to 4-D inputs only."
            )
        n, h, w = dims
        h, w = _image_size(shape, h, w, size)
        new_shape = (n, h, w)
        out_layout = "nhwc"
        default_color = "gray"
    else:
        if size is not None:
            raise UsageError(
                setting("preprocess.size") + " applies to image inputs, and the model input "
                f"{tuple(shape)} is not one; drop " + setting("preprocess.size") + "."
            )
        if any(d is None for d in dims):
            raise UsageError(f"The model input {tuple(shape)} has a dynamic dimension.")
        new_shape = tuple(dims)
        out_layout = "nhwc"
        default_color = "rgb"
    return Preprocess(
        shape=new_shape,  # type: ignore[arg-type]
        dtype=dtype_override or dtype,  # type: ignore[arg-type]
        layout=out_layout,  # type: ignore[arg-type]
        color=color or default_color,  # type: ignore[arg-type]
        mean=None if mean is None else tuple(mean),
        std=None if std is None else tuple(std),
        exif_orientation=exif_orientation,
        background=background,  # type: ignore[arg-type]  # parsed by Preprocess
        max_pixels=max_pixels,
        jpeg_draft=jpeg_draft,
        max_item_bytes=max_item_bytes,  # type: ignore[arg-type]  # checked by Preprocess
        resize=resize,  # type: ignore[arg-type]
        pad=pad,
    )


def _check_normalisation(model_dtype: object, dtype_override: str | None) -> None:
    """Refuse --mean/--std where they would normalise twice or be cut to integers."""
    try:
        model = np.dtype(model_dtype)  # type: ignore[call-overload]
        override = None if dtype_override is None else np.dtype(dtype_override)
    except TypeError:
        return  # an unknown dtype: Preprocess says so
    if model.kind in "iub":
        raise UsageError(
            f"The model's input is {model.name}, so it takes raw 0..255 pixels and does any "
            "normalisation inside its graph; drop "
            + setting("preprocess.mean")
            + "/"
            + setting("preprocess.std")
            + ", which would "
            "normalise twice."
        )
    if override is not None and override.kind in "iub":
        raise UsageError(
            setting("preprocess.mean")
            + "/"
            + setting("preprocess.std")
            + " give fractional values, which "
            + setting("preprocess.dtype")
            + f" {override.name} cannot hold; drop "
            + setting("preprocess.dtype")
            + " to "
            f"feed the model's {model.name} input."
        )


def _static(dim: int | str | None) -> int | None:
    if isinstance(dim, int | np.integer) and not isinstance(dim, bool) and dim > 0:
        return int(dim)
    return None


def _channel_layout(dims: list[int | None], wanted: str | None) -> str:
    last, second = dims[3] in (1, 3), dims[1] in (1, 3)
    if last and second and wanted:
        return wanted  # e.g. (1, 3, 8, 3): ambiguous, so believe the caller
    if last:
        return "nhwc"
    if second:
        return "nchw"
    raise UsageError(
        f"Cannot tell the channel axis of the input shape {tuple(dims)}: an image input has "
        "1 or 3 channels, last (NHWC) or second (NCHW); feed .npy tensors instead."
    )


def _image_size(
    shape: Sequence[object], h: int | None, w: int | None, size: tuple[int, int] | None
) -> tuple[int, int]:
    if size is not None:
        if len(size) != 2 or not all(isinstance(v, int) and v > 0 for v in size):
            raise UsageError(
                setting("preprocess.size") + f" {size} is not (height, width) in positive pixels."
            )
        return size[0], size[1]
    if h is None or w is None:
        raise UsageError(
            f"The model input {tuple(shape)} has a dynamic height or width; pass "
            + setting("preprocess.size")
            + " H,W."
        )
    return h, w
