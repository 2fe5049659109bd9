"""Gates: each metric's limits checked, and a verdict that names every gate.

A gate (``[gates.METRIC]`` in a job file) may set:
- ``min`` / ``max``: absolute limits;
- ``max_drop``: the value may be at most this much below the baseline's (the last accepted
  run); with ``alpha`` (top1, and map50_95/map50 of detection jobs) a larger drop fails
  only if McNemar's test on per-item correctness (the paired image bootstrap of mAP) finds
  it significant at that level, so that a few flipped items on a small set do not fail a
  night, while a real regression does;
- ``min_ratio_to_reference``: the value must be at least this share of the float
  reference's own value (MLPerf's "99 % of FP32" rule is ``min_ratio_to_reference = 0.99``).

Without a baseline (the first night) ``max_drop`` is listed as not checked; it never fails.
A metric that could not be computed (no labels, say) fails its gate: nothing is skipped
silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from batchinfer.evaluate.jobspec import SIGNIFICANCE, Gate

#: Comparisons allow this much floating-point slack.
_EPS = 1e-12

#: How each check is named in verdicts and reports.
CHECK_WORDS = {
    "min": "floor",
    "max": "ceiling",
    "max_drop": "drop vs baseline",
    "min_ratio_to_reference": "vs reference",
}


def fmt(value: float | None) -> str:
    """A metric value as shown in verdicts and reports."""
    if value is None:
        return "-"
    if float(value).is_integer() and abs(value) >= 1:
        return str(int(value))
    return format(value, ".6g")


@dataclass(frozen=True)
class GateResult:
    """One limit of one metric, checked."""

    metric: str
    check: str  # min | max | max_drop | min_ratio_to_reference
    value: float | None
    limit: float | None
    passed: bool | None  # None: not checked (no baseline yet)
    note: str = ""

    @property
    def status(self) -> str:
        return {True: "pass", False: "FAIL", None: "not checked"}[self.passed]

    @property
    def op(self) -> str:
        return "<=" if self.check == "max" else ">="

    def line(self) -> str:
        """``FAIL  top1 >= 0.999 (floor): value 0.9983``, and the note."""
        limit = f"{self.op} {fmt(self.limit)}" if self.limit is not None else "(no limit)"
        check = CHECK_WORDS[self.check]
        text = f"{self.status:<11} {self.metric} {limit} ({check}): value {fmt(self.value)}"
        return f"{text}; {self.note}" if self.note else text


@dataclass(frozen=True)
class Verdict:
    """Every gate's result; passed when none failed."""

    gates: tuple[GateResult, ...]

    @property
    def passed(self) -> bool:
        return all(g.passed is not False for g in self.gates)

    @property
    def failed(self) -> list[GateResult]:
        return [g for g in self.gates if g.passed is False]

    @property
    def word(self) -> str:
        return "pass" if self.passed else "fail"

    def records(self) -> list[dict]:
        """Every gate's result as a JSON-able dict (result.json of either kind of job)."""
        return [
            {
                "metric": g.metric,
                "check": g.check,
                "value": g.value,
                "limit": g.limit,
                "passed": g.passed,
                "note": g.note,
                "line": g.line(),
            }
            for g in self.gates
        ]

    def lines(self) -> list[str]:
        return [g.line() for g in self.gates]


#: What a max_drop gate says on the night --update-baseline accepts the first baseline.
NO_BASELINE_BEFORE = "no baseline before this evaluation"


def _at_least(value: float, limit: float) -> bool:
    return value >= limit - _EPS


def check_gates(
    gates: Sequence[Gate],
    metrics: Mapping[str, float],
    baseline: Mapping[str, float] | None,
    notes: Mapping[str, str] | None = None,
    *,
    accepting: bool = False,
) -> Verdict:
    """Check every limit of every gate against ``metrics`` (and the baseline's metrics).

    ``notes`` adds a word to a metric's absolute limits (which core or item is the worst).
    ``accepting``: this evaluation becomes the baseline (``--update-baseline``), so a
    ``max_drop`` without a baseline says so instead of asking for one.
    """
    results = []
    for gate in gates:
        value = metrics.get(gate.metric)
        missing = "not computed" if value is None else (notes or {}).get(gate.metric, "")
        if gate.min is not None:
            ok = value is not None and _at_least(value, gate.min)
            results.append(GateResult(gate.metric, "min", value, gate.min, ok, missing))
        if gate.max is not None:
            ok = value is not None and value <= gate.max + _EPS
            results.append(GateResult(gate.metric, "max", value, gate.max, ok, missing))
        if gate.max_drop is not None:
            results.append(_drop(gate, value, metrics, baseline, accepting))
        if gate.min_ratio_to_reference is not None:
            ref = metrics.get(f"reference.{gate.metric}")
            limit = None if ref is None else gate.min_ratio_to_reference * ref
            if value is None or limit is None:
                what = "the reference's value" if ref is None and value is not None else "value"
                note = f"{what} not computed"
                results.append(
                    GateResult(gate.metric, "min_ratio_to_reference", value, limit, False, note)
                )
            else:
                note = f"{gate.min_ratio_to_reference:g} x reference {fmt(ref)}"
                ok = _at_least(value, limit)
                results.append(
                    GateResult(gate.metric, "min_ratio_to_reference", value, limit, ok, note)
                )
    return Verdict(tuple(results))


def _drop(
    gate: Gate,
    value: float | None,
    metrics: Mapping[str, float],
    baseline: Mapping[str, float] | None,
    accepting: bool = False,
) -> GateResult:
    assert gate.max_drop is not None
    before = None if baseline is None else baseline.get(gate.metric)
    if before is None:
        why = "no baseline yet (accept one with --update-baseline)"
        if accepting:
            why = f"{NO_BASELINE_BEFORE} (--update-baseline makes this evaluation the baseline)"
        if baseline is not None:
            why = f"the baseline has no {gate.metric}"
        return GateResult(gate.metric, "max_drop", value, None, None, why)
    limit = before - gate.max_drop
    note = f"baseline {fmt(before)}"
    if value is None:
        return GateResult(gate.metric, "max_drop", None, limit, False, "not computed")
    ok = _at_least(value, limit)
    if not ok and gate.alpha is not None:
        p = metrics.get(SIGNIFICANCE.get(gate.metric, "mcnemar_p"))
        test = "McNemar" if gate.metric == "top1" else "bootstrap"
        if p is not None and p >= gate.alpha:
            ok = True
            note += f"; {test} p = {p:.3g} >= alpha {gate.alpha:g}: the drop is not significant"
        elif p is not None:
            note += f"; {test} p = {p:.3g} < alpha {gate.alpha:g}: significant"
    return GateResult(gate.metric, "max_drop", value, limit, ok, note)
