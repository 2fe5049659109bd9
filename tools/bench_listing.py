"""Benchmark of dataset listing: flat folders of many files, time to open and to the first item.

Builds flat folders of N empty ``.jpg`` files in a temporary folder (removed afterwards)
and measures, with the ``batchinfer`` that Python imports (point PYTHONPATH at another
checkout to measure that one):

- a plain ``os.listdir`` of the folder (the floor);
- ``open_dataset`` (one listing: count, classes, skipped files, listing hash);
- the first item of ``iter(dataset)`` (a second listing: the order needs every name);
- with ``--memory``: the peak of Python allocations (tracemalloc) during ``open_dataset``.

Medians over ``--repeats``, wall-clock and this process's CPU time (less sensitive to other
load on a shared machine). Compare figures from one sitting.

    python tools/bench_listing.py --sizes 200000 600000 --repeats 3 --memory
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

from batchinfer.data import open_dataset


def build(folder: Path, count: int) -> None:
    folder.mkdir()
    for i in range(count):
        os.close(os.open(folder / f"img_{i:07d}.jpg", os.O_CREAT | os.O_WRONLY, 0o644))


def measure(folder: Path, repeats: int) -> dict[str, tuple[float, float]]:
    """(median wall seconds, median CPU seconds of this process) per step."""
    rows: dict[str, list[tuple[float, float]]] = {"listdir": [], "open": [], "first": []}

    def clocks() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    for _ in range(repeats):
        c0 = clocks()
        os.listdir(folder)
        c1 = clocks()
        dataset = open_dataset(folder)
        c2 = clocks()
        next(iter(dataset))
        c3 = clocks()
        for name, (a, b) in zip(rows, ((c0, c1), (c1, c2), (c2, c3)), strict=True):
            rows[name].append((b[0] - a[0], b[1] - a[1]))
    return {
        name: (statistics.median(w for w, _ in values), statistics.median(c for _, c in values))
        for name, values in rows.items()
    }


def peak_memory(folder: Path) -> int:
    tracemalloc.start()
    try:
        open_dataset(folder)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 600_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="also trace Python allocations")
    parser.add_argument("--tmp", default=None, help="where to build the folders")
    args = parser.parse_args()
    import batchinfer.data

    print(f"batchinfer from {Path(batchinfer.data.__file__).parent.parent}")
    print("seconds: wall (CPU of this process), medians")
    print(
        f"{'files':>8} {'listdir':>13} {'open_dataset':>13} {'first item':>13} "
        f"{'to first item':>14}" + (f" {'peak MB':>8}" if args.memory else "")
    )
    for count in args.sizes:
        tmp = Path(tempfile.mkdtemp(prefix="bench-listing-", dir=args.tmp))
        try:
            folder = tmp / "flat"
            build(folder, count)
            m = measure(folder, args.repeats)
            cells = [f"{w:.2f} ({c:.2f})" for w, c in m.values()]
            total = m["open"][0] + m["first"][0]
            line = f"{count:>8} " + " ".join(f"{cell:>13}" for cell in cells) + f" {total:>14.2f}"
            if args.memory:
                line += f" {peak_memory(folder) / 1e6:>8.1f}"
            print(line, flush=True)
        finally:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
