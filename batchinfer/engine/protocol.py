"""The messages between the coordinator and its children (readers, core workers): one
NamedTuple per kind, so a receiver dispatches on the type (``match msg: case Done(...)``)
and a type checker sees each field.

The protocol itself (who sends what, when, and what each field means) is written down once,
at the top of engine/reader.py and engine/worker.py, in these types' names
(tests/test_protocol.py checks that each type is named there).

On the wire a message is a plain tuple, (its kind's number in KINDS, *its fields):
:func:`encode` on the way in (ChildPool.send, child.send_or_exit), :func:`decode` on the way
out (ChildPool.poll, the children's task pipes). Pickling a NamedTuple names its class,
which costs 1-2 us more per message to pickle and ~1 us more to unpickle than the tuple
(+0.010 ms of coordinator CPU per item at npu 0.5 ms, tools/cpu_by_role.py); the number
costs next to nothing. Tuples that are not engine messages (the thumbnail maker's, the
probe's) start with a string and pass through both unchanged. The records inside a batch
(a reader's reads, a worker's results) stay plain tuples: they are made per item.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from batchinfer.engine.slots import RegionSpec
    from batchinfer.runtime.adapter import CoreReason

# ------------------------------------------------------------------ either child
ReadTask = tuple  # (slot, index, path, id, member, values): one item to decode (reader.py)
ReadResult = tuple  # (slot, index, read_ms, error or None): one decoded item (reader.py)
InferResult = tuple  # (slot, index, instance, t_start, t_end, error, boxes): one inference


class Stop(NamedTuple):
    """coordinator -> child: finish, release, exit."""


class Failed(NamedTuple):
    """child -> coordinator: start-up failed (engine/child.py report_failure); then exit."""

    traceback: str


# ------------------------------------------------------------------ readers
class Read(NamedTuple):
    """coordinator -> reader: decode these, in order."""

    items: list[ReadTask]


class ReaderReady(NamedTuple):
    """reader -> coordinator: imports done, segments mapped."""

    pid: int
    cpu_s: float


class Loaded(NamedTuple):
    """reader -> coordinator: items decoded into their slots (or their errors)."""

    items: list[ReadResult]
    cpu_s: float


# ------------------------------------------------------------------ core workers
class InitFailed(NamedTuple):
    """worker -> coordinator: a runtime could not start; then exit."""

    reason: CoreReason


class Initialised(NamedTuple):
    """worker -> coordinator: runtimes up; the canary runs next."""


class WorkerReady(NamedTuple):
    """worker -> coordinator: canary done."""

    sdk_version: str | None
    outputs: list[tuple[tuple[int, ...], str]]  # (shape, dtype) of each output
    canary: list[Any]  # the canary's outputs (numpy arrays)
    pid: int
    cpu_s: float  # start-up's share, kept apart from the run's


class Attach(NamedTuple):
    """coordinator -> worker: the output slots; once, before any task."""

    outputs: RegionSpec


class Infer(NamedTuple):
    """coordinator -> worker: infer these slots."""

    tasks: list[tuple[int, int]]  # (slot, index)


class Done(NamedTuple):
    """worker -> coordinator: results of finished inferences."""

    results: list[InferResult]
    busy_s: float
    cpu_s: float


#: Every message kind, in wire order (tests: each round-trips, each is named in its
#: protocol table). Append new kinds at the end.
KINDS: tuple[type, ...] = (
    Stop,
    Failed,
    Read,
    ReaderReady,
    Loaded,
    InitFailed,
    Initialised,
    WorkerReady,
    Attach,
    Infer,
    Done,
)

ToReader = Read | Stop
FromReader = ReaderReady | Loaded | Failed
ToWorker = Attach | Infer | Stop
FromWorker = InitFailed | Failed | Initialised | WorkerReady | Done

_CODE: dict[type, int] = {kind: i for i, kind in enumerate(KINDS)}


def encode(msg: tuple) -> tuple:
    """``msg`` as it travels: (kind number, *fields); a tuple of no kind, as it is."""
    code = _CODE.get(type(msg))
    return msg if code is None else (code, *msg)


def decode(wire: tuple) -> Any:
    """The message :func:`encode` made ``wire`` from (a tuple of no kind, as it is)."""
    code = wire[0] if wire else None
    if type(code) is not int:
        return wire
    return tuple.__new__(KINDS[code], wire[1:])
