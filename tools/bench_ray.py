"""Scale-out benchmark: the same emulated workload through the single-board engine and Ray.

Every figure is an EMULATOR figure (``--backend sim``) on this host, never a board figure.
The workload: synthetic inputs (written once, so only dispatch and inference are measured)
through the bundled digits model on cores 0,1,2 of each node, k instances per core, with
the emulator's NPU time ``--npu-ms`` and host time ``--host-ms`` per call. Measured:

  board    the single-board engine (batchinfer.engine.Engine), one emulated board
  ray-N    batchinfer.cluster.ClusterEngine on N simulated nodes (ray.cluster_utils on this
           machine), each its own emulated board with three cores

For N nodes the cluster is started once and the repeats run on it; with N=1 the board and
ray-1 runs alternate, so both see the same machine load. Reported per configuration, as
the median (min-max) of the repeats:

  items/s     items over the time from the first dispatch to the last row
  of ideal    items/s over the time model's ideal, N x cores x min(k/(host+npu), 1/npu)
  driver ms   CPU time of this process (the coordinator, or the Ray driver) per item,
              from the first row to the end of the run: the dispatch path's cost
  wall ms     per item and core, how much longer ray-1 takes than board:
              cores x (1/ray-1 items/s - 1/board items/s), from the medians
  scaling     ray-N items/s over N x ray-1 items/s

Caveat: the simulated nodes, their actors and the driver all share this machine's CPUs
(2 here), so scaling stops where the CPUs run out, not where a rack of boards would.
The machine's load average (``uptime``) is printed before and after.

    python tools/bench_ray.py                          # ~5 min on 2 CPUs
    python tools/bench_ray.py --nodes 1,2 --items 2000 --repeats 5 --json ray.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

from batchinfer.demo import model_path
from batchinfer.engine import Engine, RunConfig
from batchinfer.engine import events as ev
from batchinfer.engine.planning.plan import plan_inference
from batchinfer.engine.sources import SyntheticSource
from batchinfer.options import RuntimeOptions, SimOptions
from batchinfer.sink.rows import NullSink

CORES = (0, 1, 2)


@dataclass
class Measure:
    """An observer: items, and this process's CPU time from the first row to the last."""

    items: int = 0
    cpu0: float | None = None
    cpu1: float = 0.0
    first_items: int = 0

    def notify(self, event: object) -> None:
        if isinstance(event, ev.RowsDone):
            if self.cpu0 is None:
                self.cpu0, self.first_items = time.process_time(), len(event.rows)
            self.items += len(event.rows)
            self.cpu1 = time.process_time()

    @property
    def driver_ms(self) -> float:
        counted = self.items - self.first_items
        return (self.cpu1 - (self.cpu0 or 0.0)) / counted * 1e3 if counted > 0 else float("nan")


@dataclass
class Result:
    name: str
    nodes: int
    items_per_s: list[float] = field(default_factory=list)
    driver_ms: list[float] = field(default_factory=list)


def _plan(npu_ms: float, host_ms: float, k: int):
    model = model_path("digits")
    runtime = RuntimeOptions(
        backend="sim",
        cores=CORES,
        instances_per_core=k,
        sim=SimOptions(npu_ms=npu_ms, host_ms=host_ms),
    )
    config = RunConfig(dataset=model.parent, model=model, runtime=runtime)
    return plan_inference(config, several_inputs=False).engine


def _throughput(stats) -> float:
    total = stats.table().to_pylist()[-1]
    return float(total["items_per_s"] or 0.0)


def run_board(plan, items: int) -> tuple[float, float]:
    measure = Measure()
    result = Engine(plan, SyntheticSource(count=items), NullSink(), [measure]).run()
    if result.status != "complete" or measure.items != items:
        raise SystemExit(f"board run failed: {result.status} {result.error}")
    return _throughput(result.stats), measure.driver_ms


def run_ray(plan, items: int, nodes) -> tuple[float, float]:
    from batchinfer.cluster import ClusterEngine

    measure = Measure()
    engine = ClusterEngine(plan, SyntheticSource(count=items), NullSink(), nodes, [measure])
    result = engine.run()
    if result.status != "complete" or measure.items != items:
        raise SystemExit(f"ray run failed: {result.status} {result.error}")
    return _throughput(result.stats), measure.driver_ms


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _fmt(values: list[float], spec: str) -> str:
    med = statistics.median(values)
    return f"{med:{spec}} ({min(values):{spec}}-{max(values):{spec}})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="1,2,3", help="numbers of simulated nodes")
    parser.add_argument("--items", type=int, default=3000, help="items per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--npu-ms", type=float, default=10.0)
    parser.add_argument("--host-ms", type=float, default=0.0)
    parser.add_argument("-k", "--instances", type=int, default=1)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    import ray

    from batchinfer.cluster.connect import npu_nodes
    from batchinfer.cluster.local import start_local_cluster, stop_local_cluster

    plan = _plan(args.npu_ms, args.host_ms, args.instances)
    per_core = min(args.instances / (args.host_ms + args.npu_ms), 1 / args.npu_ms) * 1e3
    ideal_node = per_core * len(CORES)
    print(f"before: {uptime()}", flush=True)
    print(
        f"workload: digits model, synthetic inputs, cores {CORES} per node, k={args.instances}, "
        f"npu {args.npu_ms:g} ms, host {args.host_ms:g} ms, {args.items} items per run, "
        f"{args.repeats} repeats; ideal {ideal_node:.0f} items/s per node",
        flush=True,
    )
    results: list[Result] = [Result("board", 1)]
    for n in [int(x) for x in args.nodes.split(",")]:
        t0 = time.perf_counter()
        cluster = start_local_cluster(n, CORES)
        ray.init(address=cluster.address, log_to_driver=False)
        print(f"{n} node(s) up in {time.perf_counter() - t0:.1f} s", flush=True)
        try:
            nodes = npu_nodes(ray.nodes())
            result = Result(f"ray-{n}", n)
            results.append(result)
            for _ in range(args.repeats):
                if n == 1:
                    thr, cpu = run_board(plan, args.items)
                    results[0].items_per_s.append(thr)
                    results[0].driver_ms.append(cpu)
                thr, cpu = run_ray(plan, args.items, nodes)
                result.items_per_s.append(thr)
                result.driver_ms.append(cpu)
                print(f"  {result.name}: {thr:.1f} items/s, driver {cpu:.3f} ms/item", flush=True)
        finally:
            ray.shutdown()
            stop_local_cluster(cluster)
    print(f"after: {uptime()}")
    by_name = {r.name: r for r in results if r.items_per_s}
    one = by_name.get("ray-1")
    print()
    print("| configuration | items/s (min-max) | of ideal | driver ms/item | scaling |")
    print("|---|---|---|---|---|")
    for r in by_name.values():
        med = statistics.median(r.items_per_s)
        ideal = ideal_node * r.nodes
        scaling = "-"
        if one is not None and r.name.startswith("ray-"):
            scaling = f"{med / (r.nodes * statistics.median(one.items_per_s)):.2f}"
        print(
            f"| {r.name} | {_fmt(r.items_per_s, '.1f')} | {med / ideal:.3f} | "
            f"{_fmt(r.driver_ms, '.3f')} | {scaling} |"
        )
    board = by_name.get("board")
    if board is not None and one is not None:
        b, o = statistics.median(board.items_per_s), statistics.median(one.items_per_s)
        print(
            f"\nray-1 vs board: {o / b:.3f} of the single-board throughput; wall overhead "
            f"{len(CORES) * (1 / o - 1 / b) * 1e3:.3f} ms per item and core"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.__dict__ for r in results], f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
