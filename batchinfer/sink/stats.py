"""Per-core statistics and the completion timeline, in memory that does not grow with items.

Latency percentiles come from a log-bucket histogram, not from a list of latencies:

    buckets: [LO·R^i, LO·R^(i+1)) with LO = 1 µs (0.001 ms), R = 1.01, up to 1 h,
             plus one bucket below LO and one above 1 h: ~2 200 int64 counters per core.

A percentile q is the nearest-rank value (numpy ``method="inverted_cdf"``: the k-th
smallest latency, k = ceil(q·n)). The histogram finds the bucket holding it and reports
the bucket's geometric midpoint, clamped to the exact min and max, so for latencies
between 1 µs and 1 h the reported value is within ±0.5 % (sqrt(1.01) - 1) of the true
one. Below 1 µs or above 1 h it is the exact min or max. ``max_ms`` is always exact.

The timeline holds one counter pair per (core, second) that saw a completion, so it
grows with the run's duration, not with its item count.

A core is a core number on one board, or a ``(node, core)`` pair on a cluster
(batchinfer.cluster); both files have a ``node`` column, null on one board.

Both files label their rows with ``invocation``: 0 for the run itself, 1 for its first
``--resume``, and so on. A resume appends its own rows and keeps the earlier ones, so the
files describe the whole run, one invocation at a time (percentiles and rates of different
invocations cannot be merged honestly); an invocation that had nothing left to do adds none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchinfer.sink.atomic import write_table_atomically
from batchinfer.sink.folder_handle import Folder

HIST_LO_MS = 1e-3
HIST_HI_MS = 3_600_000.0
HIST_RATIO = 1.01
#: Relative error bound of a reported percentile between HIST_LO_MS and HIST_HI_MS.
PERCENTILE_REL_ERROR = math.sqrt(HIST_RATIO) - 1
_LOG_RATIO = math.log(HIST_RATIO)
_N_LOG = math.ceil(math.log(HIST_HI_MS / HIST_LO_MS) / _LOG_RATIO)
# Bucket 0: below LO; 1.._N_LOG: log buckets; _N_LOG + 1: at or above HI.
_N_BUCKETS = _N_LOG + 2
PERCENTILES = (50, 90, 99)

#: A core: its number on one board, or (node, number) on a cluster.
CoreKey: TypeAlias = "int | tuple[str | None, int]"

CORE_STATS_FILE = "core_stats.parquet"
TIMELINE_FILE = "timeline.parquet"


class LatencyHistogram:
    """Streaming latency histogram (see the module docstring for the error bound)."""

    def __init__(self) -> None:
        self.counts = np.zeros(_N_BUCKETS, np.int64)
        self.n = 0
        self.min = math.inf
        self.max = -math.inf

    def add(self, ms: float) -> None:
        """Count one latency in milliseconds (NaN is ignored)."""
        if not ms >= 0:  # NaN and negatives are measurement bugs, not latencies
            return
        if ms < HIST_LO_MS:
            bucket = 0
        elif ms >= HIST_HI_MS:
            bucket = _N_BUCKETS - 1
        else:
            bucket = 1 + min(int(math.log(ms / HIST_LO_MS) / _LOG_RATIO), _N_LOG - 1)
        self.counts[bucket] += 1
        self.n += 1
        self.min = min(self.min, ms)
        self.max = max(self.max, ms)

    def add_many(self, ms: np.ndarray) -> None:
        """Count many latencies at once (NaN and negatives ignored, as in :meth:`add`)."""
        ms = np.asarray(ms, dtype=np.float64)
        ms = ms[ms >= 0]
        if not ms.size:
            return
        bucket = np.empty(ms.size, np.int64)
        low, high = ms < HIST_LO_MS, ms >= HIST_HI_MS
        mid = ~(low | high)
        bucket[low], bucket[high] = 0, _N_BUCKETS - 1
        logs = np.log(ms[mid] / HIST_LO_MS) / _LOG_RATIO
        bucket[mid] = 1 + np.minimum(logs.astype(np.int64), _N_LOG - 1)
        np.add.at(self.counts, bucket, 1)
        self.n += int(ms.size)
        self.min = min(self.min, float(ms.min()))
        self.max = max(self.max, float(ms.max()))

    def merge(self, other: LatencyHistogram) -> None:
        """Add ``other``'s counts to this histogram."""
        self.counts += other.counts
        self.n += other.n
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def percentile(self, q: float) -> float | None:
        """The nearest-rank ``q``-th percentile (0 < q <= 100) in ms, None when empty."""
        if not self.n:
            return None
        rank = max(1, math.ceil(q / 100 * self.n))
        bucket = int(np.searchsorted(np.cumsum(self.counts), rank))
        if bucket == 0:
            value = self.min
        elif bucket == _N_BUCKETS - 1:
            value = self.max
        else:
            value = HIST_LO_MS * HIST_RATIO ** (bucket - 1 + 0.5)
        return min(max(value, self.min), self.max)


@dataclass
class _CoreCounters:
    items: int = 0
    errors: int = 0
    restarts: int = 0
    recycles: int = 0  # workers replaced because they grew (engine/recycling.py)
    busy_current: float = 0.0  # the live worker incarnation's cumulative report
    busy_carried: float = 0.0  # from incarnations that died
    last_done: float | None = None
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    @property
    def busy_s(self) -> float:
        return self.busy_carried + self.busy_current


class CoreStatsRecorder:
    """Counts completions per core for core_stats.parquet and timeline.parquet.

    Busy time: each worker reports its cumulative busy seconds with :meth:`set_busy`.
    When a worker dies, call :meth:`add_busy` with the last value it reported (the
    carry-over) and :meth:`add_restart`; the restart resets the live value to 0 so
    the new incarnation's reports, which start from 0 again, are not added to a stale
    one. The two calls may come in either order.
    """

    def __init__(
        self,
        cores: Sequence[CoreKey],
        instances_per_core: int,
        invocation: int = 0,
        percentiles: Sequence[float] = PERCENTILES,
    ) -> None:
        self.instances_per_core = instances_per_core
        self.invocation = invocation
        self.percentiles = tuple(percentiles)
        self._cores: dict[tuple[str | None, int], _CoreCounters] = {
            _where(c): _CoreCounters() for c in cores
        }
        # Items that never reached a core (input errors): total row only.
        self._no_core = _CoreCounters()
        self._t0: float | None = None
        self._t_last: float | None = None
        self._timeline: dict[tuple[tuple[str | None, int] | None, int], list[int]] = {}
        self._npu_load: dict[int, float] = {}

    def set_npu_load(self, per_core: dict[int, float] | None) -> None:
        """The board's own NPU load per core (0..1, its driver's figure, mean over the run;
        batchinfer.runtime.npu_load), for the npu_load column: None or a core left out is
        null there (not readable, or no NPU)."""
        self._npu_load = dict(per_core or {})

    def _core(self, core: CoreKey | None) -> _CoreCounters:
        return self._no_core if core is None else self._at(_where(core))

    def _at(self, where: tuple[str | None, int]) -> _CoreCounters:
        # A core that was not announced still gets its row rather than being lost. (Not
        # setdefault: that built a histogram on every call, twice per row.)
        counters = self._cores.get(where)
        if counters is None:
            counters = self._cores[where] = _CoreCounters()
        return counters

    def mark_dispatch(self, t: float) -> None:
        """Note the first dispatch time (time.monotonic scale); later calls are ignored."""
        if self._t0 is None:
            self._t0 = t

    def record(
        self, core: CoreKey | None, t_done: float, latency_ms: float | None, ok: bool
    ) -> None:
        """Count one completed item (``core`` None when it never reached a core)."""
        if self._t0 is None:  # no mark_dispatch: the first completion starts the clock
            self._t0 = t_done
        c = self._core(core)
        c.items += 1
        if not ok:
            c.errors += 1
        if latency_ms is not None:
            c.latency.add(float(latency_ms))
        c.last_done = t_done if c.last_done is None else max(c.last_done, t_done)
        self._t_last = t_done if self._t_last is None else max(self._t_last, t_done)
        second = max(0, int(t_done - self._t0))
        key = None if core is None else _where(core)
        slot = self._timeline.get((key, second))
        if slot is None:
            slot = self._timeline[(key, second)] = [0, 0]
        slot[0] += 1
        if not ok:
            slot[1] += 1

    def record_rows(self, rows: Sequence[Any]) -> None:
        """Count a batch of completed rows (anything with core, t_done, latency_ms, error;
        and node, on a cluster).

        The same counts as :meth:`record` row by row; latencies go to the histograms in
        one call per core.
        """
        if not rows:
            return
        if self._t0 is None:
            self._t0 = min(r.t_done for r in rows)
        t0, timeline = self._t0, self._timeline
        latencies: dict[tuple[str | None, int] | None, list[float]] = {}
        for r in rows:
            # (node, core) once per row: the counters, histogram and timeline all use it.
            where = None if r.core is None else (getattr(r, "node", None), int(r.core))
            c = self._no_core if where is None else self._at(where)
            t, ok = r.t_done, r.error is None
            c.items += 1
            if not ok:
                c.errors += 1
            if r.latency_ms is not None:
                latencies.setdefault(where, []).append(r.latency_ms)
            if c.last_done is None or t > c.last_done:
                c.last_done = t
            if self._t_last is None or t > self._t_last:
                self._t_last = t
            slot = timeline.setdefault((where, max(0, int(t - t0))), [0, 0])
            slot[0] += 1
            if not ok:
                slot[1] += 1
        for where, values in latencies.items():
            hist = (self._no_core if where is None else self._at(where)).latency
            if len(values) > 8:
                hist.add_many(np.asarray(values))
            else:
                for ms in values:
                    hist.add(float(ms))

    def add_restart(self, core: CoreKey) -> None:
        """Count a restart of ``core``'s worker; its live busy value starts again at 0."""
        c = self._core(core)
        c.restarts += 1
        c.busy_current = 0.0

    def add_recycle(self, core: CoreKey) -> None:
        """Count a recycling of ``core``'s worker (it grew); its busy time is carried over
        as a death's (:meth:`add_busy`) when it has exited."""
        self._core(core).recycles += 1

    def set_busy(self, core: CoreKey, busy_s: float) -> None:
        """Set the live worker's cumulative busy seconds on ``core`` (as it reports them)."""
        self._core(core).busy_current = float(busy_s)

    def add_busy(self, core: CoreKey, seconds: float) -> None:
        """Add busy seconds carried over from a worker incarnation of ``core`` that died."""
        self._core(core).busy_carried += float(seconds)

    def table(self) -> pa.Table:
        """One row per core, then a total row with core null (see core_stats.parquet)."""
        rows = []
        for key in sorted(self._cores, key=place_order):
            c = self._cores[key]
            wall = self._wall(c.last_done)
            rows.append(self._row(key, self.instances_per_core, c, c.latency, c.busy_s, wall))

        total = _CoreCounters()
        latency = LatencyHistogram()
        for c in [*self._cores.values(), self._no_core]:
            total.items += c.items
            total.errors += c.errors
            total.restarts += c.restarts
            total.recycles += c.recycles
            latency.merge(c.latency)
        busy = sum(c.busy_s for c in self._cores.values())
        wall = self._wall(self._t_last)
        row = self._row(
            None, self.instances_per_core * len(self._cores), total, latency, busy, wall
        )
        # The total's utilisation is the mean over cores: busy core-seconds / core-seconds.
        n = len(self._cores)
        row["utilization"] = busy / (wall * n) if wall and n else None
        loads = [r["npu_load"] for r in rows if r["npu_load"] is not None]
        row["npu_load"] = sum(loads) / len(loads) if loads else None
        rows.append(row)
        for r in rows:
            r["invocation"] = self.invocation
        return pa.Table.from_pylist(rows, schema=core_stats_schema(self.percentiles))

    @property
    def items(self) -> int:
        """Items recorded so far, on every core and none."""
        return sum(c.items for c in [*self._cores.values(), self._no_core])

    def timeline_table(self) -> pa.Table:
        """Completions and errors per core per second since the first dispatch."""
        keys = sorted(
            self._timeline, key=lambda k: (k[1], (0,) if k[0] is None else place_order(k[0]))
        )
        return pa.table(
            {
                "invocation": pa.array([self.invocation] * len(keys), pa.int16()),
                "node": pa.array([None if k[0] is None else k[0][0] for k in keys], pa.string()),
                "core": pa.array([None if k[0] is None else k[0][1] for k in keys], pa.int16()),
                "second": pa.array([k[1] for k in keys], pa.int32()),
                "completed": pa.array([self._timeline[k][0] for k in keys], pa.int64()),
                "errors": pa.array([self._timeline[k][1] for k in keys], pa.int64()),
            }
        )

    def _wall(self, last_done: float | None) -> float | None:
        if self._t0 is None or last_done is None:
            return None
        return max(0.0, last_done - self._t0)

    def _row(
        self,
        key: tuple[str | None, int] | None,
        instances: int,
        c: _CoreCounters,
        latency: LatencyHistogram,
        busy: float,
        wall: float | None,
    ) -> dict:
        row = {
            "node": None if key is None else key[0],
            "core": None if key is None else key[1],
            "instances": instances,
            "items": c.items,
            "errors": c.errors,
            "restarts": c.restarts,
            "recycles": c.recycles,
            "busy_s": busy,
            "wall_s": wall,
            "items_per_s": c.items / wall if wall else None,
            "utilization": busy / wall if wall else None,
            "npu_load": None if key is None or key[0] is not None else self._npu_load.get(key[1]),
            "max_ms": latency.max if latency.n else None,
        }
        for q in self.percentiles:
            row[percentile_column(q)] = latency.percentile(q)
        return row


def _where(core: CoreKey) -> tuple[str | None, int]:
    """A core as (node, number); node None on one board."""
    if isinstance(core, tuple):
        return core[0], int(core[1])
    return None, int(core)


def place_order(key: tuple[str | None, int]) -> tuple:
    """Sort key of (node, core): one board's cores first, then each node's in name order."""
    return (key[0] is not None, key[0] or "", key[1])


def place_name(node: str | None, core: int) -> str:
    """A core as every report names it: ``2`` on one board, ``node1/2`` on a cluster."""
    return str(core) if node is None else f"{node}/{core}"


def percentile_column(q: float) -> str:
    """The column of percentile ``q``: 50 -> p50_ms, 99.9 -> p99_9_ms."""
    return f"p{q:g}_ms".replace(".", "_")


def core_stats_schema(percentiles: Sequence[float] = PERCENTILES) -> pa.Schema:
    """The schema of core_stats.parquet for the given latency percentiles."""
    return pa.schema(
        [
            pa.field("invocation", pa.int16()),
            pa.field("node", pa.string()),
            pa.field("core", pa.int16()),
            pa.field("instances", pa.int16()),
            pa.field("items", pa.int64()),
            pa.field("errors", pa.int64()),
            pa.field("restarts", pa.int64()),
            pa.field("recycles", pa.int64()),
            pa.field("busy_s", pa.float64()),
            pa.field("wall_s", pa.float64()),
            pa.field("items_per_s", pa.float64()),
            pa.field("utilization", pa.float64()),
            pa.field("npu_load", pa.float64()),
            *[pa.field(percentile_column(q), pa.float64()) for q in percentiles],
            pa.field("max_ms", pa.float64()),
        ],
        metadata={b"batchinfer.percentile_rel_error": f"{PERCENTILE_REL_ERROR:.6f}".encode()},
    )


CORE_STATS_SCHEMA = core_stats_schema()


def windowed_throughput(timeline: pa.Table, window_s: int) -> pa.Table:
    """Completions per second per core in windows of ``window_s`` seconds of a timeline.

    Columns: core (null: all cores), window (0, 1, ...), start_s, items, items_per_s.
    A window with no completion on a core is a row with 0 items, so a stall shows.
    """
    if window_s < 1:
        raise ValueError("window_s must be at least 1")
    seconds = timeline.column("second").to_numpy()
    completed = timeline.column("completed").to_numpy()
    cores = timeline.column("core").to_pylist()
    n = int(seconds.max()) // window_s + 1 if len(seconds) else 0
    rows = []
    for core in [*sorted({c for c in cores if c is not None}), None]:
        mask = np.ones(len(cores), bool) if core is None else np.array([c == core for c in cores])
        counts = np.bincount(seconds[mask] // window_s, weights=completed[mask], minlength=n)
        for w, items in enumerate(counts[:n]):
            rows.append(
                {
                    "core": core,
                    "window": w,
                    "start_s": w * window_s,
                    "items": int(items),
                    "items_per_s": float(items) / window_s,
                }
            )
    return pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [
                pa.field("core", pa.int16()),
                pa.field("window", pa.int32()),
                pa.field("start_s", pa.int32()),
                pa.field("items", pa.int64()),
                pa.field("items_per_s", pa.float64()),
            ]
        ),
    )


def _with_earlier(
    path: Path, recorder: CoreStatsRecorder, table: pa.Table, folder: Folder | None
) -> pa.Table:
    """``table`` after the rows of earlier invocations already in ``path`` (read inside
    ``folder``, OUT held open, when given)."""
    if recorder.invocation > 0 and recorder.items == 0:
        table = table.slice(0, 0)  # nothing was left to do: add no rows of zeros
    if recorder.invocation == 0:
        return table
    try:
        if folder is None:
            earlier = pq.read_table(path)
        else:
            with folder.open_read(path.name) as f:
                earlier = pq.read_table(f)
    except (OSError, pa.ArrowInvalid):
        return table  # absent or unreadable: this invocation's rows are still worth writing
    if "invocation" not in earlier.column_names:
        return table
    # Imported here: at the top of the module its import (~50 ms: predictions._null_mask)
    # was on every run's start-up path, and only a resumed run needs it.
    import pyarrow.compute as pc

    earlier = earlier.filter(pc.less(earlier["invocation"], recorder.invocation))
    for f in table.schema:  # a column earlier runs did not write (e.g. node) is null there
        if f.name not in earlier.column_names:
            earlier = earlier.append_column(f.name, pa.nulls(earlier.num_rows, f.type))
    return pa.concat_tables([earlier.select(table.column_names).cast(table.schema), table])


def write_core_stats(
    out_dir: Path, recorder: CoreStatsRecorder, *, folder: Folder | None = None
) -> Path:
    """Write OUT/core_stats.parquet atomically, keeping earlier invocations' rows.

    ``folder``: OUT held open (a run's): read and written inside it."""
    return _write_kept(Path(out_dir) / CORE_STATS_FILE, recorder, recorder.table(), folder)


def write_timeline(
    out_dir: Path, recorder: CoreStatsRecorder, *, folder: Folder | None = None
) -> Path:
    """Write OUT/timeline.parquet atomically, keeping earlier invocations' rows (``folder``
    as for :func:`write_core_stats`)."""
    table = recorder.timeline_table()
    return _write_kept(Path(out_dir) / TIMELINE_FILE, recorder, table, folder)


def _write_kept(
    path: Path, recorder: CoreStatsRecorder, table: pa.Table, folder: Folder | None
) -> Path:
    """Write ``table`` (this invocation's rows) to ``path`` atomically, after the rows of
    earlier invocations it holds."""
    write_table_atomically(_with_earlier(path, recorder, table, folder), path, folder=folder)
    return path
