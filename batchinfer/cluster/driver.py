"""The Ray driver's engine: the engine loop (engine/loop.py) over a :class:`RayPool`.

:class:`ClusterEngine` is :class:`batchinfer.engine.Engine` with its items run by Ray actors
on the NPU cores of a cluster's nodes (pool.py: the pool and the failure policy on Ray;
actors.py: what runs on the nodes), so the main job, bench and eval run on a cluster by
choosing this engine: the same source, row sink, observers, events, ``run()`` and
``request_stop()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from batchinfer.cluster.connect import ClusterLostError, NodeInfo
from batchinfer.cluster.nodes import DATA_MODES
from batchinfer.cluster.pool import CALL_ITEMS, RayPool
from batchinfer.engine import events as ev
from batchinfer.engine.loop import Engine
from batchinfer.engine.planning.interface import EnginePlan, EngineResult
from batchinfer.engine.sources import ItemSource
from batchinfer.sink.rows import RowSink
from batchinfer.sink.stats import CoreStatsRecorder

__all__ = ["CALL_ITEMS", "DATA_MODES", "ClusterEngine"]


class ClusterEngine(Engine):
    """Runs items from a source through the NPU cores of a Ray cluster into a sink.

    ``nodes``: the nodes to use (``RayConnection.nodes()``); ``data``: where read tasks run,
    ``head`` (on ``head_node_id``, the node this process is on: the dataset is there
    only) or ``shared`` (on every node: each mounts the dataset at the same path);
    ``call_items``: items per actor call at most.
    """

    def __init__(
        self,
        plan: EnginePlan,
        source: ItemSource,
        sink: RowSink,
        nodes: Sequence[NodeInfo],
        observers: Sequence[ev.Observer] = (),
        stats: CoreStatsRecorder | None = None,
        *,
        data: str = "head",
        head_node_id: str | None = None,
        call_items: int = CALL_ITEMS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ray_pool = RayPool(
            plan,
            source,
            nodes,
            data=data,
            head_node_id=head_node_id,
            call_items=call_items,
            clock=clock,
        )
        super().__init__(plan, source, sink, observers, stats, clock=clock, pool=self.ray_pool)

    def run(self) -> EngineResult:
        """As :meth:`Engine.run`; a cluster that stopped answering ends the run
        ``interrupted``: what is written stands, and ``--resume`` continues it."""
        result = super().run()
        if isinstance(result.error, ClusterLostError):
            result.status = "interrupted"
        return result
