"""Messages that name settings as data, which each front end renders its own way.

A library message (an error, a warning, a benchmark's reason) that tells the user to
change a setting names it with :func:`setting`::

    raise ConfigError(f"{n} slots do not fit /dev/shm; lower " + setting("runtime.slots") + ".")

The result is a :class:`Message`: a ``str`` whose text names every setting by its field
(``runtime.slots``, the library's own name, what ``str()`` and files written without a
front end show), and which keeps the references as :class:`Setting` objects, so each
front end renders them as its user sets them (:meth:`Message.render`): the CLI as flags
(``--slots``), an eval job as keys (``device.runtime.slots``). No template is stored, so
no message can reach a file or a screen unrendered.

Concatenation keeps the references (``"lower " + setting("x.y") + "."`` is a Message);
formatting a Message into an f-string, ``str.join`` or slicing gives plain text with the
field names, which is correct, only no longer renderable per front end.

The older convention, settings written as ``{group.setting}`` templates in plain strings,
is gone from the package (tests/test_messages.py fails on a new one), and plain text is
never read for templates: braces in it are the user's (an output folder named
``/tmp/{model}/out``, a shard pattern ``{0..9}``) and stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    """A reference to a setting in a message, by its field name (``runtime.slots``)."""

    field: str


Part = str | Setting


class Message(str):
    """Text naming settings as :class:`Setting` references; its ``str`` value names them by
    field. Make one with :func:`setting` and ``+`` (see the module docstring)."""

    parts: tuple[Part, ...]

    def __new__(cls, *parts: Part) -> Message:
        merged: list[Part] = []
        for part in parts:
            pieces: tuple[Part, ...] = part.parts if isinstance(part, Message) else (part,)
            for piece in pieces:
                if isinstance(piece, str) and merged and isinstance(merged[-1], str):
                    merged[-1] = merged[-1] + piece
                elif piece:
                    merged.append(piece)
        self = super().__new__(cls, _join(merged, _field))
        self.parts = tuple(merged)
        return self

    def render(self, name: Callable[[str], str]) -> str:
        """The text with every setting named by ``name(field)``."""
        return _join(self.parts, name)

    @property
    def settings(self) -> tuple[str, ...]:
        """The fields of the settings named, in order (repeats left out)."""
        return tuple(dict.fromkeys(p.field for p in self.parts if isinstance(p, Setting)))

    def __add__(self, other: str) -> Message:
        if not isinstance(other, str):
            return NotImplemented
        return Message(self, other)

    def __radd__(self, other: str) -> Message:
        if not isinstance(other, str):
            return NotImplemented
        return Message(other, self)

    def __repr__(self) -> str:
        return f"Message({', '.join(map(repr, self.parts))})"

    def __reduce__(self) -> tuple[Any, ...]:  # across processes (a warning from a child)
        return (Message, self.parts)


def setting(field: str) -> Message:
    """A message naming the setting ``field`` (``"runtime.slots"``); add text with ``+``."""
    return Message(Setting(field))


def join(separator: str, messages: Iterable[str]) -> Message:
    """``separator.join(messages)``, keeping the settings the messages name."""
    parts: list[Part] = []
    for i, message in enumerate(messages):
        if i:
            parts.append(separator)
        parts.append(message)
    return Message(*parts)


def as_message(text: str) -> Message:
    """``text`` as a Message: a Message as it is, a plain string as text naming no setting."""
    return text if isinstance(text, Message) else Message(text)


def render(text: str, name: Callable[[str], str]) -> str:
    """``text`` with the settings it names rendered by ``name`` (plain text: as it is)."""
    return as_message(text).render(name)


def _field(field: str) -> str:
    return field


def _join(parts: Iterable[Part], name: Callable[[str], str]) -> str:
    return "".join(name(p.field) if isinstance(p, Setting) else p for p in parts)
