"""The limit on open files (``ulimit -n``) a run needs, checked before any process starts.

Under a limit too low for the plan, the coordinator used to fail deep inside
multiprocessing (``os.pipe()``: EMFILE) with a traceback, a fork server printing another,
and a manifest left ``running``. :func:`check_fd_limit` refuses such a limit before the
first child or shared-memory segment exists, with one sentence; :func:`too_many_files`
words an EMFILE that still happens later (an estimate too low, files opened elsewhere).

The estimate was measured on the sim and ONNX backends (``bash -c 'ulimit -n N; batchinfer
run ...'``, the smallest N that completes): 26 for one core and one reader, 34 for three
cores and one reader, 46 for three cores and four readers; instances per core (threads of
one worker) change nothing. So: about 19 for the coordinator (standard streams, the fork
server and resource tracker, the shared-memory segments, OUT's lock, the part being
written) and 4 per child process (its task and result pipes, its sentinel, its poll), plus
a margin for a child being replaced while the old one is reaped.
"""

from __future__ import annotations

import errno
import resource

from batchinfer.errors import RunFailedError
from batchinfer.messages import setting

#: Descriptors the coordinator holds whatever the plan, and the margin on top.
BASE_FDS = 19
MARGIN_FDS = 8
#: Descriptors the coordinator holds per reader or core worker process.
FDS_PER_CHILD = 4


def fds_needed(children: int) -> int:
    """About how many descriptors a run with ``children`` processes needs (see the docstring)."""
    return BASE_FDS + MARGIN_FDS + FDS_PER_CHILD * children


def fd_limit() -> int | None:
    """The soft limit on open files of this process, or None when there is none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def _message(limit: int | str, need: int, children: int) -> str:
    return (
        f"the limit on open files is {limit} (ulimit -n), and this run needs about {need} "
        f"({children} reader and core worker processes); raise it (ulimit -n "
        f"{max(need, 1024)}) or run with fewer " + setting("runtime.readers") + "."
    )


def check_fd_limit(children: int) -> None:
    """RunFailedError (exit 3) when ``ulimit -n`` is below what ``children`` processes need.

    Only reads the limit: a soft limit below the hard one is the user's (or the service
    manager's) choice, so it is named, not silently raised.
    """
    problem = fd_limit_problem(fd_limit(), children)
    if problem is not None:
        raise RunFailedError(problem)


def fd_limit_problem(limit: int | None, children: int) -> str | None:
    """What is wrong with a soft limit of ``limit`` open files (None: unlimited) for a run
    of ``children`` processes, and the fix; None when it is enough (also used by
    ``batchinfer doctor``)."""
    need = fds_needed(children)
    return _message(limit, need, children) if limit is not None and limit < need else None


def too_many_files(exc: OSError) -> RunFailedError | None:
    """The one-sentence error for EMFILE or ENFILE met while running (None for any other
    OSError)."""
    if exc.errno == errno.EMFILE:
        limit = fd_limit()
        return RunFailedError(
            f"the run ran out of open files (the limit is {limit or 'unlimited'}, ulimit -n); "
            "raise it (ulimit -n 1024) and run again."
        )
    if exc.errno == errno.ENFILE:
        return RunFailedError(
            "the system's table of open files is full (ENFILE: all processes together); "
            "close other programs or raise fs.file-max, and run again."
        )
    return None
