"""No import runs up a layer: the lower packages of batchinfer never import the upper ones.

The graph is test_import_cycles.py's (every import counts: at the top, in a function, under
``if TYPE_CHECKING:``). Each rule is a package and the packages above it, which it must
never import; a new floor is one more row. The data layer reads files into tensors and
knows nothing of evaluation (its COCO reader is data/coco_file.py, which evaluation uses),
of the engine that runs it, or of any front end.
"""

from __future__ import annotations

from test_import_cycles import import_graph

FRONT_ENDS = ("cli", "api", "cluster", "bench", "evaluate", "demo", "doctor", "export")

#: package -> the packages above it (``batchinfer.<name>``), never imported from it.
ABOVE: dict[str, tuple[str, ...]] = {
    "data": ("engine", "sink", "tasks", *FRONT_ENDS),
    "runtime": ("data", "engine", "sink", "tasks", *FRONT_ENDS),
    "sink": ("engine", *FRONT_ENDS),
    "engine": FRONT_ENDS,
}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _upward(graph: dict[str, set[str]], above: dict[str, tuple[str, ...]]) -> list[str]:
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if _package(target) in above.get(_package(module), ())
    )


def test_the_rule_sees_an_import_that_runs_up() -> None:
    graph = {"batchinfer.data.x": {"batchinfer.evaluate.y", "batchinfer.errors"}}
    assert _upward(graph, ABOVE) == ["batchinfer.data.x -> batchinfer.evaluate.y"]


def test_no_import_runs_up_a_layer() -> None:
    found = _upward(import_graph(), ABOVE)
    assert not found, f"imports that run up a layer (move what both need down): {found}"
