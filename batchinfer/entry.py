"""The ``batchinfer`` program's entry point.

It takes charge of its signals before anything else is imported: libraries start threads
when they are imported (pyarrow does), and a thread that does not block SIGINT could
swallow a Ctrl-C (engine/signals.py says why). Then it runs the click commands.
"""

from __future__ import annotations


def main() -> None:
    """Install the signal router, then run the CLI."""
    from batchinfer.engine.signals import SignalRouter

    SignalRouter.install()
    from batchinfer.cli import main as cli

    cli()
