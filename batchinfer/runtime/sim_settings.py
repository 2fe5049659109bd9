"""The emulator's settings (:class:`SimSettings`: chip, times, faults, state folder, each
also from a BATCHINFER_SIM_* variable) and its core-mask rules per chip; the behaviour they
stand for is described in batchinfer/runtime/sim.py's docstring.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TypedDict

from batchinfer.errors import UsageError
from batchinfer.messages import setting
from batchinfer.runtime import constants as C
from batchinfer.runtime import graph, timing

ESTIMATE = timing.ESTIMATE  # the npu_ms value that asks for the per-model estimate
# Chips that run each other's models (one .rknn serves RK3566 and RK3568).
SAME_NPU = {"rk3566": "rk3568", "rk3568": "rk3566"}

FAULT_KINDS = ("crash", "hang", "none", "init", "skew", "leak")
# Faults that hold for every call on a core rather than firing at one call.
PER_CORE_KINDS = ("init", "skew", "leak")
FAULT_FORMS = (
    "KIND:core=C:call=N (once, at the N-th call on core C), KIND:item=I (every time item I "
    "is inferred), init:core=C (every init on core C fails) or skew:core=C (core C's outputs "
    "differ slightly, as some nets do on real boards), leak:mb=M or leak:core=C:mb=M (every "
    "call keeps M MB); KIND is crash, hang, none or init"
)
_FAULT_RE = re.compile(
    r"^(?P<kind>[a-z]+)"
    r"(?::core=(?P<core>\d+))?"
    r"(?::call=(?P<call>\d+))?"
    r"(?::item=(?P<item>\d+))?"
    r"(?::mb=(?P<mb>\d+(?:\.\d+)?))?$"
)


class _Defaults(TypedDict):
    chip: str
    npu_ms: float
    host_ms: float


_DEFAULTS: _Defaults = {"chip": "rk3588", "npu_ms": 2.0, "host_ms": 4.0}
_ENV = {
    "chip": "BATCHINFER_SIM_CHIP",
    "npu_ms": "BATCHINFER_SIM_NPU_MS",
    "host_ms": "BATCHINFER_SIM_HOST_MS",
    "faults": "BATCHINFER_SIM_FAULTS",
    "state_dir": "BATCHINFER_SIM_STATE",
}


# ---------------------------------------------------------------- settings and faults
@dataclass(frozen=True)
class Fault:
    """One injected fault: ``kind`` with either ``core`` (+ ``call``) or ``item``; a leak
    has ``mb`` (and ``core``, or none: every core)."""

    kind: str
    core: int | None = None
    call: int | None = None
    item: int | None = None
    mb: float | None = None

    def __str__(self) -> str:
        parts = [self.kind]
        for name in ("core", "call", "item", "mb"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={value:g}" if name == "mb" else f"{name}={value}")
        return ":".join(parts)


def parse_fault(spec: str) -> Fault:
    """The Fault a spec such as ``crash:core=1:call=5`` names; UsageError if it is malformed."""
    match = _FAULT_RE.match(spec.strip())
    bad = UsageError(f"Fault spec {spec!r} is not valid; use {FAULT_FORMS}.")
    if match is None or match["kind"] not in FAULT_KINDS:
        raise bad
    kind = match["kind"]
    core, call, item = (
        None if match[k] is None else int(match[k]) for k in ("core", "call", "item")
    )
    if (kind == "leak") != (match["mb"] is not None):
        raise bad
    if kind == "leak":
        if call is not None or item is not None:
            raise bad
        return Fault(kind, core=core, mb=float(match["mb"]))
    if item is not None:
        if core is not None or call is not None or kind in PER_CORE_KINDS:
            raise bad
        return Fault(kind, item=item)
    if core is None or (call is None and kind not in PER_CORE_KINDS) or call == 0:
        raise bad
    if kind == "skew" and call is not None:
        raise bad
    return Fault(kind, core=core, call=call)


def _parse_faults(value: str | Iterable[str | Fault] | None) -> tuple[Fault, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [part for part in value.split(";") if part.strip()]
    return tuple(v if isinstance(v, Fault) else parse_fault(v) for v in value)


def default_state_dir() -> Path:
    """Where boards live by default: a per-user folder in the temp dir (not /dev/shm)."""
    return Path(tempfile.gettempdir()) / f"batchinfer-sim-{os.getuid()}"


@dataclass(frozen=True)
class SimSettings:
    """The emulated board: chip, per-call NPU and host time, faults, state folder."""

    chip: str = _DEFAULTS["chip"]
    npu_ms: float | str = _DEFAULTS["npu_ms"]  # milliseconds, or ESTIMATE
    host_ms: float = _DEFAULTS["host_ms"]
    faults: tuple[Fault, ...] = ()
    state_dir: Path = field(default_factory=default_state_dir)
    #: True when the chip was asked for (argument or BATCHINFER_SIM_CHIP); otherwise the
    #: emulator takes the chip a loaded .rknn was converted for.
    chip_given: bool = False

    @classmethod
    def from_env(cls, **overrides: object) -> SimSettings:
        """Settings from BATCHINFER_SIM_* env vars, with non-None ``overrides`` winning."""
        names = {f.name for f in fields(cls)} - {"chip_given"}
        unknown = set(overrides) - names
        if unknown:
            raise UsageError(
                f"Unknown sim setting(s) {sorted(unknown)}; use {', '.join(sorted(names))}."
            )
        raw: dict[str, object] = {}
        for name in names:
            value = overrides.get(name)
            if value is None:
                value = os.environ.get(_ENV[name]) or None
            if value is not None:
                raw[name] = value
        chip = str(raw.get("chip", _DEFAULTS["chip"])).lower()
        if chip not in C.CHIP_CORES:
            raise UsageError(
                f"Sim chip {chip!r} is unknown; use one of {', '.join(C.CHIP_CORES)} "
                "(" + setting("runtime.sim.chip") + f" or {_ENV['chip']})."
            )
        npu_ms = _npu_ms(raw.get("npu_ms", _DEFAULTS["npu_ms"]))
        host_ms = _milliseconds(raw.get("host_ms", _DEFAULTS["host_ms"]), "host_ms")
        faults = _parse_faults(raw.get("faults"))  # type: ignore[arg-type]
        for fault in faults:
            if fault.core is not None and fault.core >= C.CHIP_CORES[chip]:
                raise UsageError(
                    f"Fault {fault} names core {fault.core}, but {chip} has "
                    f"{C.CHIP_CORES[chip]} NPU core(s); use a core below {C.CHIP_CORES[chip]}."
                )
        state = raw.get("state_dir")
        state_dir = Path(state) if state is not None else default_state_dir()  # type: ignore[arg-type]
        return cls(chip, npu_ms, host_ms, faults, state_dir, chip_given="chip" in raw)


def _npu_ms(value: object) -> float | str:
    if isinstance(value, str) and value.strip().lower() == ESTIMATE:
        if not graph.onnx_available():
            raise UsageError(
                f"Sim npu_ms={ESTIMATE!r} reads the model's graph, but {graph.ONNX_MISSING}, "
                "or give npu_ms in milliseconds."
            )
        return ESTIMATE
    return _milliseconds(value, "npu_ms")


def _milliseconds(value: object, name: str) -> float:
    try:
        ms = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        ms = -1.0
    if not ms >= 0.0 or ms == float("inf"):
        raise UsageError(
            f"Sim {name}={value!r} is not a duration; give milliseconds >= 0, e.g. 2.0"
            + (f" or {ESTIMATE!r}" if name == "npu_ms" else "")
            + f" ({_ENV[name]})."
        )
    return ms


# ---------------------------------------------------------------- core masks
def resolve_core_mask(chip: str, mask: int) -> tuple[tuple[int, ...], list[str]]:
    """The cores ``mask`` holds on ``chip`` (() = AUTO) and warnings; ValueError if refused."""
    ncores = C.CHIP_CORES[chip]
    if mask == C.NPU_CORE_AUTO:
        return (), []
    if chip not in C.MULTI_CORE_CHIPS:
        names = [c.upper() for c in C.MULTI_CORE_CHIPS]
        raise ValueError(
            f"The core_mask is only supported by {names}. Please do not set this parameter "
            "on other platforms."
        )
    if mask not in C.VALID_CORE_MASKS:
        raise ValueError(f"The core mode {mask} is not supported currently.")
    warnings = []
    if mask == C.NPU_CORE_ALL:
        mask = (1 << ncores) - 1
    elif chip == "rk3576" and mask == C.NPU_CORE_2:
        warnings.append(
            'The RK3576 platform has only two NPU cores. "NPU_CORE_2" is not supported and '
            'will be automatically replaced with "NPU_CORE_0".'
        )
        mask = C.NPU_CORE_0
    elif chip == "rk3576" and mask == C.NPU_CORE_0_1_2:
        warnings.append(
            'The RK3576 platform has only two NPU cores. "NPU_CORE_0_1_2" is not supported '
            'and will be automatically replaced with "NPU_CORE_0_1".'
        )
        mask = C.NPU_CORE_0_1
    return tuple(c for c in range(ncores) if mask & (1 << c)), warnings
