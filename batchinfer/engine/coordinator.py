"""The coordinator: owns the slots, feeds readers, dispatches to core workers, collects rows.

It is the only process that decides anything: which item goes into which slot, which core
infers it, whether a failure is retried, when a worker is restarted or a core retired. The
slot life cycle and the shutdown order are in the NOTE at the top of slots.py; the messages
are described in reader.py and worker.py.

Failure policy (issue: reliability):
- A worker that dies is noticed through its process sentinel; one that stays inside a single
  inference() past ``timeout_s`` is killed and treated the same. Items that were inside
  inference() at that moment are charged an attempt; items only queued in the worker go back
  to the front of the ready queue uncharged. The worker is restarted on the same core with
  exponential back-off; after ``_MAX_CONSECUTIVE_CRASHES`` crashes without a success in
  between, the core is retired and the run goes on without it.
- ``inference()`` returning None is retried, on another core when there is one.
- An item that failed ``max_attempts`` times becomes an error row naming each failure.
- Input errors (unreadable files) become error rows at once: retrying cannot help.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import resource
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa

from batchinfer.data.dataset import Item
from batchinfer.data.preprocess import Preprocess
from batchinfer.engine.config import RunConfig
from batchinfer.engine.plan import RunPlan, plan_run, prepare_out
from batchinfer.engine.reader import ReaderSpec, reader_main
from batchinfer.engine.slots import RingSpec, SlotRing, TensorLayout, ring_spec
from batchinfer.engine.worker import WorkerSpec, worker_main
from batchinfer.errors import (
    BatchinferError,
    NoCoreError,
    OutputWriteError,
    RunFailedError,
    RunInterrupted,
)
from batchinfer.sink.manifest import RunManifest, host_facts
from batchinfer.sink.outdir import OutLock
from batchinfer.sink.predictions import PredictionWriter
from batchinfer.sink.stats import (
    CoreStatsRecorder,
    format_summary,
    write_core_stats,
    write_timeline,
)

log = logging.getLogger("batchinfer")

_MAX_CONSECUTIVE_CRASHES = 3
_BACKOFF_S = (0.25, 1.0, 4.0)
_JOIN_TIMEOUT_S = 5.0
_TICK_S = 0.1
_MAX_READER_DEATHS = 10
_REAP_TIMEOUT_S = 1.0
_SIM_STATE_PREFIX = "batchinfer-sim-"
# Canary outputs of two cores agree when they differ by at most this share of their range.
_CANARY_RTOL = 1e-3
# Items a worker holds per instance: one in inference and two queued behind it, so an
# instance never waits for the coordinator between two inferences (4 ms of slack at 2 ms).
_QUEUED_PER_INSTANCE = 3
_STARTUP_TIMEOUT_S = 120.0  # loading a big model on a board can take tens of seconds

EXIT_OK, EXIT_ITEM_ERRORS, EXIT_INTERRUPTED = 0, 1, 130


@dataclass
class RunResult:
    """What a finished (or interrupted) run produced."""

    out: Path
    status: str  # complete | interrupted | failed
    exit_code: int
    total: int
    skipped: int
    succeeded: int
    errors: int
    summary: str
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Flight:
    """One item between the dataset and its row; lives in a slot."""

    item: Item
    read_ms: float = 0.0
    t_loaded: float = 0.0
    failures: list[str] = field(default_factory=list)
    cores_tried: list[int] = field(default_factory=list)


@dataclass
class _Worker:
    core: int
    spec: WorkerSpec
    proc: Any = None
    tasks: Connection | None = None
    results: Connection | None = None
    state: str = "down"  # starting | ready | down | retired
    inflight: set[int] = field(default_factory=set)
    crashes_in_row: int = 0
    restart_at: float | None = None
    busy_now: float = 0.0  # the live incarnation's cumulative busy seconds, as reported
    killed_for: str | None = None
    starts: int = 0
    # While starting: when to give up on it (model loading, then the canary inference).
    start_deadline: float | None = None
    start_phase: str = "loading the model"


@dataclass
class _Reader:
    spec: ReaderSpec
    proc: Any = None
    tasks: Connection | None = None
    results: Connection | None = None
    # Slots sent to this reader, in order: it works through them one by one, so the first
    # is the one it is decoding now.
    slots: deque[int] = field(default_factory=deque)
    head_since: float | None = None  # when it started on slots[0]: a decoder can hang too
    killed_for: str | None = None


def _send(conn: Connection, message: tuple) -> None:
    """Send to a child; if it has just died, say nothing: its sentinel will tell us, and
    whatever was sent to it is still recorded as its own (in flight), so nothing is lost."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        conn.send(message)


class _Interrupted(Exception):
    """A second SIGINT/SIGTERM: stop at once."""


class Coordinator:
    """Runs one :class:`RunPlan`; use :func:`run` rather than this class directly."""

    def __init__(self, plan: RunPlan, manifest: RunManifest) -> None:
        self.plan = plan
        self.manifest = manifest
        self.cfg = plan.config
        self.ctx = mp.get_context("spawn")
        self.ring: SlotRing | None = None
        self.workers: dict[int, _Worker] = {}
        self.readers: list[_Reader] = []
        self.flights: list[_Flight | None] = []
        self.free: deque[int] = deque()
        self.ready: deque[int] = deque()
        self.items = iter(())  # type: ignore[var-annotated]
        self.exhausted = False
        self.stop_reason: str | None = None
        self.stop_deadline = 0.0
        self.hard_stop = False  # a second SIGINT/SIGTERM: stop at once
        self.warnings: list[str] = []
        self.counts = {"succeeded": 0, "errors": 0, "input_errors": 0}
        self.canaries: dict[int, list[np.ndarray]] = {}
        self.canary_ref: tuple[int, list[np.ndarray]] | None = None
        self.sdk_versions: dict[int, str | None] = {}
        self.collect_s = 0.0
        self.reader_deaths = 0
        self._poller = select.poll()
        self._watched: dict[int, tuple[str, _Worker | _Reader]] = {}
        self._next_hang_check = 0.0
        self.sim_state: str | None = None
        self.progress = None
        self.writer: PredictionWriter | None = None  # made with the ring: it needs output shapes
        self.stats = CoreStatsRecorder(
            plan.cores,
            self.cfg.instances_per_core,
            invocation=len(manifest.data["invocations"]) - 1,
        )

    # ---------------------------------------------------------------- warnings and progress
    def warn(self, message: str) -> None:
        self.warnings.append(message)
        if self.progress is not None:
            self.progress.write(f"warning: {message}", file=sys.stderr)
        else:
            log.warning(message)

    # ---------------------------------------------------------------------- process start-up
    def _worker_spec(self, pos: int, core: int) -> WorkerSpec:
        pre: Preprocess = self.plan.preprocess
        return WorkerSpec(
            core=core,
            board_row=pos * self.cfg.instances_per_core,
            instances=self.cfg.instances_per_core,
            backend=self.plan.backend,
            model=str(self.plan.model),
            input_shape=pre.shape,
            input_dtype=pre.dtype,
            input_layout=pre.layout,
            sim=self._sim_kwargs(),
            cpus=self.plan.cpus,
        )

    def _sim_kwargs(self) -> dict:
        if self.plan.backend != "sim":
            return {}
        if self.sim_state is None:
            # Each run emulates its own board: fault counters ("call=N") start from zero.
            # The pid in the name lets a later run sweep it if this one is SIGKILLed.
            self.sim_state = tempfile.mkdtemp(prefix=f"{_SIM_STATE_PREFIX}{os.getpid()}-")
        s = self.cfg.sim
        kw: dict[str, Any] = {"state_dir": self.sim_state, "faults": tuple(s.faults)}
        for key in ("npu_ms", "host_ms", "chip"):
            if getattr(s, key) is not None:
                kw[key] = getattr(s, key)
        return kw

    def _spawn(self, target, spec, name: str) -> tuple[Any, Connection, Connection]:
        """Start a child with a task pipe to it and a result pipe from it."""
        task_r, task_w = self.ctx.Pipe(duplex=False)
        res_r, res_w = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=target, args=(spec, task_r, res_w), name=name)
        proc.daemon = True
        proc.start()
        task_r.close()  # the child's ends: closed here so EOF means the other side is gone
        res_w.close()
        return proc, task_w, res_r

    def _spawn_worker(self, w: _Worker) -> None:
        w.proc, w.tasks, w.results = self._spawn(worker_main, w.spec, f"batchinfer-core{w.core}")
        self._watch(w, "worker")
        w.state, w.killed_for, w.restart_at = "starting", None, None
        w.starts += 1
        w.start_phase = f"loading the model (limit {_STARTUP_TIMEOUT_S:g} s)"
        w.start_deadline = time.monotonic() + _STARTUP_TIMEOUT_S

    def _spawn_readers(self, ring: RingSpec) -> None:
        for i in range(self.plan.readers):
            spec = ReaderSpec(i, ring, self.plan.preprocess, self.plan.dataset.kind, self.plan.cpus)
            reader = _Reader(spec)
            self._spawn_reader(reader)
            self.readers.append(reader)

    def _spawn_reader(self, r: _Reader) -> None:
        r.proc, r.tasks, r.results = self._spawn(
            reader_main, r.spec, f"batchinfer-reader{r.spec.reader_id}"
        )
        self._watch(r, "reader")

    def _watch(self, child: _Worker | _Reader, kind: str) -> None:
        """Poll ``child``'s result pipe and its process sentinel from now on."""
        for fd, what in ((child.results.fileno(), kind), (child.proc.sentinel, kind + "_exit")):
            self._watched[fd] = (what, child)
            self._poller.register(fd, select.POLLIN)

    def _unwatch(self, child: _Worker | _Reader) -> None:
        for fd in [fd for fd, (_, c) in self._watched.items() if c is child]:
            self._poller.unregister(fd)
            del self._watched[fd]

    def _create_ring(self, outputs: list[tuple[tuple[int, ...], str]]) -> None:
        pre = self.plan.preprocess
        spec = ring_spec(
            slots=self.plan.slots,
            inputs=TensorLayout((pre.shape,), (pre.dtype,)),
            outputs=TensorLayout(tuple(s for s, _ in outputs), tuple("float32" for _ in outputs)),
            board_rows=len(self.plan.cores) * self.cfg.instances_per_core,
        )
        self.ring = SlotRing.create(spec)
        self.flights = [None] * spec.slots
        self.free = deque(range(spec.slots))
        self.writer = PredictionWriter(
            self.plan.out.path,
            ledger=self.manifest,
            topk=self.cfg.topk,
            rows_per_part=self.cfg.part_rows,
            save_outputs=[(f"output{i}", shape) for i, (shape, _) in enumerate(outputs)]
            if self.cfg.save_outputs
            else None,
            first_part=self.plan.resume.next_part if self.plan.resume else 0,
        )
        self._spawn_readers(spec)

    def start(self) -> None:
        """Start every core worker and wait until each is ready or has failed.

        The run (and its clock) starts only then, so every core's canary has been compared
        and no core's start-up time counts against the throughput of the others.
        """
        for pos, core in enumerate(self.plan.cores):
            w = _Worker(core, self._worker_spec(pos, core))
            self.workers[core] = w
            self._spawn_worker(w)
        # Wait for each worker's first start only: a worker restarted meanwhile joins later.
        while self.ring is None or any(
            w.state == "starting" and w.starts == 1 for w in self.workers.values()
        ):
            if all(w.state == "retired" for w in self.workers.values()):
                reasons = "; ".join(self.warnings) or "every worker exited during start-up"
                raise NoCoreError(f"no NPU core could be started: {reasons}")
            if self.stop_reason is not None:
                return
            self._wait_and_handle(_TICK_S)
            self._check_hard_stop()
            self._check_hangs(time.monotonic())
            self._restart_due(time.monotonic())
        self._check_canaries()
        self.items = self._todo()

    def _todo(self) -> Iterator[Item]:
        """The items still to do, in dataset order: within --limit, not done before --resume."""
        done = self.plan.resume
        for item in self.plan.dataset.iter_from(
            skip=done.is_done if done and done.done_keys.size else None
        ):
            if self.cfg.limit is not None and item.index >= self.cfg.limit:
                return
            yield item

    # ---------------------------------------------------------------------------- main loop
    def loop(self) -> None:
        """Run until every item has its row, or a stop request has drained the workers."""
        while True:
            if self.stop_reason is None:
                self._feed_readers()
                self._dispatch()
            if self._finished():
                return
            self._wait_and_handle(_TICK_S)
            self._check_hard_stop()
            now = time.monotonic()
            self._check_hangs(now)
            self._restart_due(now)
            if not any(w.state in ("ready", "starting", "down") for w in self.workers.values()):
                raise RunFailedError(
                    "every NPU core was retired after repeated failures, so the run cannot go "
                    "on; see the warnings above, then run again with --resume."
                )

    def _finished(self) -> bool:
        if self.stop_reason is not None:
            busy = any(w.inflight for w in self.workers.values()) or any(
                r.slots for r in self.readers
            )
            return not busy or time.monotonic() > self.stop_deadline
        return self.exhausted and len(self.free) == len(self.flights)

    def _feed_readers(self) -> None:
        while self.free and not self.exhausted:
            item = next(self.items, None)
            if item is None:
                self.exhausted = True
                return
            slot = self.free.popleft()
            self.flights[slot] = _Flight(item)
            self._send_to_reader(slot)

    def _send_to_reader(self, slot: int) -> None:
        item = self.flights[slot].item
        reader = min(self.readers, key=lambda r: len(r.slots))
        if not reader.slots:
            reader.head_since = time.monotonic()
        reader.slots.append(slot)
        _send(reader.tasks, ("read", slot, item.index, item.path))

    def _pick_worker(self, flight: _Flight, open_workers: list[_Worker]) -> _Worker | None:
        """The least loaded worker with room for ``flight``; a retry waits for a fresh core.

        An item that failed goes to a core it has not tried while such a core is alive,
        even if that means waiting for room there; only then is a tried core used again.
        """
        fresh = [w for w in open_workers if w.core not in flight.cores_tried]
        if fresh:
            return min(fresh, key=lambda w: len(w.inflight))
        if flight.cores_tried and any(
            w.state in ("ready", "starting", "down") and w.core not in flight.cores_tried
            for w in self.workers.values()
        ):
            return None
        return min(open_workers, key=lambda w: len(w.inflight), default=None)

    def _dispatch(self) -> None:
        cap = _QUEUED_PER_INSTANCE * self.cfg.instances_per_core
        waiting: list[int] = []
        while self.ready:
            open_workers = [
                w for w in self.workers.values() if w.state == "ready" and len(w.inflight) < cap
            ]
            if not open_workers:
                break
            slot = self.ready.popleft()
            w = self._pick_worker(self.flights[slot], open_workers)
            if w is None:
                waiting.append(slot)  # a retry waiting for a core it has not tried
                continue
            w.inflight.add(slot)
            self.stats.mark_dispatch(time.monotonic())
            _send(w.tasks, ("infer", slot, self.flights[slot].item.index))
        self.ready.extendleft(reversed(waiting))

    # ------------------------------------------------------------------------------ events
    def _wait_and_handle(self, timeout: float) -> None:
        """Handle whatever children sent or did within ``timeout`` seconds.

        One poll object lives as long as the run (children are added and removed as they
        start and die): building a selector per wait cost more than the rest of the loop.
        """
        exits = {}
        for fd, _ in self._poller.poll(timeout * 1000):
            kind, child = self._watched.get(fd, (None, None))
            if kind == "worker":
                self._drain_worker(child)
            elif kind == "reader":
                self._drain_reader(child)
            elif kind is not None:
                exits[id(child)] = (kind, child)
        # Deaths are handled after every pipe is drained, so a child's last messages are
        # always counted before its death is.
        for kind, child in exits.values():
            # The sentinel closes as the process exits; reaping it can lag a moment behind.
            child.proc.join(_REAP_TIMEOUT_S)
            if kind == "worker_exit":
                self._drain_worker(child)
                self._unwatch(child)
                self._on_worker_exit(child)
            else:
                self._drain_reader(child)
                self._on_reader_exit(child)

    @staticmethod
    def _drain(conn: Connection, handle) -> None:
        try:
            while conn.poll():
                handle(conn.recv())
        except (EOFError, OSError):
            pass

    def _drain_worker(self, w: _Worker) -> None:
        self._drain(w.results, lambda msg: self._on_worker_message(w, msg))

    def _drain_reader(self, r: _Reader) -> None:
        self._drain(r.results, lambda msg: self._on_reader_message(r, msg))

    def _on_reader_exit(self, r: _Reader) -> None:
        """A reader died (a decoder crash, the OOM killer, or killed by us when stuck past
        --timeout-s): it is started anew, the item it was decoding is charged an attempt (an
        error row once it has used them all, so a file that crashes or hangs the decoder
        cannot stop the run), the others are read again."""
        code = r.proc.exitcode
        self.reader_deaths += 1
        if self.reader_deaths > _MAX_READER_DEATHS:
            raise RunFailedError(
                f"reader processes died {self.reader_deaths} times (last exit code {code}); "
                "the machine may be out of memory: run with fewer --readers or --slots, "
                "then again with --resume."
            )
        slots = list(r.slots)
        r.slots.clear()
        culprit = self.flights[slots[0]].item.id if slots else None
        what = r.killed_for or f"died (exit code {code})" + (
            f" while decoding {culprit}" if culprit else ""
        )
        self._unwatch(r)
        r.tasks.close()
        r.results.close()
        r.killed_for = None
        self._spawn_reader(r)
        self.warn(f"reader {r.spec.reader_id} {what}; started a new one.")
        if slots:
            flight = self.flights[slots[0]]
            flight.failures.append(f"cannot read {culprit}: the reader process {what}")
            if len(flight.failures) >= self.cfg.max_attempts:
                self.counts["input_errors"] += 1
                self._write_error(slots[0], "; ".join(flight.failures), attempt=0)
                slots = slots[1:]
        for slot in slots:
            self._send_to_reader(slot)

    def _on_reader_message(self, reader: _Reader, msg: tuple) -> None:
        _, slot, _index, read_ms, error = msg
        was_head = reader.slots[0] == slot
        reader.slots.remove(slot)
        if was_head:
            reader.head_since = time.monotonic() if reader.slots else None
        flight = self.flights[slot]
        flight.read_ms = read_ms
        flight.t_loaded = time.monotonic()
        if error is not None:
            self.counts["input_errors"] += 1
            self._write_error(slot, error, attempt=0)
        elif self.stop_reason is not None:
            self._release(slot)  # not dispatched: the item stays to do for --resume
        else:
            self.ready.append(slot)

    def _on_worker_message(self, w: _Worker, msg: tuple) -> None:
        kind = msg[0]
        if kind == "done":
            _, slot, _index, instance, t0, t1, error, busy_s = msg
            w.inflight.discard(slot)
            w.busy_now = busy_s
            self.stats.set_busy(w.core, busy_s)
            flight = self.flights[slot]
            flight.cores_tried.append(w.core)
            if error is None:
                w.crashes_in_row = 0
                self._write_success(slot, w.core, instance, t0, t1)
            else:
                self._fail(slot, f"core {w.core}: {error}", core=w.core)
        elif kind == "initialised":
            w.start_phase = f"the canary inference (limit --timeout-s {self.cfg.timeout_s:g})"
            w.start_deadline = time.monotonic() + self.cfg.timeout_s
        elif kind == "ready":
            w.start_deadline = None
            self._on_ready(w, msg[2])
        elif kind == "init_failed":
            w.state = "retired"
            self.warn(f"core {w.core} retired: {msg[2]}")

    def _on_ready(self, w: _Worker, info: dict) -> None:
        self.sdk_versions[w.core] = info.get("sdk_version")
        if self.ring is None:
            self._create_ring(info["outputs"])
        _send(w.tasks, ("attach", self.ring.spec))
        w.state = "ready"
        if not self.cfg.canary:
            return
        if self.canary_ref is None:
            self.canaries[w.core] = info["canary"]  # judged together once all cores are up
        else:
            self._warn_canary(w.core, info["canary"])  # a restarted worker

    @staticmethod
    def _canary_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
        """Largest output difference relative to the outputs' magnitude."""
        worst = max(float(np.max(np.abs(x - y), initial=0.0)) for x, y in zip(a, b, strict=True))
        scale = max(float(np.max(np.abs(x), initial=0.0)) for x in a) or 1.0
        return worst / scale

    def _check_canaries(self) -> None:
        """Compare every core's canary outputs with the majority's; warn for the odd ones."""
        if not self.canaries:
            return
        cores = sorted(self.canaries)

        def agreeing(c: int) -> int:
            return sum(
                self._canary_diff(self.canaries[c], self.canaries[o]) <= _CANARY_RTOL for o in cores
            )

        ref = max(cores, key=lambda c: (agreeing(c), -c))
        self.canary_ref = (ref, self.canaries[ref])
        for core in cores:
            self._warn_canary(core, self.canaries[core])
        self.canaries.clear()

    def _warn_canary(self, core: int, outs: list[np.ndarray]) -> None:
        ref_core, ref = self.canary_ref
        diff = self._canary_diff(ref, outs)
        if diff > _CANARY_RTOL:
            self.warn(
                f"core {core} gives different outputs from core {ref_core} for the same canary "
                f"input (largest difference {diff:.2%} of the output range); some models do on "
                "real boards (airockchip/rknn-toolkit2#228): check this core's rows before "
                "trusting them, or leave it out with --cores."
            )

    def _on_worker_exit(self, w: _Worker) -> None:
        code = w.proc.exitcode
        if w.state == "retired":  # init_failed already said why
            self._requeue_all(w)
            return
        w.state = "down"
        self.stats.add_busy(w.core, w.busy_now)  # carried over; add_restart zeroes the live value
        w.busy_now = 0.0
        reason = w.killed_for or f"worker process crashed (exit code {code})"
        rows = slice(w.spec.board_row, w.spec.board_row + w.spec.instances)
        charged = set()
        if self.ring is not None:
            board = self.ring.board[rows]
            charged = {int(idx) for idx, t in board if t > 0}
            board[:] = 0.0
        for slot in sorted(w.inflight):
            flight = self.flights[slot]
            if flight.item.index in charged:
                flight.cores_tried.append(w.core)
                self._fail(slot, f"core {w.core}: {reason}", core=w.core)
            else:
                self.ready.appendleft(slot)
        w.inflight.clear()
        self.stats.add_restart(w.core)
        w.crashes_in_row += 1
        if w.crashes_in_row >= _MAX_CONSECUTIVE_CRASHES:
            w.state = "retired"
            self.warn(
                f"core {w.core} retired after {w.crashes_in_row} crashes in a row "
                f"(last: {reason}); the run goes on with the other cores."
            )
        else:
            delay = _BACKOFF_S[min(w.crashes_in_row, len(_BACKOFF_S)) - 1]
            w.restart_at = time.monotonic() + delay
            self.warn(f"core {w.core}: {reason}; restarting it in {delay:g} s.")

    def _requeue_all(self, w: _Worker) -> None:
        for slot in sorted(w.inflight):
            self.ready.appendleft(slot)
        w.inflight.clear()

    def _restart_due(self, now: float) -> None:
        if self.stop_reason is not None:
            return
        for w in self.workers.values():
            if w.state == "down" and w.restart_at is not None and now >= w.restart_at:
                self._close_pipes(w)
                self._spawn_worker(w)

    def _check_hangs(self, now: float) -> None:
        if now < self._next_hang_check:
            return
        self._next_hang_check = now + _TICK_S
        for r in self.readers:
            if r.head_since is not None and now - r.head_since > self.cfg.timeout_s:
                # Killed like a crashed decoder: _on_reader_exit charges the item it was on.
                culprit = self.flights[r.slots[0]].item.id
                r.killed_for = (
                    f"was stuck decoding {culprit} for more than {self.cfg.timeout_s:g} s"
                )
                r.head_since = None
                r.proc.kill()
        for w in self.workers.values():
            if w.state == "starting" and w.killed_for is None and now > (w.start_deadline or now):
                w.killed_for = f"{w.start_phase} hung while starting; worker killed"
                w.proc.kill()
        if self.ring is None:
            return
        board = self.ring.board
        # One snapshot: workers write the board concurrently, and reading a row twice could
        # see it busy and then idle (0.0), which looks like a start at the epoch.
        snap = board.copy()
        started = snap[:, 1]
        late = np.nonzero((started > 0) & (now - started > self.cfg.timeout_s))[0]
        for row in late:
            w = self.workers[self.plan.cores[row // self.cfg.instances_per_core]]
            if w.state == "ready" and w.killed_for is None:
                w.killed_for = (
                    f"inference of item {int(snap[row, 0])} hung for more than "
                    f"{self.cfg.timeout_s:g} s; worker killed"
                )
                w.proc.kill()

    # ------------------------------------------------------------------------------- rows
    def _fail(self, slot: int, failure: str, core: int | None) -> None:
        flight = self.flights[slot]
        flight.failures.append(failure)
        if len(flight.failures) >= self.cfg.max_attempts or self.stop_reason is not None:
            if self.stop_reason is not None and len(flight.failures) < self.cfg.max_attempts:
                self._release(slot)  # left to do for --resume
                return
            self._write_error(
                slot, "; ".join(flight.failures), attempt=len(flight.failures), core=core
            )
        else:
            self.ready.appendleft(slot)

    def _write_success(self, slot: int, core: int, instance: int, t0: float, t1: float) -> None:
        t_c = time.perf_counter()
        self._write_row(
            slot,
            core=core,
            instance=instance,
            attempt=len(self.flights[slot].failures) + 1,
            latency_ms=(t1 - t0) * 1e3,
            wait_ms=max(0.0, (t0 - self.flights[slot].t_loaded) * 1e3),
            outputs=self.ring.outputs(slot),
            t_done=t1,
        )
        self.collect_s += time.perf_counter() - t_c

    def _write_error(self, slot: int, error: str, attempt: int, core: int | None = None) -> None:
        self._write_row(slot, core=core, attempt=attempt, error=error, t_done=time.monotonic())

    def _write_row(
        self,
        slot: int,
        *,
        core: int | None,
        attempt: int,
        t_done: float,
        instance: int | None = None,
        latency_ms: float | None = None,
        wait_ms: float | None = None,
        error: str | None = None,
        outputs: list[np.ndarray] | None = None,
    ) -> None:
        """The item's one row, then its slot is free (see NOTE in slots.py, rule 1)."""
        flight = self.flights[slot]
        item = flight.item
        self.writer.add(
            index=item.index,
            id=item.id,
            id_bytes=item.id_bytes,
            label=item.label,
            label_name=item.label_name,
            core=core,
            instance=instance,
            attempt=attempt,
            latency_ms=latency_ms,
            read_ms=flight.read_ms,
            wait_ms=wait_ms,
            error=error,
            outputs=outputs,
        )
        self.stats.record(core, t_done, latency_ms, error is None)
        self.counts["succeeded" if error is None else "errors"] += 1
        self._release(slot, written=True)

    def _release(self, slot: int, written: bool = False) -> None:
        self.flights[slot] = None
        self.free.append(slot)
        if written and self.progress is not None:
            self.progress.update(1)

    # ---------------------------------------------------------------------------- signals
    def request_stop(self, reason: str) -> None:
        """SIGINT/SIGTERM handler: the first stops dispatching (in-flight items finish, a
        bounded wait); the second asks to stop at once; later ones are ignored.

        It only sets flags: the main loop acts on them between two events, so a signal
        never cuts a row or a Parquet part in half.
        """
        if self.stop_reason is not None:
            self.hard_stop = True
            return
        self.stop_reason = reason
        self.stop_deadline = time.monotonic() + min(self.cfg.timeout_s, 10.0)
        self.warn(
            f"{reason}: finishing the items in flight (at most "
            f"{min(self.cfg.timeout_s, 10.0):g} s); press Ctrl-C again to stop at once."
        )

    def _check_hard_stop(self) -> None:
        if self.hard_stop:
            raise _Interrupted

    # ---------------------------------------------------------------------------- shutdown
    def _close_pipes(self, w: _Worker) -> None:
        for conn in (w.tasks, w.results):
            if conn is not None:
                conn.close()
        w.tasks = w.results = None

    def close(self) -> None:
        """Stop every child, then unlink every segment (shutdown order: NOTE in slots.py).

        After a second Ctrl-C the children are killed at once instead of asked to stop.
        """
        procs = [w.proc for w in self.workers.values()] + [r.proc for r in self.readers]
        if not self.hard_stop:
            for conn in [w.tasks for w in self.workers.values()] + [r.tasks for r in self.readers]:
                if conn is not None:
                    with contextlib.suppress(OSError):
                        conn.send(("stop",))
        deadline = time.monotonic() + (0.0 if self.hard_stop else _JOIN_TIMEOUT_S)
        for p in procs:
            if p is not None:
                p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p is not None and p.is_alive():
                p.kill()
                p.join(_JOIN_TIMEOUT_S)
        for w in self.workers.values():
            self._close_pipes(w)
        for r in self.readers:
            r.tasks.close()
            r.results.close()
        if self.ring is not None:
            self.ring.close(unlink=True)
            self.ring = None
        if self.sim_state is not None:
            shutil.rmtree(self.sim_state, ignore_errors=True)


def sweep_dead_sim_states() -> None:
    """Remove emulator board folders left by coordinators that died (see _sim_kwargs)."""
    root = Path(tempfile.gettempdir())
    for path in root.glob(f"{_SIM_STATE_PREFIX}*-*"):
        pid = path.name[len(_SIM_STATE_PREFIX) :].split("-")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextlib.contextmanager
def _arrow_system_allocator():
    """Let Arrow use malloc while the run lasts (restored afterwards).

    Arrow's default allocator (mimalloc) keeps the pages of every Parquet part it wrote:
    measured here, writing 8,192 rows grew the process by ~20 MB that it never gave back,
    against ~2 MB with the system allocator. The coordinator's memory should depend on the
    slots, not on how many parts it has written.
    """
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


class _StopSignals:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal, an ssh drop) for the whole of run().

    Before the coordinator exists (planning, listing the dataset, preparing OUT) a signal
    raises RunInterrupted (exit 130): nothing has started. Once it exists, a signal only
    calls its ``request_stop``, which sets flags the main loop acts on between events, so
    a signal never cuts a row, a part or the manifest in half. Main thread only (Python
    delivers signals there); elsewhere it does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.coordinator: Coordinator | None = None
        self._old: dict = {}

    def _handler(self, signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if self.coordinator is None:
            raise RunInterrupted(f"interrupted by {name} before the run started")
        self.coordinator.request_stop(f"interrupted by {name}")

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handler) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc_info: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def run(config: RunConfig) -> RunResult:
    """Run a model over a dataset on the requested NPU cores; the library's main entry point.

    Raises a :class:`~batchinfer.errors.BatchinferError` for anything that stops the run
    before or while it runs; item failures are error rows, not exceptions.
    """
    with _arrow_system_allocator(), _StopSignals() as signals:
        plan = plan_run(config)
        lock = OutLock(plan.out.path, command=config.command)
        try:
            plan, continued = prepare_out(plan, lock)
            return _run(plan, continued, signals)
        finally:
            lock.release()


def _run(plan: RunPlan, continued: RunManifest | None, signals: _StopSignals) -> RunResult:
    config = plan.config
    if plan.backend == "sim":
        sweep_dead_sim_states()
    started = time.time()
    invocation = {
        "command": config.command,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "status": "running",
        "pid": os.getpid(),
    }
    fields: dict[str, Any] = {
        "command": config.command,
        "config": config.to_json(),
        "model": str(plan.model),
        "model_sha256": plan.model_sha256,
        "fingerprint": plan.fingerprint,
        "backend": plan.backend,
        "dataset": {
            "root": str(plan.dataset.root),
            "kind": plan.dataset.kind,
            "items": len(plan.dataset),
        },
        "preprocess": plan.preprocess_json(),
        "cores": list(plan.cores),
        "instances_per_core": config.instances_per_core,
        "slots": plan.slots,
        "readers": plan.readers,
        "cpu_affinity": list(plan.cpus) if plan.cpus else None,
        "host": host_facts(),
        "started_at": invocation["started_at"],
        "status": "running",
        "pid": os.getpid(),
    }
    if continued is None:
        manifest = RunManifest.new(
            plan.out.path, run_id=uuid.uuid4().hex[:12], invocations=[invocation], **fields
        )
    else:
        manifest = continued
        manifest.data.setdefault("invocations", []).append(invocation)
        manifest.data.update(fields)
    manifest.save()
    coord = Coordinator(plan, manifest)
    signals.coordinator = coord
    status, error = _drive(coord, plan)
    exit_code, error = _finish(coord, plan, started, status, error)
    if error is not None:
        raise error
    return RunResult(
        out=plan.out.path,
        status=status,
        exit_code=exit_code,
        total=len(plan.dataset),
        skipped=plan.skipped,
        succeeded=coord.writer.rows_written - coord.writer.errors_written if coord.writer else 0,
        errors=coord.writer.errors_written if coord.writer else 0,
        summary=format_summary(coord.stats.table()),
        warnings=coord.warnings,
    )


def _drive(coord: Coordinator, plan: RunPlan) -> tuple[str, BatchinferError | None]:
    """Start the workers and run the main loop; always stops the children: (status, error)."""
    try:
        coord.start()
        log.info(
            "started: %d items on cores %s (%s, %d instance(s) per core); results in %s",
            plan.todo,
            ",".join(str(c) for c in plan.cores),
            plan.backend,
            plan.config.instances_per_core,
            plan.out.path,
        )
        if plan.config.progress:  # after start-up, so its rate counts only the run itself
            from tqdm import tqdm

            coord.progress = tqdm(
                total=plan.todo, unit="item", dynamic_ncols=True, file=sys.stderr, smoothing=0.1
            )
        coord.loop()
        return ("interrupted" if coord.stop_reason else "complete"), None
    except _Interrupted:
        return "interrupted", None
    except BatchinferError as e:
        return "failed", e
    finally:
        coord.close()
        if coord.progress is not None:
            coord.progress.close()


def _finish(
    coord: Coordinator,
    plan: RunPlan,
    started: float,
    status: str,
    error: BatchinferError | None,
) -> tuple[int, BatchinferError | None]:
    """Write rows, stats, timeline and the manifest, whatever happened: (exit code, error).

    What is written is what --resume continues from. A write failure here (disk full) is
    the run's error, unless it already failed for another reason. The manifest's counts
    are what is on disk, not what was collected.
    """
    try:
        if coord.writer is not None:
            coord.writer.close()
        write_core_stats(plan.out.path, coord.stats)
        write_timeline(plan.out.path, coord.stats)
    except OutputWriteError as e:
        error = error or e
        status = "failed"
    c = coord.counts
    written = coord.writer.rows_written if coord.writer else 0
    errors = coord.writer.errors_written if coord.writer else 0
    if status == "interrupted":
        exit_code = EXIT_INTERRUPTED
    elif status == "complete":
        exit_code = EXIT_ITEM_ERRORS if errors else EXIT_OK
    else:
        exit_code = error.exit_code if error else 3
    on_disk, errors_on_disk = coord.manifest.rows_on_disk()
    counts = {
        "dataset": len(plan.dataset),
        "to_do": plan.todo,
        "skipped_done": plan.skipped,
        "written": written,
        "succeeded": written - errors,
        "errors": errors,
        "input_errors": c["input_errors"],
        "collected_not_written": c["succeeded"] + c["errors"] - written,
        "rows_on_disk": on_disk,
        "errors_on_disk": errors_on_disk,
    }
    finished = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    coord.manifest.data["invocations"][-1].update(
        status=status, exit_code=exit_code, finished_at=finished, counts=counts
    )
    manifest_fields = dict(
        status=status,
        exit_code=exit_code,
        error=str(error) if error else None,
        finished_at=finished,
        wall_s=round(time.time() - started, 3),
        counts=counts,
        sdk_versions={str(k): v for k, v in coord.sdk_versions.items()},
        retired_cores=[w.core for w in coord.workers.values() if w.state == "retired"],
        warnings=coord.warnings,
        timings={"collect_s": round(coord.collect_s, 4)},
        coordinator_peak_rss_mb=round(_peak_rss_mb(), 1),
    )
    try:
        coord.manifest.update(**manifest_fields)
    except OutputWriteError as e:
        error = error or e
    return exit_code, error
