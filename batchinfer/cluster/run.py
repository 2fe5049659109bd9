"""The main job on a Ray cluster: plan, connect, claim OUT, run with the cluster's engine.

The same steps as :func:`batchinfer.engine.run` (engine/runner.py), with the engine swapped:
the run folder, its manifest, parts, stats, resume and locking are the single-board ones,
so a cluster run's output is read, evaluated and resumed like any other (on one board or
on a cluster). The manifest adds ``cluster``: the address, where the dataset was read and
the nodes with their cores.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from batchinfer.cluster.connect import (
    ClusterLostError,
    NodeInfo,
    RayConnection,
    check_shared_dataset,
)
from batchinfer.cluster.driver import ClusterEngine
from batchinfer.cluster.nodes import check_data_mode, usable_nodes
from batchinfer.engine.events import Observer
from batchinfer.engine.planning.config import RunConfig
from batchinfer.engine.planning.instances import refuse_on_cluster
from batchinfer.engine.planning.interface import EnginePlan
from batchinfer.engine.planning.plan import RunPlan, plan_run
from batchinfer.engine.plumbing.signals import StopSignals
from batchinfer.engine.runner import RunResult, arrow_system_allocator, run_plan
from batchinfer.engine.sources import ItemSource
from batchinfer.errors import UsageError
from batchinfer.messages import setting
from batchinfer.sink.out_lock import refuse_if_held
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
    failures are error rows. A cluster that stops answering mid-run raises ClusterLostError
    (exit 3) once the rows done are written and the manifest says ``interrupted``.
    """
    if config.output.out is not None:  # the early refusal, before Ray is started
        refuse_if_held(config.output.out)
    with arrow_system_allocator(), StopSignals() as signals:
        # With shared data the nodes read the files (check_shared_dataset asks each for the
        # first), which this machine may not mount.
        plan = plan_run(config, listing=listing, files_here=data != "shared")
        check_one_input(plan.engine)
        with connect_cluster(address, plan.engine, signals, data) as cluster:
            if data == "shared":
                check_shared_dataset(
                    cluster.nodes, plan.dataset, plan.config.reliability.startup_timeout_s
                )

            def make_engine(
                plan: RunPlan,
                source: ItemSource,
                sink: RowSink,
                observers: list,
                invocation: int,
            ) -> ClusterEngine:
                return cluster.engine(plan.engine, source, sink, observers, invocation)

            fields = {"cluster": cluster.facts(plan.engine.cores)}
            try:
                return run_plan(plan, signals, observers, make_engine, fields)
            except ClusterLostError as e:
                raise ClusterLostError(
                    e.message + "; the rows done until then are written and the run is marked "
                    "interrupted",
                    out=plan.out.path,
                ) from e


def check_one_input(plan: EnginePlan) -> None:
    """UsageError for a plan whose model inputs are fed separately: Ray's readers ship one
    tensor per item (cluster/actors.py), not one per input (batchinfer.data.feeds)."""
    if plan.feeds:
        raise UsageError(
            setting("ray") + " feeds one tensor per item, and this run feeds the model's inputs "
            "separately (several inputs, .npz items or "
            + setting("preprocess.inputs")
            + "); run it without "
            + setting("ray")
            + "."
        )


@dataclass(frozen=True)
class ClusterSession:
    """A connected cluster, ready to run engines: its usable nodes and the driver's node."""

    address: str
    data: str
    nodes: list[NodeInfo]
    head_node_id: str

    def engine(
        self,
        plan: EnginePlan,
        source: ItemSource,
        sink: RowSink,
        observers: Sequence[Observer] = (),
        invocation: int = 0,
    ) -> ClusterEngine:
        """A ClusterEngine over these nodes, its core stats keyed by (node, core)."""
        check_one_input(plan)
        places = [(n.name, c) for n in self.nodes for c in plan.cores if c in n.cores]
        stats = CoreStatsRecorder(places, plan.instances_per_core, invocation)
        return ClusterEngine(
            plan,
            source,
            sink,
            self.nodes,
            observers,
            stats,
            data=self.data,
            head_node_id=self.head_node_id,
        )

    def facts(self, cores: Sequence[int]) -> dict[str, Any]:
        """Where it ran, for a manifest or a record: address, data mode, nodes and cores."""
        return {
            "address": self.address,
            "data": self.data,
            "nodes": [
                {
                    "name": n.name,
                    "node_id": n.node_id,
                    "address": n.address,
                    "cores": [c for c in n.cores if c in cores],
                }
                for n in self.nodes
            ],
        }


@contextlib.contextmanager
def connect_cluster(
    address: str, plan: EnginePlan, signals: StopSignals | None = None, data: str = "head"
) -> Iterator[ClusterSession]:
    """Connect to (or, for ``local:N``, start) the cluster for ``plan``'s cores.

    ``signals`` get their handlers back after ``ray.init`` (which sets its own SIGTERM
    handler). Raises UsageError for a bad ``data``, NoCoreError when no node declares one
    of the plan's cores, RunFailedError when the cluster cannot be reached.
    """
    check_data_mode(data)
    refuse_on_cluster(plan)
    with RayConnection(address, plan.backend.cores()) as connection:
        if signals is not None:
            signals.reinstall()
        nodes = usable_nodes(connection.nodes(), plan.cores)
        yield ClusterSession(address, data, nodes, connection.driver_node_id())
