"""The two limits a throughput is judged against, measured on this machine.

- **NPU limit** (emulator only): every core busy all the time, ``cores × 1000 / npu_ms``
  items/s. On a board the NPU time per call is the runtime's to know, so there is no
  figure (None).
- **Decode limit**: every usable CPU doing nothing but preparing inputs,
  ``cpus × 1000 / (decode_cpu_ms + call_cpu_ms)`` items/s, where ``decode_cpu_ms`` is one
  process's CPU time to read one of the dataset's files into a model input (decode and
  resize, or an .npy copy; the median over a sample of files, ``load_into`` as the readers
  call it) and ``call_cpu_ms`` the CPU time of one runtime call in the calling thread (the
  emulator's own per-call CPU, its ``host_ms`` included; measured only under the emulator,
  where the call runs in a process on the same CPUs).

A throughput is then reported as a fraction of each. The times are CPU times
(``time.process_time`` / ``time.thread_time``): on a shared machine they move far less
than wall time. Measured after the run, so they never compete with it.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchinfer.data.preprocess import Preprocess, load_into
from batchinfer.runtime.rknn_log import quiet_instance_logs

#: The variable quiet_instance_logs sets (runtime/rknn_log.py).
_LOG_LEVEL = "BATCHINFER_RKNN_LOG_LEVEL"

#: At most this many files, and about this much CPU time, for the decode figure.
DECODE_FILES = 24
DECODE_BUDGET_S = 1.0
#: Runtime calls timed for the emulator's per-call CPU.
CALLS = 40


@dataclass(frozen=True)
class Limits:
    cpus: int
    npu_per_s: float | None = None
    decode_per_s: float | None = None
    decode_cpu_ms: float | None = None
    call_cpu_ms: float | None = None

    def fractions(self, per_s: float) -> dict[str, float | None]:
        """``per_s`` as a fraction of each limit (None where a limit is unknown)."""
        return {
            "npu": per_s / self.npu_per_s if self.npu_per_s else None,
            "decode": per_s / self.decode_per_s if self.decode_per_s else None,
        }

    def to_json(self) -> dict[str, Any]:
        def r(x: float | None, n: int) -> float | None:
            return None if x is None else round(x, n)

        return {
            "cpus": self.cpus,
            "npu_per_s": r(self.npu_per_s, 1),
            "decode_per_s": r(self.decode_per_s, 1),
            "decode_cpu_ms": r(self.decode_cpu_ms, 4),
            "call_cpu_ms": r(self.call_cpu_ms, 4),
        }


def npu_limit(cores: int, npu_ms: float | None) -> float | None:
    return cores * 1e3 / npu_ms if npu_ms else None


def decode_cpu_ms(
    paths: Sequence[str],
    spec: Preprocess,
    kind: str,
    files: int = DECODE_FILES,
    budget_s: float = DECODE_BUDGET_S,
) -> float | None:
    """Median CPU ms for one process to read one file into a model input (files that
    fail are skipped: an error row costs no decode). None when none could be read."""
    out = np.empty(spec.shape, spec.dtype)
    times: list[float] = []
    spent = 0.0
    step = max(1, len(paths) // files)
    for path in list(paths)[::step][:files]:
        t0 = time.process_time()
        try:
            load_into(path, spec, out, kind)
        except Exception:  # the run reports its error rows; the limit is about the others
            continue
        took = time.process_time() - t0
        times.append(took)
        spent += took
        if spent > budget_s and len(times) >= 3:
            break
    return 1e3 * statistics.median(times) if times else None


def call_cpu_ms(adapter: Any, spec: Preprocess, calls: int = CALLS) -> float:
    """Median CPU ms of one ``adapter.infer`` call in this thread."""
    x = np.zeros(spec.shape, spec.dtype)
    adapter.infer([x], reuse_outputs=True, data_format=spec.layout)  # warm-up
    times = []
    for _ in range(calls):
        t0 = time.thread_time()
        adapter.infer([x], reuse_outputs=True, data_format=spec.layout)
        times.append(time.thread_time() - t0)
    return 1e3 * statistics.median(times)


def decode_limit(cpus: int, decode_ms: float | None, call_ms: float | None) -> float | None:
    if decode_ms is None:
        return None
    return cpus * 1e3 / (decode_ms + (call_ms or 0.0))


@contextlib.contextmanager
def _quiet_instance() -> Iterator[None]:
    """An instance made here starts as quiet as a core worker's (quiet_instance_logs): its
    start-up I and W lines would land in the middle of the report. The process's own level
    (a library caller's) is left as it was."""
    given = os.environ.get(_LOG_LEVEL)
    quiet_instance_logs()
    try:
        yield
    finally:
        if given is None:
            os.environ.pop(_LOG_LEVEL, None)


def measure(
    cpus: int,
    cores: int,
    npu_ms: float | None,
    spec: Preprocess | None = None,
    paths: Sequence[str] = (),
    kind: str = "",
    backend: Any = None,
    core: int = 0,
) -> Limits:
    """The limits for a run over ``paths`` (none: synthetic inputs, no decode limit).
    ``backend``: the emulator's, to time its per-call CPU (None elsewhere)."""
    decode = decode_cpu_ms(paths, spec, kind) if spec is not None and paths else None
    call = None
    if backend is not None and spec is not None and decode is not None:
        run = backend.for_run()
        with _quiet_instance():
            adapter = run.instance(core)
        try:
            call = call_cpu_ms(adapter, spec)
        finally:
            adapter.release()
            run.end_run()
    return Limits(
        cpus=cpus,
        npu_per_s=npu_limit(cores, npu_ms),
        decode_per_s=decode_limit(cpus, decode, call),
        decode_cpu_ms=decode,
        call_cpu_ms=call,
    )
