"""Comparing two bench results: side by side, and is B a regression of A?

B regresses A when its throughput is lower by more than the noise both runs measured
across their own windows. A run's noise is the standard deviation of its window
throughputs over their mean (their coefficient of variation); the drop must exceed both
runs' noise, and ``MIN_CHANGE`` (1 %), below which differences are never called
regressions. Pure functions over the JSON that ``bench --json`` writes.

Runs of different settings (backend, cores, instances per core, synthetic or dataset
inputs) or sweeps are not compared: a UsageError (exit 2) says why. Emulator settings,
the model and the machine may differ: that is what one compares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchinfer.bench.windows import noise
from batchinfer.errors import UsageError

MIN_CHANGE = 0.01


@dataclass(frozen=True)
class Comparison:
    a: dict[str, Any]
    b: dict[str, Any]
    change: float  # (B - A) / A in samples/s
    noise_a: float
    noise_b: float
    threshold: float
    regression: bool
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "change": self.change,
            "noise_a": self.noise_a,
            "noise_b": self.noise_b,
            "threshold": self.threshold,
            "regression": self.regression,
            "warnings": self.warnings,
        }


def _setting(d: dict[str, Any]) -> dict[str, Any]:
    config = d.get("config") or {}
    return {
        "backend": config.get("backend"),
        "cores": config.get("cores"),
        "instances per core": config.get("instances_per_core"),
        "inputs": (config.get("source") or {}).get("kind"),
    }


def _noise(d: dict[str, Any], name: str) -> float:
    rates = [w.get("samples_per_s", 0.0) for w in d.get("windows") or []]
    value = noise(rates)
    if value is None:
        raise UsageError(
            f"{name} has {len(rates)} measurement window(s), too few to tell its noise; "
            "compare runs of at least two windows."
        )
    return value


def compare(
    a: dict[str, Any], b: dict[str, Any], a_name: str = "A", b_name: str = "B"
) -> Comparison:
    """Whether ``b`` regresses ``a``; UsageError when they cannot be compared."""
    for d, name in ((a, a_name), (b, b_name)):
        if "sweep" in d:
            raise UsageError(
                f"{name} is a sweep; compare single runs (bench --json without --sweep)."
            )
        if not isinstance(d.get("samples_per_s"), (int, float)):
            raise UsageError(f"{name} has no samples_per_s; pass a file written by bench --json.")
    sa, sb = _setting(a), _setting(b)
    differ = [f"{k} {sa[k]} vs {sb[k]}" for k in sa if sa[k] != sb[k]]
    if differ:
        raise UsageError(
            f"{a_name} and {b_name} ran different settings ({'; '.join(differ)}); compare runs "
            "of the same setting."
        )
    na, nb = _noise(a, a_name), _noise(b, b_name)
    base = a["samples_per_s"]
    if not base > 0:
        raise UsageError(f"{a_name} measured no throughput; it cannot be a baseline.")
    change = (b["samples_per_s"] - base) / base
    threshold = max(na, nb, MIN_CHANGE)
    warnings = [
        f"{name} is INVALID, so the comparison is only indicative: "
        + "; ".join(r.rstrip(".") for r in d.get("reasons") or [])
        + "."
        for d, name in ((a, a_name), (b, b_name))
        if not d.get("valid")
    ]
    return Comparison(a, b, change, na, nb, threshold, -change > threshold, warnings)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_comparison(c: Comparison, a_name: str, b_name: str) -> str:
    """The two runs side by side, then the judgement."""
    a, b = c.a, c.b

    def core(d: dict, i: int) -> float | None:
        cores = d.get("cores") or []
        return cores[i].get("samples_per_s") if i < len(cores) else None

    lines: list[tuple[str, str, str, str]] = [
        ("", a_name, b_name, "B vs A"),
        ("verdict", _verdict(a), _verdict(b), ""),
        ("backend", _backend(a), _backend(b), ""),
        ("model", _model(a), _model(b), ""),
        (
            "samples/s",
            _fmt(a["samples_per_s"], ",.1f"),
            _fmt(b["samples_per_s"], ",.1f"),
            f"{c.change:+.1%}",
        ),
    ]
    for i, entry in enumerate(a.get("cores") or []):
        va, vb = core(a, i), core(b, i)
        rel = f"{(vb - va) / va:+.1%}" if va and vb is not None else ""
        lines.append((f"  core {entry.get('core')}", _fmt(va, ",.1f"), _fmt(vb, ",.1f"), rel))
    for key, name in (("p50", "latency p50 ms"), ("p99", "latency p99 ms"), ("p999", "p99.9 ms")):
        va, vb = [(d.get("latency_ms") or {}).get(key) for d in (a, b)]
        rel = f"{(vb - va) / va:+.1%}" if va and vb is not None else ""
        lines.append((name, _fmt(va, ".2f"), _fmt(vb, ".2f"), rel))
    lines += [
        ("window noise", f"{c.noise_a:.1%}", f"{c.noise_b:.1%}", ""),
        ("bound", _bound(a), _bound(b), ""),
    ]
    widths = [max(len(row[i]) for row in lines) for i in range(4)]
    text = [
        "  ".join(
            [
                row[0].ljust(widths[0]),
                *(x.rjust(w) for x, w in zip(row[1:], widths[1:], strict=True)),
            ]
        )
        for row in lines
    ]
    text += [f"warning: {w}" for w in c.warnings]
    drop = -c.change
    if c.regression:
        text.append(
            f"REGRESSION: {b_name} is {drop:.1%} slower than {a_name}, more than the noise both "
            f"runs measured across their windows (std/mean of the window throughputs: "
            f"{a_name} {c.noise_a:.1%}, {b_name} {c.noise_b:.1%})."
        )
    else:
        how = f"{drop:.1%} slower" if drop > 0 else f"{-drop:.1%} faster"
        text.append(
            f"no regression: {b_name} is {how} than {a_name}, within the threshold "
            f"{c.threshold:.1%}, the larger window noise (std/mean of the window throughputs: "
            f"{a_name} {c.noise_a:.1%}, {b_name} {c.noise_b:.1%}; at least {MIN_CHANGE:.0%})."
        )
    return "\n".join(text)


def _verdict(d: dict) -> str:
    return "VALID" if d.get("valid") else "INVALID"


def _bound(d: dict) -> str:
    return str((d.get("diagnosis") or {}).get("bound", "-"))


def _model(d: dict) -> str:
    model = (d.get("config") or {}).get("model") or "-"
    return model.rsplit("/", 1)[-1]


def _backend(d: dict) -> str:
    b = d.get("backend") or {}
    if b.get("name") == "sim":
        return f"sim npu {b.get('npu_ms'):g} host {b.get('host_ms'):g} ms"
    return str(b.get("name", "-"))
