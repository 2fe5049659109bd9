"""The Ray pool's nodes: their set-up, where actors and read tasks run, and the node watch.

:class:`ClusterNodes` is owned by :class:`batchinfer.cluster.pool.RayPool` and holds what
concerns whole nodes, never single actors or items:

- set-up: the shared dataset's check (``--ray-data shared``), one NodeHost per node (its
  ``begin`` gives the node's per-run backend; actors.py has the protocol) and its undoing
  (``end``); a node whose set-up fails is left out;
- placement: each core actor pinned to its node with its core's resource, each read lane
  on the head node (``head``) or spread over the nodes (``shared``);
- the node watch: which nodes the GCS still lists alive (asked once a second by the pool's
  ``check``, and whenever an actor dies), and the cluster lost once the GCS has been
  silent for _GCS_LOST_S.

A node that takes no part from now on (left out, or left the cluster) is said once; its
actors are the pool's, so the pool retires them through ``retire_node``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from batchinfer.cluster.actors import CoreActor, NodeHost, model_files
from batchinfer.cluster.connect import (
    GCS_TIMEOUT_S,
    ClusterLostError,
    NodeInfo,
    check_shared_dataset,
    live_node_ids,
)
from batchinfer.cluster.resources import core_resource
from batchinfer.engine.planning.interface import EnginePlan
from batchinfer.engine.pools import PoolEvent, Said
from batchinfer.engine.sources import ItemSource
from batchinfer.errors import NoCoreError, UsageError
from batchinfer.messages import setting
from batchinfer.runtime.backends import Backend

#: Where read tasks run: on the head node only, or on every node (each mounts the dataset).
DATA_MODES = ("head", "shared")
_NODE_CHECK_S = 1.0
#: How long the actors' stops and the hosts' ends are waited for, at the end.
STOP_WAIT_S = 2.0
# The GCS gave no answer for this long: the cluster is lost (Ray itself waits 60 s, then
# ends the process, leaving the run folder unfinished).
_GCS_LOST_S = 5.0

#: Retire a node's actors (quietly) for the reason given; the events that says.
RetireNode = Callable[[NodeInfo, str], list[PoolEvent]]


def check_data_mode(data: str) -> None:
    """UsageError unless ``data`` is one of DATA_MODES."""
    if data not in DATA_MODES:
        raise UsageError(
            setting("ray_data") + f" must be one of {', '.join(DATA_MODES)}, not {data!r}."
        )


class ClusterNodes:
    """The nodes of a run (see the module docstring): ``usable``, those of ``nodes`` that
    declare cores to use (NoCoreError when none does); ``data`` and ``head_node_id`` as
    :class:`RayPool` has them."""

    def __init__(
        self,
        ray: Any,
        plan: EnginePlan,
        nodes: Sequence[NodeInfo],
        data: str,
        head_node_id: str | None,
        *,
        clock: Callable[[], float],
        retire_node: RetireNode,
    ) -> None:
        self.ray = ray
        self.plan = plan
        self.usable = usable_nodes(nodes, plan.cores)
        self.data = data
        self.head_node_id = head_node_id
        self.clock = clock
        self.retire_node = retire_node
        self.hosts: dict[str, Any] = {}
        self.backends: dict[str, Backend] = {}
        self.lost: set[str] = set()
        self._actor_cls: Any = None
        self._next_check = 0.0
        self._gcs_silent_since: float | None = None

    def places(self) -> list[tuple[NodeInfo, int, int]]:
        """(node, core, instance) of each actor, in key order: by node, then core."""
        k = self.plan.instances_per_core
        cores = self.plan.cores
        return [(n, c, i) for n in self.usable for c in cores if c in n.cores for i in range(k)]

    def lanes_wanted(self) -> int:
        """How many read lanes: ``readers`` per node when each reads its own, else as many
        on one node (two at least)."""
        readers = self.plan.readers
        return readers * len(self.usable) if self.data == "shared" else max(2, readers)

    # ------------------------------------------------------------------ set-up
    def begin(self, source: ItemSource) -> list[PoolEvent]:
        """Set each node up (a NodeHost's ``begin``); the events of the nodes left out."""
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as Affinity

        limit = self.plan.reliability.startup_timeout_s
        dataset = getattr(source, "dataset", None)
        if source.needs_reader and self.data == "shared" and dataset is not None:
            check_shared_dataset(self.usable, dataset, limit)
        host_cls = ray.remote(num_cpus=0, max_restarts=0)(NodeHost)
        files = ray.put(model_files(self.plan.backend.model))  # for nodes without the model
        begins = {}
        for node in self.usable:
            host = host_cls.options(scheduling_strategy=Affinity(node.node_id, soft=False))
            self.hosts[node.node_id] = handle = host.remote(self.plan.backend)
            begins[node.node_id] = handle.begin.remote(files)
        events: list[PoolEvent] = []
        for node in self.usable:
            try:
                self.backends[node.node_id] = ray.get(begins[node.node_id], timeout=limit)
            except Exception as e:  # the node cannot take part; the others may
                said = f"node {node.name} is left out: its set-up failed ({short(e)})."
                events += self._leave_out(node, said, "its node's set-up failed")
        self._actor_cls = ray.remote(CoreActor)
        return events

    @property
    def names(self) -> tuple[str, ...]:
        """The names of the nodes set up."""
        return tuple(n.name for n in self.usable if n.node_id in self.backends)

    def core_actor(self, node: NodeInfo, core: int) -> Any:
        """A new core actor on ``node`` pinned to ``core``; None when the node is not set
        up (it was left out, its actors retired with it)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as Affinity

        backend = self.backends.get(node.node_id)
        if backend is None:
            return None
        plan = self.plan
        # A task that decodes in the workers decodes in the actors (actors.py).
        return self._actor_cls.options(
            num_cpus=0,
            resources={core_resource(core): 1.0 / plan.instances_per_core},
            scheduling_strategy=Affinity(node.node_id, soft=False),
            max_restarts=-1,
            max_task_retries=0,
        ).remote(
            backend, core, plan.preprocess.layout, plan.worker_task, plan.save_outputs, plan.batch
        )

    def lanes(self, count: int) -> list[tuple[Any, str | None]]:
        """Where each of ``count`` read lanes runs: (scheduling strategy, node id or None)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as Affinity

        head = self.head_node_id
        lanes: list[tuple[Any, str | None]] = []
        for lane in range(count):
            if self.data == "head" and head is not None:
                lanes.append((Affinity(head, soft=False), head))
            elif self.data == "shared":
                node_id = self.usable[lane % len(self.usable)].node_id
                lanes.append((Affinity(node_id, soft=True), node_id))
            else:
                lanes.append(("DEFAULT", None))
        return lanes

    def end(self, live: Sequence[Any], actors: Sequence[Any]) -> None:
        """Stop the core ``actors`` (``live``, those asked to stop first, get STOP_WAIT_S),
        then undo each node's set-up that is still there (its host's ``end``) and stop the
        hosts."""
        ray = self.ray
        stops = []
        for handle in live:
            with contextlib.suppress(Exception):
                stops.append(handle.stop.remote())
        if stops:
            with contextlib.suppress(Exception):
                ray.wait(stops, num_returns=len(stops), timeout=STOP_WAIT_S)
        for handle in actors:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
        ends = {}
        for node_id, host in self.hosts.items():
            if node_id in self.backends and node_id not in self.lost:
                with contextlib.suppress(Exception):
                    ends[node_id] = host.end.remote()
        if ends:
            with contextlib.suppress(Exception):
                ray.wait(list(ends.values()), num_returns=len(ends), timeout=STOP_WAIT_S)
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                ray.kill(host, no_restart=True)

    # ------------------------------------------------------------------ the watch
    def watch(self, now: float) -> list[PoolEvent]:
        """Once a second: the nodes that left the cluster since (see :meth:`lost_node`)."""
        events: list[PoolEvent] = []
        if now >= self._next_check:
            self._next_check = now + _NODE_CHECK_S
            alive = self.live()
            for node in self.usable:
                if alive is not None and node.node_id not in alive:
                    events += self.lost_node(node)
        return events

    def gone(self, node: NodeInfo) -> bool:
        """Whether ``node`` has left the cluster (asks the GCS unless that is known)."""
        if node.node_id in self.lost:
            return True
        alive = self.live()
        return alive is not None and node.node_id not in alive

    def lane_gone(self, node_id: str | None) -> bool:
        """Whether the node a read lane reads on (if any, and one of the run's) has left."""
        return node_id is not None and any(
            n.node_id == node_id and self.gone(n) for n in self.usable
        )

    def live(self) -> set[str] | None:
        """The live nodes' ids; None while the GCS is silent; ClusterLostError once it has
        been silent for _GCS_LOST_S."""
        alive = live_node_ids(self.ray, GCS_TIMEOUT_S)
        if alive is not None:
            self._gcs_silent_since = None
            return alive
        now = self.clock()
        if self._gcs_silent_since is None:
            self._gcs_silent_since = now - GCS_TIMEOUT_S  # asked that long ago
        silent = now - self._gcs_silent_since
        if silent >= _GCS_LOST_S:
            raise ClusterLostError(
                f"the Ray cluster stopped answering: its GCS{_gcs_address(self.ray)} (the "
                f"gcs_server of the head node) gave no answer for {silent:.0f} s"
            )
        return None

    def lost_node(self, node: NodeInfo) -> list[PoolEvent]:
        """``node`` left the cluster: said once; its actors are retired (quietly), their
        items go back uncharged."""
        if node.node_id in self.lost:
            return []
        return self._leave_out(
            node,
            f"node {node.name} left the cluster: its cores are retired and their items go to "
            "the other nodes.",
            "its node left the cluster",
        )

    def _leave_out(self, node: NodeInfo, said: str, why: str) -> list[PoolEvent]:
        """``node`` takes no part from now on: ``said`` once, its actors retired quietly."""
        self.lost.add(node.node_id)
        return [Said(said), *self.retire_node(node, why)]


def _gcs_address(ray: Any) -> str:
    """`` at HOST:PORT``, or nothing when Ray does not say."""
    try:
        return f" at {ray.get_runtime_context().gcs_address}"
    except Exception:
        return ""


def short(exc: BaseException) -> str:
    """The last line of an exception's text (Ray's carry the remote traceback)."""
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def usable_nodes(nodes: Sequence[NodeInfo], cores: Sequence[int]) -> list[NodeInfo]:
    """The nodes that declare at least one of ``cores``; NoCoreError when there is none."""
    usable = [n for n in nodes if set(n.cores) & set(cores)]
    if not usable:
        wanted = ", ".join(f"npu_core_{c}" for c in cores)
        raise NoCoreError(
            f"no node of the Ray cluster declares the NPU cores to use as resources ({wanted}); "
            "start each board with ray start --resources (docs/guide/ray.md)."
        )
    return usable
