"""One workload, in one sitting, through the engine and through what users write instead.

Four ways to run the same items through the same model on the same cores:

  engine       batchinfer's Engine: one worker process per core with k instances each,
               inputs in shared memory (ArraySource: the coordinator copies each tensor
               into its slot), rows into memory.
  loop         a single-process loop over one runtime instance (on the first core).
  threads      a thread pool of cores x k runtime instances pinned round-robin to the cores,
               as the popular community RKNN multi-threading repositories do
               (leafqycc/rknn-multi-threaded's rknnPoolExecutor: instance i on core i % 3,
               item n on instance n % N, results taken in order). One deviation: at most N
               items are in flight, so no instance is ever used by two threads at once.
  processes    multiprocessing.Pool (spawn) of cores x k processes, one instance each,
               pinned round-robin; the arrays are pickled to the workers with pool.map.

Everyone gets the same inputs (``--distinct`` random tensors of the model's input shape,
item n is tensor n % distinct) and the same layout, and every peer's top-1 must equal the
engine's for every item. Instances come from ``make_backend(...).instance(core)``, so the
same script runs on the emulator (``--backend sim``), ONNX Runtime, or ``rknnlite`` on a
board. Time counts from the first item handed over to the last result, after every
instance is loaded; peers run interleaved, ``--repeats`` times, and the medians are
compared as ratios to the engine's.

    python tools/compare_peers.py                            # pool224 on the emulator
    python tools/compare_peers.py --model m.rknn --backend rknnlite --cores 0,1,2 -k 2

Exit status: 0 when every peer agreed with the engine on every item, 1 otherwise.
Emulator figures are emulator figures: they compare ways of driving the cores, not boards.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from batchinfer.bench.report import table
from batchinfer.bench.runner import label
from batchinfer.demo import model_path
from batchinfer.engine import events as ev
from batchinfer.engine.loop import Engine
from batchinfer.engine.planning.config import RunConfig
from batchinfer.engine.planning.plan import plan_inference
from batchinfer.engine.sources import ArraySource
from batchinfer.options import RuntimeOptions, SimOptions
from batchinfer.runtime.adapter import RuntimeAdapter
from batchinfer.runtime.backends import Backend
from batchinfer.sink.rows import MemorySink

PEERS = ("engine", "loop", "threads", "processes")


def make_inputs(shape: tuple[int, ...], dtype: str, distinct: int, seed: int) -> list[np.ndarray]:
    """``distinct`` random tensors of the model's input (integers over 0..255 at most)."""
    rng = np.random.default_rng(seed)
    kind = np.dtype(dtype)
    if kind.kind == "f":
        return [rng.standard_normal(shape).astype(kind) for _ in range(distinct)]
    info = np.iinfo(kind)
    low, high = max(info.min, 0), min(info.max, 255)
    return [rng.integers(low, high, shape, dtype=kind, endpoint=True) for _ in range(distinct)]


def top1(adapter: RuntimeAdapter, x: np.ndarray, layout: str) -> int:
    out = adapter.infer([x], reuse_outputs=True, data_format=layout)
    return int(np.argmax(out[0].reshape(-1)))


# --------------------------------------------------------------------------- the peers
class _Span:
    """Engine observer: from Started to the last rows."""

    def __init__(self) -> None:
        self.t0 = self.t1 = 0.0

    def notify(self, event: object) -> None:
        if isinstance(event, ev.Started):
            self.t0 = event.t
        elif isinstance(event, ev.RowsDone):
            self.t1 = event.t


def run_engine(w: Workload) -> tuple[float, list[int]]:
    span, sink = _Span(), MemorySink()
    items = [w.inputs[i % len(w.inputs)] for i in range(w.items)]
    result = Engine(w.plan, ArraySource(items), sink, [span]).run()
    if result.status != "complete" or result.counts["errors"]:
        raise SystemExit(f"the engine run ended {result.status}: {result.error or result.counts}")
    return span.t1 - span.t0, [r.pred for r in sink.sorted_rows()]


def run_loop(w: Workload) -> tuple[float, list[int]]:
    adapter = w.backend.instance(w.cores[0])
    try:
        t0 = time.monotonic()
        preds = [top1(adapter, w.inputs[i % len(w.inputs)], w.layout) for i in range(w.items)]
        return time.monotonic() - t0, preds
    finally:
        adapter.release()


def run_threads(w: Workload) -> tuple[float, list[int]]:
    n = len(w.cores) * w.k
    adapters = [w.backend.instance(w.cores[i % len(w.cores)]) for i in range(n)]
    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            pending: deque = deque()
            preds = []
            t0 = time.monotonic()
            for i in range(w.items):
                x = w.inputs[i % len(w.inputs)]
                pending.append(pool.submit(top1, adapters[i % n], x, w.layout))
                if len(pending) >= n:
                    preds.append(pending.popleft().result())
            preds += [f.result() for f in pending]
            return time.monotonic() - t0, preds
    finally:
        for a in adapters:
            a.release()


# multiprocessing.Pool workers: one instance per process, made by the initializer.
_WORKER: dict = {}


def _pool_init(backend: Backend, cores: tuple[int, ...], counter, ready, layout: str) -> None:
    with counter.get_lock():
        index = counter.value
        counter.value += 1
    _WORKER["adapter"] = backend.instance(cores[index % len(cores)])
    _WORKER["layout"] = layout
    with ready.get_lock():
        ready.value += 1


def _pool_top1(x: np.ndarray) -> int:
    return top1(_WORKER["adapter"], x, _WORKER["layout"])


def run_processes(w: Workload) -> tuple[float, list[int]]:
    n = len(w.cores) * w.k
    ctx = mp.get_context("spawn")
    counter, ready = ctx.Value("i", 0), ctx.Value("i", 0)
    with ctx.Pool(n, _pool_init, (w.backend, w.cores, counter, ready, w.layout)) as pool:
        # The clock starts once every worker has loaded its instance, as for the others.
        deadline = time.monotonic() + 300
        while ready.value < n:
            if time.monotonic() > deadline:
                raise SystemExit("the multiprocessing.Pool workers did not load their instances")
            time.sleep(0.01)  # a tool polling a shared counter, not a test waiting
        items = [w.inputs[i % len(w.inputs)] for i in range(w.items)]
        t0 = time.monotonic()
        preds = pool.map(_pool_top1, items)
        elapsed = time.monotonic() - t0
        pool.close()
        pool.join()
    return elapsed, preds


RUNNERS: dict[str, Callable] = {
    "engine": run_engine,
    "loop": run_loop,
    "threads": run_threads,
    "processes": run_processes,
}


# --------------------------------------------------------------------------- the sitting
class Workload:
    """What every peer runs: the backend (a private emulated board), cores, inputs."""

    def __init__(self, args: argparse.Namespace) -> None:
        sim = SimOptions(npu_ms=args.sim_npu_ms, host_ms=args.sim_host_ms)
        runtime = RuntimeOptions(
            backend=args.backend,
            cores=args.cores,
            instances_per_core=args.k,
            sim=sim if args.backend == "sim" else SimOptions(),
        )
        model = Path(args.model)
        config = RunConfig(dataset=Path("."), model=model, runtime=runtime)
        planned = plan_inference(config, several_inputs=False)
        self.plan = planned.engine
        self.backend = self.plan.backend.for_run()  # the peers' board, shared by them all
        self.cores = self.plan.cores
        self.k = args.k
        self.layout = self.plan.preprocess.layout
        self.items = args.items
        self.shape, self.dtype = planned.shape, planned.dtype
        self.inputs = make_inputs(self.plan.preprocess.shape, self.plan.preprocess.dtype,
                                  args.distinct, args.seed)  # fmt: skip

    def close(self) -> None:
        self.backend.end_run()


def sitting(w: Workload, repeats: int, peers: tuple[str, ...]) -> dict:
    """Every peer ``repeats`` times, interleaved; items/s per run and top-1 mismatches."""
    rates: dict[str, list[float]] = {p: [] for p in peers}
    mismatches: dict[str, int] = {p: 0 for p in peers}
    reference: list[int] | None = None
    for r in range(repeats):
        for peer in peers:
            elapsed, preds = RUNNERS[peer](w)
            rates[peer].append(w.items / elapsed)
            if reference is None:
                reference = preds
            mismatches[peer] += sum(a != b for a, b in zip(preds, reference, strict=True))
            print(f"  {peer} #{r + 1}: {w.items / elapsed:8.1f} items/s", flush=True)
    return {"rates": rates, "mismatches": mismatches}


def report(w: Workload, result: dict, args: argparse.Namespace) -> str:
    rates, mismatches = result["rates"], result["mismatches"]
    base = statistics.median(rates["engine"]) if "engine" in rates else None
    n = len(w.cores) * w.k
    what = {
        "engine": f"batchinfer engine ({len(w.cores)} worker processes x {w.k} instances)",
        "loop": f"single-process loop (1 instance, core {w.cores[0]})",
        "threads": f"thread pool ({n} instances round-robin on cores)",
        "processes": f"multiprocessing.Pool ({n} processes, pickled arrays)",
    }
    rows = []
    for peer, values in rates.items():
        med = statistics.median(values)
        ratio = f"{med / base:.2f}" if base else "-"
        rows.append((what[peer], f"{med:.1f}", f"{min(values):.1f}-{max(values):.1f}", ratio,
                     str(mismatches[peer])))  # fmt: skip
    header = ("peer", f"items/s (median of {args.repeats})", "min-max", "vs engine",
              "top-1 mismatches")  # fmt: skip
    lines = [
        f"one workload: {Path(args.model).name}, {w.items} items ({args.distinct} distinct "
        f"random {'x'.join(map(str, w.plan.preprocess.shape))} {w.plan.preprocess.dtype} "
        f"tensors), cores {','.join(map(str, w.cores))}, {w.k} instance(s) per core",
        f"figures: {label(w.plan.backend.describe())}",
        table(header, rows),
    ]
    bad = [p for p, m in mismatches.items() if m]
    lines.append(
        f"top-1 disagreed with the engine for: {', '.join(bad)}"
        if bad
        else f"every peer gave the same top-1 as the engine on all {w.items} items, every run."
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=str(model_path("pool224")), help="default: demo pool224")
    p.add_argument("--backend", default="sim", choices=("sim", "onnx", "rknnlite", "auto"))
    p.add_argument("--cores", type=lambda s: tuple(int(c) for c in s.split(",")), default=None,
                   help="e.g. 0,1,2 (default: every core of the chip)")  # fmt: skip
    p.add_argument("-k", "--instances-per-core", dest="k", type=int, default=3)
    p.add_argument("--sim-npu-ms", type=float, default=None, help="emulator (default 2)")
    p.add_argument("--sim-host-ms", type=float, default=None, help="emulator (default 4)")
    p.add_argument("--items", type=int, default=3000)
    p.add_argument("--distinct", type=int, default=64, help="distinct input tensors")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peers", default=",".join(PEERS), help=f"subset of {','.join(PEERS)}")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    args.peers = tuple(x for x in args.peers.split(",") if x)
    if not set(args.peers) <= set(PEERS) or "engine" not in args.peers:
        p.error(f"--peers must include engine and name only {', '.join(PEERS)}")
    if min(args.items, args.distinct, args.repeats, args.k) < 1:
        p.error("--items, --distinct, --repeats and -k must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    w = Workload(args)
    try:
        result = sitting(w, args.repeats, args.peers)
    finally:
        w.close()
    text = report(w, result, args)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv, "report": text, **result}, indent=2))
    return 1 if any(result["mismatches"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
