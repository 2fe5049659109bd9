"""The engine loop's texts: how it names cores, groups the ones that failed alike, and
says that readers kept dying."""

from __future__ import annotations

from batchinfer.engine.pools import Where
from batchinfer.errors import RunFailedError
from batchinfer.messages import Message, setting
from batchinfer.runtime.adapter import CoreReason


def place_text(where: Where) -> str:
    """A key's core as texts name it: "core 2", "core 2 of node b"."""
    return f"core {where.core}" if where.node is None else f"core {where.core} of node {where.node}"


def worker_text(where: Where) -> str:
    """A key's worker: its core, and its instance when a key is one instance of several."""
    text = place_text(where)
    return text if where.instance is None else f"{text} (instance {where.instance})"


def alike(reasons: dict[int, CoreReason]) -> dict[CoreReason, list[int]]:
    """Keys grouped by reason: a reason names its core by a mark, so cores that failed
    alike have equal reasons."""
    groups: dict[CoreReason, list[int]] = {}
    for key in sorted(reasons):
        groups.setdefault(reasons[key], []).append(key)
    return groups


def for_cores(reason: CoreReason, cores: list[int], *, advice: bool) -> Message:
    """A reason from :func:`alike` said of ``cores``: with ``advice``, to leave them out
    where the reason advised it (not when every core failed: it cannot help then)."""
    text = reason.said(cores, advice=advice)
    if reason.names_core:
        return text
    every = f"core {cores[0]}" if len(cores) == 1 else f"cores {', '.join(map(str, cores))}"
    return f"{every}: " + text


def reader_deaths(deaths: int, last: Exception) -> RunFailedError:
    """The run's error when readers died too often with no file to blame."""
    return RunFailedError(
        f"readers died {deaths} times without a file to blame "
        f"(last: {last}); the machine may be out of memory: run with fewer "
        + setting("runtime.readers")
        + " or "
        + setting("runtime.slots")
        + ", then resume."
    )
