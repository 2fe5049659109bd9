"""The ``batchinfer`` program's entry point.

It takes charge of its signals before anything else is imported: libraries start threads
when they are imported (pyarrow does), and a thread that does not block SIGINT could
swallow a Ctrl-C (engine/signals.py says why). For ``batchinfer run`` on this machine it
then launches the children's fork server (engine/fork_server.py), so the server imports
numpy and the child modules while this process imports the CLI, pyarrow and the engine
(each takes a few tenths of a second; on two CPUs they overlap). Then it runs the click
commands.
"""

from __future__ import annotations

import contextlib
import sys


def main() -> None:
    """Install the signal router, launch the fork server early for a local run, then run
    the CLI."""
    from batchinfer.engine.signals import SignalRouter

    SignalRouter.install()
    try:
        with _fork_server_if_local_run(sys.argv[1:]):
            from batchinfer.cli import main as cli

            cli()
    except KeyboardInterrupt:  # while importing the CLI (a command handles its own)
        print("error: interrupted; nothing was started.", file=sys.stderr)
        sys.exit(130)


def _fork_server_if_local_run(args: list[str]) -> contextlib.AbstractContextManager:
    """The fork server, held for the command, if ``args`` look like a run on this machine.

    A guess from the words alone (click has not parsed them yet): a wrong guess costs a
    server launched for nothing, or one launched later by the engine itself, never a
    wrong result."""
    local_run = (
        args[:1] == ["run"]
        and not any(a == "--ray" or a.startswith("--ray=") for a in args)
        and not any(a in ("-h", "--help") for a in args)
    )
    if not local_run:
        return contextlib.nullcontext()
    from batchinfer.engine import fork_server

    return fork_server.running()
