"""Benchmark of image decoding: 12-megapixel JPEGs with and without reduced-size decoding.

Makes photo-like 4000x3000 JPEGs (smooth multi-scale noise plus a gradient, quality 90,
so the file size and entropy resemble a phone photo's), then measures
``batchinfer.data.load_into`` into a model input of SIZE x SIZE:

- time per image (decode + resize + write), median over repeats, with ``jpeg_draft`` on
  (libjpeg decodes at 1/2, 1/4 or 1/8 scale) and off (full decode), interleaved so both
  see the same machine load;
- peak memory per image: how far the resident set rises at its peak (VmHWM, reset just
  before through /proc/self/clear_refs) over one decode, each in a fresh process, median
  over processes. Linux only.

    python tools/bench_decode.py --images 4 --repeats 5 --size 224

Figures from a shared machine are noisy: compare the ratio measured in one sitting.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from batchinfer.data import load_into, preprocess_for

WIDTH, HEIGHT = 4000, 3000


def photo_like(seed: int) -> Image.Image:
    """A 4000x3000 RGB picture with a photo's mix of smooth areas and fine detail."""
    rng = np.random.default_rng(seed)
    total = np.zeros((HEIGHT, WIDTH, 3), np.float32)
    for (w, h), amplitude in (((40, 30), 90), ((250, 188), 40), ((1000, 750), 18)):
        layer = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        layer = layer.resize((WIDTH, HEIGHT), Image.Resampling.BICUBIC)
        total += (np.asarray(layer, np.float32) - 128) * (amplitude / 128)
    total += rng.normal(0, 4, (HEIGHT, WIDTH, 3)).astype(np.float32)  # sensor grain
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH]
    total += (xx / WIDTH * 80 + yy / HEIGHT * 40)[..., None].astype(np.float32) + 88
    return Image.fromarray(np.clip(total, 0, 255).astype(np.uint8))


def make_images(folder: Path, count: int) -> list[Path]:
    paths = []
    for i in range(count):
        path = folder / f"photo{i}.jpg"
        photo_like(i).save(path, quality=90)
        paths.append(path)
    return paths


def spec_for(size: int, draft: bool, color: str):
    channels = 1 if color == "gray" else 3
    return preprocess_for((1, size, size, channels), "uint8", color=color, jpeg_draft=draft)


def time_decodes(paths: list[Path], size: int, repeats: int, color: str) -> dict[str, list[float]]:
    """Seconds per image for each mode, draft and full decode interleaved."""
    specs = {"draft": spec_for(size, True, color), "full": spec_for(size, False, color)}
    out = {name: np.empty(spec.shape, np.uint8) for name, spec in specs.items()}
    times: dict[str, list[float]] = {name: [] for name in specs}
    for name, spec in specs.items():  # warm-up: code paths, page cache
        load_into(str(paths[0]), spec, out[name], "images")
    for _ in range(repeats):
        for path in paths:
            for name, spec in specs.items():
                t0 = time.perf_counter()
                load_into(str(path), spec, out[name], "images")
                times[name].append(time.perf_counter() - t0)
    return times


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def child_peak(path: str, size: int, draft: bool, color: str) -> int:
    """In a fresh process: bytes the resident set rises by, at its peak, over one decode."""
    spec = spec_for(size, draft, color)
    out = np.empty(spec.shape, np.uint8)
    with open(path, "rb") as f:  # the file in the page cache; its bytes are not the point
        f.read()
    # Reset the peak (VmHWM) to the current RSS, so the imports' peak does not hide ours.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kib("VmRSS")
    load_into(path, spec, out, "images")
    return (_status_kib("VmHWM") - before) * 1024


def measure_memory(paths: list[Path], size: int, processes: int, color: str) -> dict[str, list]:
    peaks: dict[str, list[int]] = {"draft": [], "full": []}
    for i in range(processes):
        path = paths[i % len(paths)]
        for name in peaks:
            args = [str(path), str(size), str(name == "draft"), color]
            result = subprocess.run(
                [sys.executable, __file__, "--child", *args],
                check=True,
                capture_output=True,
                text=True,
            )
            peaks[name].append(json.loads(result.stdout)["peak_bytes"])
    return peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=4, help="distinct 12 MP JPEGs")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes over the images")
    parser.add_argument("--processes", type=int, default=5, help="fresh processes per mode")
    parser.add_argument("--size", type=int, default=224, help="model input height and width")
    parser.add_argument("--color", choices=("rgb", "gray"), default="rgb")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        path, size, draft, color = args.child
        print(json.dumps({"peak_bytes": child_peak(path, int(size), draft == "True", color)}))
        return

    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        t0 = time.perf_counter()
        paths = make_images(Path(tmp), args.images)
        sizes = [p.stat().st_size for p in paths]
        print(
            f"{len(paths)} JPEGs {WIDTH}x{HEIGHT} quality 90, "
            f"{statistics.median(sizes) / 1e6:.2f} MB median, made in "
            f"{time.perf_counter() - t0:.1f} s; model input {args.size}x{args.size} {args.color}"
        )
        times = time_decodes(paths, args.size, args.repeats, args.color)
        peaks = measure_memory(paths, args.size, args.processes, args.color)

    print(f"{'mode':<6} {'n':>4} {'median ms':>10} {'min ms':>8} {'peak MB (median)':>17}")
    for name in ("full", "draft"):
        ms = [t * 1e3 for t in times[name]]
        mb = statistics.median(peaks[name]) / 1e6
        print(f"{name:<6} {len(ms):>4} {statistics.median(ms):>10.1f} {min(ms):>8.1f} {mb:>17.1f}")
    speed = statistics.median(times["full"]) / statistics.median(times["draft"])
    memory = statistics.median(peaks["full"]) / max(1, statistics.median(peaks["draft"]))
    print(f"draft vs full: {speed:.1f}x faster, {memory:.1f}x less peak memory")


if __name__ == "__main__":
    main()
