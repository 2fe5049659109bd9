"""Benchmark of the sim runtime's time model (emulator figures, not a board's).

For k = 1..max-k instances (threads, as the engine runs them) pinned to one core, run
for a few seconds and print the measured calls/s next to the model's ceiling
min(k / (host_ms + npu_ms), 1 / npu_ms) and their ratio.

    python tools/bench_sim.py --npu-ms 2 --host-ms 4 --seconds 3
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from batchinfer.runtime.constants import core_mask
from batchinfer.runtime.sim import RKNNLite


def tiny_model(directory: Path) -> Path:
    """Path of a minimal uint8 [1,8,8,1] -> float32 model: the ONNX work is negligible."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
        "bench",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 8, 8, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    path = directory / "bench.onnx"
    onnx.save(model, str(path))
    return path


def measure(k: int, args: argparse.Namespace, model: Path, state: Path) -> float:
    """Calls per second of k instances on one core, after a warm-up."""
    runtimes = []
    for _ in range(k):
        r = RKNNLite(npu_ms=args.npu_ms, host_ms=args.host_ms, faults="", state_dir=state)
        if r.load_rknn(str(model)) != 0 or r.init_runtime(core_mask=core_mask(args.core)) != 0:
            raise SystemExit("the sim runtime could not start; see the E RKNN lines above")
        runtimes.append(r)
    x = np.zeros((1, 8, 8, 1), dtype=np.uint8)
    counts = [0] * k
    start = threading.Barrier(k + 1)
    t_begin = t_end = 0.0

    def loop(i: int, r: RKNNLite) -> None:
        start.wait()
        warm_until = time.monotonic() + args.warmup
        while time.monotonic() < warm_until:
            r.inference(inputs=[x], reuse_outputs=True)
        n = 0
        while time.monotonic() < t_end:
            r.inference(inputs=[x], reuse_outputs=True)
            n += 1
        counts[i] = n

    threads = [threading.Thread(target=loop, args=(i, r)) for i, r in enumerate(runtimes)]
    for t in threads:
        t.start()
    t_begin = time.monotonic() + args.warmup
    t_end = t_begin + args.seconds
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t_begin
    for r in runtimes:
        r.release()
    return sum(counts) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npu-ms", type=float, default=2.0)
    parser.add_argument("--host-ms", type=float, default=4.0)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured time per k")
    parser.add_argument("--warmup", type=float, default=0.3, help="excluded time per k")
    parser.add_argument("--max-k", type=int, default=4)
    parser.add_argument("--core", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as tmp:
        model = tiny_model(Path(tmp))
        print(
            f"emulator (batchinfer sim), one core, npu_ms={args.npu_ms:g}, "
            f"host_ms={args.host_ms:g}, {args.seconds:g} s per k"
        )
        print(f"{'k':>2} {'emulator calls/s':>17} {'model ceiling':>14} {'ratio':>6}")
        for k in range(1, args.max_k + 1):
            # A fresh board per k: no reservation carries over.
            rate = measure(k, args, model, Path(tmp) / f"state-{k}")
            ceiling = min(k / (args.host_ms + args.npu_ms), 1 / args.npu_ms) * 1000
            print(f"{k:>2} {rate:>17.1f} {ceiling:>14.1f} {rate / ceiling:>6.3f}")


if __name__ == "__main__":
    main()
