"""The messages between the coordinator and its children (engine/protocol.py): each kind
crosses a pipe intact, and the protocol tables (reader.py, worker.py) name every kind."""

from __future__ import annotations

import ast
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from batchinfer.engine import protocol
from batchinfer.engine.protocol import (
    KINDS,
    RECORDS,
    InferResult,
    InferTask,
    ReadResult,
    ReadTask,
    decode,
    encode,
)
from batchinfer.engine.slots import RegionSpec, TensorLayout
from batchinfer.engine.states import ChildState, CoreStatus, SlotState
from batchinfer.runtime.adapter import CoreReason

ROOT = Path(__file__).resolve().parents[1]
TABLES = ("batchinfer/engine/board/reader.py", "batchinfer/engine/board/worker.py")


def _sample(kind: type) -> Any:
    """An instance of ``kind`` with a plausible value in each field."""
    values = {
        "traceback": "Traceback ...\nValueError: x",
        "items": [ReadTask(0, 7, "a.png", "a.png", None, None)],
        "pid": 1234,
        "cpu_s": 0.5,
        "reason": CoreReason.of("the runtime said no"),
        "sdk_version": "2.3.0",
        "outputs": [((1, 10), "float32")],
        "canary": [np.arange(3, dtype=np.float32)],
        "tasks": [InferTask(0, 7), InferTask(1, 8)],
        "results": [InferResult(0, 7, 1, 0.1, 0.2, None, None)],
        "busy_s": 1.5,
    }
    if kind is protocol.Attach:
        return kind(RegionSpec("bi-test", 4, TensorLayout(((1, 10),), ("float32",))))
    if kind is protocol.Loaded:
        return kind([ReadResult(0, 7, 1.5, None), ReadResult(1, 8, 0.5, "cannot read")], 0.5)
    return kind(*(values[f] for f in kind._fields))


def test_every_kind_and_record_is_a_namedtuple_of_this_module() -> None:
    defined = {
        v for v in vars(protocol).values() if isinstance(v, type) and issubclass(v, tuple)
    } - {tuple}
    assert set(KINDS) | set(RECORDS) == defined
    assert not set(KINDS) & set(RECORDS)
    assert all(k.__module__ == protocol.__name__ for k in (*KINDS, *RECORDS))


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_every_kind_round_trips_through_pickle(kind: type) -> None:
    """Pickled as it is, and as it travels (encode, pickle, decode: what the pipes do)."""
    msg = _sample(kind)
    back = pickle.loads(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
    assert type(back) is kind
    assert repr(back) == repr(msg)
    wire = encode(msg)
    assert type(wire) is tuple  # no class named on the wire: it costs CPU per message
    travelled = decode(pickle.loads(pickle.dumps(wire, protocol=pickle.HIGHEST_PROTOCOL)))
    assert type(travelled) is kind
    assert repr(travelled) == repr(msg)


@pytest.mark.parametrize("kind", [protocol.Read, protocol.Loaded, protocol.Infer, protocol.Done])
def test_the_records_in_a_batch_arrive_as_their_named_types(kind: type) -> None:
    """A receiver reads each item's fields by name (``r.read_ms``), not by position."""
    msg = _sample(kind)
    travelled = decode(pickle.loads(pickle.dumps(encode(msg), protocol=pickle.HIGHEST_PROTOCOL)))
    (records,) = (f for f in travelled if isinstance(f, list))
    assert records and all(type(r) in RECORDS for r in records)
    assert records == next(f for f in msg if isinstance(f, list))


def test_tuples_of_no_kind_travel_unchanged() -> None:
    for other in [("ready",), ("made", "data:...", None), ("timings", 1.5), ()]:
        assert decode(encode(other)) == other


def test_the_protocol_tables_name_every_kind_and_no_other() -> None:
    """Each type (and record) is written as ``Name(`` in the docstring of reader.py or
    worker.py, so the tables cannot drift from the types."""
    text = "\n".join(ast.get_docstring(ast.parse((ROOT / p).read_text())) or "" for p in TABLES)
    named = set(re.findall(r"\b([A-Z]\w*)\(", text))
    assert named == {k.__name__ for k in (*KINDS, *RECORDS)}


def test_states_are_their_old_words() -> None:
    """A state compares equal to and prints as the string it replaced."""
    assert SlotState.READY == "ready" and f"{CoreStatus.RETIRED}" == "retired"
    assert str(ChildState.GONE) == "gone"
