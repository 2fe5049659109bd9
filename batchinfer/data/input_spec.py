"""The preprocessing spec: how a dataset item becomes one model input tensor.

:class:`Preprocess` is the whole description (shape, dtype, layout, colour, normalisation
and the image-decoding switches), validated on construction; readers receive it and
:func:`batchinfer.data.preprocess.load_into` follows it. :func:`parse_background` reads
the colours of CLI flags and job files. Deriving a spec from a model's input is
:mod:`batchinfer.data.model_input`'s work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from PIL import ImageColor

from batchinfer.errors import UsageError
from batchinfer.messages import setting
from batchinfer.runtime.constants import SUPPORTED_DTYPES

#: Default ``Preprocess.max_pixels``: Pillow's own decompression-bomb threshold
#: (``PIL.Image.MAX_IMAGE_PIXELS``, about 9,459 × 9,459), written out so that a program
#: changing Pillow's global does not change batchinfer's results or run fingerprint.
DEFAULT_MAX_PIXELS = 89_478_485
#: ``Preprocess.max_item_bytes`` "auto": bytes one item may hold per pixel of
#: ``max_pixels`` (what an uncompressed RGB image of that many pixels takes), rounded up to
#: a whole MiB and at least :data:`MIN_ITEM_BYTES`: 256 MiB at the default pixel limit.
ITEM_BYTES_PER_PIXEL = 3
#: The least "auto" allows, whatever ``max_pixels`` is: metadata (EXIF, ICC profiles,
#: thumbnails) does not shrink with the pixel limit.
MIN_ITEM_BYTES = 16 * 2**20

Layout = Literal["nhwc", "nchw"]
Color = Literal["rgb", "bgr", "gray"]

LAYOUTS = ("nhwc", "nchw")
COLORS = ("rgb", "bgr", "gray")
#: stretch: to the model's size, aspect ignored (classifiers); letterbox: aspect kept, the
#: rest padded with ``pad`` (detectors: batchinfer.detect.letterbox_geometry places it).
RESIZE_MODES = ("stretch", "letterbox")

# Images are 0..255: these dtypes cannot hold them (int8) or make no sense (bool).
_NOT_FOR_IMAGES = ("int8", "bool")


@dataclass(frozen=True)
class Preprocess:
    """How a dataset item becomes one model input tensor of ``shape`` and ``dtype``.

    ``shape`` is the buffer's full shape, batch axis included, in ``layout`` for 4-D
    inputs: (1, H, W, C) for nhwc, (1, C, H, W) for nchw; 3-D inputs are (1, H, W) gray.
    ``mean`` and ``std`` are per channel, in pixel units (0..255) like RKNN's
    mean_values/std_values, and apply only to float dtypes. Other shapes only take
    ``.npy`` tensors. Validated on construction (UsageError).

    How images are decoded (see :mod:`batchinfer.data.images`):

    - ``exif_orientation``: apply the EXIF Orientation tag as image viewers do.
    - ``background``: (r, g, b) that transparent images are composited over (default
      white, as browsers and viewers show them); None drops alpha like Pillow's
      ``convert("RGB")`` (what torchvision's default loader does). A string such as
      "white", "#808080" or "0,0,0" is parsed by :func:`parse_background`.
    - ``max_pixels``: images with more pixels (width × height, from the header) are error
      rows; None for no limit. Default: Pillow's decompression-bomb threshold.
    - ``max_item_bytes``: items larger than this (an image file by its size on disk, a tar
      member by the size its header declares) are error rows, and none of their bytes
      is read; None for no limit; "auto" (the default): :func:`item_bytes_for`
      ``max_pixels`` (256 MiB at its default; no limit when pixels are not limited).
    - ``jpeg_draft``: decode large JPEGs at 1/2, 1/4 or 1/8 scale when the model input
      is that much smaller (faster, far less memory; off reproduces a full decode).
    - ``resize``: "stretch" to the input's size, or "letterbox": aspect kept, centred, the
      rest filled with ``pad`` (r, g, b), as detectors are fed; :func:`load_into` then
      returns where the image went (:class:`batchinfer.detect.Letterbox`).
    """

    shape: tuple[int, ...]
    dtype: str
    layout: Layout = "nhwc"
    color: Color = "rgb"
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    resize: Literal["stretch", "letterbox"] = "stretch"
    pad: tuple[int, int, int] = (114, 114, 114)
    exif_orientation: bool = True
    background: tuple[int, int, int] | None = (255, 255, 255)
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    jpeg_draft: bool = True
    max_item_bytes: int | Literal["auto"] | None = "auto"

    def __post_init__(self) -> None:
        shape = tuple(self.shape)
        if not shape or not all(isinstance(d, int | np.integer) and d > 0 for d in shape):
            raise UsageError(
                f"The input shape {shape} has a dimension that is not a positive integer; "
                "give every dimension a size (e.g. "
                + setting("preprocess.size")
                + " for height and width)."
            )
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))
        if self.layout not in LAYOUTS:
            raise UsageError(f"Unknown layout {self.layout!r}; use one of {', '.join(LAYOUTS)}.")
        if self.color not in COLORS:
            raise UsageError(f"Unknown color {self.color!r}; use one of {', '.join(COLORS)}.")
        if self.resize not in RESIZE_MODES:
            raise UsageError(
                f"Unknown resize mode {self.resize!r}; use one of {', '.join(RESIZE_MODES)}."
            )
        object.__setattr__(self, "background", _background(self.background))
        pad = _background(self.pad)
        if pad is None:
            raise UsageError(setting("detect.pad_colour") + " must be a colour, not none.")
        object.__setattr__(self, "pad", pad)
        if self.max_pixels is not None:
            if isinstance(self.max_pixels, bool) or not isinstance(
                self.max_pixels, int | np.integer
            ):
                raise UsageError(
                    setting("preprocess.max_pixels")
                    + f" {self.max_pixels!r} is not a whole number."
                )
            if self.max_pixels < 1:
                raise UsageError(
                    setting("preprocess.max_pixels")
                    + f" must be at least 1, not {self.max_pixels}."
                )
            object.__setattr__(self, "max_pixels", int(self.max_pixels))
        self._check_item_bytes()
        if self.is_image:
            self._check_image_spec()
        elif self.mean is not None or self.std is not None:
            raise UsageError(
                f"mean/std apply to image inputs, and the input shape {self.shape} is not "
                "one; drop "
                + setting("preprocess.mean")
                + "/"
                + setting("preprocess.std")
                + " and feed .npy tensors."
            )

    def _check_item_bytes(self) -> None:
        limit = self.max_item_bytes
        if limit == "auto":
            object.__setattr__(self, "max_item_bytes", item_bytes_for(self.max_pixels))
            return
        if limit is None:
            return
        if isinstance(limit, bool) or not isinstance(limit, int | np.integer):
            raise UsageError(
                setting("preprocess.max_item_bytes") + f" {limit!r} is not a whole number."
            )
        if limit < 1:
            raise UsageError(
                setting("preprocess.max_item_bytes") + f" must be at least 1, not {limit}."
            )
        object.__setattr__(self, "max_item_bytes", int(limit))

    @property
    def item_limit(self) -> int | None:
        """``max_item_bytes`` as a number of bytes, None for no limit ("auto" is resolved
        on construction)."""
        limit = self.max_item_bytes
        return limit if isinstance(limit, int) else None

    @property
    def item_bytes_derived(self) -> bool:
        """True when ``max_item_bytes`` is the one "auto" gives for ``max_pixels``."""
        return self.max_item_bytes == item_bytes_for(self.max_pixels)

    def _check_image_spec(self) -> None:
        channels = self.channels
        if channels not in (1, 3):
            raise UsageError(
                f"The input shape {self.shape} ({self.layout}) has {channels} channels; an "
                "image input takes 1 (gray) or 3 (rgb/bgr), so check "
                + setting("preprocess.layout")
                + " or "
                "feed .npy."
            )
        if (self.color == "gray") != (channels == 1):
            want = "gray" if channels == 1 else "rgb or bgr"
            raise UsageError(
                f"Color {self.color} does not fit an input with {channels} channel(s); "
                "use " + setting("preprocess.color") + f" {want}."
            )
        for name in ("mean", "std"):
            value = getattr(self, name)
            if value is None:
                continue
            value = tuple(float(v) for v in value)
            if len(value) == 1:
                value *= channels
            if len(value) != channels:
                raise UsageError(
                    setting(f"preprocess.{name}")
                    + f" has {len(value)} values but the input has {channels} "
                    f"channel(s); give 1 or {channels} values."
                )
            if name == "std" and not all(v != 0 and math.isfinite(v) for v in value):
                raise UsageError(
                    setting("preprocess.std") + f" {value} has a zero or non-finite value; fix it."
                )
            object.__setattr__(self, name, value)
        if (self.mean is not None or self.std is not None) and not self.is_float:
            raise UsageError(
                setting("preprocess.mean")
                + "/"
                + setting("preprocess.std")
                + " give fractional values, which a "
                f"{self.dtype} input cannot hold; drop them (an integer input takes raw 0..255 "
                "pixels and the model normalises inside its graph)."
            )

    @property
    def is_image(self) -> bool:
        """True when images can be decoded into this shape (3-D or 4-D)."""
        return len(self.shape) in (3, 4)

    @property
    def is_float(self) -> bool:
        """True for float16/float32 inputs."""
        return np.dtype(self.dtype).kind == "f"

    @property
    def size(self) -> tuple[int, int]:
        """Return (height, width) of the image the input takes."""
        self._require_image()
        if len(self.shape) == 3 or self.layout == "nhwc":
            return self.shape[1], self.shape[2]
        return self.shape[2], self.shape[3]

    @property
    def channels(self) -> int:
        """Return the input's channel count (1 for a 3-D gray input)."""
        self._require_image()
        if len(self.shape) == 3:
            return 1
        return self.shape[3] if self.layout == "nhwc" else self.shape[1]

    @property
    def nbytes(self) -> int:
        """Return the size in bytes of one input tensor (one slot)."""
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    def validate_for(self, kind: str) -> None:
        """Raise UsageError if a dataset of ``kind`` ('images' or 'npy') cannot use this spec.

        ``npz`` items feed each model input an array (batchinfer.data.feeds), which is
        checked against the input when it is read: nothing to say here.
        """
        if kind == "npz":
            return
        if kind == "npy":
            if self.mean is not None or self.std is not None:
                raise UsageError(
                    ".npy tensors are fed as they are, so mean/std do not apply; drop "
                    + setting("preprocess.mean")
                    + "/"
                    + setting("preprocess.std")
                    + " or store the tensors already normalised."
                )
            return
        if kind != "images":
            raise ValueError(f"unknown dataset kind {kind!r}")
        self._require_image()
        if self.shape[0] != 1:
            raise UsageError(
                f"The input shape {self.shape} takes a batch of {self.shape[0]}, but each "
                "image is one item; use a batch-1 model or feed .npy tensors."
            )
        if self.dtype in _NOT_FOR_IMAGES:
            raise UsageError(
                f"Images are 0..255 pixels and cannot be fed as {self.dtype}; pass "
                + setting("preprocess.dtype")
                + " uint8 or float32."
            )

    def _require_image(self) -> None:
        if not self.is_image:
            raise UsageError(
                f"The input shape {self.shape} is not an image shape (N,H,W,C), (N,C,H,W) "
                "or (N,H,W); feed .npy tensors of that shape instead."
            )


def item_bytes_for(max_pixels: int | None) -> int | None:
    """The most bytes one item may hold when ``max_item_bytes`` is "auto": 3 per pixel of
    ``max_pixels`` rounded up to a whole MiB, at least 16 MiB (256 MiB at the default
    pixel limit); None (no limit) when ``max_pixels`` is None."""
    if max_pixels is None:
        return None
    mib = 2**20
    return max(MIN_ITEM_BYTES, -(-ITEM_BYTES_PER_PIXEL * max_pixels // mib) * mib)


def parse_background(text: str) -> tuple[int, int, int] | None:
    """Parse a background colour: "none", a colour name ("white"), "#rrggbb" or "r,g,b".

    For CLI flags and job files; UsageError if it is none of those.
    """
    value = text.strip().lower()
    if value == "none":
        return None
    try:
        if value.count(",") == 2:
            return _background(tuple(int(part) for part in value.split(",")))
        return ImageColor.getrgb(value)[:3]
    except ValueError as exc:
        raise UsageError(
            setting("preprocess.background") + f" {text!r} is not a colour; {_BACKGROUND_FORMS}."
        ) from exc


_BACKGROUND_FORMS = "use none, a name (white, black), #rrggbb or r,g,b with values 0..255"


def _background(value: object) -> tuple[int, int, int] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return parse_background(value)
    if (
        isinstance(value, Sequence)
        and len(value) == 3
        and all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in value)
        and all(0 <= v <= 255 for v in value)
    ):
        return (int(value[0]), int(value[1]), int(value[2]))
    raise UsageError(
        setting("preprocess.background") + f" {value!r} is not a colour; {_BACKGROUND_FORMS}."
    )


def _dtype_name(dtype: object) -> str:
    try:
        name = np.dtype(dtype).name  # type: ignore[call-overload]
    except TypeError as exc:
        raise UsageError(
            f"Unknown dtype {dtype!r}; use one of {', '.join(SUPPORTED_DTYPES)}."
        ) from exc
    if name not in SUPPORTED_DTYPES:
        raise UsageError(
            f"dtype {name} is not one RKNNLite takes; use one of {', '.join(SUPPORTED_DTYPES)}."
        )
    return name
