"""A fault for tests: a run whose children all start late, held until the test releases them.

:func:`hold_children` puts this module first in the fork server's imports (fork_server.PRELOAD,
which the server is launched with): its import opens a FIFO for reading, which blocks until
the test opens it for writing. Until then no child of the run is forked, while the run goes
on (a start is sent to the server without waiting), so its items are sent to readers that
are still starting, as they were when every child imported its modules itself.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

HOLD_ENV = "BATCHINFER_TEST_HOLD_START"

_fifo = os.environ.get(HOLD_ENV)
if _fifo:  # set only while a test holds a run (tests import this module before that)
    with open(_fifo, "rb"):
        pass


@contextlib.contextmanager
def hold_children(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[threading.Event]:
    """Hold the children of the runs started inside until the event yielded is set."""
    from batchinfer.engine.plumbing import fork_server

    fifo = tmp_path / "hold-start"
    os.mkfifo(fifo)
    monkeypatch.setenv(HOLD_ENV, str(fifo))
    monkeypatch.setattr(fork_server, "PRELOAD", [__name__, *fork_server.PRELOAD])
    release = threading.Event()

    def releaser() -> None:
        release.wait()
        # Blocks until the server has the FIFO open, or the run ended without a server
        # (then the finally below opens the reading side itself).
        with open(fifo, "wb"):
            pass

    thread = threading.Thread(target=releaser, daemon=True)
    thread.start()
    try:
        yield release
    finally:
        release.set()
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        thread.join(timeout=10)
        os.close(fd)
