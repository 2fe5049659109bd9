"""The child processes of a run: start, watch, stop and kill readers and core workers.

It decides nothing about items (the scheduler does) and keeps only what processes need:
each child's pipes, process, state, start-up deadline and the last time it made progress.
:meth:`ChildPool.poll` waits on every child's result pipe and process sentinel at once and
returns what happened, every message of a child before its death, so a child's last
results are always counted before its exit is.

Messages are described where each child lives (board/reader.py, board/worker.py; their types in
protocol.py); the slot life cycle
and shutdown order in the NOTE of slots.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from batchinfer.engine.plumbing import fork_server
from batchinfer.engine.plumbing.fork_server import ForkedChild
from batchinfer.engine.protocol import InferResult, ReadResult, Stop, decode, encode
from batchinfer.engine.states import ChildState

if TYPE_CHECKING:
    from batchinfer.data.dataset import Item

log = logging.getLogger(__name__)

_REAP_TIMEOUT_S = 1.0
#: How long :meth:`ChildPool.close` waits for children to stop before saying it waits.
_SAY_AFTER_S = 2.0


@dataclass
class Child:
    """One reader or core worker process (a restart is a new Child with the same key)."""

    kind: str  # "reader" | "worker"
    key: int  # reader number, or NPU core
    proc: ForkedChild
    tasks: Connection
    results: Connection
    started_at: float
    deadline: float | None  # start-up deadline; None once ready
    phase: str  # what it is doing while starting, for messages
    state: ChildState = ChildState.STARTING
    last_progress: float = 0.0
    killed_for: str | None = None
    hung_items: frozenset[int] | None = None  # workers killed as hung: the items that hung
    busy_s: float = 0.0  # workers: this incarnation's cumulative busy seconds, as reported
    cpu_s: float = 0.0  # this incarnation's CPU seconds, as last reported
    cpu_at_ready: float = 0.0  # ... when it said it was ready (its start-up's cost)
    readable: Any = None  # a poll object on ``results`` alone: "is another message there?"
    yielding: bool = False  # readers: lowered in priority (Engine._yield_to_workers)
    # What the pool sent it and has not heard back about: slot -> its item (engine/board/pool.py).
    held: dict[int, Item] = field(default_factory=dict)
    stopped: bool = False  # readers: stopped because fewer readers are enough

    @property
    def name(self) -> str:
        return f"reader {self.key}" if self.kind == "reader" else f"core {self.key}"

    def sent(self, items: Iterable[tuple[int, Item]], now: float) -> None:
        """``items`` ((slot, item)) were sent to it; an idle child's clock starts now."""
        if not self.held:
            self.last_progress = now
        self.held.update(items)

    def heard(self, records: Iterable[ReadResult | InferResult]) -> None:
        """It reported these slots' items (read, or inferred): it holds them no more."""
        for r in records:
            self.held.pop(r.slot, None)


@dataclass(frozen=True)
class Message:
    child: Child
    body: tuple


@dataclass(frozen=True)
class Exited:
    child: Child
    exitcode: int | None


class ChildPool:
    """Processes of one run, forked by the process's fork server (engine/plumbing/fork_server.py; a
    runtime is never forked: children create theirs).

    A child's sentinel (its life pipe) is watched here, not its server: its death is seen
    with the server frozen or dead, and one the server never forked is reported gone when
    it is killed (at its start-up deadline)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.children: list[Child] = []
        self._poller = select.poll()
        self._fds: dict[int, tuple[bool, Child]] = {}  # fd -> (is sentinel, child)
        self._server = False
        self._abandoned: list[Child] = []  # killed before they were forked: gone at once
        self.server_cpu_s = 0.0  # the fork server's own CPU seconds, read when the pool closes
        # Children asked to stop that were killed when join_timeout_s ran out (close()).
        self.late_at_close: list[str] = []

    def open(self) -> None:
        """Launch the fork server now (it imports while the coordinator goes on)."""
        if not self._server:
            fork_server.acquire()
            self._server = True

    @property
    def parent_pid(self) -> int:
        """The pid a child's parent will have: the fork server's (a fresh one's, if the
        last one is stopped or dead)."""
        self.open()
        return fork_server.serving_pid()

    def start(
        self, kind: str, key: int, target: Callable, spec: Any, timeout_s: float, phase: str
    ) -> Child:
        """Start a child with a task pipe to it and a result pipe from it, and watch it."""
        self.open()
        task_r, task_w = Pipe(duplex=False)
        res_r, res_w = Pipe(duplex=False)
        try:
            proc = fork_server.start_child(target, spec, task_r.fileno(), res_w.fileno())
        except BaseException:
            task_w.close()
            res_r.close()
            raise
        finally:
            task_r.close()  # the child's ends: closed here so EOF means the other side is gone
            res_w.close()
        now = self.clock()
        child = Child(
            kind, key, proc, task_w, res_r, now, now + timeout_s, phase, last_progress=now
        )
        # Connection.poll() builds a selector on every call (tens of µs): a poll object made
        # once answers the same question for the cost of one system call.
        child.readable = select.poll()
        child.readable.register(res_r.fileno(), select.POLLIN)
        self.children.append(child)
        for fd, sentinel in ((res_r.fileno(), False), (proc.sentinel, True)):
            self._fds[fd] = (sentinel, child)
            self._poller.register(fd, select.POLLIN)
        return child

    def live(self, kind: str | None = None) -> list[Child]:
        return [c for c in self.children if c.state != ChildState.GONE and kind in (None, c.kind)]

    @staticmethod
    def send(child: Child, message: tuple) -> None:
        """Send to a child; if it has just died, say nothing: its sentinel will tell."""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, OSError):
            child.tasks.send(encode(message))

    def kill(self, child: Child, reason: str) -> None:
        """SIGKILL ``child``; its exit comes back from :meth:`poll` with ``killed_for`` set."""
        if child.killed_for is None:
            child.killed_for = reason
        with contextlib.suppress(OSError, ValueError):
            child.proc.kill()
        if child.proc.abandoned and child not in self._abandoned:
            self._abandoned.append(child)

    def poll(self, timeout_s: float) -> list[Message | Exited]:
        """What children sent or did within ``timeout_s``: messages first, then exits."""
        events: list[Message | Exited] = []
        exits: dict[int, Child] = {}
        for fd, _ in self._poller.poll(0 if self._abandoned else timeout_s * 1000):
            entry = self._fds.get(fd)
            if entry is None:
                continue
            sentinel, child = entry
            if not sentinel:
                events += self._drain(child)
            elif not child.proc.is_alive():  # else its pid arrived: read, nothing more
                exits[id(child)] = child
        for child in self._abandoned:
            if child.state != ChildState.GONE:
                exits[id(child)] = child
        self._abandoned.clear()
        for child in exits.values():
            # The sentinel closes as the process exits; reaping can lag a moment behind.
            child.proc.join(_REAP_TIMEOUT_S)
            events += self._drain(child)
            self._forget(child)
            events.append(Exited(child, child.proc.exitcode))
        return events

    @staticmethod
    def _drain(child: Child) -> list[Message]:
        out = []
        with contextlib.suppress(EOFError, OSError):
            while child.readable.poll(0):
                out.append(Message(child, decode(child.results.recv())))
        return out

    def _forget(self, child: Child) -> None:
        child.state = ChildState.GONE
        for fd in [fd for fd, (_, c) in self._fds.items() if c is child]:
            self._poller.unregister(fd)
            del self._fds[fd]
        for conn in (child.tasks, child.results):
            conn.close()
        child.proc.close()

    @staticmethod
    def _discard_results(children: list[Child]) -> None:
        """Read and drop whatever ``children`` are sending, never blocking. A child that is
        still starting when the run ends sends its start-up report after "stop" was sent (a
        core worker's WorkerReady carries the canary's outputs: 2.8 MB for a YOLOv8 head),
        and a pipe holds 64 KiB: unread, the child blocked in that send and never read its
        "stop", so every short run waited join_timeout_s for it and then killed it. Raw
        bytes, not messages: a whole message would block on one half-written, and none of
        these is wanted any more (the pool's usage took each child's last report)."""
        for child in children:
            with contextlib.suppress(OSError, ValueError):
                while child.readable.poll(0):
                    if not os.read(child.results.fileno(), 1 << 20):
                        break  # EOF: the child closed its end

    def close(self, hard: bool, join_timeout_s: float) -> None:
        """Stop every child: ask, wait up to ``join_timeout_s``, then SIGKILL (at once if
        ``hard``). Shutdown step 3 of the NOTE in slots.py."""
        live = self.live()
        # A stopped (SIGSTOP) child cannot read "stop": waiting for it only delays the end
        # by join_timeout_s, silently. It is killed at once (SIGKILL ends it stopped).
        stopped = [c for c in live if not hard and c.proc.stopped()]
        if stopped:
            names = ", ".join(f"{c.name} (pid {c.proc.pid})" for c in stopped)
            log.warning("stopped (SIGSTOP) at the end of the run, so killed at once: %s", names)
        # A child still starting holds no item and owes no row: waiting for it to finish
        # creating its runtime and its canary (seconds on a board) only to stop it is what
        # made short runs end seconds after their last row. It is killed at once.
        starting = [c for c in live if c.state == ChildState.STARTING and c not in stopped]
        for child in starting:
            child.killed_for = child.killed_for or "still starting at the end of the run"
            log.debug("%s was still starting at the end of the run: killed", child.name)
        polite = [c for c in live if not hard and c not in stopped and c not in starting]
        for child in polite:
            self.send(child, Stop())
        start = self.clock()
        deadline = start + (join_timeout_s if polite else 0.0)
        said = False
        for child in polite:
            # Checked again while waiting: a SIGSTOP may come after the "stop" was sent.
            while not child.proc.stopped() and child.proc.is_alive() and self.clock() < deadline:
                if not said and self.clock() - start >= _SAY_AFTER_S:
                    said = True
                    log.warning(
                        "waiting up to %g s for %s (pid %s) to stop; then it is killed",
                        join_timeout_s, child.name, child.proc.pid,
                    )  # fmt: skip
                self._discard_results(polite)
                child.proc.join(min(0.1, max(0.0, deadline - self.clock())))
        for child in live:
            if child.proc.is_alive():
                if child in polite and not child.proc.stopped():
                    child.killed_for = child.killed_for or "did not stop in time"
                    self.late_at_close.append(child.name)
                child.proc.kill()  # a stopped child too; one never forked is abandoned
                child.proc.join(join_timeout_s)
        for child in live:
            self._forget(child)
        if self._server:
            self._server = False
            self.server_cpu_s = fork_server.cpu_seconds()
            fork_server.release()
