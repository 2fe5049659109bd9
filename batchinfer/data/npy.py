""".npy tensors into a model input buffer: the header parsed (and remembered: a dataset's
tensors usually share one), the data read with ``readv`` straight into the slot's memory,
with no temporary array (Fortran-ordered files need one). Problems are InputErrors naming
the file.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

from batchinfer.data.whole_file import open_item
from batchinfer.errors import InputError
from batchinfer.messages import setting
from batchinfer.runtime.constants import SUPPORTED_DTYPES

# Parsed .npy headers by their bytes: a dataset's tensors usually share one header, and
# numpy parses it with ast.literal_eval, which cost more than reading the data itself.
_NPY_HEADERS: dict[bytes, tuple[tuple[int, ...], bool, np.dtype]] = {}
_NPY_HEADERS_KEPT = 64
# The first read of a .npy takes this much: its header (numpy pads it to a multiple of 64
# bytes, 128 for ordinary arrays) and the first data bytes, in one system call.
_NPY_FIRST_READ = 4096
#: Longest .npy header read: numpy's own limit (numpy.lib.format refuses longer ones unless
#: told they are trusted); numpy.save writes 128 bytes for an ordinary array.
NPY_HEADER_MAX = 10_000


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
    length = int.from_bytes(size_bytes, "little")
    if length > NPY_HEADER_MAX:  # read before numpy sees it: a version 2 header may say 4 GiB
        raise InputError(
            f"Cannot read {label}: its .npy header says it is {length} bytes long, more than "
            f"the {NPY_HEADER_MAX} numpy reads; save it again with numpy.save."
        )
    end = at + length
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
        except Exception as exc:  # numpy parses the header's text with ast, then tokenize:
            # ValueError, SyntaxError, tokenize's TokenError, ... for text that is no dict
            text = " ".join(str(exc).split())[:200]
            raise InputError(f"Cannot read {label}: its .npy header is damaged ({text}).") from exc
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
    fd, _ = open_item(path, label)
    try:
        head = _read_fd(fd, _NPY_FIRST_READ, label)
        if not head:
            raise InputError(f"Cannot read {label}: the file is empty.")
        fill_npy(fd, head, spec, out, label)
    finally:
        os.close(fd)


def fill_npy(fd: int | None, head: bytes, spec: Any, out: np.ndarray, label: str) -> None:
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
    view = array.data.cast("B")
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
            f"{save}, or pass "
            + setting("preprocess.dtype")
            + f" {native.name} to feed them as they are."
        )
    return (
        f"{label} has dtype {_dtype_text(dtype)}, which RKNNLite does not take, and the "
        f"input takes {target.name}; {save}."
    )


def _dtype_text(dtype: np.dtype) -> str:
    if dtype.byteorder not in "=|" and dtype.newbyteorder("=").name in SUPPORTED_DTYPES:
        return f"{dtype.name} ({'big' if dtype.byteorder == '>' else 'little'}-endian)"
    return dtype.name if dtype.fields is None else str(dtype)
