"""The engine against what users write instead, on files, over five workloads, in one sitting.

For each workload every peer reads the same files with the engine's own preprocessing
(``load_into``), runs the same model on the same emulated cores, and must give the same
top-1 for every item:

  engine     ``batchinfer.run``: readers decode into shared memory, one worker process per
             core with k instances, rows into Parquet (the whole job, as the CLI runs it);
  threads    a thread pool of cores x k runtime instances pinned round-robin to the cores
             (the popular community RKNN pattern); each task decodes its file and infers;
  pool       ``multiprocessing.Pool(cores x k)`` given file paths (``imap``, chunks of 8),
             one runtime per process, pinned round-robin; each task decodes and infers.

Two figures per run: **items/s** from the moment every runtime is loaded (the engine's
CoresReady; its cores start on items as each comes up, and those rows are not counted) to
the last result, in this process; and **end to end**: the wall time of the whole job as a
command of its own, from launch to exit (``batchinfer run ...`` for the engine; this
script with ``--one PEER`` for the others, which loads the model, works out the
preprocessing and runs the peer): interpreter, imports, planning, process start-up, model
loading and writing included, what a user waits for. (The peers' commands plan with
batchinfer's own functions, which import pyarrow: about 0.1 s a minimal script of theirs
would not pay; the engine's command writes Parquet, which theirs do not.) **CPU ms per
item** counts this process and every child it reaped (``getrusage``), start-up included,
so the three are comparable (the engine's children, forked by its fork server, also run
this script again as their ``__main__``: a cost of this harness, not of ``batchinfer run``).
**As commands** is the same for each job run as a command of its own (its whole process
tree: interpreter, imports, planning, start-up), what a user pays. Peers run
interleaved, ``--repeats`` times; medians and min-max are printed, with the ratio of each
peer to the engine.

Before each repeat the **limits** are measured in this process (``batchinfer.bench.limits``,
CPU time): the emulated NPU limit (cores / npu ms) and the decode limit (CPUs / (one
process's CPU ms to read one of the workload's files into the model input + one emulator
call's CPU ms)); every peer's items/s is also printed as a fraction of the tighter one.
Workloads (the five of the performance issue):

  npy-2ms        224x224x3 uint8 .npy, npu 2 ms, host 0, k=1     (ideal 1500 items/s)
  npy-2ms-host2  the same with host 2 ms, k=2                    (ideal 1500)
  jpeg-640       640x480 JPEGs resized to 224, npu 2 ms, k=1     (decode-bound on 2 CPUs)
  npy-1ms        npu 1 ms, k=1                                   (ideal 3000)
  npy-0.5ms      npu 0.5 ms, k=1                                 (ideal 6000)
  jpeg-64-4ms    64x64 JPEGs, npu 4 ms, k=1: not run by default    (ideal 750; one reader
                 keeps up: tools/cpu_by_role.py checks that none is added)

    python tools/bench_peers.py --workdir /tmp/peers            # all five, 3 repeats
    python tools/bench_peers.py --workloads npy-0.5ms --repeats 5

The inputs are written once into ``--workdir`` (about 450 MB of .npy and 60 MB of JPEGs
for 3,000 items). Figures are emulator figures: they compare ways of driving NPU cores on
this machine, not boards.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import bytecode_cache
import numpy as np

from batchinfer.bench.cpu import usable_cpus
from batchinfer.bench.limits import Limits
from batchinfer.bench.limits import measure as measure_limits
from batchinfer.data.folder import open_dataset
from batchinfer.data.preprocess import Preprocess, load_into
from batchinfer.demo import make_npy_dataset, model_path
from batchinfer.engine import events as ev
from batchinfer.engine.planning.config import RunConfig
from batchinfer.options import OutputOptions, RuntimeOptions, SimOptions
from batchinfer.runtime.adapter import RuntimeAdapter
from batchinfer.runtime.backends import Backend

PEERS = ("engine", "threads", "pool")


@dataclass(frozen=True)
class Workload:
    name: str
    data: str  # "npy" or "jpeg"
    npu_ms: float
    host_ms: float
    k: int
    ideal: float | None


WORKLOADS = {
    w.name: w
    for w in (
        Workload("npy-2ms", "npy", 2.0, 0.0, 1, 1500),
        Workload("npy-2ms-host2", "npy", 2.0, 2.0, 2, 1500),
        Workload("jpeg-640", "jpeg", 2.0, 0.0, 1, None),
        Workload("npy-1ms", "npy", 1.0, 0.0, 1, 3000),
        Workload("npy-0.5ms", "npy", 0.5, 0.0, 1, 6000),
        # Not in the default five: images one reader decodes faster than the NPU takes them
        # (reader scaling must add none; tools/cpu_by_role.py --workload jpeg-64-4ms).
        Workload("jpeg-64-4ms", "jpeg64", 4.0, 0.0, 1, 750),
    )
}
FIVE = [name for name in WORKLOADS if name != "jpeg-64-4ms"]  # the default run


# --------------------------------------------------------------------------- inputs
def make_jpegs(folder: Path, n: int, seed: int = 0, size: tuple[int, int] = (640, 480)) -> None:
    """``n`` photo-like JPEGs of ``size`` (width, height; smooth gradients and a little
    noise), quality 90."""
    from PIL import Image

    if folder.is_dir() and len(list(folder.glob("*.jpg"))) == n:
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0 : size[1], 0 : size[0]].astype(np.float32)
    for i in range(n):
        a, b, c = rng.random(3) * 6.28
        img = np.stack(
            [127 + 100 * np.sin(xx / (40 + 30 * a) + yy / (50 + 20 * b) + c + k) for k in range(3)],
            axis=-1,
        )
        img += rng.normal(0, 6, img.shape)
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(
            folder / f"{i:05d}.jpg", quality=90
        )


def dataset_for(workload: Workload, workdir: Path, items: int) -> Path:
    if workload.data == "npy":
        folder = workdir / f"npy224-{items}"
        if not (folder.is_dir() and len(list(folder.glob("*.npy"))) == items):
            make_npy_dataset(folder, items, shape=(1, 224, 224, 3), overwrite=True)
        return folder
    if workload.data == "jpeg64":
        folder = workdir / f"jpeg64-{items}"
        make_jpegs(folder, items, size=(64, 64))
        return folder
    folder = workdir / f"jpeg640-{items}"
    make_jpegs(folder, items)
    return folder


# --------------------------------------------------------------------------- the peers
def _cpu_now() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass
class Outcome:
    items_per_s: float
    end_to_end_s: float
    cpu_ms_per_item: float
    preds: list[int]
    roles: dict[str, float] | None = None  # the engine's CPU ms per item by role (manifest)
    command_cpu_ms_per_item: float = 0.0  # the whole job as a command: its process tree's CPU


class EngineSpan:
    """The engine's items/s counted as the peers count theirs: from the moment every core is
    up (CoresReady; items already flow while core workers start) to the last row, over the
    rows done in that span."""

    def __init__(self) -> None:
        self.t0 = self.t1 = 0.0
        self.rows = 0

    def notify(self, event: object) -> None:
        if isinstance(event, ev.CoresReady):
            self.t0 = event.t
        elif isinstance(event, ev.RowsDone) and self.t0:
            self.t1 = event.t
            self.rows += len(event.rows)

    @property
    def items_per_s(self) -> float:
        return self.rows / (self.t1 - self.t0) if self.t1 > self.t0 else float("nan")


class Setting:
    """One workload's plan: backend, cores, k, preprocessing, the files in dataset order."""

    def __init__(self, w: Workload, dataset: Path, model: Path, workdir: Path) -> None:
        self.w = w
        self.dataset = dataset
        self.model = model
        self.workdir = workdir
        self.runtime = RuntimeOptions(
            backend="sim",
            cores=(0, 1, 2),
            instances_per_core=w.k,
            sim=SimOptions(npu_ms=w.npu_ms, host_ms=w.host_ms),
        )
        # Imported here, not at the top: a script whose children import it again as their
        # __main__ would count plan's imports (pyarrow, 42 ms of CPU) per child as the engine's
        # start-up in this harness, which `batchinfer run` never pays.
        from batchinfer.engine.planning.plan import plan_inference

        config = RunConfig(dataset=dataset, model=model, runtime=self.runtime)
        data = open_dataset(dataset)
        self.kind = data.kind
        self.paths = [item.path for item in data]
        self.plan = plan_inference(config, data, several_inputs=False).engine
        self.pre: Preprocess = self.plan.preprocess
        self.cores = self.plan.cores

    def limits(self) -> Limits:
        """The NPU and decode limits, measured now in this process (batchinfer.bench.limits):
        cores / npu ms, and CPUs / (one file's decode + resize + one emulator call), CPU time."""
        return measure_limits(
            usable_cpus(),
            len(self.cores),
            self.w.npu_ms,
            self.pre,
            self.paths,
            self.kind,
            self.plan.backend,
            self.cores[0],
        )

    def run_engine(self, repeat: int) -> Outcome:
        # Imported here: the peers' commands (--one) need neither the engine nor pyarrow.
        from batchinfer.engine.runner import run
        from batchinfer.results import read_predictions

        out = self.workdir / "out" / f"{self.w.name}-{repeat}"
        cfg = RunConfig(
            dataset=self.dataset,
            model=self.model,
            runtime=self.runtime,
            output=OutputOptions(out=out, overwrite=True),
        )
        span = EngineSpan()
        c0, t0 = _cpu_now(), time.monotonic()
        result = run(cfg, observers=[span])
        wall, cpu = time.monotonic() - t0, _cpu_now() - c0
        if result.errors:
            raise SystemExit(f"engine: {result.errors} error rows")
        preds = read_predictions(out, columns=["pred"])["pred"].to_pylist()
        n = len(preds)
        manifest = json.loads((out / "manifest.json").read_text())
        roles = {role: 1e3 * s / n for role, s in manifest["cpu_s"].items()}
        return Outcome(span.items_per_s, wall, 1e3 * cpu / n, preds, roles)

    def _top1(self, adapter: RuntimeAdapter, path: str) -> int:
        x = np.empty(self.pre.shape, self.pre.dtype)
        load_into(path, self.pre, x, self.kind)
        out = adapter.infer([x], reuse_outputs=True, data_format=self.pre.layout)
        return int(np.argmax(out[0].reshape(-1)))

    def run_threads(self, repeat: int) -> Outcome:
        c0, t0 = _cpu_now(), time.monotonic()
        backend = self.plan.backend.for_run()
        n = len(self.cores) * self.w.k
        adapters = [backend.instance(self.cores[i % len(self.cores)]) for i in range(n)]
        try:
            with ThreadPoolExecutor(max_workers=n) as pool:
                pending: deque = deque()
                preds = []
                t1 = time.monotonic()
                for i, path in enumerate(self.paths):
                    pending.append(pool.submit(self._top1, adapters[i % n], path))
                    if len(pending) >= n:
                        preds.append(pending.popleft().result())
                preds += [f.result() for f in pending]
                t2 = time.monotonic()
        finally:
            for a in adapters:
                a.release()
            backend.end_run()
        wall, cpu = time.monotonic() - t0, _cpu_now() - c0
        return Outcome(len(preds) / (t2 - t1), wall, 1e3 * cpu / len(preds), preds)

    def run_pool(self, repeat: int) -> Outcome:
        c0, t0 = _cpu_now(), time.monotonic()
        backend = self.plan.backend.for_run()
        n = len(self.cores) * self.w.k
        ctx = mp.get_context("spawn")
        counter, ready = ctx.Value("i", 0), ctx.Value("i", 0)
        args = (backend, self.cores, counter, ready, self.pre, self.kind)
        try:
            with ctx.Pool(n, _pool_init, args) as pool:
                while ready.value < n:
                    time.sleep(0.01)  # a tool polling a shared counter, not a test waiting
                t1 = time.monotonic()
                preds = list(pool.imap(_pool_top1, self.paths, chunksize=8))
                t2 = time.monotonic()
                pool.close()
                pool.join()
        finally:
            backend.end_run()
        wall, cpu = time.monotonic() - t0, _cpu_now() - c0
        return Outcome(len(preds) / (t2 - t1), wall, 1e3 * cpu / len(preds), preds)


_WORKER: dict = {}


def _pool_init(backend: Backend, cores, counter, ready, pre: Preprocess, kind: str) -> None:
    with counter.get_lock():
        index = counter.value
        counter.value += 1
    _WORKER.update(adapter=backend.instance(cores[index % len(cores)]), pre=pre, kind=kind)
    with ready.get_lock():
        ready.value += 1


def _pool_top1(path: str) -> int:
    pre: Preprocess = _WORKER["pre"]
    x = np.empty(pre.shape, pre.dtype)
    load_into(path, pre, x, _WORKER["kind"])
    out = _WORKER["adapter"].infer([x], reuse_outputs=True, data_format=pre.layout)
    return int(np.argmax(out[0].reshape(-1)))


# --------------------------------------------------------------------------- the sitting
def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} ({min(values):.1f}-{max(values):.1f})"


def sitting(args: argparse.Namespace) -> dict:
    results: dict = {}
    for name in args.workloads:
        w = WORKLOADS[name]
        dataset = dataset_for(w, args.workdir, args.items)
        setting = Setting(w, dataset, Path(args.model), args.workdir)
        runs: dict[str, list[Outcome]] = {p: [] for p in PEERS}
        reference: list[int] | None = None
        mismatches = dict.fromkeys(PEERS, 0)
        print(f"\n{name}: {args.items} items in {dataset}", flush=True)
        limits: list[Limits] = []
        for r in range(args.repeats):
            limits.append(setting.limits())
            print(f"  limits   #{r + 1}: {_limits_text(limits[-1])}", flush=True)
            for peer in PEERS:
                outcome = getattr(setting, f"run_{peer}")(r)
                outcome.end_to_end_s, command_cpu_s = command_wall(peer, setting, args, r)
                outcome.command_cpu_ms_per_item = 1e3 * command_cpu_s / args.items
                runs[peer].append(outcome)
                reference = reference or outcome.preds
                mismatches[peer] += sum(
                    a != b for a, b in zip(outcome.preds, reference, strict=True)
                )
                print(
                    f"  {peer:8} #{r + 1}: {outcome.items_per_s:8.1f} items/s, end to end "
                    f"{outcome.end_to_end_s:6.2f} s, {outcome.cpu_ms_per_item:.3f} CPU ms/item, "
                    f"as a command {outcome.command_cpu_ms_per_item:.3f}",
                    flush=True,
                )
        results[name] = {
            p: {
                "items_per_s": [o.items_per_s for o in runs[p]],
                "end_to_end_s": [o.end_to_end_s for o in runs[p]],
                "command_cpu_ms_per_item": [o.command_cpu_ms_per_item for o in runs[p]],
                "cpu_ms_per_item": [o.cpu_ms_per_item for o in runs[p]],
                "mismatches": mismatches[p],
            }
            for p in PEERS
        }
        results[name]["engine"]["roles"] = [o.roles for o in runs["engine"]]
        results[name]["limits"] = [lim.to_json() for lim in limits]
    return results


def command_wall(
    peer: str, setting: Setting, args: argparse.Namespace, repeat: int
) -> tuple[float, float]:
    """Seconds from launching ``peer``'s whole job as a command of its own to its exit, and
    the CPU seconds of that command and every process it started (``wait4``'s rusage)."""
    w = setting.w
    if peer == "engine":
        out = setting.workdir / "out" / f"{w.name}-cmd-{repeat}"
        argv = ["-m", "batchinfer", "run", str(setting.dataset), "--model", str(setting.model)]
        argv += ["--backend", "sim", "--sim-npu-ms", str(w.npu_ms), "--sim-host-ms", str(w.host_ms)]
        argv += ["--cores", ",".join(map(str, setting.cores)), "-k", str(w.k)]
        argv += ["--out", str(out), "--overwrite", "--no-progress"]
    else:
        argv = [__file__, "--one", peer, "--workloads", w.name, "--workdir", str(args.workdir)]
        argv += ["--items", str(args.items), "--model", str(setting.model)]
    c0, t0 = _children_cpu(), time.monotonic()
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True)
    wall, cpu = time.monotonic() - t0, _children_cpu() - c0
    if done.returncode != 0:
        raise SystemExit(f"{peer} as a command failed ({done.returncode}):\n{done.stderr}")
    return wall, cpu


def _children_cpu() -> float:
    """CPU seconds of this process's reaped children (and theirs, reaped by them)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def one(args: argparse.Namespace) -> int:
    """``--one PEER``: run PEER once over the first workload, as a command of its own."""
    w = WORKLOADS[args.workloads[0]]
    dataset = dataset_for(w, args.workdir, args.items)
    setting = Setting(w, dataset, Path(args.model), args.workdir)
    getattr(setting, f"run_{args.one}")(0)
    return 0


def report(results: dict, args: argparse.Namespace) -> str:
    lines = [
        f"{args.items} items per run, {args.repeats} interleaved repeats; medians (min-max); "
        "emulated NPU (batchinfer sim), cores 0,1,2, on this machine",
        "| workload | engine items/s | threads / engine | pool / engine | engine end to end s "
        "| threads e2e / engine | pool e2e / engine | CPU ms/item engine, threads, pool "
        "| as commands |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        med = {p: statistics.median(r[p]["items_per_s"]) for p in PEERS}
        e2e = {p: statistics.median(r[p]["end_to_end_s"]) for p in PEERS}
        cpu = {p: statistics.median(r[p]["cpu_ms_per_item"]) for p in PEERS}
        cmd = {p: statistics.median(r[p]["command_cpu_ms_per_item"]) for p in PEERS}
        ideal = WORKLOADS[name].ideal
        of_ideal = f" ({med['engine'] / ideal:.2f} of ideal)" if ideal else ""
        lines.append(
            f"| {name} | {_summary(r['engine']['items_per_s']).strip()}{of_ideal} "
            f"| {med['threads'] / med['engine']:.2f} | {med['pool'] / med['engine']:.2f} "
            f"| {e2e['engine']:.2f} | {e2e['engine'] / e2e['threads']:.2f} "
            f"| {e2e['engine'] / e2e['pool']:.2f} "
            f"| {cpu['engine']:.2f}, {cpu['threads']:.2f}, {cpu['pool']:.2f} "
            f"| {cmd['engine']:.2f}, {cmd['threads']:.2f}, {cmd['pool']:.2f} |"
        )
    lines += ["", *limits_table(results), "", *roles_table(results)]
    bad = [f"{n}/{p}" for n, r in results.items() for p in PEERS if r[p]["mismatches"]]
    lines.append(
        "top-1 differed from the engine's for: " + ", ".join(bad)
        if bad
        else "every peer gave the engine's top-1 for every item, every run."
    )
    lines.append(
        "(\"e2e / engine\" is the peer's end-to-end speed relative to the engine's, each "
        "job run as a command of its own: above 1, the peer finished the whole job sooner.)"
    )
    return "\n".join(lines)


def _limits_text(lim: Limits) -> str:
    call = f" + {lim.call_cpu_ms:.3f} ms emulator call" if lim.call_cpu_ms is not None else ""
    return (
        f"NPU {lim.npu_per_s:.0f}/s (cores / npu ms), decode {lim.decode_per_s:.0f}/s "
        f"({lim.cpus} CPUs / ({lim.decode_cpu_ms:.3f} ms CPU to read an item{call}))"
    )


def limits_table(results: dict) -> list[str]:
    """Each peer's items/s as a fraction of the tighter of the two limits, with both limits
    (medians of the measurements taken before each repeat, same sitting)."""
    lines = [
        "Limits (measured before each repeat, medians): NPU = cores / npu ms; decode = CPUs / "
        "(one process's CPU ms to read an item + one emulator call's CPU ms)",
        "| workload | NPU limit /s | decode limit /s (read + call CPU ms) | bound "
        "| engine of limit | threads of limit | pool of limit |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lim = r["limits"]
        npu = statistics.median(x["npu_per_s"] for x in lim)
        dec = statistics.median(x["decode_per_s"] for x in lim)
        read = statistics.median(x["decode_cpu_ms"] for x in lim)
        call = statistics.median(x["call_cpu_ms"] for x in lim)
        bound, limit = ("NPU", npu) if npu <= dec else ("decode", dec)
        of = {p: statistics.median(r[p]["items_per_s"]) / limit for p in PEERS}
        lines.append(
            f"| {name} | {npu:.0f} | {dec:.0f} ({read:.3f} + {call:.3f}) | {bound} "
            f"| {of['engine']:.2f} | {of['threads']:.2f} | {of['pool']:.2f} |"
        )
    return lines


def roles_table(results: dict) -> list[str]:
    """The engine's CPU ms per item by role (its manifest's cpu_s over the items; start-up is
    every process until it was ready), beside the emulator's own call and the thread pool's
    whole CPU per item: what the engine pays beyond the runtime call."""
    lines = [
        "Engine CPU ms per item by role (manifest cpu_s, medians); the emulator's call is "
        "part of the workers' share; the rest of the whole is this process's own",
        "| workload | whole | coordinator | readers | workers | of which emulator call "
        "| start-up | threads' whole |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        roles = r["engine"].get("roles") or []
        if not roles:
            continue
        med = {k: statistics.median(x[k] for x in roles) for k in roles[0]}
        call = statistics.median(x["call_cpu_ms"] for x in r["limits"])
        whole = statistics.median(r["engine"]["cpu_ms_per_item"])
        threads = statistics.median(r["threads"]["cpu_ms_per_item"])
        lines.append(
            f"| {name} | {whole:.3f} | {med['coordinator']:.3f} | {med['readers']:.3f} "
            f"| {med['workers']:.3f} | {call:.3f} | {med['startup']:.3f} | {threads:.3f} |"
        )
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", type=Path, default=Path("/tmp/batchinfer-peers"))
    p.add_argument("--workloads", default=",".join(FIVE), help=",".join(WORKLOADS))
    p.add_argument("--items", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default=str(model_path("pool224")))
    p.add_argument("--json", type=Path)
    p.add_argument("--one", choices=PEERS[1:], help=argparse.SUPPRESS)  # see command_wall
    args = p.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown:
        p.error(f"unknown workloads {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bytecode_cache.ensure()  # what an installed batchinfer costs (tools/bytecode_cache.py)
    # Runtimes made in this process (the peers') print their start-up lines otherwise.
    os.environ.setdefault("BATCHINFER_RKNN_LOG_LEVEL", "ERROR")
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.one:
        return one(args)
    results = sitting(args)
    text = report(results, args)
    print("\n" + text)
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv, "results": results}, indent=2))
    return 1 if "differed" in text else 0


if __name__ == "__main__":
    sys.exit(main())
