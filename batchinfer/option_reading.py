"""Reading and checking option groups: a job file's table into a group's dataclass
(:func:`from_mapping`), a group's values against their bounds (:func:`check_group`).

Generic over any group of batchinfer.options (fields made by ``option()``, their metadata
carrying ``help``, ``bounds``, ``choices``, ``words``); batchinfer.options re-exports these.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from batchinfer.bounds import check_value
from batchinfer.errors import ConfigError
from batchinfer.messages import setting


def options_fields(cls: type) -> list[dataclasses.Field]:
    """The option fields of a group (nested groups left out)."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def _type_of(cls: type, name: str) -> Any:
    return typing.get_type_hints(cls)[name]


def _as_is(value: Any) -> Any:
    return value


#: A scalar hint -> the TOML values it takes and how they are converted. A bool is never
#: taken for a number (a Python bool is an int).
_SCALARS: dict[Any, tuple[tuple[type, ...], Callable[[Any], Any]]] = {
    bool: ((bool,), _as_is),
    int: ((int,), _as_is),
    float: ((int, float), float),
    str: ((str,), _as_is),
    Path: ((str, Path), Path),
}


def _conforms(value: Any, hint: Any) -> Any:
    """``value`` converted to ``hint`` where a job file's TOML types differ; ValueError if not."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _one_of(value, typing.get_args(hint))
    if origin is tuple:
        return _tuple_of(value, typing.get_args(hint))
    accepts, convert = _SCALARS.get(hint, ((), _as_is))  # an unknown hint takes nothing
    if not isinstance(value, accepts) or (isinstance(value, bool) and hint is not bool):
        raise ValueError
    return convert(value)


def _one_of(value: Any, args: tuple[Any, ...]) -> Any:
    """``value`` as the first member of a union that takes it (None where it is one)."""
    if value is None and type(None) in args:
        return None
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _conforms(value, arg)
        except ValueError:
            continue
    raise ValueError


def _tuple_of(value: Any, args: tuple[Any, ...]) -> tuple:
    """A TOML array as ``tuple[T, ...]`` or a fixed-length ``tuple[T, T]`` (of one type)."""
    if not isinstance(value, (list, tuple)):
        raise ValueError
    if not (len(args) == 2 and args[1] is Ellipsis) and len(value) != len(args):
        raise ValueError
    return tuple(_conforms(v, args[0]) for v in value)


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
_PLURAL = {int: "integers", float: "numbers", str: "strings"}


def _type_name(hint: Any) -> str:
    """How a job file's author would say the type: "a list of integers", "a number"."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint) if a is not type(None))
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_PLURAL.get(args[0], 'values')}"
        return f"a list of {len(args)} {_PLURAL.get(args[0], 'values')}"
    if hint is Path:
        return "a path"
    return _NAMES.get(hint, str(hint))


def from_mapping(
    cls: type, data: Mapping[str, Any], where: str, resolve: Callable[[Path], Path] | None = None
) -> Any:
    """An option group read from a job file's table ``data`` at key path ``where``.

    Unknown keys and wrong types raise ConfigError naming ``where.key``; nested groups
    (``runtime.sim``) are read from sub-tables. ``resolve`` turns relative paths into
    absolute ones (job files resolve them against their own folder).
    """
    if not isinstance(data, Mapping):
        raise ConfigError(setting(where) + " must be a table of settings.", where)
    known = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{where}.{key}"
        if key not in known:
            close = [k for k in known if similar_name(k, key)]
            hint = f"; did you mean {where}.{close[0]}?" if close else ""
            raise ConfigError(
                setting(name) + f" is not a setting (settings of {where}: "
                f"{', '.join(sorted(known))}){hint}",
                name,
            )
        hint_type = _type_of(cls, key)
        if isinstance(hint_type, type) and dataclasses.is_dataclass(hint_type):
            values[key] = from_mapping(hint_type, value, name, resolve)
            continue
        try:
            converted = _conforms(value, hint_type)
        except ValueError:
            raise ConfigError(
                setting(name) + f" must be {_type_name(hint_type)}, not {value!r}.", name
            ) from None
        if isinstance(converted, Path) and resolve is not None:
            converted = resolve(converted)
        choices = known[key].metadata.get("choices")
        if choices and converted is not None and converted not in choices:
            raise ConfigError(
                setting(name) + f" must be one of {', '.join(choices)}, not {converted!r}.", name
            )
        words = known[key].metadata.get("words")
        if words and isinstance(converted, str) and converted not in words:
            raise ConfigError(
                setting(name) + f" must be {_type_name(hint_type).replace(' or a string', '')} or "
                f"{' or '.join(repr(w) for w in words)}, not {converted!r}.",
                name,
            )
        check_value(known[key].metadata.get("bounds"), converted, name)
        values[key] = converted
    return cls(**values)


def check_group(group: Any, where: str) -> None:
    """ConfigError naming ``{where.field}`` for the first value of ``group`` (an option
    group, its nested groups included) that is outside its ``bounds`` or not finite."""
    for f in dataclasses.fields(group):
        value = getattr(group, f.name)
        if dataclasses.is_dataclass(value):
            check_group(value, f"{where}.{f.name}")
        elif "help" in f.metadata:
            check_value(f.metadata.get("bounds"), value, f"{where}.{f.name}")


def similar_name(a: str, b: str) -> bool:
    """Near-misses worth suggesting: same letters mostly, or one contains the other."""
    if a in b or b in a:
        return True
    import difflib

    return difflib.SequenceMatcher(None, a, b).ratio() >= 0.75
