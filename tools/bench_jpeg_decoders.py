"""JPEG decoders compared: CPU time per image, decode + resize to the model's size.

Single process, one image at a time, as a reader decodes. Each decoder decodes at the
same reduced scale as Pillow's ``draft`` (1/2, 1/4 or 1/8, never below the model's size)
and the result goes through the same resize (Pillow, bilinear), so the figures compare
decoders, and the pixels can be compared with Pillow's:

  pillow       Image.open + draft + convert + resize (what batchinfer did before)
  batchinfer   ``batchinfer.data.load_into``: the engine's decode as installed (pixel
               limit, EXIF orientation, then simplejpeg if it is installed, else Pillow)
  bi-pillow    the same with simplejpeg hidden: the engine's decode through Pillow
  simplejpeg   libjpeg-turbo through simplejpeg (manylinux wheels, x86_64 and aarch64)
  turbojpeg    PyTurboJPEG 1.x over the system libturbojpeg (a Debian package)
  pyvips       libvips' jpegload with shrink (pyvips + pyvips-binary wheels)

A decoder that does not import is skipped. CPU time is ``time.process_time`` (this
process, all its threads: libvips' are counted), steadier than wall time on a shared
machine; decoders are interleaved image by image, and medians are printed with the
largest difference from Pillow's pixels (max |a - b| over every pixel, 0..255).

    python tools/bench_jpeg_decoders.py --images 8 --repeats 15          # 640x480 -> 224
    python tools/bench_jpeg_decoders.py --photos 3 --repeats 5           # 4000x3000 -> 224
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from batchinfer.data import load_into, preprocess_for

Decoder = Callable[[bytes, tuple[int, int]], np.ndarray]


def draft_scale(full: tuple[int, int], size: tuple[int, int]) -> int:
    """The scale denominator Pillow's ``draft`` picks: the largest of 8, 4, 2, 1 that
    keeps both sides at least the model's."""
    fit = min(full[0] // size[0], full[1] // size[1])
    return next(s for s in (8, 4, 2, 1) if fit >= s)


def _resize(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    img = Image.fromarray(pixels)
    if img.size != size:
        img = img.resize(size, Image.Resampling.BILINEAR)
    return np.asarray(img)


def pillow(data: bytes, size: tuple[int, int]) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        img.draft("RGB", size)
        img = img.convert("RGB")
        if img.size != size:
            img = img.resize(size, Image.Resampling.BILINEAR)
        return np.asarray(img)


def make_batchinfer(size: tuple[int, int], pillow_only: bool = False) -> Decoder:
    from batchinfer.data import fast_jpeg

    spec = preprocess_for((1, size[1], size[0], 3), "uint8")
    out = np.empty(spec.shape, np.uint8)
    folder = tempfile.mkdtemp(prefix="bench-jpeg-")
    paths: dict[int, str] = {}  # load_into reads a path: each image is written once

    def decode(data: bytes, size: tuple[int, int]) -> np.ndarray:
        path = paths.get(id(data))
        if path is None:
            path = paths[id(data)] = os.path.join(folder, f"{len(paths)}.jpg")
            with open(path, "wb") as f:
                f.write(data)
        if pillow_only:
            saved, fast_jpeg._simplejpeg = fast_jpeg._simplejpeg, lambda: None
            try:
                load_into(path, spec, out, "images")
            finally:
                fast_jpeg._simplejpeg = saved
        else:
            load_into(path, spec, out, "images")
        return out[0].copy()

    return decode


def make_simplejpeg() -> Decoder:
    import simplejpeg

    def decode(data: bytes, size: tuple[int, int]) -> np.ndarray:
        h, w, _, _ = simplejpeg.decode_jpeg_header(data)
        s = draft_scale((w, h), size)
        pixels = simplejpeg.decode_jpeg(
            data, "RGB", min_width=-(-w // s), min_height=-(-h // s), min_factor=1
        )
        return _resize(pixels, size)

    return decode


def make_turbojpeg() -> Decoder:
    from turbojpeg import TJPF_RGB, TurboJPEG

    tj = TurboJPEG()

    def decode(data: bytes, size: tuple[int, int]) -> np.ndarray:
        w, h, _, _ = tj.decode_header(data)
        s = draft_scale((w, h), size)
        pixels = tj.decode(data, pixel_format=TJPF_RGB, scaling_factor=(1, s))
        return _resize(pixels, size)

    return decode


def make_pyvips() -> Decoder:
    import pyvips

    def decode(data: bytes, size: tuple[int, int]) -> np.ndarray:
        head = pyvips.Image.new_from_buffer(data, "", access="sequential")
        s = draft_scale((head.width, head.height), size)
        img = pyvips.Image.jpegload_buffer(data, shrink=s, access="sequential")
        pixels = np.frombuffer(img.write_to_memory(), np.uint8)
        return _resize(pixels.reshape(img.height, img.width, img.bands), size)

    return decode


def decoders(size: tuple[int, int]) -> dict[str, Decoder]:
    found: dict[str, Decoder] = {
        "pillow": pillow,
        "bi-pillow": make_batchinfer(size, pillow_only=True),
        "batchinfer": make_batchinfer(size),
    }
    for name, make in (
        ("simplejpeg", make_simplejpeg),
        ("turbojpeg", make_turbojpeg),
        ("pyvips", make_pyvips),
    ):
        try:
            found[name] = make()
        except Exception as exc:  # not installed, or its C library missing
            print(f"{name}: skipped ({type(exc).__name__}: {str(exc).splitlines()[0]})")
    return found


def measure(
    images: list[bytes], size: tuple[int, int], repeats: int
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """CPU seconds per decode for each decoder (interleaved), and each one's largest
    pixel difference from Pillow's."""
    found = decoders(size)
    diff = dict.fromkeys(found, 0)
    for data in images:  # warm-up, and the pixel check
        ref = pillow(data, size).astype(np.int16)
        for name, decode in found.items():
            got = decode(data, size)
            diff[name] = max(diff[name], int(np.abs(got.astype(np.int16) - ref).max()))
    times: dict[str, list[float]] = {name: [] for name in found}
    for _ in range(repeats):
        for data in images:
            for name, decode in found.items():
                t0 = time.process_time()
                decode(data, size)
                times[name].append(time.process_time() - t0)
    return times, diff


def report(title: str, times: dict[str, list[float]], diff: dict[str, int]) -> str:
    base = statistics.median(times["pillow"])
    header = f"{'decoder':<11} {'n':>5} {'CPU ms median':>14} {'vs pillow':>10} {'max diff':>9}"
    lines = [title, header]
    for name, ts in times.items():
        med = statistics.median(ts)
        lines.append(
            f"{name:<11} {len(ts):>5} {med * 1e3:>14.3f} {base / med:>9.2f}x {diff[name]:>9}"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=8, help="640x480 JPEGs (0: none)")
    p.add_argument("--photos", type=int, default=0, help="4000x3000 JPEGs (0: none)")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--size", type=int, default=224, help="model input height and width")
    p.add_argument(
        "--pillow-blocks",
        type=int,
        default=0,
        help="Pillow's block cache (Image.core.set_blocks_max; Pillow's default 0: every "
        "image's memory is allocated afresh)",
    )
    args = p.parse_args()
    Image.core.set_blocks_max(args.pillow_blocks)
    os.environ.setdefault("VIPS_CONCURRENCY", "1")  # one process, one thread, as a reader
    sys.path.insert(0, str(Path(__file__).parent))
    size = (args.size, args.size)
    print(
        f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, "
        f"Pillow blocks_max {args.pillow_blocks}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-jpeg-") as tmp:
        if args.images:
            from bench_peers import make_jpegs

            make_jpegs(Path(tmp) / "640", args.images)
            data = [f.read_bytes() for f in sorted((Path(tmp) / "640").glob("*.jpg"))]
            times, diff = measure(data, size, args.repeats)
            print(report(f"\n{len(data)} JPEGs 640x480 q90 -> {args.size}", times, diff))
        if args.photos:
            from bench_decode import make_images

            paths = make_images(Path(tmp), args.photos)
            data = [f.read_bytes() for f in paths]
            times, diff = measure(data, size, args.repeats)
            print(report(f"\n{len(data)} JPEGs 4000x3000 q90 -> {args.size}", times, diff))
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
