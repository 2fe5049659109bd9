"""Connecting to Ray, and the NPU cores each node declares.

Every node of a batchinfer cluster declares its NPU cores as Ray custom resources, one
resource per core, one unit each::

    ray start --head --resources='{"npu_core_0": 1, "npu_core_1": 1, "npu_core_2": 1}'

An actor holding one runtime instance on core c asks for ``1/K`` of ``npu_core_c`` (K
instances per core), so Ray itself never puts more than K instances on a core, whoever
starts them. A node's name (the ``node`` column of the outputs) is its Ray node name
(``ray start --node-name``, by default its IP address), made unique with its node id.

Addresses (``--ray``): an existing cluster (``auto``, ``HOST:PORT``; run batchinfer on its
head node), ``local`` (one node on this machine) or ``local:N`` (N simulated nodes on this
machine, started with ``ray.cluster_utils.Cluster`` by a keeper process (local.py) for
trying things out and for tests).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchinfer.bounds import local_nodes_ceiling
from batchinfer.cluster.local import LocalCluster
from batchinfer.cluster.resources import RESOURCE_PREFIX
from batchinfer.data.dataset import Dataset
from batchinfer.errors import (
    BatchinferError,
    RunFailedError,
    RuntimeUnavailableError,
    UsageError,
)
from batchinfer.messages import setting

_RESOURCE_RE = re.compile(rf"^{RESOURCE_PREFIX}(\d+)$")
#: Open files each process may have for ``local:N``: with 64, the GCS waits for descriptors
#: and nothing starts; 256 ran local:2 here, and the GCS of local:3 with 18 actors peaked at
#: 107 descriptors; 1024 is the usual default.
MIN_OPEN_FILES = 1024
_RAISE_OPEN_FILES = 65536  # what ray.init raises the soft limit to, when the hard one allows


#: How long one question to the cluster's GCS (its list of nodes) may take.
GCS_TIMEOUT_S = 2.0


class ClusterLostError(RunFailedError):
    """The cluster's GCS stopped answering mid-run (its head node or gcs_server died).

    The run stops at once and ends ``interrupted``, its rows written; ``out`` is the run
    folder when known, and a front end sets ``resume_command``, which the message then ends
    with (rendered after the fields, so the command is shown as it is).
    """

    def __init__(self, message: str, out: Path | None = None) -> None:
        super().__init__(message)
        self.out = out
        self.resume_command: str | None = None

    def render(self, name: Callable[[str], str]) -> str:
        text = super().render(name)
        if self.out is None:
            return text
        if self.resume_command:
            return f"{text}; resume it with: {self.resume_command}"
        return f"{text}; resume it with {setting('output.resume').render(name)}"


def live_node_ids(ray: Any, timeout_s: float = GCS_TIMEOUT_S) -> set[str] | None:
    """The ids (hex) of the cluster's live nodes; None when its GCS gave no answer within
    ``timeout_s``.

    ``ray.nodes()`` cannot be bounded: with the GCS gone it blocks until Ray's own
    reconnection timeout (60 s), after which Ray ends the process.
    """
    try:
        client = ray._private.worker.global_worker.gcs_client
        get = client.get_all_node_info
    except AttributeError:  # a Ray without it: unbounded, but it answers the same
        return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    try:
        infos = get(timeout=timeout_s)
    except Exception:  # RpcError (timed out, unavailable), or the connection is gone
        return None
    from ray.core.generated import gcs_pb2

    alive = gcs_pb2.GcsNodeInfo.ALIVE
    return {node_id.hex() for node_id, info in infos.items() if info.state == alive}


def import_ray() -> Any:
    """The ray module, or RuntimeUnavailableError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise RuntimeUnavailableError(
            "Ray is not installed, so " + setting("ray") + " cannot run; install it with "
            "pip install 'batchinfer[ray]' (on every node of the cluster)."
        ) from None
    return ray


@dataclass(frozen=True)
class NodeInfo:
    """A node that offers NPU cores."""

    name: str  # the ``node`` column of the outputs
    node_id: str  # Ray's node id (hex)
    address: str  # its IP address
    cores: tuple[int, ...]  # NPU cores it declares


def npu_nodes(nodes: list[dict[str, Any]]) -> list[NodeInfo]:
    """The live nodes of ``ray.nodes()`` that declare NPU cores, in a stable order."""
    found = []
    for node in nodes:
        if not node.get("Alive"):
            continue
        cores = sorted(
            int(m.group(1))
            for key in node.get("Resources", {})
            if (m := _RESOURCE_RE.match(key)) is not None
        )
        if cores:
            found.append((node, tuple(cores)))
    names = [n.get("NodeName") or n.get("NodeManagerAddress") or "node" for n, _ in found]
    infos = []
    for (node, node_cores), name in zip(found, names, strict=True):
        if names.count(name) > 1:  # several nodes behind one address (or simulated ones)
            name = f"{name}-{node['NodeID'][:6]}"
        address = node.get("NodeManagerAddress", "")
        infos.append(NodeInfo(name, node["NodeID"], address, node_cores))
    return sorted(infos, key=lambda n: n.name)


def parse_address(address: str) -> tuple[str, int]:
    """("local", N) for ``local``/``local:N``; ("remote", 0) for anything else."""
    if address == "local":
        return "local", 1
    if address.startswith("local:"):
        try:
            n = int(address.split(":", 1)[1])
        except ValueError:
            n = 0
        if n < 1:
            raise UsageError(
                setting("ray")
                + f" {address!r} is not a number of simulated nodes; pass e.g. local:3."
            )
        most, why = local_nodes_ceiling()
        if n > most:
            raise UsageError(
                setting("ray")
                + f" {address!r} asks for more simulated nodes than this machine can "
                f"run: at most {most} ({why}); pass e.g. local:3."
            )
        return "local", n
    if not address.strip():
        raise UsageError(setting("ray") + " is empty; pass auto, HOST:PORT, local or local:N.")
    return "remote", 0


class RayConnection:
    """The Ray cluster a run uses, as a context manager.

    ``local:N`` starts N simulated nodes on this machine (named node0, node1, ...; node0 is
    the head), each declaring ``cores``; they are stopped on exit with every process they
    started. Otherwise ``ray.init(address)`` connects to a running cluster. When this
    process is already connected to Ray (a caller's ``ray.init``), that connection is used
    and left open, whatever ``address`` says.
    """

    def __init__(self, address: str, cores: Sequence[int], log_to_driver: bool = True) -> None:
        self.address = address
        self.kind, self.local_nodes = parse_address(address)
        self.cores = tuple(cores)
        self.log_to_driver = log_to_driver
        self.cluster: LocalCluster | None = None  # local:N
        self._connected_here = False
        # The ray module once entered (import_ray: Any, as every use of Ray's API here).
        self.ray: Any = None

    def __enter__(self) -> RayConnection:
        ray = self.ray = import_ray()
        if ray.is_initialized():
            return self
        try:
            if self.kind == "local":
                check_open_files(self.address)
                self.cluster = LocalCluster(self.local_nodes, self.cores).start()
                address = self.cluster.address
            else:
                address = self.address
            ray.init(
                address=address,
                log_to_driver=self.log_to_driver,
                logging_level=logging.WARNING,
                configure_logging=True,
            )
            self._connected_here = True
        except BaseException as exc:
            self.__exit__(None, None, None)
            if isinstance(exc, BatchinferError):
                raise
            if isinstance(exc, (ConnectionError, RuntimeError, ValueError)):
                raise RunFailedError(
                    "cannot connect to the Ray cluster at "
                    + setting("ray")
                    + f" {self.address} ({exc}); "
                    "start it first (ray start --head on the head node) or pass local:N."
                ) from exc
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._connected_here:
            with contextlib.suppress(Exception):
                self.ray.shutdown()
            self._connected_here = False
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None

    def nodes(self) -> list[NodeInfo]:
        """The nodes that declare NPU cores, now."""
        return npu_nodes(self.ray.nodes())

    def driver_node_id(self) -> str:
        """The node this process is connected through (where a head-only dataset is read)."""
        return self.ray.get_runtime_context().get_node_id()


def check_open_files(address: str) -> None:
    """Raise the soft limit on open files to the hard one (as ``ray.init`` does, but before
    the local nodes start, so that they inherit it); RuntimeUnavailableError when it stays
    below MIN_OPEN_FILES, where Ray's processes would wait for descriptors for ever."""
    try:
        import resource
    except ImportError:  # not a POSIX system: nothing to check
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < MIN_OPEN_FILES:
        most = _RAISE_OPEN_FILES if hard == resource.RLIM_INFINITY else hard
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(most, _RAISE_OPEN_FILES), hard))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < MIN_OPEN_FILES:
        raise RuntimeUnavailableError(
            f"only {soft} files may be open per process here (ulimit -n {soft}), too few for "
            "the Ray processes of "
            + setting("ray")
            + f" {address}, which would wait for ever: raise the "
            f"limit to {MIN_OPEN_FILES} or more (ulimit -n {MIN_OPEN_FILES}; above the hard "
            f"limit of {hard} only root can) and run again."
        )


def check_shared_dataset(nodes: Sequence[NodeInfo], dataset: Dataset, timeout_s: float) -> None:
    """UsageError unless every node reads the dataset's first item at the same path."""
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as Affinity

    first = next(iter(dataset.iter_from()), None)
    if first is None:
        return
    from batchinfer.cluster.actors import dataset_visible

    check = ray.remote(num_cpus=0, max_retries=0)(dataset_visible)
    refs = {
        n.name: check.options(scheduling_strategy=Affinity(n.node_id, soft=False)).remote(
            [first.path]
        )
        for n in nodes
    }
    for name, ref in refs.items():
        missing = ray.get(ref, timeout=timeout_s)
        if missing is not None:
            raise UsageError(
                f"node {name} cannot read {missing}, so the dataset is not on storage every "
                "node mounts at the same path; mount it there, or pass "
                + setting("ray_data")
                + " head to "
                "read it on this node only."
            )
