"""Imported last by the fork server, and only there (engine/plumbing/fork_server.py says why).

Everything the server has imported by now is shared by every child it forks. Collecting
once here and freezing what is left moves it out of the collector's sight: each child's
collections then scan only what the child itself made. A core worker's start-up collection
(board/worker.py) took 16-23 ms with the server's modules in view, on the path to its first item;
with them frozen, about 1 ms (timed inside the workers of 3-core runs on the 2-CPU
development VM; no benchmark in tools/ isolates it, and ``test_fork_server.py`` checks
only that children start frozen). Frozen objects' headers are not written by collections
either, so children share more of the server's pages instead of copying them.
"""

import gc

gc.collect()
gc.freeze()
