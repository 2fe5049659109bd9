"""The board's own NPU load, sampled from the moment a run starts until it ends.

An engine observer: at :class:`~batchinfer.engine.events.Started` it asks for the run's
backend (the one its children got, which knows where its board writes the load); at
:class:`~batchinfer.engine.events.CoresReady` (every runtime is initialised: the steady
state, as for bench's warm-up) it starts :class:`batchinfer.runtime.npu_load.
NpuLoadSampler` on a thread of the coordinator; the caller stops it when the engine
returns. When the driver's file cannot be read, that is said once, as a log line, when
sampling starts (never per sample). A run that ends before every core is ready (a few
items) has no figure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchinfer.engine.board.pool import BoardPool
from batchinfer.engine.events import CoresReady, Started
from batchinfer.runtime.npu_load import NpuLoad, NpuLoadSampler, board_load_file
from batchinfer.runtime.sim_load import load_path

log = logging.getLogger(__name__)
NOT_SAMPLED = "the run ended before every core was ready: no NPU load was sampled"


class NpuLoadWatch:
    """Samples the NPU load from Started until :meth:`stop` (see the module docstring).

    ``backend``: called once at Started, returns the run's backend, or None where the
    coordinator cannot see the NPU (a cluster's nodes).
    """

    def __init__(self, backend: Callable[[], Any]) -> None:
        self._backend = backend
        self.sampler: NpuLoadSampler | None = None
        self._started = False

    def notify(self, event: object) -> None:
        if isinstance(event, Started) and self.sampler is None:
            self.sampler = sampler_for(self._backend())
        elif isinstance(event, CoresReady) and self.sampler is not None and not self._started:
            self._started = True
            self.sampler.start()
            if self.sampler.unreadable is not None:
                log.info(self.sampler.unreadable)

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()

    def summary(self, t0: float | None = None, t1: float | None = None) -> NpuLoad | None:
        """The load over ``[t0, t1]`` (the whole run by default); None: no NPU to read."""
        if self.sampler is None:
            return None
        if not self._started:
            return NpuLoad(self.sampler.label, unreadable=NOT_SAMPLED)
        return self.sampler.summary(t0, t1)


def board_backend(engine: object) -> Any:
    """The backend a run on this board gave its children (it knows where the board writes
    the NPU load); None on a cluster, whose NPUs the coordinator cannot read."""
    pool = getattr(engine, "pool", None)
    return pool.backend if isinstance(pool, BoardPool) else None


def sampler_for(backend: Any, root: Path = Path("/")) -> NpuLoadSampler | None:
    """The sampler of a run's backend (the one its children got: ``Backend.for_run``'s):
    the board's driver file for rknnlite, the emulated board's file for sim (its state
    folder), None for backends without an NPU (onnx, toolkit)."""
    name = getattr(backend, "name", None)
    if name == "rknnlite":
        return NpuLoadSampler(board_load_file(root))
    state_dir = getattr(backend, "state_dir", None)
    if name == "sim" and state_dir is not None:
        path = load_path(Path(state_dir), backend.chip())
        return NpuLoadSampler(
            path,
            label=f"the emulator's rknpu load file ({path.name})",
            hint="the emulator writes it when its runtimes start: report this as a bug",
        )
    return None
