"""What a real ``.rknn`` file says about itself: the JSON document at its end.

Layout of the files rknn-toolkit2 2.5.0 writes (read off the files it made for the demo,
``batchinfer/demo/assets/*.rknn``; Rockchip does not document it)::

    offset 0    b"RKNN\\0\\0\\0\\0"   magic
           8    u64 little-endian   format version (6)
          16    u64 little-endian   size S of the compiled model that follows the header
          24    zeros up to 64
          64    S bytes             the compiled model (weights, NPU command streams)
      64 + S    u64 little-endian   length L of the JSON document
      72 + S    L bytes             the JSON document, which ends the file

The JSON names the target platforms, the toolkit version that wrote the file and, per
input and output, the tensor's name, its shape in the source model's layout (NCHW for an
image input of an ONNX model: the runtime's own view of it is NHWC) and its quantised
type. Mean, std and channel order given to ``rknn.config()`` are compiled into the model
and appear nowhere in it.

The document is found from the end of the file: through the header's size when it is
consistent, otherwise by looking back from the end for a ``{`` preceded by its own length.
So files of any size work, including those over 1 MiB, whose JSON lies far from the start.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchinfer.errors import ModelError

MAGIC = b"RKNN"
_HEADER_SIZE = 64
_LENGTH_SIZE = 8
#: How far back from the end the fallback looks for the document (its own size included).
TAIL_LIMIT = 16 << 20

__all__ = ["RknnMetadata", "RknnTensor", "read_rknn_metadata"]


@dataclass(frozen=True)
class RknnTensor:
    """One model input or output as the file describes it.

    ``shape`` is as in the source model (``size`` in the file: NCHW for an ONNX image
    input). ``dtype`` is the quantised type the NPU holds it in ("int8", ...), or None when
    the file names none (a float tensor). ``qnt_method`` is "layer" or "channel", or None.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str | None
    qnt_method: str | None


@dataclass(frozen=True)
class RknnMetadata:
    """The typed content of an .rknn file's trailing JSON (``raw`` keeps all of it)."""

    path: Path
    platforms: tuple[str, ...]  # lower case as written, e.g. ("rk3588",)
    version: str | None  # the rknn-toolkit2 version that wrote the file
    source_format: str | None  # the framework converted from, e.g. "ONNX"
    inputs: tuple[RknnTensor, ...]
    outputs: tuple[RknnTensor, ...]
    raw: dict[str, Any]


def read_rknn_metadata(path: str | os.PathLike[str]) -> RknnMetadata | None:
    """The metadata at the end of the .rknn file at ``path``; None when it has none.

    None means the file holds no such document (not an .rknn, or a format this reader does
    not know). A missing or unreadable file raises ModelError.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            document = _trailing_document(fh, size)
    except OSError as exc:
        raise ModelError(
            f"Cannot read the model file {path} ({exc.strerror or exc}); check the path."
        ) from exc
    if document is None:
        return None
    return _metadata(path, document)


def _trailing_document(fh: Any, size: int) -> dict | None:
    """The JSON object that ends the file, or None."""
    head = fh.read(24)
    if len(head) < 24 or head[:4] != MAGIC:
        return None
    start = _start_from_header(fh, size, int.from_bytes(head[16:24], "little"))
    if start is None:
        start = _start_from_tail(fh, size)
    if start is None:
        return None
    fh.seek(start)
    try:
        document = json.loads(fh.read(size - start).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def _start_from_header(fh: Any, size: int, model_size: int) -> int | None:
    """Where the document starts if the header's model size leads to a length that fits."""
    length_at = _HEADER_SIZE + model_size
    if length_at + _LENGTH_SIZE >= size:
        return None
    fh.seek(length_at)
    length = int.from_bytes(fh.read(_LENGTH_SIZE), "little")
    start = length_at + _LENGTH_SIZE
    return start if start + length == size else None


def _start_from_tail(fh: Any, size: int) -> int | None:
    """Where the document starts: the last ``{`` whose 8 preceding bytes give its length."""
    window = min(size, TAIL_LIMIT)
    fh.seek(size - window)
    tail = fh.read(window)
    pos = tail.rfind(b"{")
    while pos >= _LENGTH_SIZE:
        if int.from_bytes(tail[pos - _LENGTH_SIZE : pos], "little") == window - pos:
            return size - window + pos
        pos = tail.rfind(b"{", 0, pos)
    return None


def _metadata(path: Path, doc: dict) -> RknnMetadata:
    tensors = {t.get("tensor_id"): t for t in _dicts(doc.get("norm_tensor"))}
    ends: dict[str, list[tuple[int, RknnTensor]]] = {"input": [], "output": []}
    # "graph" links the model's i-th input/output to a tensor of "norm_tensor".
    for link in _dicts(doc.get("graph")):
        side = link.get("left")
        tensor = tensors.get(link.get("right_tensor_id"))
        if side in ends and link.get("right") == "norm_tensor" and tensor is not None:
            ends[side].append((int(link.get("left_tensor_id", len(ends[side]))), _tensor(tensor)))
    platforms = doc.get("target_platform") or []
    if isinstance(platforms, str):
        platforms = [platforms]
    return RknnMetadata(
        path=path,
        platforms=tuple(str(p).lower() for p in platforms),
        version=_text(doc.get("version")),
        source_format=_text(doc.get("ori_network_platform") or doc.get("network_platform")),
        inputs=tuple(t for _, t in sorted(ends["input"], key=lambda e: e[0])),
        outputs=tuple(t for _, t in sorted(ends["output"], key=lambda e: e[0])),
        raw=doc,
    )


def _tensor(entry: dict) -> RknnTensor:
    raw_dtype, raw_size = entry.get("dtype"), entry.get("size")
    dtype = raw_dtype if isinstance(raw_dtype, dict) else {}
    size = raw_size if isinstance(raw_size, list) else []
    return RknnTensor(
        name=str(entry.get("url", "")),
        shape=tuple(int(d) for d in size),
        dtype=_text(dtype.get("qnt_type")),
        qnt_method=_text(dtype.get("qnt_method")),
    )


def _dicts(value: Any) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _text(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None
