"""The ``batchinfer`` program's entry point.

It takes charge of its signals before anything else is imported: libraries start threads
when they are imported (pyarrow does), and a thread that does not block SIGINT could
swallow a Ctrl-C (engine/plumbing/signals.py says why). For ``batchinfer run`` on this machine it
then launches the children's fork server (engine/plumbing/fork_server.py), so that the server
imports numpy and the child modules while this process imports click, the CLI, pyarrow
and the engine (each takes a few tenths of a second; on two CPUs they overlap). Then it
runs the click commands, and stops the server when the command ends.

Whether the words are such a run is read before click is imported, as click would read
them, from tables generated from the commands' own option definitions
(batchinfer/run_words.py). Nothing else is asked here: a held ``--out`` is refused by the
``run`` command from its parsed options, and that refusal ends the command, so the server
launched for it is stopped at once (a few milliseconds of launch, spent for nothing).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
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
    """The fork server, held for the command, if ``args`` are a run on this machine.

    Launched here, before click and the CLI are imported, it starts 30-70 ms sooner than
    from the ``run`` command, which matters on a loaded machine (docs/performance.md). A
    wrong guess costs a server launched for nothing, or one launched later by the command
    itself, never a wrong result."""
    if not local_run(args):
        return contextlib.nullcontext()
    from batchinfer.engine.plumbing import fork_server

    return fork_server.running()


def local_run(args: list[str]) -> bool:
    """Whether ``batchinfer ARGS`` runs the ``run`` command on this machine: the command
    named, no help or version asked for, no ``--ray``, and every option one click knows."""
    from batchinfer import run_words as words

    top = read_words(args, words.GROUP_OPTIONS, interspersed=False)
    if top is None or top[0] & words.ENDS_EARLY or top[1][:1] != [words.COMMAND]:
        return False
    run = read_words(top[1][1:], words.RUN_OPTIONS, interspersed=True)
    return run is not None and not run[0] & {*words.ENDS_EARLY, words.ON_CLUSTER}


def read_words(
    args: list[str], options: Mapping[str, tuple[str, int]], *, interspersed: bool
) -> tuple[set[str], list[str]] | None:
    """The parameters ``args`` set and their positional words, read as click's parser
    reads them: ``--name=value`` or ``--name value``, short options clustered (``-k3``,
    ``-ab``), ``--`` ending the options, a value taken whatever it looks like. Without
    ``interspersed`` (a group) the first positional word ends the options. None where click
    would refuse a word (an unknown option, a missing value, a value given to a flag).
    ``options`` maps each option to its parameter and the words its value takes."""
    given: set[str] = set()
    words: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            words += args[i:]
            break
        if len(arg) < 2 or arg[0] != "-":  # a positional word ("-" is one too)
            if not interspersed:
                words += args[i - 1 :]
                break
            words.append(arg)
            continue
        taken = _option_words(arg, options, given)
        if taken is None or i + taken > len(args):
            return None
        i += taken
    return given, words


def _option_words(arg: str, options: Mapping[str, tuple[str, int]], given: set[str]) -> int | None:
    """Add the parameters the option word ``arg`` sets to ``given``; return how many of the
    words after it are its value (None: click would refuse ``arg``)."""
    if arg.startswith("--"):  # --name or --name=value (a value given to a flag: refused)
        name, eq, _ = arg.partition("=")
        param, n = options.get(name, ("", -1))
        if n < 0 or (eq and n == 0):
            return None
        given.add(param)
        return n - 1 if eq else n
    for j in range(1, len(arg)):  # -abc: the flags a, b and c; -kVALUE: k and its value
        param, n = options.get("-" + arg[j], ("", -1))
        if n < 0:
            return None
        given.add(param)
        if n:
            return n - 1 if j + 1 < len(arg) else n
    return 0
