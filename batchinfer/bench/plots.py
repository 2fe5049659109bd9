"""Plots of a bench run or sweep, made with matplotlib (the ``plot`` extra).

matplotlib is imported only here, on first use, and only its object-oriented API is used
(a ``Figure`` saved to a file): no pyplot, no global backend switch in the caller's
process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from batchinfer.bench.windows import Samples, percentile
from batchinfer.errors import UsageError

INSTALL_HINT = "pip install 'batchinfer[plot]' (matplotlib)"


def available() -> bool:
    """Whether matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(rows: int = 1, height: float = 4.0) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError(
            f"plots need matplotlib, which is not installed; {INSTALL_HINT}."
        ) from None
    return Figure(figsize=(9, height * rows), dpi=100, layout="constrained")


def throughput_plot(
    path: Path,
    samples: Samples,
    t_zero: float,
    t_end: float,
    warmup_s: float,
    cores: list[int],
    title: str,
    bin_s: float = 1.0,
) -> Path:
    """Samples/s per core and in total over time, warm-up and drain shown but shaded."""
    t = samples.t_done - t_zero
    lo = min(-warmup_s, float(t.min()) if len(t) else 0.0)
    hi = max(t_end - t_zero, float(t.max()) if len(t) else 0.0)
    edges = np.arange(np.floor(lo / bin_s) * bin_s, hi + bin_s, bin_s)
    if len(edges) < 2:
        edges = np.array([lo, lo + bin_s])
    fig = _figure(rows=2, height=3.0)
    total_ax, core_ax = fig.subplots(2, 1, sharex=True)
    counts, _ = np.histogram(t, edges)
    total_ax.stairs(counts / bin_s, edges, color="black", label="all cores")
    for c in cores:
        n, _ = np.histogram(t[samples.core == c], edges)
        core_ax.stairs(n / bin_s, edges, label=f"core {c}")
    for ax in (total_ax, core_ax):
        ax.axvspan(edges[0], 0, color="0.88", zorder=0, label="warm-up (excluded)")
        ax.axvspan(t_end - t_zero, edges[-1], color="0.94", zorder=0, label="after the measurement")
        ax.set_ylabel("samples/s")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(loc="best", fontsize="small")
    core_ax.set_xlabel(f"seconds since the measurement started ({bin_s:g} s bins)")
    total_ax.set_title(title, fontsize="medium")
    fig.savefig(path)
    return path


def latency_plot(path: Path, latency_ms: np.ndarray, title: str) -> Path:
    """The distribution of measured latencies, with p50, p99 and p99.9 marked."""
    fig = _figure()
    ax = fig.subplots()
    values = latency_ms[latency_ms > 0]
    if len(values):
        lo, hi = float(values.min()), float(values.max())
        bins = np.geomspace(lo, hi * 1.0001, 80) if hi > lo else 10
        ax.hist(values, bins=bins, color="tab:blue", alpha=0.8)
        if hi > 2 * lo:
            ax.set_xscale("log")
        ax.set_yscale("log")
        for name, q, style in (("p50", 50, "-"), ("p99", 99, "--"), ("p99.9", 99.9, ":")):
            v = percentile(values, q)
            ax.axvline(v, color="black", linestyle=style, label=f"{name} {v:.2f} ms")
        ax.legend(fontsize="small")
    ax.set_xlabel("latency of one inference() call (ms)")
    ax.set_ylabel("samples")
    ax.set_title(title, fontsize="medium")
    ax.grid(alpha=0.3)
    fig.savefig(path)
    return path


def sweep_plot(path: Path, sweep: dict[str, Any]) -> Path:
    """Samples/s (and p99) against the swept setting; hollow markers for INVALID runs."""
    entries = sweep.get("sweep") or []
    kind = sweep.get("sweep_of")
    x = [len(e["cores"]) if kind == "cores" else e["instances_per_core"] for e in entries]
    y = [e["samples_per_s"] for e in entries]
    fig = _figure()
    ax = fig.subplots()
    ax.plot(x, y, color="tab:blue", marker="", label="samples/s")
    for xi, yi, e in zip(x, y, entries, strict=True):
        face = "tab:blue" if e.get("valid") else "white"
        ax.plot([xi], [yi], marker="o", markersize=8, color="tab:blue", markerfacecolor=face)
    rec = (sweep.get("recommendation") or {}).get("name")
    for xi, yi, e in zip(x, y, entries, strict=True):
        if e["name"] == rec:
            ax.annotate("recommended", (xi, yi), textcoords="offset points", xytext=(0, 10),
                        ha="center")  # fmt: skip
    ax.set_xlabel("NPU cores" if kind == "cores" else "instances per core")
    ax.set_xticks(x)
    ax.set_ylabel("samples/s (hollow: INVALID run)")
    ax.set_ylim(0, 1.2 * max(y, default=1.0))
    ax.grid(alpha=0.3)
    p99 = [e.get("p99_ms") for e in entries]
    if all(v is not None for v in p99):
        ax2 = ax.twinx()
        ax2.plot(x, p99, color="tab:orange", marker="s", linestyle="--", label="p99 ms")
        ax2.set_ylabel("p99 latency (ms)", color="tab:orange")
        ax2.set_ylim(0, 1.2 * max(p99, default=1.0))
    ax.set_title(f"sweep of {kind}\n{sweep.get('label')}", fontsize="medium")
    fig.savefig(path)
    return path
