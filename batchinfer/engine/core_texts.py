"""The engine loop's texts: how it names cores (and the places of keys), groups the ones
that failed alike, and says that readers kept dying."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from batchinfer.engine.pools import Where
from batchinfer.errors import RunFailedError
from batchinfer.messages import Message, join, setting
from batchinfer.runtime.adapter import CoreReason
from batchinfer.sink.stats import place_name


def place_text(where: Where) -> str:
    """A key's core as texts name it: "core 2", "core 2 of node b"."""
    return f"core {where.core}" if where.node is None else f"core {where.core} of node {where.node}"


def worker_text(where: Where) -> str:
    """A key's worker: its core, and its instance when a key is one instance of several."""
    text = place_text(where)
    return text if where.instance is None else f"{text} (instance {where.instance})"


def label(where: Where) -> int | str:
    """How the result names a key's place: its core on a board, node:core on a cluster."""
    return where.core if where.node is None else place_name(where.node, where.core)


def cores_of(where: Callable[[int], Where], keys: Iterable[int]) -> list[int]:
    """The cores of ``keys``, each once (a cluster's keys share core numbers)."""
    return sorted({where(k).core for k in keys})


def nodes_of(where: Callable[[int], Where], keys: Iterable[int]) -> list[str]:
    """The nodes of ``keys``, each once: none on a board."""
    return sorted({n for n in (where(k).node for k in keys) if n})


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
    return f"{cores_text(cores)}: " + text


def cores_text(cores: list[int]) -> str:
    """ "core 2", "cores 0, 2"."""
    return f"core {cores[0]}" if len(cores) == 1 else f"cores {', '.join(map(str, cores))}"


def nodes_text(nodes: list[str]) -> str:
    """ "node a", "nodes a, b"."""
    return f"node{'s' if len(nodes) > 1 else ''} {', '.join(nodes)}"


def held_text(reason: CoreReason, cores: list[int], nodes: list[str]) -> Message:
    """Cores (of several keys, on ``nodes`` on a cluster) retired alike while the others
    started: "cores 0, 2 retired: ...", with the advice to leave them out."""
    which = cores_text(cores) + (f" of {nodes_text(nodes)}" if nodes else "")
    return f"{which} retired: " + for_cores(reason, cores, advice=True)


def no_core_text(
    retired: dict[int, CoreReason],
    workers: int,
    where: Callable[[int], Where],
    warnings: list[Message],
) -> str:
    """Why no core of ``workers`` started, given why each of ``retired`` was retired (and
    ``where`` each key is). Cores that all failed the same way (a model the runtime refuses, a
    missing driver) are said once, without the advice to leave one core out, which cannot
    help; else every warning of the start-up."""
    if len(retired) > 1 and workers == len(retired):
        groups = alike(retired)
        if len(groups) == 1:
            ((reason, keys),) = groups.items()
            return for_cores(reason, cores_of(where, keys), advice=False)
    return join("; ", warnings) or "every worker exited during start-up"


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
