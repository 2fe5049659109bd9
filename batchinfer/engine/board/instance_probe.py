"""``-k auto`` measured: :func:`probe` runs :func:`~batchinfer.engine.planning.instances.measure`
in a child, :func:`settle_instances` puts the choice into the plan.

The rule and the measurement are planning's (engine/planning/instances.py, whose docstring
says what is measured and why); starting the child that measures is the board's plumbing
(engine/plumbing/children.py, as a core worker is started). This module is where the two
meet, so that planning starts no process and the plumbing knows no plan.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from batchinfer.engine.planning.instances import (
    AUTO_MAX,
    FALLBACK,
    Choice,
    Timings,
    choose,
    default_slots,
    measure,
)

log = logging.getLogger("batchinfer")


@dataclass(frozen=True)
class ProbeSpec:
    """What the probe child needs (picklable: it travels to the forked child)."""

    backend: Any  # batchinfer.runtime.backends.Backend
    core: int
    instances: int
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    data_format: str | tuple[str, ...]
    cpus: tuple[int, ...] | None
    parent_pid: int


def probe_main(spec: ProbeSpec, tasks: Connection, results: Connection) -> None:
    """Entry point of the probe child: make the instances, :func:`measure`, report, release."""
    from batchinfer.engine.canary import canary_input
    from batchinfer.engine.plumbing.child import (
        cpu_seconds,
        report_failure,
        send_or_exit,
        setup_child,
    )
    from batchinfer.runtime.rknn_log import quiet_instance_logs

    setup_child(spec.parent_pid, spec.cpus)
    quiet_instance_logs()
    adapters: list = []
    try:
        for _ in range(spec.instances):
            adapters.append(spec.backend.instance(spec.core))
        inputs = [canary_input(s, d) for s, d in zip(spec.shapes, spec.dtypes, strict=True)]
        fmt = spec.data_format if isinstance(spec.data_format, str) else list(spec.data_format)
        calls = [
            (lambda a=a: a.infer(inputs, data_format=fmt, reuse_outputs=True)) for a in adapters
        ]
        timings = dataclasses.replace(measure(calls), cpu_s=cpu_seconds())
        send_or_exit(results, ("timings", timings))
    except BaseException as exc:
        report_failure(results, exc)
    finally:
        for a in adapters:
            a.release()


def probe(plan: Any, timeout_s: float) -> Timings:
    """:func:`measure` on ``plan``'s first core, in a child forked by the run's fork server
    (as a core worker is: a runtime never lives in the coordinator). RuntimeError when it
    fails or takes longer than ``timeout_s``."""
    from batchinfer.engine.plumbing.children import ChildPool, Exited
    from batchinfer.engine.protocol import Failed

    pool = ChildPool(time.monotonic)
    finished = False
    try:
        layout = plan.input_layout
        spec = ProbeSpec(
            backend=plan.backend,
            core=plan.cores[0],
            instances=AUTO_MAX,
            shapes=tuple(layout.shapes),
            dtypes=tuple(layout.dtypes),
            data_format=plan.data_format,
            cpus=plan.cpus,
            parent_pid=pool.parent_pid,
        )
        pool.start("probe", 0, probe_main, spec, timeout_s, "measuring")
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            for event in pool.poll(min(left, 0.5)):
                if isinstance(event, Exited):
                    raise RuntimeError(f"the probe exited (code {event.exitcode})")
                if isinstance(event.body, Failed):
                    raise RuntimeError(event.body.traceback.strip().splitlines()[-1])
                _, value = event.body  # ("timings", Timings)
                finished = True  # it releases its instances and exits by itself
                return value
        raise RuntimeError(f"the measurement took longer than {timeout_s:g} s")
    finally:
        pool.close(hard=not finished, join_timeout_s=5.0)


# ------------------------------------------------------------------ the one entry
def settle_instances(plan: Any, measure_core: Callable[[Any, float], Timings] = probe) -> Any:
    """``plan`` (an EnginePlan) with instances per core chosen when it asks for auto;
    itself otherwise. Says the choice once (the CLI shows it) and records it in the plan's
    ``instances_choice``; default slots (sized for AUTO_MAX) are sized for the choice."""
    if not getattr(plan, "instances_auto", False):
        return plan
    started = time.monotonic()
    try:
        timings = measure_core(plan, plan.reliability.startup_timeout_s)
        choice = choose(timings)
        choice = dataclasses.replace(choice, core=plan.cores[0])
        log.info(choice.line())
    except RuntimeError as e:
        reason = f"measuring failed ({e}); the default used"
        choice = Choice(FALLBACK, reason, core=plan.cores[0])
        log.warning(f"instances per core: {FALLBACK} (auto: {reason})")
    log.debug(f"instances per core chosen in {time.monotonic() - started:.2f} s")
    slots, cores = plan.slots, len(plan.cores)
    if slots == default_slots(cores, AUTO_MAX, plan.max_readers):
        slots = default_slots(cores, choice.k, plan.max_readers)
    return dataclasses.replace(
        plan,
        instances_per_core=choice.k,
        instances_auto=False,
        instances_choice=choice.to_json(),
        slots=slots,
    )
