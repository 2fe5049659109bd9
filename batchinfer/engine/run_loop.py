"""EngineLoop: what every engine shares, whatever runs the items (child processes on one
board, Ray actors on a cluster): observers, stop requests (a first one drains, a second
stops at once), when the run is finished, and set-up/loop/close with the error mapping.
"""

from __future__ import annotations

from collections.abc import Callable

from batchinfer.engine import events as ev
from batchinfer.engine.fd_limit import too_many_files
from batchinfer.engine.scheduler import ReaderDeathsExceeded, Scheduler
from batchinfer.errors import BatchinferError, RunFailedError
from batchinfer.messages import Message, as_message
from batchinfer.options import ReliabilityOptions


class HardStop(Exception):
    """A second stop request: stop at once."""


class EngineLoop:
    """What every engine's loop shares: observers, stop requests, draining, and when it is
    done. engine.loop's Engine drives child processes, batchinfer.cluster's ClusterEngine Ray
    actors. A subclass sets the attributes used here and gives ``_setup``, ``_start``,
    ``_admit``, ``_send_work``, ``_turn``, ``_close`` and ``_reader_deaths``."""

    ALL_RETIRED = (
        "every NPU core was retired after repeated failures, so the run cannot go on; see "
        "the warnings above, then resume the run."
    )
    scheduler: Scheduler
    rel: ReliabilityOptions
    clock: Callable[[], float]
    observers: list[ev.Observer]
    warnings: list[Message]
    stop_reason: str | None
    hard_stop: bool
    _drain_until: float
    _exhausted: bool

    # ------------------------------------------------------------------ observers
    def notify(self, event: object) -> None:
        for observer in self.observers:
            observer.notify(event)

    def warn(self, message: str) -> None:
        # Kept and sent with its settings as references (batchinfer.messages): a front end
        # renders them, and whatever writes a warning unrendered writes field names.
        said = as_message(message)
        self.warnings.append(said)
        self.notify(ev.Warned(said))

    def request_stop(self, reason: str) -> None:
        """Stop gracefully (items in flight finish); a second call stops at once.

        Safe in a signal handler: it only sets flags the loop acts on between events.
        """
        if self.stop_reason is not None:
            self.hard_stop = True
            return
        self.stop_reason = reason

    def _loop(self) -> None:
        while True:
            if self.stop_reason is not None and not self.scheduler.stopping:
                self.scheduler.stop()
                self._drain_until = self.clock() + self.rel.drain_timeout_s
                self.notify(ev.Stopping(self.stop_reason))
                self.warn(
                    f"{self.stop_reason}: finishing the items in flight (at most "
                    f"{self.rel.drain_timeout_s:g} s); press Ctrl-C again to stop at once."
                )
            if not self.scheduler.stopping:
                self._admit()
                self._send_work()
            if self._finished():
                return
            self._turn()
            if not self.scheduler.alive_cores():
                raise RunFailedError(self.ALL_RETIRED)

    def _finished(self) -> bool:
        if self.scheduler.stopping:
            return not self.scheduler.in_flight() or self.clock() > self._drain_until
        return self._exhausted and not self.scheduler.busy()

    def _drive(self) -> tuple[str, BatchinferError | None]:
        """Set up, start and loop until done; always close: (status, error)."""
        status = "complete"
        error: BatchinferError | None = None
        try:
            self._setup()
            self._start()
            self._loop()
            status = "interrupted" if self.stop_reason else "complete"
        except HardStop:
            status = "interrupted"
        except ReaderDeathsExceeded as e:
            status, error = "failed", self._reader_deaths(e)
        except BatchinferError as e:
            status, error = "failed", e
        except OSError as e:  # out of file descriptors: one sentence, not a traceback
            error = too_many_files(e)
            if error is None:
                raise
            status = "failed"
        finally:
            self._close()
        return status, error

    def _reader_deaths(self, e: ReaderDeathsExceeded) -> RunFailedError:
        raise NotImplementedError

    def _setup(self) -> None:
        raise NotImplementedError

    def _start(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def _admit(self) -> None:
        raise NotImplementedError

    def _send_work(self) -> None:
        raise NotImplementedError

    def _turn(self) -> None:
        raise NotImplementedError
