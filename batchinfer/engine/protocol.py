"""The messages between the coordinator and its children (readers, core workers): one
NamedTuple per kind, so a receiver dispatches on the type (``match msg: case Done(...)``)
and a type checker sees each field.

The protocol itself (who sends what, when, and what each field means) is written down once,
at the top of engine/board/reader.py and engine/board/worker.py, in these types' names
(tests/test_protocol.py checks that each type is named there).

On the wire a message is a plain tuple, (its kind's number in KINDS, *its fields):
:func:`encode` on the way in (ChildPool.send, child.send_or_exit), :func:`decode` on the way
out (ChildPool.poll, the children's task pipes). Pickling a NamedTuple names its class,
which costs 1-2 us more per message to pickle and ~1 us more to unpickle than the tuple
(+0.010 ms of coordinator CPU per item at npu 0.5 ms, tools/cpu_by_role.py); the number
costs next to nothing. Tuples that are not engine messages (the thumbnail maker's, the
probe's) start with a string and pass through both unchanged.

The records inside a batch (a reader's tasks and reads, a worker's tasks and results) are
NamedTuples too, so each field is named and typed where it is made and read. They travel
as what they are (pickle names a record's class once per message, then refers to it); what
that costs per item was within the noise of tools/cpu_by_role.py against plain tuples
(emulator, npu 1 and 2 ms, 11 repeats, load 8-11: coordinator medians 0.119 -> 0.126 and
0.126 -> 0.130 ms per item, runs spread over +-0.02 ms; core workers 0.277 -> 0.273 and
0.289 -> 0.309 ms).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from batchinfer.data.dataset import Locator
    from batchinfer.engine.slots import RegionSpec
    from batchinfer.runtime.adapter import CoreReason
    from batchinfer.tasks import Decoded


# ------------------------------------------------------------------ records in a batch
class ReadTask(NamedTuple):
    """One item for a reader to decode into its slot (board/reader.py)."""

    slot: int
    item_index: int  # the item's place in the dataset (a field named index would hide tuple's)
    path: str
    id: str  # names the file in errors
    locator: Locator | None  # where the item is inside the file at path (Item.member)
    values: tuple | None  # the item's value of each manifest column that feeds an input


class ReadResult(NamedTuple):
    """One item a reader decoded (or could not: ``error``)."""

    slot: int
    item_index: int
    read_ms: float
    error: str | None


class InferTask(NamedTuple):
    """One item for a core worker to infer (board/worker.py)."""

    slot: int
    item_index: int


class InferResult(NamedTuple):
    """One item a core worker inferred, times on its clock (CLOCK_MONOTONIC, the
    coordinator's too); ``error`` None: its outputs are in the slot's output region;
    ``decoded``: a task's payload when the task decodes in the worker, else None."""

    slot: int
    item_index: int
    instance: int
    t0: float
    t1: float
    error: str | None
    decoded: Decoded | None


#: The records, which travel inside messages (tests: each round-trips).
RECORDS: tuple[type, ...] = (ReadTask, ReadResult, InferTask, InferResult)


# ------------------------------------------------------------------ either child
class Stop(NamedTuple):
    """coordinator -> child: finish, release, exit."""


class Failed(NamedTuple):
    """child -> coordinator: start-up failed (engine/plumbing/child.py report_failure);
    then exit."""

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

    tasks: list[InferTask]


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


def until_stop(tasks: Connection) -> Iterator[Any]:
    """A child's messages on its task pipe, decoded, until Stop or until the pipe closes
    (the coordinator is gone): either ends the child's loop."""
    while True:
        try:
            msg = decode(tasks.recv())
        except (EOFError, OSError):
            return
        if isinstance(msg, Stop):
            return
        yield msg
