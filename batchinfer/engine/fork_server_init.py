"""Imported first by the fork server, and only there (engine/fork_server.py says why).

Ctrl-C and a closed terminal reach the whole process group, the fork server included. It
ignores SIGINT and SIGHUP from here on: multiprocessing records the server's handlers after
its preload and gives them back to every child it forks, so children start immune (as
engine/signals.py requires). SIGTERM is ignored too: the server must live until the
coordinator has drained and stopped its children (it exits with the coordinator anyway),
and a child sets its own SIGTERM back to the default (engine/child.py). It also puts back the
environment the server was launched with (see below).
"""

import json
import os
import signal

for _s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(_s, signal.SIG_IGN)

# The server was launched with PYTHONPATH and PYTHONSAFEPATH of its own (fork_server.py
# says why); children get the coordinator's environment back.
_saved = os.environ.pop("_BATCHINFER_FORK_SERVER_ENV", None)
for _key, _value in (json.loads(_saved) if _saved else {}).items():
    if _value is None:
        os.environ.pop(_key, None)
    else:
        os.environ[_key] = _value
