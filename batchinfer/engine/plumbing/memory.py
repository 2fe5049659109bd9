"""The shared memory of one run: its owner lock, input slots, status board and output slots
(and, for detection runs, each slot's letterbox geometry: engine/detection.py).

Layout of the status board: one row per (core worker, instance), N per instance for a
batch-N model (engine/batching.py), cores in the order of the plan, then one row per reader.
Creation and removal follow the NOTE in slots.py.
"""

from __future__ import annotations

from batchinfer.engine.detection import GEOMETRY_LAYOUT
from batchinfer.engine.plumbing.janitor import Janitor
from batchinfer.engine.slots import (
    BoardSpec,
    RegionSpec,
    RunOwner,
    SlotRegion,
    StatusBoard,
    TensorLayout,
    new_run_token,
    segment_name,
)


class RunMemory:
    """Creates (and alone unlinks) every segment of one run."""

    def __init__(
        self,
        slots: int,
        layout: TensorLayout,
        cores: tuple[int, ...],
        instances: int,
        readers: int,
        geometry: bool = False,
    ) -> None:
        self.slots = slots
        self.cores = cores
        self.instances = instances
        self.token = new_run_token()
        self.janitor: Janitor | None = Janitor()
        self.owner: RunOwner | None = None
        self.inputs: SlotRegion | None = None
        self.board: StatusBoard | None = None
        self.outputs: SlotRegion | None = None
        self.geometry: SlotRegion | None = None
        try:
            roles = ("owner", "in", "board", "out") + (("geo",) if geometry else ())
            for role in roles:  # before they exist: no gap
                self.janitor.watch(segment_name(self.token, role))
            self.owner = RunOwner(self.token)
            # One view per model input in each slot (EnginePlan.input_layout).
            self.inputs = SlotRegion.create(
                RegionSpec(segment_name(self.token, "in"), slots, layout)
            )
            rows = len(cores) * instances + readers
            self.board = StatusBoard.create(BoardSpec(segment_name(self.token, "board"), rows))
            if geometry:
                self.geometry = SlotRegion.create(
                    RegionSpec(segment_name(self.token, "geo"), slots, GEOMETRY_LAYOUT)
                )
        except BaseException:
            self.close()
            raise

    def worker_rows(self, core: int) -> slice:
        """The board rows of ``core``'s instances."""
        first = self.cores.index(core) * self.instances
        return slice(first, first + self.instances)

    def reader_row(self, reader: int) -> int:
        return len(self.cores) * self.instances + reader

    def create_outputs(self, shapes: list[tuple[tuple[int, ...], str]]) -> SlotRegion:
        """The output slots, once the first core worker has said what the model returns."""
        layout = TensorLayout(tuple(s for s, _ in shapes), tuple(d for _, d in shapes))
        self.outputs = SlotRegion.create(
            RegionSpec(segment_name(self.token, "out"), self.slots, layout)
        )
        return self.outputs

    def close(self) -> None:
        """Close and unlink everything (only after every child is gone: NOTE, step 4)."""
        for region in (self.inputs, self.outputs, self.geometry):
            if region is not None:
                region.close(unlink=True)
        if self.board is not None:
            self.board.close(unlink=True)
        if self.owner is not None:
            self.owner.close()
        if self.janitor is not None:
            self.janitor.close()
        self.inputs = self.outputs = self.board = self.owner = self.janitor = None
        self.geometry = None
