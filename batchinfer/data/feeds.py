"""Model inputs and what feeds them: one tensor per model input and dataset item.

A model input gets its tensor from one of:

- ``npz``: the item is a ``.npz`` file holding one array per model input, named after it;
- ``column``: a column of the item's manifest row (``--input NAME=COLUMN``): a path to an
  image or a ``.npy`` file (relative paths are relative to the manifest's folder), or the
  numbers themselves (a list, or a string holding a JSON list such as ``"[0, 1, 0.5]"``);
- ``item``: the item itself (an image or a ``.npy``): the one input of a single-input model
  as always, or the one input no ``--input`` names (a manifest's ``path`` feeds the image,
  its columns the other inputs).

Image inputs (rank 3, or rank 4 with 1 or 3 channels) fed images go through the image
pipeline (:mod:`batchinfer.data.preprocess`, with the run's preprocessing options); every
tensor (an ``.npz`` array, a ``.npy``, a list of numbers) must have the input's dtype (a
list of numbers is converted when no value changes) and its shape, with or without the
batch axis. Planning (:func:`plan_feeds`) refuses what cannot work for any item (exit 2);
a fault of one item's tensor is an :class:`~batchinfer.errors.InputError` naming the input
and the array or column, which becomes that item's error row (:func:`load_feeds`).
"""

from __future__ import annotations

import json
import math
import os
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from batchinfer.data.dataset import IMAGE_EXTENSIONS, NPY_EXTENSIONS, Item
from batchinfer.data.preprocess import Preprocess, load_into, read_npy
from batchinfer.errors import InputError, UsageError
from batchinfer.messages import setting

FROM_ITEM = "item"
FROM_NPZ = "npz"
FROM_COLUMN = "column"


class TensorSpec(NamedTuple):
    """What a tensor fed to an input must be: its shape (batch axis included) and dtype."""

    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Feed:
    """One model input and where its tensor comes from (picklable: readers get it)."""

    name: str  # the model input's name
    shape: tuple[int, ...]  # the buffer's shape, as the runtime takes it
    dtype: str
    source: str  # FROM_ITEM, FROM_NPZ or FROM_COLUMN
    column: str | None = None  # FROM_COLUMN: the manifest column
    # How images become this input; None when it is not an image input (tensors only).
    preprocess: Preprocess | None = None
    # The layout of ``shape`` for a 4-D tensor input: "nchw" when the model's source graph
    # takes NCHW (tensors are fed as the graph computes them; the runtime transposes).
    layout: str = "nhwc"

    @property
    def data_format(self) -> str:
        """What RKNNLite's ``data_format`` is for this input: the image layout, else the
        tensor's (the runtime transposes nothing that is not 4-D)."""
        return self.preprocess.layout if self.preprocess is not None else self.layout

    @property
    def tensor(self) -> TensorSpec:
        return TensorSpec(self.shape, self.dtype)

    def describe(self) -> str:
        """Where the tensor comes from, in words (``info``, the run's log)."""
        if self.source == FROM_NPZ:
            return f"the array {self.name!r} of each .npz item"
        if self.source == FROM_COLUMN:
            return f"the manifest column {self.column!r}"
        return "the dataset item (an image or a .npy)"

    def to_json(self) -> dict[str, Any]:
        """For the manifest and the resume fingerprint."""
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "source": self.source,
            "column": self.column,
            "layout": self.data_format,
        }


def parse_input_map(pairs: Sequence[str]) -> dict[str, str]:
    """``("prompt=mask", ...)`` -> {"prompt": "mask"}; UsageError for a malformed pair."""
    mapping: dict[str, str] = {}
    for pair in pairs:
        name, sep, column = (part.strip() for part in str(pair).partition("="))
        if not sep or not name or not column:
            raise UsageError(
                setting("preprocess.inputs")
                + f" {pair!r} is not NAME=COLUMN; give the model input's "
                "name, '=', and the manifest column that feeds it, e.g. prompt=prompt_path."
            )
        if name in mapping:
            raise UsageError(
                setting("preprocess.inputs") + f" names the input {name!r} twice; give it once."
            )
        mapping[name] = column
    return mapping


def is_image_shape(shape: Sequence[int]) -> bool:
    """True when images can be fed to an input of this (runtime-view) shape."""
    if len(shape) == 3:
        return True
    return len(shape) == 4 and (shape[3] in (1, 3) or shape[1] in (1, 3))


def plan_feeds(
    inputs: Sequence[Any],
    mapping: Mapping[str, str],
    kind: str,
    image_preprocess: Callable[[Any], Preprocess],
    model: str = "the model",
) -> tuple[Feed, ...]:
    """The feeds of a model's ``inputs`` (TensorInfo-like: name, shape, dtype), or () when
    the model has one input fed by the item itself as before (no mapping, not ``.npz``).

    ``mapping`` is input name -> manifest column; ``kind`` the dataset's kind;
    ``image_preprocess(input)`` the image preprocessing of an image input (the run's
    options). UsageError (exit 2) for a name the model has no input of, an input nothing
    feeds, or a dynamic tensor shape.
    """
    names = [t.name for t in inputs]
    unknown = [name for name in mapping if name not in names]
    if unknown:
        raise UsageError(
            setting("preprocess.inputs")
            + f" names {', '.join(repr(n) for n in unknown)}, but {model} "
            f"has no such input; its inputs are {', '.join(repr(n) for n in names)}."
        )
    if len(inputs) == 1 and not mapping and kind != FROM_NPZ:
        return ()
    unmapped = [n for n in names if n not in mapping]
    if kind != FROM_NPZ and len(unmapped) > 1:
        raise UsageError(
            f"{model} has {len(inputs)} inputs ({', '.join(repr(n) for n in names)}) and "
            f"the dataset's items can feed only one of {', '.join(repr(n) for n in unmapped)}: "
            "pass "
            + setting("preprocess.inputs")
            + " NAME=COLUMN (a column of a manifest) for the others, "
            "or use a dataset of .npz files holding one array per input name."
        )
    feeds = []
    for t in inputs:
        column = mapping.get(t.name)
        if column is not None:
            source = FROM_COLUMN
        elif kind == FROM_NPZ:
            source = FROM_NPZ
        else:
            source = FROM_ITEM
        preprocess = None
        if source != FROM_NPZ and is_image_shape(t.shape):
            preprocess = image_preprocess(t)
        if source == FROM_ITEM and kind == "images" and preprocess is None:
            raise UsageError(
                f"the dataset's items are images, but they would feed the input {t.name!r} "
                f"{list(t.shape)} of {model}, which is not an image input; feed it .npy "
                "files, .npz items or a manifest column."
            )
        layout = "nhwc"
        if preprocess is not None:
            shape, dtype = preprocess.shape, preprocess.dtype
        else:
            shape = tuple(1 if (i == 0 and d < 1) else int(d) for i, d in enumerate(t.shape))
            dtype = str(t.dtype)
            if any(d < 1 for d in shape):
                raise UsageError(
                    f"the input {t.name!r} of {model} has a dynamic shape {list(t.shape)}; "
                    "batchinfer feeds tensors of one fixed shape."
                )
            feature_map = len(shape) == 4 and not is_image_shape(shape)
            if feature_map and getattr(t, "layout", None) == "nchw":
                # The runtime takes it NHWC; the tensor comes as the source graph's NCHW.
                # (Image-shaped tensors come NHWC, as .npy items of image inputs always have.)
                n, h, w, c = shape
                shape, layout = (n, c, h, w), "nchw"
        feeds.append(Feed(t.name, shape, dtype, source, column, preprocess, layout))
    return tuple(feeds)


def check_first_item(feeds: Sequence[Feed], item: Item | None, dataset: str) -> None:
    """UsageError (exit 2) when the dataset's first item shows that a column feed cannot
    work for any item: no such column, or a column whose values are of the wrong type."""
    wanted = [f for f in feeds if f.source == FROM_COLUMN]
    if not wanted or item is None:
        return
    columns = item.columns
    for feed in wanted:
        if columns is None:
            raise UsageError(
                setting("preprocess.inputs")
                + f" {feed.name}={feed.column} needs a manifest with a "
                f"column {feed.column!r}, but the items of {dataset} have no columns; pass a "
                "list file (.csv, .jsonl, .parquet) that has one."
            )
        if feed.column is None or feed.column not in columns:  # (FROM_COLUMN has a column)
            have = ", ".join(repr(c) for c in columns) or "none"
            raise UsageError(
                setting("preprocess.inputs")
                + f" {feed.name}={feed.column}: the manifest {dataset} has "
                f"no column {feed.column!r} (its other columns: {have})."
            )
        value = columns[feed.column]
        if _value_kind(value) is None:
            raise UsageError(
                f"the column {feed.column!r} of {dataset} holds {type(value).__name__} values "
                f"(first row: {value!r}), which cannot feed the input {feed.name!r}; it must "
                "hold paths of images or .npy files, or lists of numbers."
            )
        image = os.path.splitext(str(value))[1].lower() in IMAGE_EXTENSIONS
        if _value_kind(value) == "path" and feed.preprocess is None and image:
            raise UsageError(
                f"the column {feed.column!r} of {dataset} holds images ({value}), but the "
                f"input {feed.name!r} {list(feed.shape)} is not an image input; give "
                ".npy paths or lists of numbers."
            )


def _value_kind(value: object) -> str | None:
    """ "path", "numbers" or "missing" for a column value; None for a type that cannot feed."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "missing"
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return "numbers" if value.lstrip().startswith("[") else "path"
    if isinstance(value, os.PathLike):
        return "path"
    if isinstance(value, (int, float, np.number)):
        return "numbers"
    if isinstance(value, (list, tuple, np.ndarray)):
        return "numbers"
    return None


# --------------------------------------------------------------------------- loading


def load_feeds(
    feeds: Sequence[Feed],
    path: str,
    values: Sequence[object] | None,
    outs: Sequence[np.ndarray],
    kind: str,
    *,
    name: str,
    base: str = "",
) -> None:
    """Write item ``path``'s tensor for every feed into ``outs`` (one view per feed).

    ``values`` holds the item's value of each column feed, in feed order; ``kind`` is the
    dataset's; ``name`` is how messages call the item; ``base`` the folder relative paths in
    columns are relative to. InputError (the item's error row) naming the input for any fault.
    """
    npz = None
    try:
        column_values = iter(values or ())
        for feed, out in zip(feeds, outs, strict=True):
            if feed.source == FROM_NPZ:
                if npz is None:
                    npz = _open_npz(path, name)
                _npz_array(npz, feed, out, name)
            elif feed.source == FROM_COLUMN:
                _from_column(feed, next(column_values, None), out, name, base)
            else:
                if feed.preprocess is not None and kind == "images":
                    load_into(path, feed.preprocess, out, kind, name=name)
                else:
                    read_npy(path, feed.tensor, out, name)
    finally:
        if npz is not None:
            npz.close()


def _open_npz(path: str, name: str) -> Any:
    try:
        return np.load(path, allow_pickle=False)
    except OSError as exc:
        raise InputError(f"Cannot read {name}: {exc.strerror or exc}.") from exc
    # NotImplementedError: a zip of a version zipfile cannot read (or a multi-disk zip).
    except (ValueError, zipfile.BadZipFile, EOFError, NotImplementedError) as exc:
        raise InputError(f"Cannot read {name}: it is not a .npz file ({exc}).") from exc


def _npz_array(npz: Any, feed: Feed, out: np.ndarray, name: str) -> None:
    if feed.name not in npz.files:
        held = ", ".join(repr(f) for f in npz.files) or "no arrays"
        raise InputError(
            f"{name} has no array {feed.name!r} for the model input of that name (it holds "
            f"{held}); save one array per model input, named after it."
        )
    what = f"the array {feed.name!r} of {name}"
    try:
        _check_stored(*_npz_header(npz, feed.name), feed, what)
        array = npz[feed.name]
    # RuntimeError: an encrypted member; NotImplementedError: a compression zipfile lacks.
    except (
        ValueError, OSError, zipfile.BadZipFile, EOFError, zlib.error, RuntimeError,
        NotImplementedError,
    ) as exc:  # fmt: skip
        raise InputError(f"Cannot read the array {feed.name!r} of {name}: {exc}.") from exc
    _copy_tensor(array, feed, out, what, convert=False)


def _npz_header(npz: Any, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of the array ``key`` of an open .npz, from its member's header only.

    A member is inflated as it is read, and numpy allocates what its header declares: a
    small .npz (zeros deflate 1000:1) would cost a reader gigabytes before the shape is
    checked. So the header is checked first (ValueError for a member that is no .npy).
    """
    member = key + ".npy" if key + ".npy" in npz.zip.namelist() else key
    fmt = np.lib.format
    with npz.zip.open(member) as f:
        version = fmt.read_magic(f)
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, _, dtype = read(f)
    return tuple(shape), dtype


def _check_stored(shape: tuple[int, ...], dtype: np.dtype, feed: Feed, what: str) -> None:
    """InputError when a stored array's shape or dtype cannot feed the input (read
    before the array is: its size is then bounded by the input's)."""
    if dtype.hasobject or dtype.fields is not None:
        raise InputError(f"{what} is not an array of numbers ({dtype}).")
    if shape != feed.shape and shape != feed.shape[1:]:
        raise InputError(_shape_mismatch(what, shape, feed))
    if dtype != np.dtype(feed.dtype) and dtype.newbyteorder("=") != np.dtype(feed.dtype):
        raise InputError(_dtype_mismatch(what, dtype, feed))


def _shape_mismatch(what: str, shape: tuple[int, ...], feed: Feed) -> str:
    return (
        f"{what} has shape {shape} but the input {feed.name!r} takes {feed.shape}; give it "
        "that shape (the batch axis may be left out)."
    )


def _dtype_mismatch(what: str, dtype: np.dtype, feed: Feed) -> str:
    target = np.dtype(feed.dtype).name
    return (
        f"{what} has dtype {dtype} but the input {feed.name!r} takes {target}; save it as {target}."
    )


def _copy_tensor(
    array: np.ndarray, feed: Feed, out: np.ndarray, what: str, *, convert: bool
) -> None:
    """Check ``array`` against the input and copy it into ``out``.

    ``convert``: numbers written as text or lists (a manifest's) are converted to the
    input's dtype when no value changes; a stored array must have the input's dtype.
    """
    target = np.dtype(feed.dtype)
    if array.dtype.hasobject or array.dtype.fields is not None:
        raise InputError(f"{what} is not an array of numbers ({array.dtype}).")
    reshaped = convert and array.size == math.prod(feed.shape)
    if array.shape != feed.shape and array.shape != feed.shape[1:] and not reshaped:
        raise InputError(_shape_mismatch(what, tuple(array.shape), feed))
    if array.dtype != target:
        same = array.dtype.newbyteorder("=") == target
        if convert and array.dtype.kind in "iufb":
            cast = array.astype(target)
            with np.errstate(invalid="ignore"):
                exact = np.array_equal(cast.astype(array.dtype), array) or (
                    target.kind == "f" and array.dtype.kind in "iuf"
                )
            if not exact:
                raise InputError(
                    f"{what} holds values that {target.name} cannot hold exactly (the input "
                    f"{feed.name!r} takes {target.name})."
                )
            array = cast
        elif not same:
            raise InputError(_dtype_mismatch(what, array.dtype, feed))
    np.copyto(out, array.reshape(out.shape), casting="unsafe")


def _from_column(feed: Feed, value: object, out: np.ndarray, name: str, base: str) -> None:
    where = f"the column {feed.column!r} of {name}"
    kind = _value_kind(value)
    if kind == "missing":
        raise InputError(f"{where} is empty; the input {feed.name!r} needs a value.")
    if kind is None:
        raise InputError(
            f"{where} holds {type(value).__name__} {value!r}, which cannot feed the input "
            f"{feed.name!r}; give a path of an image or .npy file, or a list of numbers."
        )
    if kind == "numbers":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise InputError(f"{where} is not a JSON list of numbers ({exc}).") from exc
        try:
            array = np.asarray(value)
        except ValueError as exc:  # ragged nested lists
            raise InputError(f"{where} is not a list of numbers ({exc}).") from exc
        if array.dtype.kind not in "iufb":
            raise InputError(f"{where} is not a list of numbers.")
        _copy_tensor(array, feed, out, where, convert=True)
        return
    assert isinstance(value, (str, os.PathLike))  # _value_kind's "path"
    text = os.fspath(value)
    path = text if os.path.isabs(text) or not base else os.path.join(base, text)
    label = f"{text} ({where})"
    extension = os.path.splitext(text)[1].lower()
    if extension in NPY_EXTENSIONS:
        read_npy(path, feed.tensor, out, label)
    elif extension in IMAGE_EXTENSIONS and feed.preprocess is not None:
        load_into(path, feed.preprocess, out, "images", name=label)
    else:
        what = "an image or a .npy file" if feed.preprocess is not None else "a .npy file"
        raise InputError(
            f"{where} names {text}, which is not {what}; the input {feed.name!r} takes that."
        )
