"""The engine: readers, core workers and shared-memory slots, fed by a source, into a sink.

Four floors (docs/design.md draws the map; tests/test_import_layers.py holds the walls):

- ``engine/`` itself: the loop, :class:`Engine` (loop.py), the one loop every front end
  runs (``run``, ``bench``, ``eval``, the library's ``infer``, a Ray cluster): source in,
  rows out, through a worker pool, the interface in pools.py (a pool reads the run only
  through the RunState the loop passes; it imports no policy). The policy it applies:
  scheduler.py (slots, retries, error rows; its workers' life cycle in core_life.py, its
  records in flights.py, the pools' read-only view of it in run_view.py), collector.py
  (rows and statistics), canary.py, recycling.py, watchdog.py, reader_scaling.py;
  queue_depth.py, the items a worker holds, read by all sides. The two pools' front doors:
  this board's (``engine/board/``, below) and a cluster's Ray actors (batchinfer.cluster).
  ``run`` (runner.py) is the main job: a dataset folder into a run folder (the output
  folder's life in batchinfer.sink). And the vocabulary every floor shares: the messages
  (protocol.py), the states (states.py), the shared memory's layout (slots.py), the
  letterbox rows (detection.py), and how a batch-N model splits (batching.py: planning
  reads its rule, the core worker runs its loop).
- ``engine/board/``: the board's pool and what runs in its children: the pool (pool.py,
  its children's specs in spawn.py), the readers (reader.py), the core workers (worker.py,
  their serving threads in core_worker.py) and the ``-k auto`` probe (instance_probe.py).
- ``engine/planning/``: settings and files in, an EnginePlan out (plan.py; RunConfig in
  config.py, EnginePlan and EngineResult in interface.py), before any process starts.
- ``engine/plumbing/``: the board's process plumbing (the fork server, children, signals,
  limits, CPU by role, the run's segments and their janitor), private to the board's pool;
  it knows nothing of the loop, the scheduler or planning.

Names are imported on first use: a reader or core worker process imports
``batchinfer.engine.board.reader`` or ``.worker``, and must not pay for the coordinator's
modules (pyarrow among them) at start-up.
"""

from __future__ import annotations

from batchinfer.lazy_exports import exports

_WHERE = {
    "Engine": "batchinfer.engine.loop",
    "EnginePlan": "batchinfer.engine.planning.interface",
    "EngineResult": "batchinfer.engine.planning.interface",
    "RunConfig": "batchinfer.engine.planning.config",
    "RunResult": "batchinfer.engine.runner",
    "run": "batchinfer.engine.runner",
    # Named by the Ray guide's example, so that it does not depend on the engine's floors.
    "plan_inference": "batchinfer.engine.planning.plan",
    "StopSignals": "batchinfer.engine.plumbing.signals",
    "OutputOptions": "batchinfer.options",
    "PreprocessOptions": "batchinfer.options",
    "ReliabilityOptions": "batchinfer.options",
    "RuntimeOptions": "batchinfer.options",
    "SimOptions": "batchinfer.options",
}

__all__, __getattr__ = exports(_WHERE)
