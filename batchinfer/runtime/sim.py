"""The ``sim`` backend: an NPU emulator that is a drop-in for ``rknnlite.api.RKNNLite``.

A script written for the real runtime runs with only its import changed::

    from batchinfer.runtime.sim import RKNNLite   # was: from rknnlite.api import RKNNLite

It honours the RKNNLite contract (batchinfer/runtime/CONTRACT.md), computes real outputs
with ONNX Runtime (applying the normalisation a ``.rknn`` carries, from its
``<stem>.config.json``), and adds what a board has and a CPU lacks:

Board lines
    The wheel's ``W rknn-toolkit-lite2 version: 2.5.0`` at construction; at init
    librknnrt's ``I RKNN:`` runtime, driver and model lines, and for a static-shape model
    the two dynamic-range warnings every board prints. All go through
    ``self.rknn_log.logger``. A ``.rknn`` whose settings name another ``target_platform``
    fails init with RKNN_ERR_TARGET_PLATFORM_UNMATCH, as on a board.

Core-mask rules per chip
    ``chip`` rk3588 (3 cores, default), rk3576 (2), rk3566 and the other one-core chips.
    See :func:`resolve_core_mask`. When no chip is given (argument or
    BATCHINFER_SIM_CHIP), a loaded ``.rknn`` sets it: the ``target_platform`` of its
    settings, else the first platform its own metadata names.

Time model
    Each ``inference`` call first spends ``host_ms`` on its own (a sleep that releases
    the GIL: it stands for host-side work on the board's CPU), then holds its NPU core
    exclusively for ``npu_ms``. A core is shared by every instance pinned to it, across
    processes: the "board" is a small mmap'd file per chip in ``state_dir`` holding, per
    core, the time (CLOCK_MONOTONIC, system-wide on Linux) until which the core is
    reserved. Under its core's exclusive ``flock`` a call takes ``start = max(entry + host_ms,
    busy_until)`` (``entry``: when inference() was called, so the emulator's own input
    checks count as host time) and sets ``busy_until = start + npu_ms``; it computes the
    ONNX outputs meanwhile and waits until that absolute deadline (sleeping, then yielding
    for the last 0.1 ms), so a call ends close to it and no overshoot piles up
    (``tools/bench_sim.py`` compares the emulator with this model). The seconds each core
    was held also go into the board file, from which the emulator writes the rknpu driver's
    load text beside it (``<chip>.load``: batchinfer.runtime.sim_load).
    So k instances on one core reach at most ``min(k / (host_ms + npu_ms), 1 / npu_ms)``
    calls per second. ``npu_ms="estimate"`` derives npu_ms per model from its ONNX graph
    (:mod:`batchinfer.runtime.timing`): an estimate, labelled so in get_sdk_version and
    the init line.
    Multi-core masks (NPU_CORE_0_1, NPU_CORE_0_1_2, NPU_CORE_ALL) model RKNN's
    multi-core split ideally: the call holds every core of its mask from a common start
    for ``npu_ms / ncores``. One instance on three cores therefore gains only on the NPU
    part, never on ``host_ms``, which is why one instance per core wins on a real board.
    NPU_CORE_AUTO takes whichever core of the chip frees first.
    Batch-N models (a static batch axis N > 1): ``npu_ms`` is one item's NPU time, and a
    call of N items holds its core ``N × npu_ms`` (the estimate, counted on the batch-N
    graph, grows with N by itself); ``host_ms`` is paid once per call. Public reports of
    RKNN batch models on boards find NPU time about linear in N (rockchip-linux/rknpu#47;
    airockchip/rknn-toolkit2#278 found it worse), so a batch gains only the per-call host
    time: a model chosen from those reports, not a board measurement (docs/guide/emulator.md).

Faults (for tests of the engine)
    ``KIND:core=C:call=N`` fires once, at the N-th inference call on core C counted
    across all processes sharing ``state_dir`` (the counters live in the board file, so
    a restarted process does not fire it again); ``KIND:item=I`` fires every time
    dataset item I is inferred. KIND is ``crash`` (SIGKILL to the own process), ``hang``
    (never returns), ``none`` (inference returns None with an E line), or ``init``
    (``init:core=C`` fails every init_runtime on core C, ``init:core=C:call=N`` the N-th);
    ``skew:core=C`` makes every output computed on core C differ slightly (by 1 % of its
    largest magnitude), as some nets do per core on real boards (airockchip/rknn-toolkit2#228).
    ``leak:mb=M`` (every core) or ``leak:core=C:mb=M`` makes every successful call keep M MB
    of memory it touched for as long as its process lives, as a runtime that leaks per call
    does: the worker's memory grows until it is recycled (engine/recycling.py).
    The engine says which item is being inferred with :meth:`RKNNLite.set_current_item`,
    an extra method the real RKNNLite does not have.

Settings come from keyword arguments or the environment: ``BATCHINFER_SIM_CHIP``
(rk3588), ``BATCHINFER_SIM_NPU_MS`` (2.0, or ``estimate``), ``BATCHINFER_SIM_HOST_MS``
(4.0, so one instance keeps its core a third busy, as on real boards), ``BATCHINFER_SIM_FAULTS``
(specs separated by ';'), ``BATCHINFER_SIM_STATE`` (default
``{tempdir}/batchinfer-sim-{uid}/``). Counters persist per state_dir: use a fresh one
per run when faults must fire again.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from batchinfer.errors import ModelError
from batchinfer.runtime import constants as C
from batchinfer.runtime import timing
from batchinfer.runtime._emulated_runtime import EmulatedRuntime
from batchinfer.runtime._onnx_base import (
    RKNN_API_VERSION,
    Deliver,
    DeviceRefused,
    OnnxRKNNBase,
)
from batchinfer.runtime.conversion import ConversionSettings
from batchinfer.runtime.model_info import InputSpec
from batchinfer.runtime.rknn_file import read_rknn_metadata
from batchinfer.runtime.sim_board import Board
from batchinfer.runtime.sim_settings import (
    PER_CORE_KINDS,
    SAME_NPU,
    Fault,
    SimSettings,
    resolve_core_mask,
)

#: The rknpu driver version the emulated board reports (a current RK3588 BSP's).
DRIVER_VERSION = "0.9.8"
ESTIMATE = timing.ESTIMATE  # the npu_ms value that asks for the per-model estimate


def _model_chip(path: Path) -> str | None:
    """The chip an .rknn was converted for: its settings' target_platform, else its own
    metadata's first platform; None when neither names a chip the emulator knows."""
    if path.suffix.lower() != ".rknn":
        return None
    try:
        settings = ConversionSettings.load_beside(path)
        meta = None if settings and settings.target_platform else read_rknn_metadata(path)
    except ModelError:
        return None  # init_runtime says what is wrong with the files
    named = settings.target_platform if settings and settings.target_platform else None
    if named is None and meta is not None and meta.platforms:
        named = meta.platforms[0]
    chip = (named or "").lower()
    return chip if chip in C.CHIP_CORES else None


def _static_batch(specs: tuple[InputSpec, ...]) -> int:
    """A model's batch: its first input's leading axis when static and > 1, else 1."""
    if not specs or len(specs[0].shape) < 2:
        return 1
    return max(1, int(specs[0].shape[0]))


# ---------------------------------------------------------------- timing helpers
_thread_state = threading.local()
_PR_SET_TIMERSLACK = 29


def _tight_timer_slack() -> None:
    """Set this thread's timer slack to 1 ns (Linux), so 2 ms sleeps end near 2.0 ms."""
    if getattr(_thread_state, "slack_set", False):
        return
    _thread_state.slack_set = True
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)


# A timer wake-up lands late even with 1 ns slack: measured here, time.sleep(2 ms) took
# 2.04 ms (median) on an idle machine, more on a loaded one, which would make every emulated
# 2 ms call slower than the NPU it stands for. So the last stretch before a deadline yields
# the CPU in a loop instead of sleeping, for at most _SPIN_S of CPU per call.
_SPIN_S = 0.0001


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.monotonic() - _SPIN_S
    if remaining > 0:
        time.sleep(remaining)
    while time.monotonic() < deadline:
        time.sleep(0)  # releases the GIL and lets other threads and processes run


# What leak faults kept (``leak:mb=M``): for as long as the process lives, as a real leak.
_LEAKED: list[np.ndarray] = []


# ---------------------------------------------------------------- the runtime
class RKNNLite(OnnxRKNNBase):
    """``rknnlite.api.RKNNLite`` emulating an NPU board (see the module docstring)."""

    def __init__(
        self,
        verbose: bool = False,
        verbose_file: str | None = None,
        *,
        chip: str | None = None,
        npu_ms: float | str | None = None,
        host_ms: float | None = None,
        faults: str | Iterable[str | Fault] | None = None,
        state_dir: str | Path | None = None,
    ) -> None:
        self.settings = SimSettings.from_env(
            chip=chip, npu_ms=npu_ms, host_ms=host_ms, faults=faults, state_dir=state_dir
        )
        super().__init__(verbose, verbose_file)
        #: Cores this runtime is pinned to after init_runtime; () = NPU_CORE_AUTO.
        self.cores: tuple[int, ...] = ()
        #: NPU milliseconds per call for the loaded model (settings.npu_ms, or its estimate).
        self.npu_ms: float | None = None
        self._estimate: timing.Estimate | None = None
        self._board: Board | None = None
        self._current_items: frozenset[int] = frozenset()
        #: The loaded model's batch (its first input's static batch axis; 1 for dynamic).
        self.batch = 1

    def set_current_item(self, index: int | None) -> None:
        """Tell the emulator which dataset item the next inference is for (item faults).

        Not part of RKNNLite: the engine calls it only when the runtime has it.
        """
        self._current_items = frozenset() if index is None else frozenset((index,))

    def set_current_items(self, indexes: Iterable[int]) -> None:
        """The items of the next call of a batch-N model: an item fault fires when any of
        them is its item (not part of RKNNLite either)."""
        self._current_items = frozenset(indexes)

    # ---------------------------------------------------------------- hooks
    def _announce(self) -> None:
        self.rknn_log.w(f"rknn-toolkit-lite2 version: {RKNN_API_VERSION}")

    def _loaded(self, path: Path) -> None:
        chip = None if self.settings.chip_given else _model_chip(path)
        if chip is not None and chip != self.settings.chip:
            self.settings = dataclasses.replace(self.settings, chip=chip)

    def _check_settings(self, settings: ConversionSettings | None) -> None:
        if not settings:
            return
        wanted = (settings.target_platform or "").lower()
        chip = self.settings.chip
        if wanted and wanted not in (chip, SAME_NPU.get(chip)):
            self.rknn_log.native(
                logging.ERROR,
                f"The target platform of the model ({wanted}) does not match the current "
                f"platform ({chip}), RKNN_ERR_TARGET_PLATFORM_UNMATCH",
            )
            raise ModelError(
                f"{settings.path} says target_platform {wanted!r}, but the emulated chip is "
                f"{chip}; convert for {chip} or set BATCHINFER_SIM_CHIP={wanted}"
            )

    def _prepare(self, onnx_path: Path, onnx_bytes: bytes, specs: tuple[InputSpec, ...]) -> None:
        self.batch = _static_batch(specs)
        if self.settings.npu_ms != ESTIMATE:
            # npu_ms is one item's NPU time: a batch-N call holds its core N times as long
            # (the Time model's batch rule, module docstring).
            self.npu_ms, self._estimate = float(self.settings.npu_ms) * self.batch, None
            return
        shapes = {s.name: s.to_onnx(s.shape) for s in specs}
        try:
            self._estimate = timing.estimate(onnx_bytes, shapes)
        except (ImportError, ValueError) as exc:
            raise ModelError(f"cannot estimate npu_ms for {onnx_path.name}: {exc}") from exc
        self.npu_ms = self._estimate.npu_ms

    def _before_init(self, core_mask: int) -> bool:
        _tight_timer_slack()
        try:
            self._board = Board(self.settings.state_dir, self.settings.chip)
        except OSError as exc:
            self.rknn_log.e(
                f"cannot open the sim board in {self.settings.state_dir} ({exc}); set "
                "BATCHINFER_SIM_STATE to a writable folder.",
                False,
            )
            return False
        return True

    def _check_device(self, core_mask: int) -> None:
        assert self._board is not None  # _before_init opened it
        try:
            cores, _ = resolve_core_mask(self.settings.chip, core_mask)
        except ValueError:
            cores = ()  # the mask itself fails later, in _apply_core_mask
        init_faults = [f for f in self.settings.faults if f.kind == "init"]
        if not cores or not init_faults:
            return
        with self._board.cores_locked(cores):
            counts = {c: self._board.count(c, init=True) for c in cores}
        for fault in init_faults:
            if fault.core in counts and fault.call in (None, counts[fault.core]):
                self.rknn_log.native(
                    logging.ERROR,
                    f"RKNN_ERR_DEVICE_UNAVAILABLE: NPU core {fault.core} failed to initialise "
                    f"(injected fault {fault}).",
                )
                self.rknn_log.e("Catch exception when init runtime!", False)
                raise DeviceRefused(
                    f"RKNN_ERR_DEVICE_UNAVAILABLE: NPU core {fault.core} (injected fault {fault})"
                )

    def _after_init(self, runtime: EmulatedRuntime) -> None:
        s = self.settings
        log = self.rknn_log
        dynamic = any(spec.shapes is not None for spec in runtime.inputs)
        api, drv = runtime.get_sdk_version()[1:]
        log.native(logging.INFO, f"RKNN Runtime Information, librknnrt version: {api}")
        log.native(logging.INFO, f"RKNN Driver Information, version: {drv}")
        log.native(
            logging.INFO,
            f"RKNN Model Information, version: 6, toolkit version: none (emulated), target: "
            f"RKNPU v2, target platform: {s.chip}, framework name: ONNX, framework layout: "
            f"NCHW, model inference type: {'dynamic_shape' if dynamic else 'static_shape'}",
        )
        if self._estimate is not None:
            log.native(logging.INFO, f"batchinfer sim: {self._estimate.describe()}")

    def _dynamic_checked(self, dynamic: bool) -> None:
        if not dynamic:  # what every board prints for a static-shape model
            self.rknn_log.native(
                logging.WARNING,
                "query RKNN_QUERY_INPUT_DYNAMIC_RANGE error, rknn model is static shape type, "
                "please export rknn with dynamic_shapes",
            )
            self.rknn_log.w(
                "Query dynamic range failed. Ret code: RKNN_ERR_MODEL_INVALID. (If it is a "
                "static shape RKNN model, please ignore the above warning message.)"
            )

    @property
    def _skewed(self) -> bool:
        return any(f.kind == "skew" and f.core in self.cores for f in self.settings.faults)

    def _apply_core_mask(self, core_mask: int) -> None:
        try:
            cores, warnings = resolve_core_mask(self.settings.chip, core_mask)
        except ValueError as exc:
            self.core_mask, self.cores = C.NPU_CORE_AUTO, ()
            self.rknn_log.e(str(exc))  # logs, then raises ValueError as the wheel's e() does
        for warning in warnings:
            self.rknn_log.w(warning)
        self.core_mask, self.cores = core_mask, cores

    def _after_release(self) -> None:
        if self._board is not None:
            self._board.close()
            self._board = None
        self.cores = ()

    def _versions(self) -> tuple[str, str]:
        s = self.settings
        if self._estimate is not None:
            npu = f"npu_ms={self._estimate.npu_ms:.3g} (an estimate from the graph)"
        else:
            npu = f"npu_ms={self.npu_ms:g}"
            if self.batch > 1:
                per_item = self.settings.npu_ms
                npu = f"npu_ms={per_item:g} per item, {self.npu_ms:g} per call of {self.batch}"
        # Imported here, not at the top: the coordinator imports this module to check the
        # emulator's settings and never needs ONNX Runtime (runtime/onnx_graph.py).
        import onnxruntime

        return (
            f"{RKNN_API_VERSION} (batchinfer sim, onnxruntime {onnxruntime.__version__})",
            f"{DRIVER_VERSION} (emulated {s.chip}, {C.CHIP_CORES[s.chip]} core(s), {npu}, "
            f"host_ms={s.host_ms:g})",
        )

    def _execute(
        self, runtime: EmulatedRuntime, feeds: dict[str, np.ndarray], deliver: Deliver
    ) -> list | None:
        # The host phase starts when inference() was entered, so the emulator's own input
        # checks are part of host_ms rather than time on top of host_ms + npu_ms.
        host_done = self._call_started + self.settings.host_ms / 1000.0
        _tight_timer_slack()
        for fault in self.settings.faults:
            if fault.item is not None and fault.item in self._current_items:
                self._fire(fault)  # returns only for "none": no outputs
                return None
        _sleep_until(host_done)
        fired, end = self._reserve(host_done)
        if fired is not None:
            self._fire(fired)
            return None
        outputs = runtime.compute(feeds)
        self._leak()
        if self._skewed:
            # A small, deterministic per-core difference (airockchip/rknn-toolkit2#228).
            outputs = [o + np.float32(0.01) * (np.abs(o).max() or 1) for o in outputs]
        # Outputs are staged while the emulated NPU still holds the core, so the call
        # returns at its deadline rather than after our own copying.
        outputs = deliver(outputs)
        _sleep_until(end)
        return outputs

    def _leak(self) -> None:
        """The leak faults of this call's cores: keep memory that was written (np.full
        touches every page, so it is resident, not merely reserved)."""
        for f in self.settings.faults:
            if f.kind == "leak" and f.mb and (f.core is None or f.core in self.cores):
                _LEAKED.append(np.full(int(f.mb * 2**20), 1, np.uint8))

    def _reserve(self, earliest: float) -> tuple[Fault | None, float]:
        """Reserve this call's core(s) on the board: (fault that fires, end of the hold).

        The hold starts at ``earliest`` (the end of this call's host phase) or when the
        core frees, whichever is later, never before either.
        """
        board = self._board
        assert board is not None and self.npu_ms is not None  # init_runtime succeeded
        ncores = C.CHIP_CORES[self.settings.chip]
        cores = self.cores
        if not cores:  # AUTO: whichever core frees first (a choice: read without its lock)
            now = time.monotonic()
            cores = (min(range(ncores), key=lambda c: board.busy_until(c, now)),)
        with board.cores_locked(cores):
            now = time.monotonic()
            fired = None
            for core in cores:
                n = board.count(core, init=False)
                for fault in self.settings.faults:
                    if fault.kind not in PER_CORE_KINDS and fault.core == core and fault.call == n:
                        fired = fault
            if fired is not None:
                return fired, now
            start = max([min(now, earliest)] + [board.busy_until(c, now) for c in cores])
            end = start + self.npu_ms / 1000.0 / len(cores)
            for core in cores:
                board.hold(core, start, end)
        board.publish_load(now)
        return None, end

    def _fire(self, fault: Fault) -> None:
        """Act out an inference fault; returns (None) only for ``none``."""
        log = self.rknn_log
        if fault.kind == "crash":
            log.e(f"injected fault {fault}: the process dies now.", False)
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind == "hang":
            log.e(f"injected fault {fault}: this call never returns.", False)
            sys.stderr.flush()
            threading.Event().wait()
        log.native(
            logging.ERROR, f"failed to submit!, op id: 0, RKNN_ERR_FAIL (injected fault {fault})."
        )
        log.e("Catch exception when running RKNN model.", False)
        return None
