"""Preprocessing: decode one dataset item straight into a model input buffer.

Readers call :func:`load_into` with an ndarray view over a shared-memory slot; the
tensor is written there, with as few full-size copies as the format allows:

- images are decoded by :func:`batchinfer.data.images.decode_image` (pixel limit, EXIF
  orientation, reduced-size JPEG decoding, transparency, 16-bit scaling, resize);
- uint8 NHWC rgb/gray images: Pillow's pixels are copied once into the slot;
- other layouts, colours and integer dtypes: the same single copy, through a strided view;
- float dtypes with mean/std: ``(x - mean) / std`` computed into the slot
  (float16 goes through one float32 temporary to keep its precision);
- ``.npy`` tensors: the header is parsed and the data read with ``readinto`` into the
  slot's memory, with no temporary array (Fortran-ordered files need one).

Every problem with an item raises :class:`~batchinfer.errors.InputError` naming the file;
the engine turns it into an error row. A spec that cannot work at all raises UsageError
before any item is read.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Literal

import numpy as np
from PIL import ImageColor

from batchinfer.data.images import DEFAULT_MAX_PIXELS, decode_image
from batchinfer.data.shards import Member, ShardFiles, member_label
from batchinfer.errors import InputError, UsageError
from batchinfer.runtime.constants import SUPPORTED_DTYPES

if TYPE_CHECKING:
    from batchinfer.detect import Letterbox

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

    def __post_init__(self) -> None:
        shape = tuple(self.shape)
        if not shape or not all(isinstance(d, int | np.integer) and d > 0 for d in shape):
            raise UsageError(
                f"The input shape {shape} has a dimension that is not a positive integer; "
                "give every dimension a size (e.g. {preprocess.size} for height and width)."
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
            raise UsageError("{detect.pad_colour} must be a colour, not none.")
        object.__setattr__(self, "pad", pad)
        if self.max_pixels is not None:
            if isinstance(self.max_pixels, bool) or not isinstance(
                self.max_pixels, int | np.integer
            ):
                raise UsageError(
                    f"{{preprocess.max_pixels}} {self.max_pixels!r} is not a whole number."
                )
            if self.max_pixels < 1:
                raise UsageError(
                    f"{{preprocess.max_pixels}} must be at least 1, not {self.max_pixels}."
                )
            object.__setattr__(self, "max_pixels", int(self.max_pixels))
        if self.is_image:
            self._check_image_spec()
        elif self.mean is not None or self.std is not None:
            raise UsageError(
                f"mean/std apply to image inputs, and the input shape {self.shape} is not "
                "one; drop {preprocess.mean}/{preprocess.std} and feed .npy tensors."
            )

    def _check_image_spec(self) -> None:
        channels = self.channels
        if channels not in (1, 3):
            raise UsageError(
                f"The input shape {self.shape} ({self.layout}) has {channels} channels; an "
                "image input takes 1 (gray) or 3 (rgb/bgr), so check {preprocess.layout} or "
                "feed .npy."
            )
        if (self.color == "gray") != (channels == 1):
            want = "gray" if channels == 1 else "rgb or bgr"
            raise UsageError(
                f"Color {self.color} does not fit an input with {channels} channel(s); "
                f"use {{preprocess.color}} {want}."
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
                    f"--{name} has {len(value)} values but the input has {channels} "
                    f"channel(s); give 1 or {channels} values."
                )
            if name == "std" and not all(v != 0 and math.isfinite(v) for v in value):
                raise UsageError(
                    f"{{preprocess.std}} {value} has a zero or non-finite value; fix it."
                )
            object.__setattr__(self, name, value)
        if (self.mean is not None or self.std is not None) and not self.is_float:
            raise UsageError(
                "{preprocess.mean}/{preprocess.std} give fractional values, which a "
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
                    "{preprocess.mean}/{preprocess.std} or store the tensors already normalised."
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
                "{preprocess.dtype} uint8 or float32."
            )

    def _require_image(self) -> None:
        if not self.is_image:
            raise UsageError(
                f"The input shape {self.shape} is not an image shape (N,H,W,C), (N,C,H,W) "
                "or (N,H,W); feed .npy tensors of that shape instead."
            )


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
        f"{model} takes {preprocess.dtype} input and no mean/std were given (--mean/--std, "
        "mean/std in an eval job's preprocess settings, or mean_values/std_values in the "
        ".config.json beside a .rknn), so raw 0-255 pixel values are fed; give the "
        "normalisation the model was trained with, unless it expects 0-255."
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
                "{preprocess.layout} applies to 4-D inputs only."
            )
        n, h, w = dims
        h, w = _image_size(shape, h, w, size)
        new_shape = (n, h, w)
        out_layout = "nhwc"
        default_color = "gray"
    else:
        if size is not None:
            raise UsageError(
                "{preprocess.size} applies to image inputs, and the model input "
                f"{tuple(shape)} is not one; drop {{preprocess.size}}."
            )
        if any(d is None for d in dims):
            raise UsageError(f"The model input {tuple(shape)} has a dynamic dimension.")
        new_shape = tuple(dims)  # type: ignore[assignment]
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
            "normalisation inside its graph; drop {preprocess.mean}/{preprocess.std}, which would "
            "normalise twice."
        )
    if override is not None and override.kind in "iub":
        raise UsageError(
            "{preprocess.mean}/{preprocess.std} give fractional values, which "
            f"{{preprocess.dtype}} {override.name} cannot hold; drop {{preprocess.dtype}} to "
            f"feed the model's {model.name} input."
        )


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
        return ImageColor.getrgb(value)[:3]  # type: ignore[return-value]
    except ValueError as exc:
        raise UsageError(
            f"{{preprocess.background}} {text!r} is not a colour; {_BACKGROUND_FORMS}."
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
    raise UsageError(f"{{preprocess.background}} {value!r} is not a colour; {_BACKGROUND_FORMS}.")


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
                f"{{preprocess.size}} {size} is not (height, width) in positive pixels."
            )
        return size[0], size[1]
    if h is None or w is None:
        raise UsageError(
            f"The model input {tuple(shape)} has a dynamic height or width; pass "
            "{preprocess.size} H,W."
        )
    return h, w


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


# --------------------------------------------------------------------------- loading


#: How :attr:`~batchinfer.data.dataset.Item.path` starts for a list's row that cannot name
#: a file (a malformed CSV line, a JSON line without a path): NUL, which no file path can
#: hold, then the row's error. Readers make it that item's error row, wherever they run.
BAD_ROW = "\0"


def load_into(
    path: str,
    spec: Preprocess,
    out: np.ndarray,
    kind: str,
    *,
    name: str | None = None,
    member: Member | None = None,
    shards: ShardFiles | None = None,
) -> Letterbox | None:
    """Decode the item at ``path`` and write its input tensor into ``out``.

    ``out`` must have ``spec.shape`` and ``spec.dtype`` and be C-contiguous (a view over a
    shared-memory slot); ``kind`` is the dataset's ('images' or 'npy'). ``name`` is how
    messages call the file (the item's id; default ``path``). ``member``: the item is that
    member of the tar shard at ``path``, read from ``shards`` (the reader's open shards;
    without it the shard is opened for this item alone). Returns where a letterboxed
    image went on the input (``spec.resize == "letterbox"``), else None. Raises
    InputError for anything wrong with the file.
    """
    if out.shape != spec.shape or out.dtype != np.dtype(spec.dtype) or not out.flags.c_contiguous:
        raise ValueError(
            f"out is {out.shape} {out.dtype} (contiguous={out.flags.c_contiguous}), "
            f"expected C-contiguous {spec.shape} {spec.dtype}"
        )
    if path.startswith(BAD_ROW):  # a list's row that names no file: its error, as it was
        raise InputError(path[len(BAD_ROW) :])
    spec.validate_for(kind)
    if member is not None:
        return _load_member(path, member, spec, out, kind, name, shards)
    label = name or path
    if kind == "images":
        with _open(path, label) as f:
            pixels, placed = decode_image(f, spec, label)
        _write_pixels(pixels, spec, out)
        return placed
    if kind == "npy":
        _read_npy(path, spec, out, label)
        return None
    raise ValueError(f"unknown dataset kind {kind!r}")


def _load_member(
    path: str,
    member: Member,
    spec: Preprocess,
    out: np.ndarray,
    kind: str,
    name: str | None,
    shards: ShardFiles | None,
) -> Letterbox | None:
    """load_into for a member of a tar shard: its bytes in one read, decoded from memory."""
    label = member_label(path, member, name)
    files = shards if shards is not None else ShardFiles(keep=1)
    try:
        data = files.read(path, member, label)
    finally:
        if shards is None:
            files.close()
    if kind == "images":
        pixels, placed = decode_image(io.BytesIO(data), spec, label)
        _write_pixels(pixels, spec, out)
        return placed
    if kind == "npy":
        _fill_npy(None, data, spec, out, label)
        return None
    raise ValueError(f"unknown dataset kind {kind!r}")


def _open(path: str, label: str) -> BinaryIO:
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the caller's with-block
    except OSError as exc:
        raise InputError(f"Cannot read {label}: {exc.strerror or exc}.") from exc
    if os.fstat(f.fileno()).st_size == 0:
        f.close()
        raise InputError(f"Cannot read {label}: the file is empty.")
    return f


def _write_pixels(pixels: np.ndarray, spec: Preprocess, out: np.ndarray) -> None:
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
    else:
        np.divide(src, std, out=dst, dtype=dst.dtype)


def _per_channel(values: tuple[float, ...] | None, axis: int | None) -> np.ndarray | None:
    if values is None:
        return None
    array = np.asarray(values, dtype=np.float32)
    if axis is None:
        return array.reshape(())  # 3-D gray input: a single channel
    return array.reshape((-1, 1, 1)) if axis == -3 else array


# Parsed .npy headers by their bytes: a dataset's tensors usually share one header, and
# numpy parses it with ast.literal_eval, which cost more than reading the data itself.
_NPY_HEADERS: dict[bytes, tuple[tuple[int, ...], bool, np.dtype]] = {}
_NPY_HEADERS_KEPT = 64
# The first read of a .npy takes this much: its header (numpy pads it to a multiple of 64
# bytes, 128 for ordinary arrays) and the first data bytes, in one system call.
_NPY_FIRST_READ = 4096


def _npy_header(
    fd: int | None, head: bytes, label: str
) -> tuple[tuple[int, ...], bool, np.dtype, bytes]:
    """(shape, fortran_order, dtype, data bytes read so far) of the .npy file open at ``fd``,
    whose first bytes ``head`` are; ``fd`` is left where ``head`` ends."""
    if len(head) < 10 or head[:6] != b"\x93NUMPY":
        raise InputError(f"Cannot read {label}: it is not a .npy file.")
    version = (head[6], head[7])
    if version == (1, 0):
        size_bytes, at = head[8:10], 10
    elif version == (2, 0):
        size_bytes, at = head[8:12], 12
    else:
        raise InputError(
            f"Cannot read {label}: .npy format version {version[0]}.{version[1]} is "
            "not supported; save it with numpy.save of a plain numeric array."
        )
    end = at + int.from_bytes(size_bytes, "little")
    while len(head) < end:  # a header longer than the first read
        more = _read_fd(fd, end - len(head), label)
        if not more:
            raise InputError(f"Cannot read {label}: its .npy header is truncated.")
        head += more
    header = head[at:end]
    key = head[6:8] + header
    parsed = _NPY_HEADERS.get(key)
    if parsed is None:
        fmt = np.lib.format
        reader = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        try:
            shape, fortran_order, dtype = reader(io.BytesIO(size_bytes + header))
        except (ValueError, SyntaxError, KeyError, TypeError) as exc:
            raise InputError(f"Cannot read {label}: its .npy header is damaged ({exc}).") from exc
        parsed = (tuple(shape), bool(fortran_order), dtype)
        if len(_NPY_HEADERS) < _NPY_HEADERS_KEPT:
            _NPY_HEADERS[key] = parsed
    return (*parsed, head[end:])


def read_npy(path: str, spec: Any, out: np.ndarray, name: str) -> None:
    """Read the ``.npy`` at ``path`` into ``out``, checked against ``spec``'s ``shape`` and
    ``dtype`` (a Preprocess, or any object with those); InputError naming ``name``."""
    _read_npy(path, spec, out, name)


def _read_npy(path: str, spec: Any, out: np.ndarray, label: str) -> None:
    # os-level reads, not a file object: a tensor file is one open, one read of its header
    # and first bytes, one read of the rest into the slot, one close. A buffered file object
    # added an fstat, an isatty ioctl, a seek and a read: 27-28 against 22.5-23 µs a 150 kB
    # tensor (`python tools/bench_npy_read.py`, both versions in one sitting).
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"Cannot read {label}: {exc.strerror or exc}.") from exc
    try:
        head = _read_fd(fd, _NPY_FIRST_READ, label)
        if not head:
            raise InputError(f"Cannot read {label}: the file is empty.")
        _fill_npy(fd, head, spec, out, label)
    finally:
        os.close(fd)


def _fill_npy(fd: int | None, head: bytes, spec: Preprocess, out: np.ndarray, label: str) -> None:
    """Write the .npy whose first bytes are ``head`` into ``out``, reading the rest from
    ``fd``; ``fd`` None: ``head`` is all of it (a member of a tar shard)."""
    shape, fortran_order, dtype, first = _npy_header(fd, head, label)
    if dtype.hasobject:
        raise InputError(
            f"Cannot read {label}: it holds Python objects, which batchinfer never "
            "unpickles; save a numeric array instead."
        )
    target = np.dtype(spec.dtype)
    swap = False
    if dtype != target:
        if dtype.byteorder not in "=|" and dtype.newbyteorder("=") == target:
            swap = True  # same type in the other byte order: fix after reading
        else:
            raise InputError(_dtype_mismatch(label, dtype, target))
    shape = tuple(shape)
    if shape != spec.shape and not (spec.shape[0] == 1 and shape == spec.shape[1:]):
        raise InputError(
            f"{label} has shape {shape} but the model takes {spec.shape}; "
            "save tensors of that shape."
        )
    if fortran_order and sum(d > 1 for d in shape) > 1:
        # The bytes are the transpose: read them as such, then copy in C order.
        tmp = np.empty(shape[::-1], dtype=target)
        _read_exact(fd, first, tmp, label)
        if swap:
            tmp.byteswap(inplace=True)
        out.reshape(shape)[...] = tmp.T
        return
    _read_exact(fd, first, out, label)
    if swap:
        out.byteswap(inplace=True)


def _read_fd(fd: int | None, n: int, label: str) -> bytes:
    if fd is None:
        return b""  # all there was came in the first bytes
    try:
        return os.read(fd, n)
    except OSError as exc:
        raise InputError(f"Cannot read {label}: {exc.strerror or exc}.") from exc


def _read_exact(fd: int | None, first: bytes, array: np.ndarray, label: str) -> None:
    """Fill ``array`` with ``first`` (data bytes already read), then from ``fd`` (None:
    there is nothing more)."""
    view = memoryview(array).cast("B")
    total = min(len(first), len(view))
    view[:total] = first[:total]
    while total < len(view):
        try:
            n = 0 if fd is None else os.readv(fd, [view[total:]])
        except OSError as exc:
            raise InputError(f"Cannot read {label}: {exc.strerror or exc}.") from exc
        if not n:
            raise InputError(
                f"Cannot read {label}: the file is truncated ({total} of {len(view)} data "
                "bytes); write it again."
            )
        total += n


def _dtype_mismatch(label: str, dtype: np.dtype, target: np.dtype) -> str:
    native = dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype
    save = f"save the tensors as {target.name} (numpy.save(path, x.astype('{target.name}')))"
    if dtype.fields is None and native.name in SUPPORTED_DTYPES:
        # The runtime converts a supported dtype to the model's, so feeding as-is works too.
        return (
            f"{label} has dtype {_dtype_text(dtype)} but the input takes {target.name}; "
            f"{save}, or pass {{preprocess.dtype}} {native.name} to feed them as they are."
        )
    return (
        f"{label} has dtype {_dtype_text(dtype)}, which RKNNLite does not take, and the "
        f"input takes {target.name}; {save}."
    )


def _dtype_text(dtype: np.dtype) -> str:
    if dtype.byteorder not in "=|" and dtype.newbyteorder("=").name in SUPPORTED_DTYPES:
        return f"{dtype.name} ({'big' if dtype.byteorder == '>' else 'little'}-endian)"
    return dtype.name if dtype.fields is None else str(dtype)
