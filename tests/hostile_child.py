"""Running a hostile-input check in a child process with its memory and time bounded.

A reader that regresses on a memory bomb (``/dev/zero`` read whole, a YAML alias bomb
walked) must fail its test, not take the machine: the child has an address-space limit
(RLIMIT_AS), so it dies of MemoryError instead of swapping, and a timeout, so a reader
that blocks on a FIFO is killed. The child prints what the check found, one line per
call, for the test to assert on.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Address space of the child: Python with numpy and pyarrow imported needs ~1 GiB of it.
MEMORY = 2 << 30

PRELUDE = """
import sys
from batchinfer.errors import BatchinferError

def said(call):
    try:
        result = call()
    except BatchinferError as exc:
        print(f"{type(exc).__name__} {exc.exit_code}: {exc}")
    else:
        print(f"returned {result!r:.200}")
"""


def run_child(code: str, *, memory: int = MEMORY, timeout: float = 60) -> list[str]:
    """The lines ``code`` printed (after PRELUDE: ``said(lambda: ...)`` prints the error a
    call raised); AssertionError with the child's stderr when it failed or printed a
    traceback. subprocess.run kills the child at ``timeout`` (TimeoutExpired)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stdout.splitlines()
