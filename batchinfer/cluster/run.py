"""The main job on a Ray cluster: plan, connect, claim OUT, run with the cluster's engine.

The same steps as :func:`batchinfer.engine.run` (engine/runner.py), with the engine swapped:
the run folder, its manifest, parts, stats, resume and locking are the single-board ones,
so a cluster run's output is read, evaluated and resumed like any other (on one board or
on a cluster). The manifest adds ``cluster``: the address, where the dataset was read and
the nodes with their cores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from batchinfer.cluster.connect import NodeInfo, RayConnection, check_shared_dataset
from batchinfer.cluster.driver import DATA_MODES, ClusterEngine
from batchinfer.engine.config import RunConfig
from batchinfer.engine.events import Observer
from batchinfer.engine.plan import RunPlan, plan_run
from batchinfer.engine.runner import RunResult, arrow_system_allocator, run_plan
from batchinfer.engine.signals import StopSignals
from batchinfer.engine.sources import ItemSource
from batchinfer.errors import NoCoreError, UsageError
from batchinfer.sink.rows import RowSink
from batchinfer.sink.stats import CoreStatsRecorder


def run_on_cluster(
    config: RunConfig,
    address: str,
    observers: Sequence[Observer] = (),
    *,
    data: str = "head",
    listing: Callable[[int], None] | None = None,
) -> RunResult:
    """Run a model over a dataset folder on the NPU cores of a Ray cluster into a run folder.

    ``address``: ``auto`` or ``HOST:PORT`` (a running cluster; call this on its head node),
    ``local`` or ``local:N`` (N simulated nodes on this machine, stopped at the end).
    ``data``: ``head`` (the dataset is read on this node and its tensors shipped through
    Ray's object store) or ``shared`` (every node mounts it at the same path and reads its
    share). ``listing`` as for :func:`batchinfer.engine.run`, which this raises like; item
    failures are error rows.
    """
    if data not in DATA_MODES:
        raise UsageError(f"{{ray_data}} must be one of {', '.join(DATA_MODES)}, not {data!r}.")
    with arrow_system_allocator(), StopSignals() as signals:
        plan = plan_run(config, listing=listing)
        with RayConnection(address, plan.backend.cores()) as connection:
            signals.reinstall()  # ray.init set its own SIGTERM handler
            nodes = usable_nodes(connection.nodes(), plan.engine.cores)
            if data == "shared":
                check_shared_dataset(nodes, plan.dataset, plan.config.reliability.startup_timeout_s)
            head = connection.driver_node_id()

            def make_engine(
                plan: RunPlan,
                source: ItemSource,
                sink: RowSink,
                observers: list,
                invocation: int,
            ) -> ClusterEngine:
                k = plan.engine.instances_per_core
                places = [(n.name, c) for n in nodes for c in plan.engine.cores if c in n.cores]
                stats = CoreStatsRecorder(places, k, invocation)
                return ClusterEngine(
                    plan.engine,
                    source,
                    sink,
                    nodes,
                    observers,
                    stats,
                    data=data,
                    head_node_id=head,
                )

            fields = {
                "cluster": {
                    "address": address,
                    "data": data,
                    "nodes": [
                        {
                            "name": n.name,
                            "node_id": n.node_id,
                            "address": n.address,
                            "cores": [c for c in n.cores if c in plan.engine.cores],
                        }
                        for n in nodes
                    ],
                }
            }
            return run_plan(plan, signals, observers, make_engine, fields)


def usable_nodes(nodes: list[NodeInfo], cores: Sequence[int]) -> list[NodeInfo]:
    """The nodes that declare at least one of ``cores``; NoCoreError when there is none."""
    usable = [n for n in nodes if set(n.cores) & set(cores)]
    if not usable:
        wanted = ", ".join(f"npu_core_{c}" for c in cores)
        raise NoCoreError(
            f"no node of the Ray cluster declares the NPU cores to use as resources ({wanted}); "
            "start each board with ray start --resources (README: Scale-out on Ray)."
        )
    return usable
