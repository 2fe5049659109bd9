"""How a node declares its NPU cores to Ray: one custom resource per core
(``npu_core_0: 1``), which actors pinned to that core ask for."""

from __future__ import annotations

from collections.abc import Sequence

RESOURCE_PREFIX = "npu_core_"


def core_resource(core: int) -> str:
    """The Ray resource that stands for NPU core ``core`` of a node."""
    return f"{RESOURCE_PREFIX}{core}"


def node_resources(cores: Sequence[int]) -> dict[str, float]:
    """The resources a node with these NPU cores declares (``ray start --resources``)."""
    return {core_resource(c): 1.0 for c in cores}
