"""The board's process plumbing: forking children, watching them, their signals, limits and
CPU, and the run's shared-memory segments (their owner and their janitor).

Private to the board's pool (engine/board/: pool.py and spawn.py are its front door); a few
front ends borrow a tool from it (the coordinator's signals, the fd-limit estimate, a
ChildPool for thumbnails). It knows nothing of the loop, the scheduler or planning: of the
engine it uses only the shared vocabulary (protocol.py, states.py, slots.py, detection.py),
and tests/test_import_layers.py holds that.
"""
