"""Reader processes: decode and preprocess dataset items straight into input slots.

Protocol (the types: protocol.py; slot life cycle: NOTE in slots.py; the coordinator's
side: engine/board/pool.py):
  reader -> coordinator  ReaderReady(pid, cpu_s)                 imports done, segments mapped
                         Loaded([ReadResult(slot, item_index, read_ms, error), ...], cpu_s)
                         error: None, or why the item cannot be read (its row)
                         cpu_s: the reader's CPU seconds so far (for CPU per item by role)
                         Failed(traceback)                        start-up failed; then exit
  coordinator -> reader  Read([ReadTask(slot, item_index, path, id, locator, values), ...])
                                  decode these, in order; id names the file in errors;
                                  locator: None, or where the item is inside the file at
                                  path (data/dataset.py Locator), which the data layer's
                                  load_into reads by; the reader keeps what makes the next
                                  read cheap open: the tar shard it last read (ShardFiles),
                                  a video range's decode (VideoFiles; the scheduler sends
                                  one group's items to one reader, Item.group);
                                  values: None, or the item's value of each manifest
                                  column that feeds a model input (feeds)
                         Stop()
Results go back in batches: after the last item of a task, or as soon as the oldest unsent
one is ``_SEND_AFTER_S`` old; a slow item (a large photo) goes back on its own at once.
While decoding an item the reader's row on the status board holds (index, start time):
that is how the coordinator tells a hung decode from a slow queue.
A model with several inputs (or .npz items, or inputs fed from manifest columns) has
``feeds``: the slot's input region holds one view per model input and each is written from
its own source (batchinfer.data.feeds); a fault in any is the item's error row.
Detection runs letterbox images: the reader also writes where each image went into the
slot's row of the geometry segment (engine/detection.py) before it reports Loaded, so
the core worker finds it there; the messages do not change.
A reader exits on Stop, when its pipe from the coordinator closes, or with the coordinator.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

from batchinfer.data.feeds import Feed, load_feeds
from batchinfer.data.preprocess import Preprocess, load_into
from batchinfer.data.shard_reading import ShardFiles
from batchinfer.data.video.frames import VideoFiles
from batchinfer.engine.detection import write_geometry
from batchinfer.engine.plumbing.child import cpu_seconds, report_failure, send_or_exit, setup_child
from batchinfer.engine.protocol import Loaded, ReaderReady, ReadResult, until_stop
from batchinfer.engine.slots import BoardSpec, RegionSpec, SlotRegion, StatusBoard
from batchinfer.errors import InputError

_SEND_AFTER_S = 0.005


@dataclass(frozen=True)
class ReaderSpec:
    """What one reader process needs; picklable (it travels to the forked child)."""

    reader_id: int
    board_row: int
    inputs: RegionSpec
    board: BoardSpec
    preprocess: Preprocess
    kind: str
    cpus: tuple[int, ...] | None
    parent_pid: int
    geometry: RegionSpec | None = None  # detection runs: where each image went
    feeds: tuple[Feed, ...] = ()  # one per model input, when fed separately
    column_base: str = ""  # relative paths in manifest columns are relative to this folder


def reader_main(spec: ReaderSpec, tasks: Connection, results: Connection) -> None:
    """Entry point of a reader process."""
    setup_child(spec.parent_pid, spec.cpus)
    try:
        # Normal priority: the coordinator lowers it once the cores are seen well fed
        # (Engine._yield_to_workers), never while decoding is what they wait for.
        inputs = SlotRegion.attach(spec.inputs)
        board = StatusBoard.attach(spec.board)
        geometry = SlotRegion.attach(spec.geometry) if spec.geometry is not None else None
    except BaseException as exc:
        report_failure(results, exc)
        return
    send_or_exit(results, ReaderReady(os.getpid(), cpu_seconds()))
    shards = ShardFiles()
    videos = VideoFiles()
    try:
        _serve(spec, inputs, board, tasks, results, geometry, shards, videos)
    finally:
        videos.close()
        shards.close()
        inputs.close()
        board.close()
        if geometry is not None:
            geometry.close()


def _serve(
    spec: ReaderSpec,
    inputs: SlotRegion,
    board: StatusBoard,
    tasks: Connection,
    results: Connection,
    geometry: SlotRegion | None = None,
    shards: ShardFiles | None = None,
    videos: VideoFiles | None = None,
) -> None:
    row = spec.board_row
    for msg in until_stop(tasks):
        done: list[ReadResult] = []
        first_unsent = 0.0
        for slot, index, path, item_id, locator, values in msg.items:
            t0 = time.perf_counter()
            board.start(row, index, time.monotonic())
            error: str | None = None
            try:
                if spec.feeds:
                    load_feeds(
                        spec.feeds,
                        path,
                        values,
                        inputs[slot],
                        spec.kind,
                        name=item_id,
                        base=spec.column_base,
                    )
                    placed = None
                else:
                    placed = load_into(
                        path,
                        spec.preprocess,
                        inputs[slot][0],
                        spec.kind,
                        name=item_id,
                        member=locator,
                        shards=shards,
                        videos=videos,
                    )
                if geometry is not None:
                    write_geometry(geometry[slot][0], placed)
            except InputError as e:
                # Its settings stay references (batchinfer.messages), so the row's error is
                # said as each front end names them (the CLI: --dtype).
                error = e.message
            except Exception as e:  # a decoder bug must not kill the run: it is this item's error
                error = f"cannot read {item_id}: {type(e).__name__}: {e}"
            board.finish(row)
            t1 = time.perf_counter()
            if not done:
                first_unsent = t1
            done.append(ReadResult(slot, index, (t1 - t0) * 1e3, error))
            # Slow items go back one by one (a message is cheap next to their decode); fast
            # ones in batches, none of them waiting more than _SEND_AFTER_S.
            if t1 - first_unsent >= _SEND_AFTER_S or t1 - t0 >= _SEND_AFTER_S:
                send_or_exit(results, Loaded(done, cpu_seconds()))
                done = []
        if done:
            send_or_exit(results, Loaded(done, cpu_seconds()))
