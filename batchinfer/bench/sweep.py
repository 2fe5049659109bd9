"""Sweeps: the same benchmark over 1, 2, 3 cores or over 1..4 instances per core, and the
setting to recommend.

Every setting is a whole benchmark run (warm-up, windows, verdict, diagnosis), one after
the other in one sitting. The recommendation (a pure function, :func:`recommend`):

1. candidates: the VALID settings (when none is VALID, every setting, and it says so),
   keeping only those whose p99 latency is at most ``max_p99_ms`` when one is given;
2. among candidates, those within ``RECOMMEND_TOLERANCE`` (3 %) of the best throughput
   are as good as the best: the one using the fewest instances in all (cores × instances
   per core) is recommended (fewer processes, less memory, shorter queues), then the one
   with the lower p99.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from batchinfer.bench.result import FORMAT, KIND, BenchResult
from batchinfer.bounds import DAY_S, Bounds, check_value
from batchinfer.errors import ConfigError, render_fields
from batchinfer.messages import setting as named_setting

SWEEPS = ("cores", "instances")
#: Keys of the recommended setting's result repeated at the top of a sweep's JSON.
HEADLINE = ("samples_per_s", "latency_ms", "cores", "windows", "diagnosis")
INSTANCES_SWEPT = (1, 2, 3, 4)
RECOMMEND_TOLERANCE = 0.03
#: The p99 latency a sweep may be asked to stay under (--max-p99-ms): a day, in ms.
MAX_P99_MS = Bounds(0, DAY_S * 1000, above=True, why="one day")


@dataclass(frozen=True)
class Setting:
    name: str  # e.g. "cores=0,1" or "k=2"
    cores: tuple[int, ...]
    instances_per_core: int


def settings(kind: str, cores: tuple[int, ...], instances_per_core: int) -> list[Setting]:
    """The settings a sweep runs: ``cores`` prefixes (1, 2, 3 cores), or K = 1..4."""
    if kind == "cores":
        return [
            Setting(f"cores={','.join(map(str, cores[:n]))}", tuple(cores[:n]), instances_per_core)
            for n in range(1, len(cores) + 1)
        ]
    if kind == "instances":
        return [Setting(f"k={k}", tuple(cores), k) for k in INSTANCES_SWEPT]
    raise ConfigError(
        named_setting("bench.sweep") + f" must be one of {', '.join(SWEEPS)}, not {kind!r}."
    )


@dataclass(frozen=True)
class Row:
    """One setting's result, as the sweep table and JSON show it."""

    name: str
    cores: tuple[int, ...]
    instances_per_core: int
    samples_per_s: float
    valid: bool
    p99_ms: float | None
    bound: str
    relative: float | None = None  # samples/s over the first setting's
    efficiency: float | None = None  # cores sweep: relative / number of cores

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "cores": list(self.cores)}


def rows(kind: str, results: Sequence[tuple[Setting, BenchResult]]) -> list[Row]:
    """The table of a sweep: each setting against the first (scaling efficiency for cores)."""
    out = []
    base = results[0][1].figures.samples_per_s if results else 0.0
    for setting, r in results:
        rel = r.figures.samples_per_s / base if base else None
        eff = None
        if kind == "cores" and rel is not None:
            eff = rel / len(setting.cores)
        out.append(
            Row(
                setting.name,
                setting.cores,
                setting.instances_per_core,
                r.figures.samples_per_s,
                r.valid,
                r.figures.latency_ms["p99"],
                r.diagnosis.bound,
                rel,
                eff,
            )
        )
    return out


@dataclass(frozen=True)
class Recommendation:
    row: Row | None
    reason: str

    def to_json(self) -> dict[str, Any] | None:
        if self.row is None:
            return {"name": None, "reason": self.reason}
        return {**self.row.to_json(), "reason": self.reason}


def recommend(
    table: Sequence[Row],
    max_p99_ms: float | None = None,
    tolerance: float = RECOMMEND_TOLERANCE,
) -> Recommendation:
    """The setting to use (see the module docstring)."""
    if not table:
        return Recommendation(None, "nothing was measured.")
    pool = [r for r in table if r.valid]
    caveat = ""
    if not pool:
        pool = list(table)
        caveat = " No setting was VALID, so this rests on INVALID runs: see their reasons."
    if max_p99_ms is not None:
        kept = [r for r in pool if r.p99_ms is not None and r.p99_ms <= max_p99_ms]
        if not kept:
            lowest = min(pool, key=lambda r: r.p99_ms if r.p99_ms is not None else float("inf"))
            return Recommendation(
                None,
                f"no setting kept p99 at or under {max_p99_ms:g} ms (the lowest was "
                f"{lowest.p99_ms:.2f} ms, {lowest.name}); relax "
                + named_setting("bench.max_p99_ms")
                + ".",
            )
        pool = kept
    best = max(pool, key=lambda r: r.samples_per_s)
    close = [r for r in pool if r.samples_per_s >= (1 - tolerance) * best.samples_per_s]
    pick = min(
        close,
        key=lambda r: (
            len(r.cores) * r.instances_per_core,
            r.p99_ms if r.p99_ms is not None else float("inf"),
        ),
    )
    why = f"{pick.name}: {pick.samples_per_s:.1f} samples/s"
    if pick is not best:
        why += (
            f", within {tolerance:.0%} of the best ({best.name}, {best.samples_per_s:.1f}) "
            "with fewer instances"
        )
    else:
        why += ", the highest"
    if max_p99_ms is not None:
        why += f", p99 {pick.p99_ms:.2f} ms <= {max_p99_ms:g} ms"
    return Recommendation(pick, why + "." + caveat)


@dataclass
class SweepResult:
    kind: str
    results: list[tuple[Setting, BenchResult]]
    table: list[Row]
    recommendation: Recommendation
    max_p99_ms: float | None = None
    interrupted: bool = False

    @property
    def valid(self) -> bool:
        return bool(self.results) and all(r.valid for _, r in self.results)

    def to_json(self, render: Callable[[str], str] = lambda f: f) -> dict[str, Any]:
        results = [r for _, r in self.results]
        entries = []
        for row, r in zip(self.table, results, strict=True):
            entries.append({**row.to_json(), "result": r.to_json(render)})
        rec = self.recommendation.to_json()
        if rec is not None:
            rec["reason"] = render_fields(rec["reason"], render)
        first = results[0].to_json(render) if results else {}
        # The sweep's headline figures are those of the setting it recommends.
        chosen: dict[str, Any] = next(
            (e["result"] for e in entries if rec and e["name"] == rec.get("name")), {}
        )
        headline = {k: chosen.get(k) for k in HEADLINE}
        return {
            "kind": KIND,
            "format": FORMAT,
            "label": first.get("label"),
            "sweep_of": self.kind,
            "valid": self.valid,
            "reasons": [
                f"{row.name}: {reason}"
                for row, r in zip(self.table, results, strict=True)
                for reason in r.to_json(render)["reasons"]
            ],
            "max_p99_ms": self.max_p99_ms,
            "sweep": entries,
            "recommendation": rec,
            **headline,
            "config": first.get("config"),
            "conditions": {
                "before": results[0].conditions.get("before") if results else None,
                "after": results[-1].conditions.get("after") if results else None,
            },
            "versions": first.get("versions"),
            "interrupted": self.interrupted,
        }


def with_setting(config: Any, setting: Setting) -> Any:
    """A BenchConfig running ``setting``."""
    runtime = dataclasses.replace(
        config.runtime, cores=setting.cores, instances_per_core=setting.instances_per_core
    )
    return dataclasses.replace(config, runtime=runtime)


def run_sweep(
    config: Any,
    kind: str,
    max_p99_ms: float | None = None,
    observers: Sequence[Any] = (),
    read_conditions: Callable[[], dict] | None = None,
    on_result: Callable[[Setting, BenchResult], None] | None = None,
) -> SweepResult:
    """Run ``config`` (a BenchConfig) at every setting of the sweep ``kind``, in order.

    Every setting is checked before the first one runs. Ctrl-C stops the setting being
    measured (its result is kept, INVALID) and the sweep with it.
    """
    from batchinfer.bench.runner import prepare, run_bench
    from batchinfer.engine.board.instance_probe import settle_instances
    from batchinfer.engine.plumbing.signals import StopSignals

    check_value(MAX_P99_MS, max_p99_ms, "bench.max_p99_ms")
    base = prepare(config)
    # -k auto: a cores sweep measures once and runs every setting with the choice.
    k = settle_instances(base.plan).instances_per_core if kind == "cores" else 1
    chosen = settings(kind, base.plan.cores, k)
    prepared = [prepare(with_setting(config, s)) for s in chosen]
    results: list[tuple[Setting, BenchResult]] = []
    interrupted = False
    with StopSignals() as signals:
        for setting, p in zip(chosen, prepared, strict=True):
            result = run_bench(p, observers, read_conditions, signals)
            results.append((setting, result))
            if on_result is not None:
                on_result(setting, result)
            if result.interrupted:
                interrupted = True
                break
    table = rows(kind, results)
    return SweepResult(kind, results, table, recommend(table, max_p99_ms), max_p99_ms, interrupted)
