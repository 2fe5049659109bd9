"""Imported first by the fork server, and only there (engine/fork_server.py says why).

Ctrl-C and a closed terminal reach the whole process group, the fork server included. It
ignores SIGINT and SIGHUP from here on: multiprocessing records the server's handlers after
its preload and gives them back to every child it forks, so children start immune (as
engine/signals.py requires). SIGTERM is ignored too: the server must live until the
coordinator has drained and stopped its children (it exits with the coordinator anyway),
and a child sets its own SIGTERM back to the default (engine/child.py).
"""

import signal

for _s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(_s, signal.SIG_IGN)
