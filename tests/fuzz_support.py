"""The fuzz tier's shared parts: its hypothesis settings, a runner that calls a reader in a
forked child under a memory limit and a time limit, and strategies for hostile values.

Every reader of untrusted input (tests/test_fuzz_*.py) is called through
:func:`run_bounded`: the child sets ``RLIMIT_AS`` to what it has mapped plus
:data:`MEMORY_BOUND`, so a memory bomb ends as a MemoryError in that child (the machine
never swaps), and a reader that blocks (a FIFO) is killed after ``timeout`` seconds. The
child sends back what happened as an :class:`Outcome`; the test judges it.

Profiles: by default a few examples with a fixed seed (``derandomize``), so the tier is
brief and the same on every run; ``BATCHINFER_FUZZ=long`` runs many more (still
reproducible), ``BATCHINFER_FUZZ=explore`` as many with a fresh seed each run (a failure
prints the ``@reproduce_failure`` blob to replay it).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import resource
import select
import signal
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from batchinfer.errors import BatchinferError, InputError, UsageError

#: Extra address space a reader may map while it reads one generated input. The inputs
#: are a few kilobytes; a reader that wants more than this for them is a bomb.
MEMORY_BOUND = 512 << 20
#: Seconds one reader call may take (a blocked read of a FIFO is stopped by it).
TIME_BOUND = 10.0

_MODE = os.environ.get("BATCHINFER_FUZZ", "")
_COMMON: dict[str, Any] = {
    "deadline": None,  # each example forks a child: timing varies on a loaded machine
    "database": None,  # nothing written into the checkout
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
}
settings.register_profile("fuzz", max_examples=10, derandomize=True, **_COMMON)
settings.register_profile("fuzz-long", max_examples=200, derandomize=True, **_COMMON)
settings.register_profile("fuzz-explore", max_examples=200, derandomize=False, **_COMMON)
_PROFILE = {"long": "fuzz-long", "explore": "fuzz-explore"}.get(_MODE, "fuzz")
#: The settings every fuzz test is decorated with.
fuzz = settings(settings.get_profile(_PROFILE))


@dataclass(frozen=True)
class Outcome:
    """What one bounded call did.

    ``kind``: "ok" (it returned ``value``), "usage" (a UsageError: one line, exit 2),
    "input" (an InputError: the item's error row), "other" (another BatchinferError),
    "crash" (any other exception: a traceback for the user), "memory" (MemoryError under
    the limit), "timeout" (killed after the time bound), "died" (the child ended without
    a word: a signal).
    """

    kind: str
    value: Any = None
    error: str = ""  # the exception's type and message
    trace: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.error}\n{self.trace}" if self.error else self.kind

    @property
    def one_line(self) -> bool:
        """The message is one line (the CLI prints it as the user's one sentence)."""
        return "\n" not in self.error.split(": ", 1)[-1].strip()


def _classify(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "memory"
    if isinstance(exc, UsageError):
        return "usage"
    if isinstance(exc, InputError):
        return "input"
    if isinstance(exc, BatchinferError):
        return "other"
    return "crash"


def _mapped_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _child(call: Callable[[], Any], out: int, memory: int) -> None:
    try:
        limit = _mapped_bytes() + memory
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
        try:
            outcome = Outcome("ok", call())
        except BaseException as exc:
            outcome = Outcome(
                _classify(exc), None, f"{type(exc).__name__}: {exc}"[:2000], traceback.format_exc()
            )
        try:
            data = pickle.dumps(outcome)
        except Exception as exc:
            data = pickle.dumps(Outcome("crash", None, f"unpicklable result: {exc}"))
        view = memoryview(data)
        while view:
            view = view[os.write(out, view) :]
    finally:
        os._exit(0)


def run_bounded(
    call: Callable[[], Any], *, memory: int = MEMORY_BOUND, timeout: float = TIME_BOUND
) -> Outcome:
    """``call()`` in a forked child under ``memory`` more bytes of address space and
    ``timeout`` seconds; what it returned (picklable) or raised, as an Outcome."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        _child(call, write, memory)
    os.close(write)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([read], [], [], left)
            if not ready:
                continue
            chunk = os.read(read, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read)
        if timed_out:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if timed_out:
        return Outcome("timeout", None, f"no answer within {timeout} s")
    if not chunks:
        return Outcome("died", None, "the child ended without an answer")
    outcome: Outcome = pickle.loads(b"".join(chunks))
    return outcome


def assert_clean(outcome: Outcome, allowed: tuple[str, ...] = ("ok", "usage")) -> None:
    """The outcome is one the user may meet: a value, or an allowed error in one line."""
    assert outcome.kind in allowed, str(outcome)
    if outcome.kind != "ok":
        assert outcome.one_line, f"a message of several lines: {outcome.error!r}"


# --------------------------------------------------------------------------- strategies

#: Integers a hostile file writes where a small count or id is expected.
huge_ints = st.sampled_from(
    [-1, -(2**63), 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**30, -(10**30)]
)
#: Any integer a hostile file may hold, small or absurd.
ints = st.one_of(st.integers(-3, 20), huge_ints)

#: Text with the characters that break naive code: NULs, separators, quotes, surrogate-free
#: unicode (combining marks, right-to-left, emoji), control characters.
nasty_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        [
            "",
            " ",
            "\x00",
            "a\x00b",
            "é",
            "e\u0301",
            "\u202ereversed",
            "🙂",
            "\ufeff",
            "\t",
            "a,b",
            '"q"',
            "#x",
            "\\",
            "\u2028",
            "x" * 300,
        ]
    ),
)

#: Relative and absolute paths, including ones that climb out of their folder.
nasty_paths = st.one_of(
    st.sampled_from(
        [
            "img/0.png",
            "./img/0.png",
            "img//0.png",
            "../outside.png",
            "../../../../etc/passwd",
            "/etc/passwd",
            "/dev/zero",
            "/",
            ".",
            "..",
            "img/../img/0.png",
            "img\\0.png",
            "~/x.png",
            "a\x00b.png",
            "img/",
            ".hidden.png",
            "x.npy",
        ]
    ),
    nasty_text,
)

#: JSON values of every type (a wrong type wherever a field expects one).
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=False), nasty_text),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(nasty_text, inner, max_size=4)
    ),
    max_leaves=8,
)


def nested(depth: int, kind: str = "list") -> str:
    """JSON text nested ``depth`` deep: ``[[[...]]]`` or ``{"a": {"a": ...}}``."""
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


# --------------------------------------------------------------------------- the CLI


@dataclass(frozen=True)
class CliRun:
    """What a watched ``batchinfer`` command did: its exit code (None when it was killed),
    output, and the largest RSS any one process of its tree reached (bytes)."""

    returncode: int | None
    stdout: str
    stderr: str
    peak_rss: int


def run_cli_watched(
    args: list[str], *, rss_bound: int = MEMORY_BOUND, timeout: float = 120.0
) -> CliRun:
    """``python -m batchinfer ARGS``, its process tree killed as soon as one process of it
    holds more than ``rss_bound`` bytes resident (or after ``timeout``): a bomb fails the
    test instead of making the machine swap."""
    import subprocess
    import sys
    import tempfile

    import psutil

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "batchinfer", *args], stdout=out, stderr=err, text=True
        )
        root = psutil.Process(proc.pid)
        peak, deadline, killed = 0, time.monotonic() + timeout, False
        while proc.poll() is None:
            tree = [root]
            with contextlib.suppress(psutil.Error):
                tree += root.children(recursive=True)
            for p in tree:
                with contextlib.suppress(psutil.Error):
                    peak = max(peak, p.memory_info().rss)
            if peak > rss_bound or time.monotonic() > deadline:
                for p in reversed(tree):
                    with contextlib.suppress(psutil.Error):
                        p.kill()
                killed = True
                psutil.wait_procs(tree, timeout=10)
                break
            time.sleep(0.02)
        proc.wait()
        out.seek(0)
        err.seek(0)
        return CliRun(None if killed else proc.returncode, out.read(), err.read(), peak)
