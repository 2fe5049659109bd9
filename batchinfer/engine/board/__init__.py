"""The board's pool and what runs in its children.

The pool (pool.py, :class:`BoardPool`, the loop's WorkerPool on this board) starts its
children from their specs (spawn.py) through the board's plumbing (engine/plumbing/). What
runs in them: the readers (reader.py), the core workers (worker.py, which starts one; its
serving threads in core_worker.py) and the ``-k auto`` probe (instance_probe.py, where
planning's rule meets the plumbing). Each child's protocol is written down at the top of
reader.py and worker.py.

This package imports nothing, on purpose: a reader or core worker process imports
``batchinfer.engine.board.reader`` or ``.worker`` and must not pay for the pool's modules
(tests/test_import_layers.py checks it, and what this floor may import of the engine).
"""
