"""Benchmark of dataset listing: flat folders of many files, time to open and to the first item.

Builds flat folders of N empty ``.jpg`` files in a temporary folder (removed afterwards)
and measures, with the ``batchinfer`` that Python imports (point PYTHONPATH at another
checkout to measure that one):

- a plain ``os.listdir`` of the folder (the floor);
- ``open_dataset`` (one listing: count, classes, skipped files, listing hash);
- the first item of ``iter(dataset)`` (a second listing: the order needs every name);
- with ``--memory``: the peak of Python allocations (tracemalloc) during ``open_dataset``.

Medians over ``--repeats``. A shared machine is noisy: compare figures from one sitting.

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


def measure(folder: Path, repeats: int) -> dict[str, float]:
    rows: dict[str, list[float]] = {"listdir": [], "open_dataset": [], "first_item": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        os.listdir(folder)
        t1 = time.perf_counter()
        dataset = open_dataset(folder)
        t2 = time.perf_counter()
        next(iter(dataset))
        t3 = time.perf_counter()
        rows["listdir"].append(t1 - t0)
        rows["open_dataset"].append(t2 - t1)
        rows["first_item"].append(t3 - t2)
    return {name: statistics.median(values) for name, values in rows.items()}


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
    print(
        f"{'files':>8} {'listdir s':>10} {'open_dataset s':>15} {'first item s':>13} "
        f"{'to first item s':>16}" + (f" {'peak MB':>8}" if args.memory else "")
    )
    for count in args.sizes:
        tmp = Path(tempfile.mkdtemp(prefix="bench-listing-", dir=args.tmp))
        try:
            folder = tmp / "flat"
            build(folder, count)
            m = measure(folder, args.repeats)
            line = (
                f"{count:>8} {m['listdir']:>10.2f} {m['open_dataset']:>15.2f} "
                f"{m['first_item']:>13.2f} {m['open_dataset'] + m['first_item']:>16.2f}"
            )
            if args.memory:
                line += f" {peak_memory(folder) / 1e6:>8.1f}"
            print(line, flush=True)
        finally:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
