"""Click options generated from the option groups (batchinfer.options), and back.

The CLI renders each setting as a flag: ``runtime.instances_per_core`` is
``--instances-per-core``, ``runtime.sim.npu_ms`` is ``--sim-npu-ms``. Defaults, help and
choices come from the groups, so the CLI and job files can never disagree about them.
:func:`flag_of` turns field names in library messages into the flags a user typed.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from batchinfer.options import GROUPS, flag_name, options_fields

# Top-level settings of a run that belong to no group.
_TOP = {
    "dataset": "DATASET",
    "model": "--model",
    "limit": "--limit",
    "labels": "--labels",
    "image_root": "--image-root",
    "ray": "--ray",
    "ray_data": "--ray-data",
}


def _flag(group: str, f: dataclasses.Field) -> str:
    return flag_name(group, f)


def flag_of(field_name: str) -> str:
    """The CLI flag of a setting (``runtime.slots`` -> ``--slots``); itself when unknown."""
    if field_name in _TOP:
        return _TOP[field_name]
    group, _, name = field_name.rpartition(".")
    cls = GROUPS.get(group)
    if cls is None:
        return field_name
    for f in options_fields(cls):
        if f.name == name:
            flag = _flag(group, f)
            return flag.split("/")[0]  # --canary/--no-canary -> --canary
    return field_name


class _Parsed(click.ParamType):
    """A click type that applies an option's ``parse`` (ValueError -> a usage error)."""

    def __init__(self, parse: Callable[[str], Any], name: str) -> None:
        self.parse = parse
        self.name = name

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


def _default_text(value: Any) -> str | None:
    if value in (None, (), False):
        return None
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _click_option(group: str, f: dataclasses.Field, cls: type) -> Callable:
    meta = f.metadata
    flag = _flag(group, f)
    names = [flag] + ([meta["short"]] if "short" in meta else [])
    dest = f"{group.replace('.', '__')}__{f.name}"
    hint = typing.get_type_hints(cls)[f.name]
    kwargs: dict[str, Any] = {"help": meta["help"], "default": None}
    if hint is bool:
        kwargs["default"] = f.default
        if "/" not in flag:
            kwargs["is_flag"] = True
    elif meta.get("multiple"):
        kwargs["multiple"] = True
        kwargs["default"] = ()
    elif "choices" in meta:
        kwargs["type"] = click.Choice(list(meta["choices"]))
    elif "parse" in meta:
        kwargs["type"] = _Parsed(meta["parse"], f.name)
    elif meta.get("path"):
        kwargs["type"] = click.Path(path_type=Path)
    else:
        base = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        kwargs["type"] = base[0] if base[0] in (int, float, str) else str
    text = _default_text(f.default)
    if text is not None and hint is not bool:
        kwargs["help"] += f"  [default: {text}]"
    return click.option(*names, dest, **kwargs)


def group_options(*groups: str, skip: tuple[str, ...] = ()) -> Callable:
    """A decorator adding the click options of ``groups`` (field names in ``skip`` left out)."""

    def decorate(fn: Callable) -> Callable:
        for group in reversed(groups):
            cls = GROUPS[group]
            for f in reversed(options_fields(cls)):
                if f"{group}.{f.name}" not in skip:
                    fn = _click_option(group, f, cls)(fn)
        return fn

    return decorate


def build_group(group: str, params: dict[str, Any], **nested: Any) -> Any:
    """The option group ``group`` from click's parsed ``params`` (unset flags: defaults)."""
    cls = GROUPS[group]
    prefix = f"{group.replace('.', '__')}__"
    values = {}
    for f in options_fields(cls):
        value = params.pop(prefix + f.name, None)
        if value is None or (value == () and f.metadata.get("multiple")):
            continue
        values[f.name] = tuple(value) if f.metadata.get("multiple") else value
    return cls(**values, **nested)


# ------------------------------------------------------------ options several commands take

#: ``--no-progress``, the same on every command that shows a bar.
no_progress_option = click.option(
    "--no-progress", is_flag=True, help="No progress bar (there is none off a terminal)."
)


def image_root_option(lists: str) -> Callable:
    """``--image-root``; ``lists`` names the files whose relative paths it anchors."""
    return click.option(
        "--image-root",
        type=click.Path(path_type=Path),
        help=f"Where the relative paths of {lists} start (default: the list's folder).",
    )


def ray_options(
    runs: str, note: str = "", data_default: str | None = "head", data_note: str = ""
) -> Callable:
    """``--ray`` and ``--ray-data``. ``runs`` says what runs on the cluster and ``note``
    what the command adds; ``data_default`` None leaves the data setting to the caller (eval
    takes it from the job file, as ``data_note`` says)."""
    address = (
        f"{runs} a Ray cluster: auto or HOST:PORT (a running cluster; run this on its head "
        f"node), local or local:N (N simulated nodes on this machine). {note}"
    ).rstrip() + " Needs batchinfer[ray]."
    data = (
        "With --ray: the dataset is on this node only (read here, tensors shipped to the "
        f"nodes), or on storage every node mounts at the same path (each node reads). {data_note}"
    ).rstrip()

    def decorate(fn: Callable) -> Callable:
        fn = click.option(
            "--ray-data",
            type=click.Choice(["head", "shared"]),
            default=data_default,
            show_default=data_default is not None,
            help=data,
        )(fn)
        return click.option(
            "--ray",
            "ray_address",
            metavar="ADDRESS",
            help=address,
        )(fn)

    return decorate
