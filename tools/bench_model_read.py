"""What reading a model's input shape costs the coordinator: off the file, or through ONNX
Runtime (what planning did before runtime/onnx_graph.py).

For each model size, a model of that many MB of weights (one MatMul) is written into
``--workdir`` once; then each way of reading it runs in a fresh interpreter, interleaved,
``--repeats`` times. Per way: milliseconds from before the import to the shape (the import
included: the coordinator pays it) and the process's peak RSS (VmHWM). Medians. Linux.

    python tools/bench_model_read.py --sizes 1 200 --repeats 3     # needs onnx (extras)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import bytecode_cache

_READ = """
import json, sys, time
import numpy  # both ways need it for the engine anyway: not part of the cost
t = time.perf_counter()
if sys.argv[1] == "onnx_graph":
    from batchinfer.runtime.onnx_graph import read_graph_interface
    shape = read_graph_interface(sys.argv[2]).inputs[0].shape
else:
    from batchinfer.runtime.model_info import open_session
    shape = open_session(sys.argv[2]).get_inputs()[0].shape
ms = (time.perf_counter() - t) * 1000
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the process that forked us.
hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
rss = int(hwm.split()[1]) / 1024
print(json.dumps({"ms": ms, "rss_mb": rss, "shape": list(shape)}))
"""

WAYS = ("onnx_graph", "onnxruntime")


def write_model(path: Path, megabytes: int) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if path.is_file():
        return path
    n_in = 3 * 64 * 64
    n_out = max(1, megabytes * 2**20 // (4 * n_in))
    weights = np.random.default_rng(0).standard_normal((n_in, n_out)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["image"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "W"], ["out"]),
        ],
        "weights",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, n_out])],
        [numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def read_once(way: str, model: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _READ, way, str(model)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", type=Path, default=Path("/tmp/batchinfer-model-read"))
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 200], help="MB of weights")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    bytecode_cache.ensure()
    for size in args.sizes:
        model = write_model(args.workdir / f"weights-{size}mb.onnx", size)
        runs: dict[str, list[dict]] = {way: [] for way in WAYS}
        for _ in range(args.repeats):
            for way in WAYS:
                runs[way].append(read_once(way, model))
        shapes = {json.dumps(r["shape"]) for rs in runs.values() for r in rs}
        if len(shapes) != 1:
            raise SystemExit(f"the two ways disagree on {model}: {shapes}")
        mb = model.stat().st_size / 2**20
        for way, rs in runs.items():
            ms = statistics.median(r["ms"] for r in rs)
            rss = statistics.median(r["rss_mb"] for r in rs)
            print(f"{mb:7.1f} MB model  {way:12} {ms:8.1f} ms  peak RSS {rss:6.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
