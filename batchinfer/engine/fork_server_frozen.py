"""Imported last by the fork server, and only there (engine/fork_server.py says why).

Everything the server has imported by now is shared by every child it forks. Collecting
once here and freezing what is left moves it out of the collector's sight: each child's
collections then scan only what the child itself made. A core worker's start-up collection
(worker.py) took 16-23 ms with the server's modules in view, on the path to its first item;
with them frozen, about 1 ms. Frozen objects' headers are not written by collections
either, so children share more of the server's pages instead of copying them.
"""

import gc

gc.collect()
gc.freeze()
