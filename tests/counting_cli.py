"""``batchinfer`` as a program, plus one line ``rows N`` on stdout after each batch of rows
of a ``--ray`` run (N: rows so far), so that a test can act on a run in another process at
a known point (kill its cluster's GCS, kill the driver) instead of after a guessed delay.

    python tests/counting_cli.py run DATASET --model M --ray local:2 ...
"""

from __future__ import annotations

import sys

from batchinfer.engine.plumbing.signals import SignalRouter

SignalRouter.install()  # first, as batchinfer.entry does (it is idempotent)

import batchinfer.cluster  # noqa: E402
from batchinfer.engine import events as ev  # noqa: E402
from batchinfer.entry import main  # noqa: E402


class _RowCounter:
    def __init__(self) -> None:
        self.rows = 0

    def notify(self, event: object) -> None:
        if isinstance(event, ev.RowsDone):
            self.rows += len(event.rows)
            print(f"rows {self.rows}", flush=True)


_run_on_cluster = batchinfer.cluster.run_on_cluster


def _counting_run_on_cluster(config, address, observers=(), **kwargs):
    return _run_on_cluster(config, address, [*observers, _RowCounter()], **kwargs)


batchinfer.cluster.run_on_cluster = _counting_run_on_cluster  # the CLI imports it per call

if __name__ == "__main__":
    sys.argv[0] = "batchinfer"
    main()
