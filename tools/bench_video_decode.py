"""Video decoding in one process: frames per second, PyAV against an ffmpeg child.

What one reader can feed: the generated demo clip (moving digits, batchinfer's
``batchinfer.data.video.clip``) is written once as H.264 (libx264 from PyAV's bundled
FFmpeg, else MPEG-4 Part 2) at the size asked, then decoded whole to RGB arrays by:

  pyav     ``batchinfer.data.video.decode.decode_range``, one decoding thread (a reader
           is one of several processes: threads would only compete with the others)
  ffmpeg   ``batchinfer.data.video.ffmpeg_pipe.decode_range_ffmpeg`` (``--decoder
           ffmpeg``), the ffmpeg program on PATH with ``-threads 1``, frames over a pipe

The decoders alternate, ``--repeats`` times each; printed are the median frames per
second (wall time, the clip from open to its last frame) and the median CPU milliseconds
per frame, this process and its children together (the ffmpeg child decodes and
converts to RGB; this process copies the pipe's bytes). A run's frame rate is at most
readers x one reader's rate, and less when the readers share fewer CPUs.

``--rotation DEG`` adds ``pyav-turned``: the same packets remuxed with a display matrix of
DEG degrees (a portrait phone video), decoded and turned as readers turn them; every
decoder's frames then also go into a Pillow image as the preprocessing's first step does
(decode_array), the copy in which a turned frame's strides are paid.

    python tools/bench_video_decode.py                          # 640x480, 300 frames
    python tools/bench_video_decode.py --size 1920x1080 --repeats 3
    python tools/bench_video_decode.py --size 1920x1080 --rotation 90
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from batchinfer.data.video import DecodedFrame, plan_ranges, probe
from batchinfer.data.video.clip import h264_codec, write_clip
from batchinfer.data.video.decode import decode_range
from batchinfer.data.video.ffmpeg_pipe import decode_range_ffmpeg


def _cpu_s() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _time(
    frames: Callable[[], Iterator[object]], expected: int, to_pillow: bool
) -> tuple[float, float]:
    """(frames per second, CPU ms per frame) of one whole decode."""
    from PIL import Image

    cpu, wall = _cpu_s(), time.perf_counter()
    count = 0
    for f in frames():
        if isinstance(f, DecodedFrame):
            if to_pillow:
                Image.fromarray(f.rgb, "RGB")
            count += 1
    wall, cpu = time.perf_counter() - wall, _cpu_s() - cpu
    if count != expected:
        raise SystemExit(f"decoded {count} frames, expected {expected}")
    return count / wall, 1000 * cpu / count


def _turned(src: Path, dst: Path, degrees: int) -> Path:
    """``src``'s packets remuxed with a display matrix turning them ``degrees``."""
    import av

    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        stream = inp.streams.video[0]
        copy = out.add_stream_from_template(stream)
        copy.set_display_rotation(degrees)
        for packet in inp.demux(stream):
            if packet.size:
                packet.stream = copy
                out.mux(packet)
    return dst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="640x480", help="WIDTHxHEIGHT (default 640x480)")
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rotation", type=int, choices=(90, 180, 270), default=None)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory(prefix="bench-video-") as folder:
        path = write_clip(Path(folder) / "clip.mp4", "h264", args.frames, width, height)
        info = probe(path)
        whole = plan_ranges(info, 1)[0]
        decoders: dict[str, Callable[[], Iterator[object]]] = {
            "pyav": lambda: decode_range(info, whole, threads=1)
        }
        if args.rotation:
            turned_info = probe(_turned(path, Path(folder) / "turned.mp4", args.rotation))
            decoders["pyav-turned"] = lambda: decode_range(turned_info, whole, threads=1)
        if shutil.which("ffmpeg"):
            decoders["ffmpeg"] = lambda: decode_range_ffmpeg(info, whole, ["-threads", "1"])
        else:
            print("no ffmpeg program on PATH: the ffmpeg decoder is left out")
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in decoders}
        for _ in range(args.repeats):
            for name, frames in decoders.items():
                results[name].append(_time(frames, info.frames, bool(args.rotation)))
    print(
        f"clip: {info.frames} frames {width}x{height} {info.codec} ({h264_codec()}), "
        f"keyframe every {info.frames // len(info.keyframes)} frames; {args.repeats} repeats"
    )
    print(f"{'decoder':8} {'frames/s':>9} {'(min-max)':>13} {'CPU ms/frame':>13}")
    for name, runs in results.items():
        fps = [r[0] for r in runs]
        cpu = statistics.median(r[1] for r in runs)
        spread = f"({min(fps):.0f}-{max(fps):.0f})"
        print(f"{name:8} {statistics.median(fps):9.0f} {spread:>13} {cpu:13.2f}")


if __name__ == "__main__":
    main()
