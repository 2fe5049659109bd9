"""The canary: the same input through every core before the run, to find the odd core out.

Some nets give different results on some cores of real boards (airockchip/rknn-toolkit2#228).
Each core worker infers :func:`canary_input` before it reports ready; once every core is up
they are compared with the majority, so the warning names the odd core, not whichever
happened to start first. A core that restarts later is compared with that majority.

The canary is an inference like any other, and may fail like one, once: an item gets
``reliability.max_attempts`` tries, so the canary is not judged on one either. A canary
that returns None is tried again in the worker (:func:`infer_canary`) before the core is
retired; one that hangs is killed at its deadline and its worker restarted, as a hung item's
is (the loop's crash path), so the core is retired only after repeated failures there too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from batchinfer.errors import InferenceError
from batchinfer.messages import setting

# Canary outputs of two cores agree when they differ by at most this share of their range.
CANARY_RTOL = 1e-3
#: Tries of the canary in one worker before its failure retires the core.
CANARY_TRIES = 3


def canary_input(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The fixed input every core infers before the run, so cores can be compared."""
    rng = np.random.default_rng(20240229)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    lo, hi = (0, 2) if info is None else (max(info.min, 0), min(info.max, 255) + 1)
    return rng.integers(lo, hi, size=shape).astype(dtype)


def infer_canary(infer: Callable[[], list[np.ndarray]], tries: int = CANARY_TRIES) -> list:
    """``infer()``'s outputs, tried up to ``tries`` times while it raises InferenceError (a
    None result); the last error, saying how many tries failed, if every one did."""
    for attempt in range(1, tries + 1):
        try:
            return infer()
        except InferenceError as e:
            if attempt == tries:
                raise InferenceError(f"{str(e).rstrip('.')} ({tries} tries).") from e
    raise AssertionError("unreachable")


def canary_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """Largest output difference relative to the outputs' (finite) magnitude. NaN against
    NaN, and an infinity against the same infinity, agree: a model that gives them gives
    them on every core (NaN compared as a number made every core differ, even from itself).
    A non-finite value against anything else is an infinite difference."""
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        finite = np.isfinite(x) & np.isfinite(y)
        alike = (x == y) | (np.isnan(x) & np.isnan(y))
        if not np.all(alike | finite):
            return float("inf")
        worst = max(worst, float(np.max(np.abs(x[finite] - y[finite]), initial=0.0)))
    scale = max(float(np.max(np.abs(x[np.isfinite(x)]), initial=0.0)) for x in map(np.asarray, a))
    return worst / (scale or 1.0)


class Canary:
    """Collects each core's canary outputs and says which cores disagree."""

    def __init__(self, name: Callable[[int], str] | None = None) -> None:
        self.name = name or (lambda core: f"core {core}")  # how warnings call a core
        self._pending: dict[int, list[np.ndarray]] = {}
        self.reference: tuple[int, list[np.ndarray]] | None = None

    def add(self, core: int, outputs: list[np.ndarray]) -> list[str]:
        """Record ``core``'s outputs; warnings at once if the reference is already chosen."""
        if self.reference is None:
            self._pending[core] = outputs
            return []
        return self._judge(core, outputs)

    def settle(self) -> list[str]:
        """Choose the majority's outputs as the reference; warnings for the cores that differ."""
        if not self._pending:
            return []
        cores = sorted(self._pending)

        def agreeing(c: int) -> int:
            return sum(
                canary_difference(self._pending[c], self._pending[o]) <= CANARY_RTOL for o in cores
            )

        ref = max(cores, key=lambda c: (agreeing(c), -c))
        self.reference = (ref, self._pending[ref])
        warnings = [w for core in cores for w in self._judge(core, self._pending[core])]
        self._pending.clear()
        return warnings

    def _judge(self, core: int, outputs: list[np.ndarray]) -> list[str]:
        assert self.reference is not None
        ref_core, ref = self.reference
        diff = 0.0 if core == ref_core else canary_difference(ref, outputs)
        if diff <= CANARY_RTOL:
            return []
        how = (
            "one gives NaN or infinite values where the other does not"
            if diff == float("inf")
            else f"largest difference {diff:.2%} of the output range"
        )
        return [
            f"{self.name(core)} gives different outputs from {self.name(ref_core)} for the same "
            f"canary input ({how}); some models do on "
            "real boards (airockchip/rknn-toolkit2#228): check this core's rows before "
            "trusting them, or leave it out of " + setting("runtime.cores") + "."
        ]
