"""Benchmark of list-file datasets at scale: a million-row Parquet or CSV manifest.

Builds, in a temporary folder (removed afterwards), a few real 8x8 PNGs and manifests of
``--rows`` rows naming them over and over (unique ids, a label and one carried column),
then measures, each in a fresh process so its peak RSS is its own:

- ``open``: planning's read of the list (``open_source``: rows counted, ids checked
  unique, labels and kind found, content hash), wall and CPU seconds;
- ``stream``: every item taken from the engine's ``DatasetSource``, as a run takes them;
- RSS: the process's resident memory after imports, and its peak (``VmHWM``) after
  opening and after streaming every item: flat memory means the peak does not grow with
  the rows;
- with ``--run``: ``batchinfer run LIST --limit N --backend sim`` and the manifest's
  ``timings.first_row_s`` (seconds from process start to the first row written, start-up
  and the whole list's planning included).

Medians over ``--repeats``. Emulator figures for ``--run``. Compare figures from one sitting.

    python tools/bench_manifest.py --rows 1000000 --repeats 3 --run
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = r"""
import json, resource, sys, time
def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20
def peak_mb():  # VmHWM: this process image's peak (ru_maxrss would carry the parent's over exec)
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
from batchinfer.data.sources import open_source
from batchinfer.engine.sources import DatasetSource
base = rss_mb()
w, c = time.perf_counter(), time.process_time()
dataset = open_source(sys.argv[1])
peak = peak_mb()
out = {"open_s": time.perf_counter() - w, "open_cpu_s": time.process_time() - c,
       "rss_base_mb": base, "peak_after_open_mb": peak}
w = time.perf_counter()
n = sum(1 for _ in DatasetSource(dataset))
out.update(stream_s=time.perf_counter() - w, items=n,
           peak_after_stream_mb=peak_mb())
print(json.dumps(out))
"""


def build(folder: Path, rows: int, row_group: int | None = None) -> dict[str, Path]:
    """The PNGs and the manifests (Parquet, CSV) naming them."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    (folder / "images").mkdir(parents=True)
    files = []
    for i in range(16):
        name = f"images/{i:02d}.png"
        Image.fromarray(np.full((8, 8), i * 16, np.uint8)).save(folder / name)
        files.append(name)
    paths = [files[i % 16] for i in range(rows)]
    ids = [f"item-{i:08d}" for i in range(rows)]
    labels = [i % 10 for i in range(rows)]
    shards = [f"shard-{i // 10000:04d}" for i in range(rows)]
    table = pa.table({"path": paths, "id": ids, "label": labels, "shard": shards})
    pq.write_table(table, folder / "list.parquet", row_group_size=row_group)
    with open(folder / "list.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(table.column_names)
        w.writerows(zip(paths, ids, labels, shards, strict=True))
    return {"parquet": folder / "list.parquet", "csv": folder / "list.csv"}


def measure(manifest: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(manifest)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def first_row(manifest: Path, model: Path, out: Path, limit: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "batchinfer", "run", str(manifest), "--model", str(model),
           "--backend", "sim", "--sim-npu-ms", "0.2", "--limit", str(limit), "--out", str(out),
           "--no-progress"]  # fmt: skip
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    manifest_json = json.loads((out / "manifest.json").read_text())
    return {
        "first_row_s": manifest_json["timings"]["first_row_s"],
        "coordinator_peak_rss_mb": manifest_json["coordinator_peak_rss_mb"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--forms", nargs="+", default=["parquet", "csv"])
    parser.add_argument("--run", action="store_true", help="also time a run's first row")
    parser.add_argument("--limit", type=int, default=2000, help="items a --run runs")
    parser.add_argument(
        "--row-group", type=int, help="rows per Parquet row group (default: pyarrow's, 1M)"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-manifest-"))
    try:
        lists = build(tmp, args.rows, args.row_group)
        model = None
        if args.run:
            from batchinfer.demo import write_demo

            model = write_demo(tmp / "kit").models["digits"]
        print(f"{args.rows:,} rows; medians of {args.repeats}; load {os.getloadavg()[0]:.1f}")
        head = ["open s", "cpu s", "stream s", "rss base", "peak open", "peak stream"]
        head += ["first row s", "run peak"] if args.run else []
        print(f"{'form':8} " + " ".join(f"{h:>11}" for h in head))
        for form in args.forms:
            runs = [measure(lists[form]) for _ in range(args.repeats)]
            assert all(r["items"] == args.rows for r in runs)
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            line = f"{form:8} " + " ".join(
                [f"{med[k]:11.2f}" for k in ("open_s", "open_cpu_s", "stream_s")]
                + [f"{med[k]:9.0f}MB" for k in ("rss_base_mb", "peak_after_open_mb",
                                                 "peak_after_stream_mb")]
            )  # fmt: skip
            if model is not None:
                fr = [first_row(lists[form], model, tmp / "out", args.limit)
                      for _ in range(args.repeats)]  # fmt: skip
                line += (
                    f" {statistics.median(r['first_row_s'] for r in fr):11.2f} "
                    f"{statistics.median(r['coordinator_peak_rss_mb'] for r in fr):9.0f}MB"
                )
            print(line, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
