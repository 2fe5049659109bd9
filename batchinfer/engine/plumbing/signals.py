"""SIGINT, SIGTERM and SIGHUP during a run: stop cleanly, and never kill a child.

Ctrl-C and a closed terminal reach the whole process group: the coordinator and every
reader and core worker. Only the coordinator decides what they mean (drain, then stop),
so children must ignore them from their very first instruction: a child that is still
importing when Ctrl-C comes would otherwise die with a traceback and count as a crash.
A signal ignored when a process starts stays ignored in it (exec keeps SIG_IGN, and Python
installs its SIGINT handler only over SIG_DFL), so the coordinator must hold them ignored
whenever it starts a child. But an ignored signal is lost to the coordinator itself...

... unless it is blocked. A process that owns its signals (the ``batchinfer`` command) uses
a :class:`SignalRouter`: it blocks the three signals in the main thread before any other
thread exists (every thread then inherits the blocked mask, native library threads
included), sets SIGINT and SIGHUP to ignored for good (so children start immune), and
takes the signals with ``sigwaitinfo`` in one thread of its own (a blocked signal is never
discarded, even while ignored). That thread hands each signal to the current route.

When the main thread itself must stop (a signal before the run's engine exists, or with no
route), the router's thread raises the exception in it with a signal of its own:
it stores the exception and sends :data:`WAKE` to the main thread (``pthread_kill``), whose
Python handler raises it. Public API only, and better than the asynchronous exception
set through CPython's C API that the router used before: a system call the main thread is
in returns EINTR, so the exception is seen there too.

Whatever else starts in this process must not unblock the three signals in the main
thread; multiprocessing's resource tracker does when it starts (a ``spawn`` or
``forkserver`` child, a ``multiprocessing.shared_memory`` segment). The engine uses none
of them; and :class:`StopSignals` blocks the three again in the main thread whenever a run
takes or retakes them (after ``ray.init``), so a library that unblocked them loses nothing
but the time before.

A second signal must end the program even when its main thread cannot act on anything:
blocked in a system call that restarts after a signal or cannot be interrupted (reading a
dead network mount) it never runs another bytecode, and its output folders would stay
locked for every later run. So, with a router, the
second signal also arms a deadline: if the command is still inside its
:class:`StopSignals` :data:`HARD_EXIT_AFTER_S` later (a third signal: at once), the
router's thread ends the process itself (:func:`hard_exit`): SIGKILL to every child
process, this process's shared-memory segments unlinked, exit 130; the kernel drops its
``flock``s as it goes.

A library caller that did not install a router gets Python handlers for the duration of
the call instead (:class:`StopSignals` does either). Its children are immune from their
first instruction too: they are forked by a fork server that ignores SIGINT and SIGHUP
(engine/plumbing/fork_server.py), whatever the caller's handlers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import NoReturn, Protocol

from batchinfer.errors import RunInterrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_IGNORED = (signal.SIGINT, signal.SIGHUP)
#: How long a command may still take to stop after a second signal (see the docstring).
HARD_EXIT_AFTER_S = 5.0


#: The signal the router's thread makes the main thread raise with (the docstring): a
#: real-time one, which neither the engine nor the libraries it loads use.
WAKE = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2


def hard_exit(why: str, code: int = 130) -> NoReturn:
    """End this process now, from any thread: SIGKILL every child process (readers,
    workers, the fork server, a janitor, a local Ray cluster), unlink this process's
    shared-memory segments, say ``why`` on stderr, exit ``code``.

    Nothing here takes a lock the stuck main thread may hold: no ``print`` (sys.stderr's
    buffer has a lock), no logging, only system calls and already imported modules.
    """
    import psutil

    from batchinfer.engine.slots import SEGMENT_PREFIX, SHM_DIR

    with contextlib.suppress(OSError):
        os.write(2, f"error: {why}\n".encode())
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    mine = f"{SEGMENT_PREFIX}-{os.getpid()}-"
    with contextlib.suppress(OSError):
        for name in os.listdir(SHM_DIR):
            if name.startswith(mine):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(SHM_DIR, name))
    os._exit(code)


class _Stoppable(Protocol):
    """What a stop needs of the engine of a run (runner.RunEngine has it)."""

    def request_stop(self, reason: str) -> None: ...


class SignalRouter:
    """Takes SIGINT/SIGTERM/SIGHUP in a thread of its own (see the module docstring)."""

    _installed: SignalRouter | None = None

    def __init__(self) -> None:
        self._route: Callable[[int], None] | None = None
        self._raise: type[BaseException] | None = None  # for the main thread, at WAKE

    @classmethod
    def install(cls) -> SignalRouter:
        """Install the process's router (once; call it first, from the main thread)."""
        if cls._installed is None:
            router = cls()
            block()
            for s in _IGNORED:
                signal.signal(s, signal.SIG_IGN)
            signal.signal(WAKE, router._on_wake)
            threading.Thread(target=router._wait, name="batchinfer-signals", daemon=True).start()
            cls._installed = router
        return cls._installed

    @classmethod
    def current(cls) -> SignalRouter | None:
        return cls._installed

    def route(self, handler: Callable[[int], None] | None) -> None:
        """Send signals to ``handler(signum)`` (called in the router's thread); None: the
        default, KeyboardInterrupt in the main thread."""
        self._route = handler

    def _wait(self) -> None:
        while True:
            info = signal.sigwaitinfo(SIGNALS)
            handler = self._route
            if handler is not None:
                handler(info.si_signo)
            else:
                self.raise_in_main_thread(KeyboardInterrupt)

    def raise_in_main_thread(self, exc_type: type[BaseException]) -> None:
        """Have the main thread raise ``exc_type`` (from another thread; the docstring)."""
        ident = threading.main_thread().ident
        assert ident is not None  # the main thread has started: it is running this program
        self._raise = exc_type
        signal.pthread_kill(ident, WAKE)

    def _on_wake(self, _signum: int, _frame: object) -> None:
        exc_type, self._raise = self._raise, None
        if exc_type is not None:
            raise exc_type


def block() -> None:
    """Block SIGINT, SIGTERM and SIGHUP in the calling thread (a router takes them)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)


class StopSignals:
    """What SIGINT, SIGTERM and SIGHUP do during one run (set ``engine`` once it exists).

    Before the engine exists (planning, listing the dataset) a signal raises RunInterrupted
    in the main thread: nothing has started. Once it exists, a signal only calls its
    ``request_stop``, which sets flags the loop acts on between events, so a signal never
    cuts a row, a part or the manifest in half.
    """

    def __init__(self) -> None:
        self.engine: _Stoppable | None = None  # set once the run's engine exists
        self._old: dict = {}
        self._router = SignalRouter.current()
        self._received = 0
        self._left = threading.Event()  # set when the block ends

    def _dispatch(self, signum: int) -> None:
        name = signal.Signals(signum).name
        self._received += 1
        if self._router is not None and self._received == 2:
            threading.Thread(
                target=self._hard_exit_unless_left,
                args=(name,),
                name="batchinfer-hard-exit",
                daemon=True,
            ).start()
        elif self._router is not None and self._received > 2:
            hard_exit(f"interrupted by {name} a third time; stopped at once.")
        if self.engine is None:
            if self._router is not None:
                self._router.raise_in_main_thread(RunInterrupted)
                return
            raise RunInterrupted(f"interrupted by {name} before the run started")
        self.engine.request_stop(f"interrupted by {name}")

    def _hard_exit_unless_left(self, name: str) -> None:
        if not self._left.wait(HARD_EXIT_AFTER_S):
            hard_exit(
                f"interrupted by {name} again and still not stopped after "
                f"{HARD_EXIT_AFTER_S:g} s (blocked in a read?): stopped at once; child "
                "processes killed, shared memory removed, output folders unlocked. Nothing "
                "more was written."
            )

    def _handler(self, signum: int, _frame: object) -> None:
        self._dispatch(signum)

    def __enter__(self) -> StopSignals:
        if self._router is not None:
            _block_in_main_thread()
            self._router.route(self._dispatch)
        elif threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handler) for s in SIGNALS}
        return self

    def reinstall(self) -> None:
        """Take the signals back from a library that set its own meanwhile (ray.init does)."""
        if self._router is not None:
            _block_in_main_thread()
            for s in _IGNORED:  # children started from now on must still start immune
                signal.signal(s, signal.SIG_IGN)
            self._router.route(self._dispatch)
        elif self._old:
            for s in SIGNALS:
                signal.signal(s, self._handler)

    def __exit__(self, *exc_info: object) -> None:
        self._left.set()
        if self._router is not None:
            self._router.route(None)
        for s, h in self._old.items():
            signal.signal(s, h)


def _block_in_main_thread() -> None:
    """Block the three signals again, should something have unblocked them in the main
    thread (multiprocessing's resource tracker does when it starts: the docstring)."""
    if threading.current_thread() is threading.main_thread():
        block()
