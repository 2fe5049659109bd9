"""Checks of what a run takes from the machine: memory, /dev/shm, open files.

Sized for the default plan (batchinfer.engine.planning.plan): one worker per NPU core with one
instance each, readers up to the CPUs usable, and the slots ``default_slots`` gives, each
holding one of the model's inputs (read off ``--model``; without one a 640x640 RGB image,
a detector's usual input). The /dev/shm and open-files verdicts are the engine's own
checks (``slots_fit_error``, ``fd_limit_problem``), so doctor and a run agree.
"""

from __future__ import annotations

import resource
from pathlib import Path

from batchinfer.doctor.machine import Machine
from batchinfer.doctor.report import Check, fail, ok
from batchinfer.engine.planning.instances import default_slots
from batchinfer.engine.planning.plan import slots_fit_error
from batchinfer.engine.plumbing.fd_limit import fd_limit_problem, fds_needed
from batchinfer.engine.slots import TensorLayout
from batchinfer.errors import BatchinferError
from batchinfer.messages import setting

#: The input assumed without --model: a 640x640 RGB image, uint8.
DEFAULT_INPUT = ((1, 640, 640, 3), "uint8")
#: Memory one process of a run holds besides the model (Python, numpy, the runtime): rough,
#: from the RSS of the sim backend's workers.
PROCESS_BYTES = 100 << 20


def model_input(model: Path | None) -> tuple[tuple[int, ...], str, str]:
    """The first input's (shape, dtype) of ``model``, and where it came from."""
    if model is not None:
        if model.suffix.lower() == ".rknn":
            from batchinfer.runtime.rknn_file import read_rknn_metadata

            try:
                meta = read_rknn_metadata(model)
            except BatchinferError:
                meta = None
            if meta is not None and meta.inputs:
                first = meta.inputs[0]  # int8 on the NPU; the slots hold 8-bit pixels
                dtype = "uint8" if first.dtype else "float32"
                return first.shape, dtype, model.name
        else:
            from batchinfer.runtime import describe_model

            try:
                tensor = describe_model(model).inputs[0]
                shape = tuple(d if d > 0 else 1 for d in tensor.shape)
                return shape, str(tensor.dtype), model.name
            except (BatchinferError, IndexError):
                pass
    return (*DEFAULT_INPUT, "a 640x640 RGB input (no --model)")


def plan_size(m: Machine, cores: int) -> tuple[int, int]:
    """(slots, processes) of the default plan on ``cores`` NPU cores."""
    readers = max(1, m.cpus)
    return default_slots(cores, 1, readers), cores + readers


def memory(m: Machine, cores: int, model: Path | None) -> list[Check]:
    shape, dtype, source = model_input(model)
    layout = TensorLayout((shape,), (dtype,))
    slots, processes = plan_size(m, cores)
    shm_need = slots * layout.nbytes
    model_bytes = model.stat().st_size if model is not None and model.is_file() else 0
    need = shm_need + processes * PROCESS_BYTES + cores * model_bytes
    checks = []
    available = _mem_available(m)
    workers = f"{cores} core worker{'s' if cores > 1 else ''}"
    plan = f"{workers}, {processes - cores} readers, {slots} slots of {source}"
    if available is None:
        checks.append(ok("memory", "Memory", f"not readable (/proc/meminfo); the plan: {plan}"))
    elif available < need:
        checks.append(
            fail(
                "memory",
                "Memory",
                f"{available / 2**20:.0f} MiB available, a run needs about "
                f"{need / 2**20:.0f} MiB ({plan})",
                "close other programs, or run with fewer readers and cores ("
                + setting("runtime.readers")
                + ", "
                + setting("runtime.cores")
                + ").",
                available=available,
                need=need,
            )
        )
    else:
        checks.append(
            ok(
                "memory",
                "Memory",
                f"{available / 2**20:.0f} MiB available, a run needs about {need / 2**20:.0f} MiB",
                available=available,
                need=need,
            )
        )
    checks.append(_shm(m, slots, layout, plan))
    return checks


def size(nbytes: float) -> str:
    """Bytes in MiB, or KiB below one MiB (a small model's slots take a few KiB)."""
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def _mem_available(m: Machine) -> int | None:
    for line in (m.read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _shm(m: Machine, slots: int, layout: TensorLayout, plan: str) -> Check:
    try:
        st = m.statvfs(str(m.path("/dev/shm")))
    except OSError:
        return fail(
            "shm",
            "/dev/shm",
            "missing: the engine's shared memory lives there",
            "mount it (sudo mount -t tmpfs -o size=1g tmpfs /dev/shm).",
        )
    free = st.f_bavail * st.f_frsize
    error = slots_fit_error(slots, layout, free, "/dev/shm")
    need = slots * layout.nbytes
    if error is not None:
        return fail(
            "shm",
            "/dev/shm",
            f"{size(free)} free, the default plan needs {size(need)} ({plan})",
            error.message,
            free=free,
            need=need,
        )
    return ok(
        "shm",
        "/dev/shm",
        f"{size(free)} free, the default plan needs {size(need)}",
        free=free,
        need=need,
    )


def open_files(m: Machine, cores: int) -> Check:
    soft, _ = m.nofile()
    limit = None if soft == resource.RLIM_INFINITY else soft
    _, processes = plan_size(m, cores)
    need = fds_needed(processes)
    problem = fd_limit_problem(limit, processes)
    shown = "unlimited" if limit is None else str(limit)
    if problem is not None:
        return fail(
            "open_files",
            "Open files",
            f"limit {shown}, a run needs about {need}",
            problem,
            limit=limit,
            need=need,
        )
    return ok(
        "open_files",
        "Open files",
        f"limit {shown}, a run needs about {need}",
        limit=limit,
        need=need,
    )
