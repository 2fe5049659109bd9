"""The anchors of an anchor-based (YOLOv5/v7) head: ``detect.anchors``, else ``anchors`` in
the model's ``<stem>.config.json`` (the conversion settings beside it,
runtime/conversion.py), else COCO's defaults (None here)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchinfer.detect.heads import Head
from batchinfer.errors import ConfigError
from batchinfer.messages import setting


def head_anchors(
    given: Sequence[Sequence[float]] | None, model: Path, head: Head
) -> tuple[tuple[tuple[tuple[float, float], ...], ...] | None, str]:
    """The head's anchors per stride as (w, h) pairs, and where they came from."""
    source, flat = "option", given
    if flat is None:
        from batchinfer.runtime.conversion import ConversionSettings

        settings = ConversionSettings.load_beside(model)
        raw = None if settings is None else settings.raw.get("anchors")
        if raw is None:
            return None, "default"
        assert settings is not None  # raw came from it
        source, flat = f"{model.stem}.config.json", _anchors_from_json(raw, settings.path)
    strides = len(head.strides)
    groups = [tuple(float(v) for v in g) for g in flat]
    if len(groups) == 1 and strides > 1 and len(groups[0]) % (2 * strides) == 0:
        per = len(groups[0]) // strides  # one flat list (the model zoo's anchors file)
        groups = [groups[0][i * per : (i + 1) * per] for i in range(strides)]
    want = 2 * head.num_anchors
    if len(groups) != strides or any(len(g) != want for g in groups):
        where = setting("detect.anchors") if source == "option" else f"anchors in {source}"
        raise ConfigError(
            where + f" gives {[len(g) // 2 for g in groups]} anchors per stride, but the "
            f"model's {head.describe()} needs {head.num_anchors} (w,h pairs) for each of its "
            f"{strides} strides.",
            "detect.anchors",
        )
    return tuple(tuple((g[i], g[i + 1]) for i in range(0, len(g), 2)) for g in groups), source


def _anchors_from_json(raw: Any, path: Path | None) -> tuple[tuple[float, ...], ...]:
    """``anchors`` of a .config.json: a flat list, a list per stride, or (w, h) pairs per
    stride."""

    def flat(value: Any) -> list[float]:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return [float(value)]
        if isinstance(value, list):
            return [v for item in value for v in flat(item)]
        raise ConfigError(
            f"anchors in {path} must be numbers (w,h pairs per stride), not {value!r}.",
            "detect.anchors",
        )

    if isinstance(raw, list) and raw and all(isinstance(g, list) for g in raw):
        return tuple(tuple(flat(g)) for g in raw)
    return (tuple(flat(raw)),)
