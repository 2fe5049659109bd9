"""The ``batchinfer`` program's entry point.

It takes charge of its signals before anything else is imported: libraries start threads
when they are imported (pyarrow does), and a thread that does not block SIGINT could
swallow a Ctrl-C (engine/signals.py says why). Then it runs the click commands. It reads
none of their options: ``batchinfer run`` refuses a held ``--out`` and launches the
children's fork server itself, from its parsed options (cli/run.py).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def main() -> None:
    """Install the signal router, then run the CLI."""
    _prefer_system_allocator()
    from batchinfer.engine.signals import SignalRouter

    SignalRouter.install()
    code: object = 0
    try:
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
