"""Conversion settings: what the user passed to ``rknn.config(...)``, kept beside the ``.rknn``.

A converted ``.rknn`` carries the normalisation given to ``rknn.config()`` (``mean_values``,
``std_values``) and applies it on the NPU, so it takes raw pixels. Those values are not in
the file's readable metadata, so a conversion script writes them beside the model, as the
exact keyword arguments it passed::

    cfg = dict(mean_values=[[123.675, 116.28, 103.53]], std_values=[[58.395, 57.12, 57.375]],
               target_platform="rk3588")
    rknn.config(**cfg)
    json.dump(cfg, open("model.config.json", "w"))

For ``model.rknn`` the file is ``model.config.json``. Keys are rknn-toolkit2's own; keys
this module does not use are kept in :attr:`ConversionSettings.raw` and ignored.

What rknn-toolkit2 documents (API reference V2.3.2, ``config``) and this module follows:

- ``mean_values`` / ``std_values``: one list per model input, one value per channel; the
  model computes ``(x - mean) / std`` per channel. Missing means mean 0 / std 1.
- ``quant_img_RGB2BGR`` is used only to read calibration images while quantising and
  "will not be recorded in the final RKNN model": at inference the channels are taken in
  the order the caller gives them, and mean/std apply in that order. So :meth:`normalise`
  never reorders channels.
- ``dynamic_input``: the input shapes compiled into a dynamic-shape model, as
  ``[[in0_shapeA, in1_shapeA, ...], [in0_shapeB, ...], ...]`` in the source model's layout
  (NCHW for ONNX). Only those shapes run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchinfer.errors import ModelError

if TYPE_CHECKING:  # numpy is imported where it is used: the CLI imports this module early
    import numpy as np

SUFFIX = ".config.json"

_STR_KEYS = ("target_platform", "quantized_dtype", "quantized_algorithm", "quantized_method")


def settings_path(rknn_path: Path | str) -> Path:
    """Where the conversion settings of ``rknn_path`` live: ``<stem>.config.json`` beside it."""
    path = Path(rknn_path)
    return path.with_name(path.stem + SUFFIX)


@dataclass(frozen=True)
class ConversionSettings:
    """The keyword arguments of ``rknn.config()`` a model was converted with (validated).

    ``mean_values`` / ``std_values`` hold one tuple per input (None: not given);
    ``quant_img_rgb2bgr`` one flag per input as given (informational only, see the module
    docstring); ``dynamic_input`` the compiled shape sets (None: static model).
    """

    raw: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None
    mean_values: tuple[tuple[float, ...], ...] | None = None
    std_values: tuple[tuple[float, ...], ...] | None = None
    quant_img_rgb2bgr: tuple[bool, ...] = ()
    target_platform: str | None = None
    quantized_dtype: str | None = None
    quantized_algorithm: str | None = None
    dynamic_input: tuple[tuple[tuple[int, ...], ...], ...] | None = None

    # ------------------------------------------------------------ reading and writing
    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any], path: Path | None = None) -> ConversionSettings:
        """Settings from ``rknn.config``'s keyword arguments; ModelError for wrong types."""
        where = f"{path}" if path is not None else "the conversion settings"
        if not isinstance(cfg, Mapping):
            raise ModelError(
                f"{where} must hold a JSON object of rknn.config() arguments, not "
                f"{type(cfg).__name__}; write it with json.dump(cfg, ...) where cfg is a dict."
            )
        strings = {}
        for key in _STR_KEYS:
            value = cfg.get(key)
            if value is not None and not isinstance(value, str):
                raise ModelError(f"{where}: {key} must be a string, not {value!r}; fix the file.")
            strings[key] = value
        return cls(
            raw=dict(cfg),
            path=path,
            mean_values=_per_input_values(cfg.get("mean_values"), "mean_values", where),
            std_values=_per_input_values(cfg.get("std_values"), "std_values", where, std=True),
            quant_img_rgb2bgr=_flags(cfg.get("quant_img_RGB2BGR"), where),
            target_platform=strings["target_platform"],
            quantized_dtype=strings["quantized_dtype"],
            quantized_algorithm=strings["quantized_algorithm"],
            dynamic_input=_shape_sets(cfg.get("dynamic_input"), where),
        )

    @classmethod
    def load(cls, path: Path | str) -> ConversionSettings:
        """Read a settings file; ModelError if it is unreadable, not JSON or ill-typed."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ModelError(f"Cannot read the conversion settings {path} ({exc}).") from exc
        try:
            cfg = json.loads(text)
        except ValueError as exc:
            raise ModelError(
                f"{path} is not valid JSON ({exc}); write it with json.dump(cfg, ...)."
            ) from exc
        return cls.from_dict(cfg, path)

    @classmethod
    def load_beside(cls, rknn_path: Path | str) -> ConversionSettings | None:
        """The settings written beside ``rknn_path`` (``<stem>.config.json``), or None."""
        path = settings_path(rknn_path)
        return cls.load(path) if path.is_file() else None

    def write_beside(self, rknn_path: Path | str) -> Path:
        """Write :attr:`raw` as ``<stem>.config.json`` beside ``rknn_path``; its path."""
        path = settings_path(rknn_path)
        path.write_text(json.dumps(dict(self.raw), indent=1) + "\n", encoding="utf-8")
        return path

    # ------------------------------------------------------------ per input
    def mean(self, index: int = 0) -> tuple[float, ...] | None:
        """Input ``index``'s per-channel mean, or None when none was given."""
        return _nth(self.mean_values, index)

    def std(self, index: int = 0) -> tuple[float, ...] | None:
        """Input ``index``'s per-channel std, or None when none was given."""
        return _nth(self.std_values, index)

    def normalises(self, index: int = 0) -> bool:
        """True when the model normalises input ``index`` itself (mean or std given)."""
        return self.mean(index) is not None or self.std(index) is not None

    def normalise(self, x: np.ndarray, index: int = 0) -> np.ndarray:
        """Input ``index`` as the model computes on it: see :func:`normalise`."""
        return normalise(x, self.mean(index), self.std(index))

    def shapes(self, index: int = 0) -> tuple[tuple[int, ...], ...] | None:
        """The shapes compiled for input ``index`` (source layout), or None when static."""
        if self.dynamic_input is None:
            return None
        return tuple(shape_set[index] for shape_set in self.dynamic_input)


def normalise(
    x: np.ndarray, mean: Sequence[float] | None, std: Sequence[float] | None
) -> np.ndarray:
    """``(x - mean) / std`` per channel (last axis, NHWC) as float32; ValueError on misfit.

    One value applies to every channel. Channels are used in the order given: no RGB/BGR
    reorder (see the module docstring).
    """
    import numpy as np

    out: np.ndarray = np.asarray(x, dtype=np.float32)
    channels = out.shape[-1] if out.ndim else 1
    for name, values in (("mean_values", mean), ("std_values", std)):
        if values is not None and len(values) not in (1, channels):
            raise ValueError(
                f"{name} has {len(values)} value(s) but the input has {channels} "
                "channel(s) on its last axis"
            )
    if mean is not None:
        out = out - np.asarray(mean, dtype=np.float32)
    if std is not None:
        out = out / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(out, dtype=np.float32)


def _nth(values: tuple[tuple[float, ...], ...] | None, index: int) -> tuple[float, ...] | None:
    if values is None or index >= len(values):
        return None
    return values[index]


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _per_input_values(
    value: object, name: str, where: str, std: bool = False
) -> tuple[tuple[float, ...], ...] | None:
    if value is None:
        return None
    example = "[[58.395, 57.12, 57.375]]" if std else "[[123.675, 116.28, 103.53]]"
    bad = ModelError(
        f"{where}: {name} must be a list with one list of per-channel numbers per input, "
        f"e.g. {example}, not {value!r}; fix the file."
    )
    if not isinstance(value, list) or not value:
        raise bad
    if all(_is_number(v) for v in value):
        value = [value]  # one input's values given flat
    out = []
    for sub in value:
        if not isinstance(sub, list) or not sub or not all(_is_number(v) for v in sub):
            raise bad
        if not all(math.isfinite(v) for v in sub) or (std and any(v == 0 for v in sub)):
            raise ModelError(f"{where}: {name} {sub} has a zero or non-finite value; fix the file.")
        out.append(tuple(float(v) for v in sub))
    return tuple(out)


def _flags(value: object, where: str) -> tuple[bool, ...]:
    if value is None:
        return ()
    if isinstance(value, bool):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, bool) for v in value):
        return tuple(value)
    raise ModelError(
        f"{where}: quant_img_RGB2BGR must be true/false or one per input, not {value!r}."
    )


def _shape_sets(value: object, where: str) -> tuple[tuple[tuple[int, ...], ...], ...] | None:
    if value is None:
        return None
    bad = ModelError(
        f"{where}: dynamic_input must be a list of shape sets, one shape per input, e.g. "
        f"[[[1,3,224,224]], [[1,3,192,192]]], not {value!r}; fix the file."
    )
    if not isinstance(value, list) or not value:
        raise bad
    sets = []
    for shape_set in value:
        if not isinstance(shape_set, list) or not shape_set:
            raise bad
        shapes = []
        for shape in shape_set:
            if not _is_shape(shape):
                raise bad
            shapes.append(tuple(int(d) for d in shape))
        sets.append(tuple(shapes))
    if len({len(s) for s in sets}) != 1:
        raise bad
    return tuple(sets)


def _is_shape(shape: object) -> bool:
    return (
        isinstance(shape, Sequence)
        and not isinstance(shape, str)
        and len(shape) > 0
        and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
    )
