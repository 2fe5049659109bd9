"""RunConfig: one run of the main job (a dataset folder through the engine into a run folder)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchinfer.errors import ConfigError, UsageError
from batchinfer.messages import setting
from batchinfer.options import (
    GROUPS,
    DetectOptions,
    OutputOptions,
    PreprocessOptions,
    ReliabilityOptions,
    RuntimeOptions,
    SimOptions,
    from_mapping,
    keyword_name,
    options_fields,
    similar_name,
)

__all__ = [
    "DetectOptions",
    "OutputOptions",
    "PreprocessOptions",
    "ReliabilityOptions",
    "RunConfig",
    "RuntimeOptions",
    "SimOptions",
]


@dataclass(frozen=True)
class RunConfig:
    """One run: what to run on, and the option groups (see batchinfer.options).

    Paths may be relative to the current folder; planning resolves them.
    """

    dataset: Path
    model: Path
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    preprocess: PreprocessOptions = field(default_factory=PreprocessOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    reliability: ReliabilityOptions = field(default_factory=ReliabilityOptions)
    detect: DetectOptions = field(default_factory=DetectOptions)  # the task (batchinfer/tasks)
    limit: int | None = None  # only the first N items of the dataset
    labels: Path | None = None  # a class map file (see batchinfer.data.classes)
    image_root: Path | None = None  # where a list's / COCO file's relative paths start
    command: str | None = None  # the command line, for the manifest

    @classmethod
    def of(
        cls, dataset: str | os.PathLike[str], model: str | os.PathLike[str], **options: Any
    ) -> RunConfig:
        """A RunConfig from the CLI's option names, as ``batchinfer.run(dataset, model=...,
        **options)`` takes them: each flag without its dashes, ``_`` for ``-``
        (``cores=(0, 1, 2)``, ``instances_per_core=2``, ``sim_npu_ms=2``, ``out="runs/a"``,
        ``overwrite=True``, ``conf=0.3``), plus ``limit``, ``labels``, ``image_root``, and
        whole option groups as ``infer`` takes them (``runtime=RuntimeOptions(...)``), which
        the single names then change. A value is what a job file holds (numbers, lists,
        strings) or the CLI's text (``cores="0,1,2"``); each is checked as a job file's is
        (type, choices, bounds), and a name no front end has is a UsageError."""
        keywords = _keywords()
        groups: dict[str, Any] = {}
        for name in _GROUP_NAMES:
            given = options.pop(name, None)
            groups[name] = given if given is not None else _GROUP_NAMES[name]()
            if not isinstance(groups[name], _GROUP_NAMES[name]):
                raise UsageError(
                    f"{name}= takes a {_GROUP_NAMES[name].__name__}, not a "
                    f"{type(groups[name]).__name__}."
                )
        top = {k: options.pop(k) for k in _TOP if k in options}
        settings: dict[str, dict[str, Any]] = {}
        for keyword, value in options.items():
            if keyword not in keywords:
                close = [k for k in sorted(keywords) if similar_name(k, keyword)]
                hint = f"; did you mean {close[0]}?" if close else ""
                raise UsageError(
                    f"{keyword!r} is not an option of run (they are the CLI's flags, "
                    f"'_' for '-': {', '.join(sorted([*keywords, *_TOP]))}){hint}"
                )
            group, f = keywords[keyword]
            settings.setdefault(group, {})[f.name] = _as_setting(group, f, value)
        sim = groups["runtime"].sim
        if "runtime.sim" in settings:
            sim = _changed(sim, "runtime.sim", settings.pop("runtime.sim"))
        for group, values in settings.items():
            groups[group] = _changed(groups[group], group, values)
        groups["runtime"] = dataclasses.replace(groups["runtime"], sim=sim)
        return cls(
            dataset=Path(dataset),
            model=Path(model),
            limit=top.get("limit"),
            labels=None if top.get("labels") is None else Path(top["labels"]),
            image_root=None if top.get("image_root") is None else Path(top["image_root"]),
            **groups,
        )

    def to_json(self) -> dict[str, Any]:
        """The config as plain JSON values, for the manifest."""

        def plain(value: Any) -> Any:
            if isinstance(value, Path):
                return str(value)
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            return value

        return plain(dataclasses.asdict(self))


_TOP = ("limit", "labels", "image_root")  # a run's settings that belong to no group
_GROUP_NAMES: dict[str, type] = {
    "runtime": RuntimeOptions,
    "preprocess": PreprocessOptions,
    "output": OutputOptions,
    "reliability": ReliabilityOptions,
    "detect": DetectOptions,
}


def _keywords() -> dict[str, tuple[str, dataclasses.Field]]:
    """Each setting's keyword (its CLI flag as a Python name) -> (group, field)."""
    return {
        keyword_name(group, f): (group, f)
        for group, group_cls in GROUPS.items()
        for f in options_fields(group_cls)
    }


def _as_setting(group: str, f: dataclasses.Field, value: Any) -> Any:
    """``value`` as a job file would hold it: the CLI's text parsed as the CLI parses it, one
    string for a repeatable flag taken as a list of one."""
    if f.metadata.get("multiple") and isinstance(value, str):
        return [value]
    parse = f.metadata.get("parse")
    if parse is not None and isinstance(value, str):
        try:
            return parse(value)
        except ValueError as e:
            name = f"{group}.{f.name}"
            raise ConfigError(setting(name) + f": {e}.", name) from None
    return value


def _changed(base: Any, group: str, values: dict[str, Any]) -> Any:
    """``base`` with ``values`` set, each checked as a job file's setting is (from_mapping)."""
    checked = from_mapping(type(base), values, group)
    return dataclasses.replace(base, **{k: getattr(checked, k) for k in values})
