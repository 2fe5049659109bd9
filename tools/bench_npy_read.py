"""Reading `.npy` tensors into a slot: the readers' ``load_into`` against ``np.load``.

Writes ``--files`` tensors of ``--shape`` (uint8) into ``--workdir`` once, reads them all
once to have them in the page cache, then times passes over them, interleaved: the
engine's ``batchinfer.data.load_into`` straight into a preallocated array (what a reader
does with a shared-memory slot), and ``np.load`` plus a copy into it (what a script
does). Microseconds per file, median over ``--repeats`` passes. Run it with another
checkout on PYTHONPATH to compare versions of the reader.

    python tools/bench_npy_read.py --files 3000 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from batchinfer.data import load_into, preprocess_for


def write_files(folder: Path, count: int, shape: tuple[int, ...]) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        path = folder / f"{i:06d}.npy"
        if not path.is_file():
            np.save(path, rng.integers(0, 256, shape, dtype=np.uint8))
        paths.append(str(path))
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", type=Path, default=Path("/tmp/batchinfer-npy-read"))
    p.add_argument("--files", type=int, default=3000)
    p.add_argument("--shape", type=int, nargs="+", default=[1, 224, 224, 3])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    shape = tuple(args.shape)
    paths = write_files(args.workdir / "x".join(map(str, shape)), args.files, shape)
    spec = preprocess_for(shape, "uint8")
    out = np.empty(shape, np.uint8)

    def engine() -> None:
        for path in paths:
            load_into(path, spec, out, "npy")

    def numpy_load() -> None:
        for path in paths:
            out[...] = np.load(path)

    ways = {"load_into": engine, "np.load + copy": numpy_load}
    for way in ways.values():
        way()  # page cache and code paths
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, way in ways.items():
            t0 = time.perf_counter()
            way()
            times[name].append((time.perf_counter() - t0) / len(paths) * 1e6)
    print(f"{len(paths)} files of {shape} uint8, µs per file, median (min-max) of {args.repeats}")
    for name, us in times.items():
        print(f"  {name:15} {statistics.median(us):7.1f} ({min(us):.1f}-{max(us):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
