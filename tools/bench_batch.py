"""A batch-N model against its batch-1 twin on the emulator: ``bench``'s throughput curve.

Builds the batch-N twin of a batch-1 ONNX model (``--model``; default: the demo's
digits.onnx): every input's and output's leading axis set to N, and each Reshape whose
constant shape starts with 1 made to keep the batch axis (0, ONNX's "copy this axis"). The
twins are checked to agree item by item on ONNX Runtime, then each (batch 1, batch N) and
each ``-k`` is one ``python -m batchinfer bench`` subprocess on synthetic inputs, cores
0,1,2, interleaved ``--repeats`` times; the table gives median items/s (min-max).

The emulator's batch rule (runtime/sim.py, docs/guide/emulator.md): ``npu_ms`` is one
item's NPU time, a call of N holds its core N × npu_ms, ``host_ms`` is paid once per call.
A model chosen from public reports, not a board measurement: these are emulator figures.

    python tools/bench_batch.py --batch 4 --repeats 3
    python tools/bench_batch.py --model my.onnx --batch 8 -k 1,2 --sim-host-ms 1
    python tools/bench_batch.py --batch 4 -k 1 --ray local:2

``--ray ADDRESS``: ``bench`` does not run on a cluster, so each measurement is a
``python -m batchinfer run`` of the demo's 1,797 digits on that Ray cluster instead, and
its figure is the sum over cores of ``core_stats.parquet``'s items/s (start-up excluded).

``python`` is the interpreter running this tool, so run it with the checkout's venv (and
``PYTHONPATH`` at the checkout).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def batch_twin(model_bytes: bytes, n: int) -> bytes:
    """The batch-``n`` twin of a batch-1 ONNX model (see the module docstring)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load_from_string(model_bytes)
    graph = model.graph
    for value in [*graph.input, *graph.output]:
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].ClearField("dim_param")
            dims[0].dim_value = n
    del graph.value_info[:]  # inferred shapes of batch 1
    constants = {init.name: init for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Reshape" and node.input[1] in constants:
            init = constants[node.input[1]]
            shape = numpy_helper.to_array(init).copy()
            if shape.size and shape[0] == 1:
                shape[0] = 0  # keep the input's batch axis
                init.CopyFrom(numpy_helper.from_array(shape, init.name))
    onnx.checker.check_model(model)
    return model.SerializeToString()


def check_twins(one: Path, many: Path, n: int) -> float:
    """The largest difference between the twins' outputs on the same ``n`` random items."""
    import onnxruntime as ort

    s1 = ort.InferenceSession(str(one), providers=["CPUExecutionProvider"])
    sn = ort.InferenceSession(str(many), providers=["CPUExecutionProvider"])
    spec = s1.get_inputs()[0]
    shape = [n, *spec.shape[1:]]
    rng = np.random.default_rng(0)
    dtype = np.uint8 if "uint8" in spec.type else np.float32
    x = (rng.integers(0, 256, shape) if dtype == np.uint8 else rng.random(shape)).astype(dtype)
    batched = sn.run(None, {spec.name: x})
    worst = 0.0
    for j in range(n):
        single = s1.run(None, {spec.name: x[j : j + 1]})
        for a, b in zip(single, batched, strict=True):
            worst = max(worst, float(np.abs(a - b[j : j + 1]).max()))
    return worst


def one_bench(model: Path, k: str, args: argparse.Namespace) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-m", "batchinfer", "bench", "--model", str(model)]
        cmd += ["--backend", "sim", "--cores", "0,1,2", "-k", k]
        cmd += ["--sim-npu-ms", str(args.sim_npu_ms), "--sim-host-ms", str(args.sim_host_ms)]
        cmd += ["--duration", str(args.duration), "--warmup", str(args.warmup)]
        cmd += ["--min-samples", "100", "--json", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode not in (0, 1):  # 1: INVALID (a loaded machine); still measured
            raise SystemExit(f"bench failed (exit {proc.returncode}):\n{proc.stderr}")
        return float(json.loads(out.read_text())["samples_per_s"])


def one_ray_run(model: Path, k: str, args: argparse.Namespace) -> float:
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "batchinfer", "run", str(args.dataset), "--model"]
        cmd += [str(model), "--backend", "sim", "--cores", "0,1,2", "-k", k]
        cmd += ["--sim-npu-ms", str(args.sim_npu_ms), "--sim-host-ms", str(args.sim_host_ms)]
        cmd += ["--ray", args.ray, "--no-progress", "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"run failed (exit {proc.returncode}):\n{proc.stderr}")
        stats = pq.read_table(out / "core_stats.parquet").to_pylist()
        return float(sum(row["items_per_s"] or 0.0 for row in stats))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, help="a batch-1 ONNX (default: the demo's digits)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("-k", default="1,3", help="instances per core to run, comma-separated")
    p.add_argument("--sim-npu-ms", type=float, default=2.0)
    p.add_argument("--sim-host-ms", type=float, default=4.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "bench-batch")
    p.add_argument("--ray", metavar="ADDRESS", help="measure runs on this Ray cluster instead")
    args = p.parse_args()
    if args.model is None:
        from batchinfer.demo import model_path

        args.model = model_path("digits")
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.ray:
        from batchinfer.demo import write_demo

        args.dataset = write_demo(args.workdir / "demo", overwrite=True).dataset
    twin = args.workdir / f"{args.model.stem}-b{args.batch}.onnx"
    twin.write_bytes(batch_twin(args.model.read_bytes(), args.batch))
    worst = check_twins(args.model, twin, args.batch)
    print(f"twins agree on {args.batch} items to {worst:.2g} (largest output difference)")
    models = {"batch 1": args.model, f"batch {args.batch}": twin}
    ks = args.k.split(",")
    runs: dict[tuple[str, str], list[float]] = {(m, k): [] for m in models for k in ks}
    for _ in range(args.repeats):
        for name, path in models.items():
            for k in ks:
                measure = one_ray_run if args.ray else one_bench
                runs[(name, k)].append(measure(path, k, args))
    print(
        f"emulator figures (batchinfer sim on this machine: npu {args.sim_npu_ms:g} ms per "
        f"item, host {args.sim_host_ms:g} ms per call), "
        + (f"runs of the demo's digits on Ray ({args.ray})" if args.ray else "synthetic inputs")
        + f", cores 0,1,2; "
        f"median items/s (min-max) of {args.repeats}"
    )
    print(f"{'':<10}" + "".join(f"{'k=' + k:>26}" for k in ks))
    for name in models:
        cells = []
        for k in ks:
            r = runs[(name, k)]
            cells.append(f"{statistics.median(r):9.0f} ({min(r):.0f}-{max(r):.0f})")
        print(f"{name:<10}" + "".join(f"{c:>26}" for c in cells))


if __name__ == "__main__":
    main()
