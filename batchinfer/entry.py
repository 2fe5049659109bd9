"""The ``batchinfer`` program's entry point.

It takes charge of its signals before anything else is imported: libraries start threads
when they are imported (pyarrow does), and a thread that does not block SIGINT could
swallow a Ctrl-C (engine/plumbing/signals.py says why). For ``batchinfer run`` on this machine it
then launches the children's fork server (engine/plumbing/fork_server.py), so the server imports
numpy and the child modules while this process imports the CLI, pyarrow and the engine
(each takes a few tenths of a second; on two CPUs they overlap), unless ``--out`` names a
folder another run holds (the command then refuses before it imports the engine). Then
it runs the click commands.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import NoReturn


def main() -> None:
    """Install the signal router, launch the fork server early for a local run, then run
    the CLI."""
    _prefer_system_allocator()
    from batchinfer.engine.plumbing.signals import SignalRouter

    SignalRouter.install()
    code: object = 0
    try:
        with _fork_server_if_local_run(sys.argv[1:]):
            from batchinfer.cli import main as cli

            cli()
    except KeyboardInterrupt:  # while importing the CLI (a command handles its own)
        print("error: interrupted; nothing was started.", file=sys.stderr)
        code = 130
    except SystemExit as done:  # how click ends every command
        code = done.code
    _exit(code)


def _prefer_system_allocator() -> None:
    """Make malloc Arrow's allocator in this program, unless the user chose one.

    Parquet's column writers allocate from Arrow's C++ default pool, which
    ``pyarrow.set_memory_pool`` (engine/runner.py) does not change, and that pool
    (mimalloc) kept the pages of the parts already written: measured here, the coordinator
    grew by 14 MB at the first 8,192-row part and 8 MB more at the second, against 2-4 MB
    in all with malloc (``ARROW_DEFAULT_MEMORY_POOL=mimalloc python tools/bench_run.py
    --scenario memory`` shows the growth again: 100.4 MB for 12,000 items, 108.1 MB for
    120,000, against 86.6 and 88.8 MB without it). Arrow reads this variable once, when pyarrow
    is imported, so it is set before anything imports pyarrow.
    """
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def _exit(code: object) -> NoReturn:
    """End the program without tearing the interpreter down, once the command is done.

    Tearing it down (finalising every module, pyarrow's and onnxruntime's static objects,
    their thread pools) took about 0.1 s here after every command, a wait with nothing
    left to do: by now the command has closed and written everything it opened, its child
    processes are gone and its shared memory is unlinked. Only the standard streams may
    hold output, so they are flushed first. Under coverage (tests measuring the CLI) or
    for an exit code that is not a number, the normal exit runs, so atexit work is done.
    """
    number = 0 if code is None else code
    if not isinstance(number, int) or "coverage" in sys.modules:
        raise SystemExit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe: let the normal exit deal with it
        raise SystemExit(code) from None
    _remove_multiprocessing_temp_dir()
    os._exit(number)


def _remove_multiprocessing_temp_dir() -> None:
    """Remove the folder multiprocessing made in TMPDIR for this process, if it made one.

    Some of multiprocessing's uses (its own fork server, whose socket every run left there
    before the engine had a fork server of its own, a listener) make a ``pymp-*`` folder
    that multiprocessing removes at the interpreter's exit, which ``os._exit`` skips. Only a
    process that imported multiprocessing can have made it; ``get_temp_dir`` hands back the
    folder it already made (it would make one otherwise: a mkdir and an rmdir, ~0.1 ms).
    """
    if "multiprocessing.util" not in sys.modules:
        return
    import shutil
    from multiprocessing import util

    shutil.rmtree(util.get_temp_dir(), ignore_errors=True)


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
    if not local_run or _out_is_held(args):  # a held OUT: the command refuses at once
        return contextlib.nullcontext()
    from batchinfer.engine.plumbing import fork_server

    return fork_server.running()


def _out_is_held(args: list[str]) -> bool:
    """Whether ``--out``/``-o`` in ``args`` names a folder another run holds (a guess from
    the words, as above; the command itself checks properly)."""
    out = None
    for i, arg in enumerate(args):
        if arg in ("--out", "-o") and i + 1 < len(args):
            out = args[i + 1]
        elif arg.startswith("--out="):
            out = arg[len("--out=") :]
    if not out:
        return False
    from batchinfer.sink.out_lock import lock_holder

    try:
        return lock_holder(Path(os.path.abspath(os.path.expanduser(out)))) is not None
    except OSError:
        return False
