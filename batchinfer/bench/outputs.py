"""What ``--out DIR`` holds after a bench run or sweep.

    DIR/bench.json        the result (as --json writes it)
    DIR/samples.parquet   one row per completed inference: t_s (seconds since the
                          measurement started; negative in the warm-up), phase (warmup |
                          measured | after), core, instance, latency_ms, wait_ms, read_ms
    DIR/windows.parquet   samples/s per measurement window, per core and in total (core null)
    DIR/throughput.png    samples/s per core and in total over time
    DIR/latency.png       the latency distribution with p50, p99, p99.9
A sweep writes one such folder per setting (DIR/k1/, DIR/cores0-1/, ...) and
DIR/bench.json, DIR/sweep.parquet (one row per setting) and DIR/sweep.png.

DIR must be new, empty, or hold an earlier bench output (its bench.json): only the files
named above are replaced there, nothing else is touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from batchinfer.bench import plots
from batchinfer.bench.result import KIND, BenchResult, write_json
from batchinfer.bench.sweep import SweepResult
from batchinfer.errors import UsageError
from batchinfer.sink.atomic import write_table_atomically

MARK = "bench.json"


def check_out(out: Path) -> Path:
    """``out`` as an absolute path, if a bench may write there (see the module docstring)."""
    out = Path(out).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder (new, or an earlier bench's).")
    if out.is_dir() and any(out.iterdir()) and not _is_bench_folder(out):
        raise UsageError(
            f"--out {out} is not empty and holds no bench result ({MARK}); choose a new or "
            "empty folder, so nothing of yours is overwritten."
        )
    return out


def _is_bench_folder(out: Path) -> bool:
    import json

    try:
        return json.loads((out / MARK).read_text()).get("kind") == KIND
    except (OSError, ValueError, AttributeError):
        return False


def slug(name: str) -> str:
    """A sweep setting's folder name: "k=2" -> "k2", "cores=0,1" -> "cores0-1"."""
    return name.replace("=", "").replace(",", "-")


def samples_table(result: BenchResult) -> pa.Table:
    s = result.samples
    t0 = result.t_start if result.t_start is not None else 0.0
    t1 = result.t_end if result.t_end is not None else t0
    phase = np.where(s.t_done < t0, "warmup", np.where(s.t_done < t1, "measured", "after"))
    return pa.table(
        {
            "t_s": pa.array(s.t_done - t0, pa.float64()),
            "phase": pa.array(phase.tolist(), pa.string()),
            "core": pa.array(s.core, pa.int16()),
            "instance": pa.array(s.instance, pa.int16()),
            "latency_ms": pa.array(s.latency_ms, pa.float64()),
            "wait_ms": pa.array(s.wait_ms, pa.float64(), from_pandas=True),
            "read_ms": pa.array(s.read_ms, pa.float64(), from_pandas=True),
        }
    )


def windows_table(result: BenchResult) -> pa.Table:
    cols: dict[str, list] = {"core": [], "window": [], "start_s": [], "samples": [], "rate": []}
    window_s = result_window(result)
    for w in result.figures.windows:
        entries = [(c, round(r * window_s), r) for c, r in sorted(w.per_core.items())]
        for core, samples, rate in [*entries, (None, w.samples, w.samples_per_s)]:
            for key, value in zip(cols, (core, w.index, w.start_s, samples, rate), strict=True):
                cols[key].append(value)
    return pa.table(
        {
            "core": pa.array(cols["core"], pa.int16()),
            "window": pa.array(cols["window"], pa.int32()),
            "start_s": pa.array(cols["start_s"], pa.float64()),
            "samples": pa.array(cols["samples"], pa.int64()),
            "samples_per_s": pa.array(cols["rate"], pa.float64()),
        }
    )


def result_window(result: BenchResult) -> float:
    return float(result.config.get("window_s", 1.0))


def write_run(out: Path, result: BenchResult, data: dict[str, Any], with_plots: bool) -> list[Path]:
    """Write one run's files under ``out``; returns them."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / MARK]
    write_json(data, out / MARK)
    for name, table in (("samples", samples_table(result)), ("windows", windows_table(result))):
        path = out / f"{name}.parquet"
        write_table_atomically(table, path)
        written.append(path)
    if with_plots:
        t0 = result.t_start if result.t_start is not None else 0.0
        t1 = result.t_end if result.t_end is not None else t0
        verdict = "VALID" if data["valid"] else "INVALID"
        title = f"{data['label']}\n{verdict}, {data['samples_per_s']:.1f} samples/s"
        written.append(
            plots.throughput_plot(
                out / "throughput.png",
                result.samples,
                t0,
                t1,
                float(result.config.get("warmup_s", 0.0)),
                result.cores,
                title,
                bin_s=result_window(result),
            )
        )
        measured = result.samples.between(t0, t1)
        written.append(plots.latency_plot(out / "latency.png", measured.latency_ms, title))
    return written


def write_sweep(
    out: Path, sweep: SweepResult, data: dict[str, Any], with_plots: bool
) -> list[Path]:
    """Write a sweep's files under ``out``: one folder per setting, the table, the plot."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for (setting, result), entry in zip(sweep.results, data["sweep"], strict=True):
        written += write_run(out / slug(setting.name), result, entry["result"], with_plots)
    write_json(data, out / MARK)
    written.append(out / MARK)
    rows = [{k: v for k, v in e.items() if k != "result"} for e in data["sweep"]]
    table = pa.Table.from_pylist(rows)
    write_table_atomically(table, out / "sweep.parquet")
    written.append(out / "sweep.parquet")
    if with_plots:
        written.append(plots.sweep_plot(out / "sweep.png", data))
    return written
