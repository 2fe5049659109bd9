"""``batchinfer run`` over a video against what users write instead, in one sitting.

The demo clip of moving digits (batchinfer.demo.clip: 320 x 240 H.264, lengthened to
``--frames``), the demo detector (digits-det.onnx, letterboxed to 256, pixels / 255), one
backend at a time (``--backends``: ``sim``, the emulated NPU with its default 2 ms NPU +
4 ms host per call, and ``onnx``, ONNX Runtime on this CPU). Every peer feeds the model
with the engine's own preprocessing (``decode_array`` + ``write_pixels``), calls the same
runtime instances the engine would (``backend.instance(core)``) and decodes the same
boxes (``ItemDecoder``), and must find as many boxes (conf 0.25) in every frame as the
engine does:

  engine        ``batchinfer.run``: readers decode ranges of the clip beside the cores,
                one worker process per core (cores 0,1,2, the default instances);
  loop-pyav     one Python loop: PyAV decodes a frame, then it is preprocessed, inferred
                and decoded, in turn (the popular single-script pattern);
  loop-opencv   the same loop with ``cv2.VideoCapture`` (opencv-python-headless, when
                importable; its BGR frames converted to RGB);
  threads       PyAV decodes in the main thread and a thread pool of cores x k runtime
                instances, pinned round-robin, preprocesses, infers and decodes (the
                community's RKNN multi-threading pattern); at most 2 frames a thread in
                flight.

**frames/s** counts from the moment every runtime is loaded (the engine's CoresReady; the
peers' instances are made first) to the last result; **end to end** is the whole job in
this process (model loading, start-up, writing Parquet for the engine). Peers run
interleaved, ``--repeats`` times; medians and min-max are printed with each peer's ratio
to the engine.

The **limit** is measured before each repeat in this process (CPU time, one decoding
thread): one process's CPU ms to decode a frame and preprocess it, so readers x 1000 /
that is what readers can feed (the engine's readers are processes: it is the decode limit
of the run, with ``R`` the readers it used); a loop's own limit is 1000 / (decode +
preprocess + one inference + decode of boxes, in sequence).

    python tools/bench_video_peers.py                         # sim and onnx, 3 repeats
    python tools/bench_video_peers.py --backends sim --repeats 5 --frames 3000
    python tools/bench_video_peers.py --scale 4 --frames 600   # 1280 x 960: decode-bound

Emulator figures (``sim``) are the emulator's, not a board's.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bench_peers import EngineSpan  # tools/ is on sys.path: this is a script beside it

from batchinfer.data.images import decode_array
from batchinfer.data.pixels import write_pixels
from batchinfer.demo import model_path
from batchinfer.engine.detection import write_geometry
from batchinfer.engine.planning.config import RunConfig
from batchinfer.tasks import ItemDecoder

PEERS = ("engine", "loop-pyav", "loop-opencv", "threads")
CONF = 0.25
DETECTOR = {"mean": (0.0, 0.0, 0.0), "std": (255.0, 255.0, 255.0)}


@dataclass
class Outcome:
    frames_per_s: float
    end_to_end_s: float
    boxes: list[int]  # boxes at CONF per frame, in frame order
    readers: int = 0


class Setting:
    """One backend's plan: the engine's preprocessing, task and runtime instances."""

    def __init__(self, clip: Path, backend: str, workdir: Path) -> None:
        from batchinfer.engine.planning.plan import plan_inference

        self.clip, self.backend_name, self.workdir = clip, backend, workdir
        self.options = {"backend": backend, "cores": (0, 1, 2), **DETECTOR}
        config = RunConfig.of(clip, model_path("digits-det"), **self.options)
        plan = plan_inference(config).engine
        self.plan, self.pre, self.cores = plan, plan.preprocess, plan.cores
        self.instances = len(plan.cores) * plan.instances_per_core

    # ------------------------------------------------------------------ shared steps
    def _infer(self, adapter, decoder: ItemDecoder, rgb: np.ndarray) -> int:
        """Preprocess ``rgb`` as the engine does, infer, decode: boxes at CONF."""
        x = np.empty(self.pre.shape, self.pre.dtype)
        pixels, placed = decode_array(rgb, self.pre)
        write_pixels(pixels, self.pre, x)
        geometry = np.empty(6)
        write_geometry(geometry, placed)
        outputs = adapter.infer([x], data_format=self.pre.layout)
        rows = decoder(outputs, geometry).payload.rows
        return int((rows[:, 4] >= CONF).sum())

    def _adapters(self, n: int) -> tuple[object, list]:
        backend = self.plan.backend.for_run()
        return backend, [backend.instance(self.cores[i % len(self.cores)]) for i in range(n)]

    # ------------------------------------------------------------------ the peers
    def run_engine(self, repeat: int) -> Outcome:
        import pyarrow.parquet as pq

        from batchinfer.engine.runner import run

        out = self.workdir / f"engine-{self.backend_name}-{repeat}"
        config = RunConfig.of(self.clip, model_path("digits-det"), out=out, overwrite=True,
                              **self.options)  # fmt: skip
        span, t0 = EngineSpan(), time.monotonic()
        result = run(config, observers=[span])
        wall = time.monotonic() - t0
        if result.errors:
            raise SystemExit(f"engine: {result.errors} error rows")
        table = pq.read_table(out / "predictions", columns=["frame", "boxes"]).to_pylist()
        table.sort(key=lambda r: r["frame"])
        boxes = [sum(b["score"] >= CONF for b in r["boxes"]) for r in table]
        readers = json.loads((out / "manifest.json").read_text()).get("readers")
        return Outcome(span.items_per_s, wall, boxes, int(readers or 0))

    def _loop(self, frames: Callable[[], Iterator[np.ndarray]]) -> Outcome:
        t0 = time.monotonic()
        backend, (adapter,) = self._adapters(1)
        decoder = ItemDecoder(self.plan.task)
        try:
            t1 = time.monotonic()
            boxes = [self._infer(adapter, decoder, rgb) for rgb in frames()]
            t2 = time.monotonic()
        finally:
            adapter.release()
            backend.end_run()
        return Outcome(len(boxes) / (t2 - t1), time.monotonic() - t0, boxes)

    def run_loop_pyav(self, repeat: int) -> Outcome:
        return self._loop(lambda: pyav_frames(self.clip))

    def run_loop_opencv(self, repeat: int) -> Outcome:
        return self._loop(lambda: opencv_frames(self.clip))

    def run_threads(self, repeat: int) -> Outcome:
        t0 = time.monotonic()
        n = self.instances
        backend, adapters = self._adapters(n)
        free: queue.SimpleQueue = queue.SimpleQueue()
        for adapter in adapters:
            free.put((adapter, ItemDecoder(self.plan.task)))

        def work(rgb: np.ndarray) -> int:
            instance = free.get()  # one thread per instance at a time (RKNNLite is not reentrant)
            try:
                return self._infer(instance[0], instance[1], rgb)
            finally:
                free.put(instance)

        try:
            with ThreadPoolExecutor(max_workers=n) as pool:
                pending: list[Future] = []
                boxes: list[int] = []
                t1 = time.monotonic()
                for rgb in pyav_frames(self.clip):
                    pending.append(pool.submit(work, rgb))
                    if len(pending) >= 2 * n:
                        boxes.append(pending.pop(0).result())
                boxes += [f.result() for f in pending]
                t2 = time.monotonic()
        finally:
            for adapter in adapters:
                adapter.release()
            backend.end_run()
        return Outcome(len(boxes) / (t2 - t1), time.monotonic() - t0, boxes)

    # ------------------------------------------------------------------ the limit
    def limits(self, frames: int = 100) -> tuple[float, float]:
        """CPU ms per frame in this process: (decode + preprocess with one decoding thread,
        one inference + the decoding of its boxes: the emulator computes the model too)."""
        x = np.empty(self.pre.shape, self.pre.dtype)
        backend, (adapter,) = self._adapters(1)
        decoder = ItemDecoder(self.plan.task)
        decode = infer = 0.0
        n = 0
        try:
            for rgb in pyav_frames(self.clip, threads=1):
                c0 = time.process_time()
                write_pixels(decode_array(rgb, self.pre)[0], self.pre, x)
                c1 = time.process_time()
                self._infer(adapter, decoder, rgb)
                # _infer preprocesses again: its share is taken off below
                infer += time.process_time() - c1 - (c1 - c0)
                decode += c1 - c0
                n += 1
                if n == frames:
                    break
        finally:
            adapter.release()
            backend.end_run()
        # the decode's share happens inside pyav_frames' next(), outside this loop's clock
        whole = self._decode_only(frames)
        return 1e3 * (decode / n + whole), 1e3 * infer / n

    def _decode_only(self, frames: int) -> float:
        """CPU seconds per frame of PyAV's decode to RGB alone (one thread)."""
        c0, n = time.process_time(), 0
        for _ in pyav_frames(self.clip, threads=1):
            n += 1
            if n == frames:
                break
        return (time.process_time() - c0) / n


def pyav_frames(clip: Path, threads: int = 0) -> Iterator[np.ndarray]:
    """The clip's frames as RGB arrays, PyAV as a user calls it (``threads`` 0: its default)."""
    import av

    with av.open(str(clip)) as container:
        stream = container.streams.video[0]
        if threads:
            stream.codec_context.thread_count = threads
        for frame in container.decode(stream):
            yield frame.to_ndarray(format="rgb24")


def opencv_frames(clip: Path) -> Iterator[np.ndarray]:
    import cv2

    capture = cv2.VideoCapture(str(clip))
    try:
        while True:
            ok, bgr = capture.read()
            if not ok:
                return
            yield cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    finally:
        capture.release()


def has_opencv() -> bool:
    try:
        import cv2  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- the sitting
def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} ({min(values):.1f}-{max(values):.1f})"


def sitting(args: argparse.Namespace, clip: Path) -> None:
    peers = [p for p in PEERS if p != "loop-opencv" or has_opencv()]
    if "loop-opencv" not in peers:
        print("loop-opencv: not run (no cv2: pip install opencv-python-headless)")
    for backend in args.backends:
        setting = Setting(clip, backend, args.workdir)
        runs: dict[str, list[Outcome]] = {p: [] for p in peers}
        limits: list[tuple[float, float]] = []
        print(f"\n{backend}: {args.frames} frames of {clip.name}, cores {setting.cores}, "
              f"{setting.instances} instances", flush=True)  # fmt: skip
        for r in range(args.repeats):
            limits.append(setting.limits())
            print(f"  CPU ms/frame #{r + 1}: decode+preprocess {limits[-1][0]:.2f}, "
                  f"infer+boxes {limits[-1][1]:.2f}", flush=True)  # fmt: skip
            for peer in peers:
                outcome = getattr(setting, f"run_{peer.replace('-', '_')}")(r)
                runs[peer].append(outcome)
                print(f"  {peer:12} #{r + 1}: {outcome.frames_per_s:7.1f} frames/s, end to end "
                      f"{outcome.end_to_end_s:5.2f} s", flush=True)  # fmt: skip
        reference = runs["engine"][0].boxes
        engine = statistics.median(o.frames_per_s for o in runs["engine"])
        readers = max(o.readers for o in runs["engine"])
        ms = statistics.median(d for d, _ in limits)
        infer_ms = statistics.median(i for _, i in limits)
        cpus = len(os.sched_getaffinity(0))
        print(f"\n  {backend}: peer, frames/s median (min-max), vs engine, end to end s, "
              f"frames whose box count differs from the engine's")  # fmt: skip
        for peer in peers:
            rates = [o.frames_per_s for o in runs[peer]]
            walls = [o.end_to_end_s for o in runs[peer]]
            differ = sum(sum(a != b for a, b in zip(o.boxes, reference, strict=True))
                         for o in runs[peer])  # fmt: skip
            print(f"  {peer:12} {_summary(rates)}  {statistics.median(rates) / engine:5.2f}  "
                  f"{statistics.median(walls):5.2f}  {differ}")  # fmt: skip
        print(f"  limit: decode + preprocess {ms:.2f} CPU ms/frame in one process: "
              f"{1e3 / ms:.0f} frames/s per reader; the engine used {readers} reader(s): "
              f"{readers * 1e3 / ms:.0f} frames/s if they had a CPU each. With inference "
              f"and boxes ({infer_ms:.2f} CPU ms/frame here) every frame costs "
              f"{ms + infer_ms:.2f} CPU ms: {cpus} CPUs give at most "
              f"{cpus * 1e3 / (ms + infer_ms):.0f} frames/s; one loop at most "
              f"{1e3 / (ms + infer_ms):.0f} (plus the NPU's wait, for sim)")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=1500, help="clip length (30 fps)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=["sim", "onnx"], choices=["sim", "onnx"])
    parser.add_argument(
        "--scale", type=int, default=1, help="frames enlarged this many times (4: 1280 x 960)"
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench-video-peers"))
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    clip = make_clip(args.workdir, args.frames, args.scale)
    print(f"load average before: {_loadavg()}", flush=True)
    sitting(args, clip)
    print(f"\nload average after: {_loadavg()}")


def make_clip(workdir: Path, frames: int, scale: int) -> Path:
    """The demo clip of ``frames`` frames (made once in ``workdir``), each frame enlarged
    ``scale`` times (pixel repetition: the same digits, scale squared the pixels to decode)."""
    from batchinfer.data.video.clip import encode_frames
    from batchinfer.demo import clip as demo_clip

    path = workdir / f"clip-{frames}-x{scale}" / "digits.mp4"
    if path.exists():
        return path
    if scale == 1:
        return demo_clip.write_demo_clip(path.parent, frames=frames).video
    path.parent.mkdir(parents=True)
    big = (np.repeat(np.repeat(s.image, scale, 0), scale, 1) for s in demo_clip.clip_scenes(frames))
    w, h = demo_clip.WIDTH * scale, demo_clip.HEIGHT * scale
    return encode_frames(path, big, "h264", w, h, demo_clip.FPS, demo_clip.GOP)


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


if __name__ == "__main__":
    sys.exit(main())
