"""Scale-out on Ray: the same run over a fleet of boards.

Each node (board) declares its NPU cores as Ray custom resources (connect.py); a Ray actor
holds one runtime instance pinned to one core (actors.py); the engine's one loop drives
them through a worker pool (pool.py: :class:`RayPool`, the failure policy on Ray), with the
single-board scheduler and collector (driver.py: :class:`ClusterEngine`), so items keep the
single-board semantics (an error row per bad item, retries on another core, exactly one row
each); run.py writes the same run folder as a single-board run.

    from batchinfer.cluster import run_on_cluster
    result = run_on_cluster(config, "local:3")          # or "auto" on a cluster's head node

``batchinfer eval`` runs its device side through :func:`connect_cluster` and
:meth:`ClusterSession.engine`: a :class:`ClusterEngine` takes any item source, row sink and
observers, like :class:`batchinfer.engine.Engine` (docs/guide/ray.md).
"""

from batchinfer.cluster.connect import (
    ClusterLostError,
    NodeInfo,
    RayConnection,
)
from batchinfer.cluster.driver import CALL_ITEMS, DATA_MODES, ClusterEngine
from batchinfer.cluster.nodes import usable_nodes
from batchinfer.cluster.resources import core_resource, node_resources
from batchinfer.cluster.run import ClusterSession, connect_cluster, run_on_cluster

__all__ = [
    "CALL_ITEMS",
    "DATA_MODES",
    "ClusterEngine",
    "ClusterLostError",
    "ClusterSession",
    "NodeInfo",
    "RayConnection",
    "connect_cluster",
    "core_resource",
    "node_resources",
    "run_on_cluster",
    "usable_nodes",
]
