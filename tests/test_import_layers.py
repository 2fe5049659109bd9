"""No import runs up a layer: the lower packages of batchinfer never import the upper ones.

The graph is test_import_cycles.py's (every import counts: at the top, in a function, under
``if TYPE_CHECKING:``). Each rule is a package and the packages above it, which it must
never import; a new floor is one more row. The data layer reads files into tensors and
knows nothing of evaluation (its COCO reader is data/coco_file.py, which evaluation uses),
of the engine that runs it, or of any front end.

Inside the engine, its floors (engine/board/, engine/planning/, engine/plumbing/) have walls
of their own: the second half of this file.
"""

from __future__ import annotations

import subprocess
import sys

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


# ---------------------------------------------------------------------- the engine's walls
# Each row is a floor of batchinfer/engine/ and the engine modules it
# may import beside its own (anything outside the engine is the top-level layer rule's
# business). An allow-list, not a deny-list: a new edge out of a floor is a decision, made
# here, with its reason.
#
# - ``plumbing`` (the board's processes, signals, limits, shared-memory segments) knows
#   nothing of the loop, the scheduler, planning or the pools: only the vocabulary it carries
#   (protocol.py's messages, states.py's states, slots.py's layout, detection.py's geometry
#   rows in the segments it creates).
# - ``planning`` (settings and files in, an EnginePlan out) starts no process, so it imports
#   nothing of the plumbing, nor of what runs a plan: only slots.py (the layout a plan sizes),
#   batching.py (how a batch-N model splits) and queue_depth.py (the items a worker holds),
#   which the default number of slots is made of. batching.py stays in engine/ beside the
#   shared vocabulary, not in the board's floor: its split rule is planning's input and its
#   NOTE spans planning, the slots, the scheduler's charging and the core worker's loop; in
#   ``board`` it would make planning import the floor that runs a plan.
# - ``board`` (the board's pool and what runs in its children) may import:
#   - ``plumbing``: the pool's private plumbing (children, segments, limits, usage);
#   - ``planning``: the EnginePlan the pool carries out (interface.py), and the ``-k auto``
#     rule the probe measures and puts into the plan (instances.py);
#   - ``pools``: the interface the pool implements, its events and RunState;
#   - ``protocol``, ``states``, ``slots``, ``detection``: the shared vocabulary;
#   - ``batching`` and ``queue_depth``: a batch-N model's loop in the core worker, and the
#     items a worker holds (its capacity and refill point);
#   - ``canary``: the input a core worker and the probe try the model with;
#   - ``watchdog``, ``reader_scaling``: what only a board has (hangs read from the status
#     board, readers grown and shrunk), used by the pool, not by the loop;
#   - ``sources``: the ItemSource whose items the pool fills into slots.
#   Never the loop, the scheduler or its parts (the next section's rule, for the pool).

ENGINE = "batchinfer.engine"

#: floor (a subpackage of the engine) -> the engine modules outside it that it may import.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "board": frozenset(
        {
            *("plumbing", "planning", "pools"),
            *("protocol", "states", "slots", "detection"),
            *("batching", "queue_depth", "canary", "watchdog", "reader_scaling", "sources"),
        }
    ),
    "plumbing": frozenset({"protocol", "states", "slots", "detection"}),
    "planning": frozenset({"slots", "batching", "queue_depth"}),
}


def _floor(module: str) -> str | None:
    """The engine floor ``module`` is in (a subpackage's name), or None."""
    parts = module.split(".")
    if parts[:2] != ENGINE.split(".") or len(parts) < 3 or parts[2] not in MAY_IMPORT:
        return None
    return parts[2]


def _through_the_wall(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in graph.items():
        floor = _floor(module)
        if floor is None:
            continue
        for target in targets:
            parts = target.split(".")
            if parts[:2] != ENGINE.split(".") or _floor(target) == floor:
                continue
            name = parts[2] if len(parts) > 2 else "__init__"
            if name not in MAY_IMPORT[floor]:
                found.append(f"{module} -> {target}")
    return sorted(found)


def test_the_rule_sees_an_import_through_a_wall() -> None:
    graph = {
        "batchinfer.engine.plumbing.a": {
            "batchinfer.engine.plumbing.b",  # its own floor
            "batchinfer.engine.protocol",  # allowed
            "batchinfer.engine.scheduler",  # not allowed
            "batchinfer.errors",  # outside the engine
        },
        "batchinfer.engine.planning.p": {"batchinfer.engine.plumbing.a"},
        "batchinfer.engine.loop": {"batchinfer.engine.plumbing.a"},  # above: no rule
    }
    assert _through_the_wall(graph) == [
        "batchinfer.engine.planning.p -> batchinfer.engine.plumbing.a",
        "batchinfer.engine.plumbing.a -> batchinfer.engine.scheduler",
    ]


def test_every_floor_exists_and_holds_modules() -> None:
    graph = import_graph()
    for floor in MAY_IMPORT:
        assert any(m.startswith(f"{ENGINE}.{floor}.") for m in graph), floor
    for floor, allowed in MAY_IMPORT.items():
        missing = sorted(m for m in allowed if f"{ENGINE}.{m}" not in graph)
        assert not missing, f"{floor} may import modules that are gone: {missing}"


def test_no_import_goes_through_an_engine_wall() -> None:
    found = _through_the_wall(import_graph())
    assert not found, (
        "imports through a wall of the engine (move what both sides need down, or pass it "
        f"in the call): {found}"
    )


# ---------------------------------------------------------------------- pools know no policy
# A pool carries out and reports (engine/pools.py); what it may read of the run comes with
# the loop's calls (RunState). So no pool reaches the scheduler, the loop or its policy
# modules through the engine's imports: neither directly nor through an engine module it
# imports (the walk stays inside the engine: cluster/pool.py reaches the loop through the
# package's front door, which is not a pool reading the scheduler).

POOLS = ("batchinfer.engine.pools", "batchinfer.engine.board.pool", "batchinfer.cluster.pool")
POLICY = frozenset(
    f"{ENGINE}.{m}"
    for m in (
        *("scheduler", "core_life", "flights", "run_view"),  # the scheduler and its parts
        *("loop", "collector", "recycling", "runner"),
    )
)


def _policy_reached(graph: dict[str, set[str]], start: str) -> list[str]:
    """The policy modules ``start`` reaches through engine modules, each as a path."""
    paths, seen, todo = [], {start}, [(start, [start])]
    while todo:
        module, path = todo.pop()
        for target in sorted(graph.get(module, ())):
            if target in seen or not target.startswith(f"{ENGINE}."):
                continue
            seen.add(target)
            if target in POLICY:
                paths.append(" -> ".join([*path, target]))
            else:
                todo.append((target, [*path, target]))
    return sorted(paths)


def test_the_rule_sees_a_pool_reaching_the_scheduler_through_another_module() -> None:
    graph = {
        "batchinfer.engine.board.pool": {"batchinfer.engine.recycling", "batchinfer.errors"},
        "batchinfer.engine.recycling": {"batchinfer.engine.scheduler"},
    }
    assert _policy_reached(graph, "batchinfer.engine.board.pool") == [
        "batchinfer.engine.board.pool -> batchinfer.engine.recycling",
    ]


def test_no_pool_imports_the_scheduler_or_the_loop() -> None:
    graph = import_graph()
    found = [path for pool in POOLS for path in _policy_reached(graph, pool)]
    assert not found, (
        "a pool reaches the loop's policy (pass what it needs in the call: pools.RunState): "
        f"{found}"
    )


def test_a_child_imports_none_of_the_board_pool() -> None:
    """A reader or core worker process imports its module (the fork server's PRELOAD) and so
    every package above it: engine/board/__init__.py must not pull in the pool's side."""
    pool_side = [f"{ENGINE}.board.{m}" for m in ("pool", "spawn", "instance_probe")]
    check = (
        "import sys; from batchinfer.engine.plumbing.fork_server import PRELOAD; "
        "[__import__(m) for m in PRELOAD]; "
        f"print([m for m in {pool_side!r} if m in sys.modules])"
    )
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout
