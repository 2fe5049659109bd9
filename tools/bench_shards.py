"""Tar shards against the same images as files: listing, reading and decoding throughput.

Writes ``--images`` random-content JPEGs of ``--size`` pixels (a photo's entropy is
between noise and a flat colour: a blurred noise field) into ``--workdir``/files, once, and
the same bytes into ``--shards`` WebDataset-style shards (each image beside a ``.cls``
member). Both are read once first so the page cache holds them (these are warm-cache
figures: the cost of the format, not of a disk), then, over ``--repeats`` interleaved
passes, timed:

- listing: ``open_dataset`` of the folder against the shard set (headers only);
- read: every item's bytes, a file opened, read and closed each against a member read with
  one ``pread`` from the shard the reader keeps open (``ShardFiles``);
- decode: ``load_into`` of every item into a ``--input``-sized uint8 slot (what a reader
  does), from files against from shards.

It also counts the file descriptors a reader holds while it reads the whole shard set
(one per active reader is the design: ``ShardFiles`` keeps the last two). Medians, with
the range, in items per second.

    python tools/bench_shards.py --images 4000 --shards 100 --repeats 5
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

from batchinfer.data import load_into, open_dataset, preprocess_for
from batchinfer.data.shard_reading import ShardFiles


def write_images(folder: Path, count: int, size: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        path = folder / f"{i % 10}" / f"{i:06d}.jpg"
        if not path.is_file():
            path.parent.mkdir(exist_ok=True)
            noise = rng.integers(0, 256, (size // 4, size // 4, 3), dtype=np.uint8)
            image = Image.fromarray(noise).resize((size, size), Image.Resampling.BILINEAR)
            image.filter(ImageFilter.GaussianBlur(1)).save(path, quality=90)
        paths.append(path)
    return paths


def write_shards(folder: Path, root: Path, count: int) -> str:
    """The shard pattern of ``count`` shards holding the images of ``folder`` in its order."""
    items = list(open_dataset(root))
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-len(items) // count)
    width = max(3, len(str(count - 1)))
    for n in range(count):
        path = folder / f"shard-{n:0{width}d}.tar"
        if path.is_file():
            continue
        with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
            for item in items[n * per : (n + 1) * per]:
                tar.add(item.path, arcname=item.id)
                info = tarfile.TarInfo(item.id.rsplit(".", 1)[0] + ".cls")
                data = str(item.label).encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(folder / f"shard-{{{0:0{width}d}..{count - 1:0{width}d}}}.tar")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", type=Path, default=Path("/tmp/batchinfer-bench-shards"))
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--size", type=int, default=256, help="image side in pixels")
    p.add_argument("--shards", type=int, default=100)
    p.add_argument("--input", type=int, default=224, help="model input side (decode pass)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    base = args.workdir / f"{args.images}x{args.size}"
    write_images(base / "files", args.images, args.size)
    pattern = write_shards(base / f"shards-{args.shards}", base / "files", args.shards)
    folder = open_dataset(base / "files")
    shards = open_dataset(pattern)
    files_items, shard_items = list(folder), list(shards)
    assert len(files_items) == len(shard_items) == args.images
    spec = preprocess_for((1, args.input, args.input, 3), "uint8")
    out = np.empty(spec.shape, np.uint8)
    held = {"max": 0}

    def list_folder() -> None:
        open_dataset(base / "files")

    def list_shards() -> None:
        open_dataset(pattern)

    def read_files() -> None:
        for item in files_items:
            with open(item.path, "rb") as f:
                f.read()

    def read_shards() -> None:
        files = ShardFiles()
        before = open_fds()
        for item in shard_items:
            files.read(item.path, item.member, item.id)  # type: ignore[arg-type]
            held["max"] = max(held["max"], open_fds() - before)
        files.close()

    def decode_files() -> None:
        for item in files_items:
            load_into(item.path, spec, out, "images", name=item.id)

    def decode_shards() -> None:
        files = ShardFiles()
        for item in shard_items:
            load_into(
                item.path, spec, out, "images", name=item.id, member=item.member, shards=files
            )
        files.close()

    ways = {
        "list folder": list_folder,
        "list shards": list_shards,
        "read files": read_files,
        "read shards": read_shards,
        "decode files": decode_files,
        "decode shards": decode_shards,
    }
    for way in ways.values():
        way()  # page cache and code paths
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, way in ways.items():
            t0 = time.perf_counter()
            way()
            times[name].append(args.images / (time.perf_counter() - t0))
    size = sum(os.path.getsize(i.path) for i in files_items) / len(files_items)
    print(
        f"{args.images} JPEGs of {args.size}x{args.size} ({size / 1024:.1f} KiB each) as files "
        f"and in {args.shards} tar shards; warm page cache; items/s, median (min-max) of "
        f"{args.repeats}; decode into a {args.input}x{args.input} uint8 slot"
    )
    for name, rates in times.items():
        print(f"  {name:14} {statistics.median(rates):10.0f} ({min(rates):.0f}-{max(rates):.0f})")
    print(f"  open shard files held by the reader while reading all {args.shards}: {held['max']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
