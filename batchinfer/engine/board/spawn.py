"""Starting children: the spec each one gets, and the deadline it has to get ready."""

from __future__ import annotations

from batchinfer.engine.board.reader import ReaderSpec, reader_main
from batchinfer.engine.board.worker import WorkerSpec, worker_main
from batchinfer.engine.planning.interface import EnginePlan
from batchinfer.engine.plumbing.children import Child, ChildPool
from batchinfer.engine.plumbing.memory import RunMemory
from batchinfer.engine.queue_depth import REFILL_AT
from batchinfer.engine.slots import BoardSpec, RegionSpec
from batchinfer.runtime.backends import Backend


def _shared(memory: RunMemory) -> tuple[RegionSpec, BoardSpec]:
    """The input slots' and status board's specs every child gets (RunMemory sets both up
    in __init__ and clears them only in close(), after every child is gone)."""
    inputs, board = memory.inputs, memory.board
    assert inputs is not None and board is not None, "the run's shared memory is closed"
    return inputs.spec, board.spec


def start_worker(
    pool: ChildPool, plan: EnginePlan, memory: RunMemory, backend: Backend, core: int
) -> Child:
    """Start the core worker of ``core`` (again, after a crash)."""
    inputs, board = _shared(memory)
    spec = WorkerSpec(
        core=core,
        board_row=memory.worker_rows(core).start,
        instances=plan.instances_per_core,
        backend=backend,
        inputs=inputs,
        board=board,
        input_layout=plan.data_format,
        cpus=plan.cpus,
        parent_pid=pool.parent_pid,
        refill_at=REFILL_AT * plan.item_lanes,
        task=plan.worker_task,
        geometry=memory.geometry.spec if memory.geometry is not None else None,
        save_outputs=plan.save_outputs,
        batch=plan.batch,
    )
    limit = plan.reliability.startup_timeout_s
    return pool.start(
        "worker",
        core,
        worker_main,
        spec,
        limit,
        f"loading the model took longer than {limit:g} s (the start-up timeout)",
    )


def start_reader(
    pool: ChildPool,
    plan: EnginePlan,
    memory: RunMemory,
    kind: str,
    reader: int,
    column_base: str = "",
) -> Child:
    """Start reader number ``reader`` (again, after it died or hung); ``column_base``: the
    folder relative paths in manifest columns are relative to."""
    inputs, board = _shared(memory)
    spec = ReaderSpec(
        reader_id=reader,
        board_row=memory.reader_row(reader),
        inputs=inputs,
        board=board,
        preprocess=plan.preprocess,
        kind=kind,
        cpus=plan.cpus,
        parent_pid=pool.parent_pid,
        geometry=memory.geometry.spec if memory.geometry is not None else None,
        feeds=plan.feeds,
        column_base=column_base,
    )
    limit = plan.reliability.startup_timeout_s
    return pool.start(
        "reader",
        reader,
        reader_main,
        spec,
        limit,
        f"starting took longer than {limit:g} s (the start-up timeout)",
    )
