"""Where a run's CPU goes per item: coordinator, readers, core workers, start-up, and the
emulator's own call, from whole ``batchinfer run`` commands; optionally two source trees
alternated in one sitting (a change measured against its parent).

Each run is the CLI as a user runs it, in a process of its own, over one of
``tools/bench_peers.py``'s workloads (its files: ``--workdir``, made if missing). Per run:

  command    every CPU second of the command and what it started (``wait4``'s rusage of
             the process tree), per item: what the user pays, start-up included;
  roles      the manifest's ``cpu_s``: coordinator, readers and core workers during the run
             (each child's own report), and start-up (every process until it was ready);
  call       one emulator call's CPU (``batchinfer.bench.limits``, measured in this process
             before each repeat), part of the core workers' share: the engine's own share
             of a worker is what is left.

Medians over ``--repeats`` (the versions interleaved within each repeat). Emulator figures.

    python tools/cpu_by_role.py --workload npy-2ms --items 3000 --repeats 5
    python tools/cpu_by_role.py --trees /tmp/before,. --workload npy-1ms   # A/B
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import bench_peers
import bytecode_cache

from batchinfer.demo import model_path

ROLES = ("coordinator", "readers", "workers", "startup")


def run_once(tree: Path, setting: bench_peers.Setting, out: Path) -> dict[str, float]:
    """One ``batchinfer run`` from ``tree``: CPU ms per item by role, and the command's."""
    w = setting.w
    argv = [sys.executable, "-m", "batchinfer", "run", str(setting.dataset)]
    argv += ["--model", str(setting.model), "--backend", "sim"]
    argv += ["--sim-npu-ms", str(w.npu_ms), "--sim-host-ms", str(w.host_ms)]
    argv += ["--cores", ",".join(map(str, setting.cores)), "-k", str(w.k)]
    argv += ["--out", str(out), "--overwrite", "--no-progress"]
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=tree, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"batchinfer run from {tree} failed ({proc.returncode})")
    manifest = json.loads((out / "manifest.json").read_text())
    items = sum(manifest["counts"][k] for k in ("succeeded", "errors"))
    cpu = manifest["cpu_s"]
    row = {role: 1e3 * cpu[role] / items for role in ROLES}
    row["command"] = 1e3 * (usage.ru_utime + usage.ru_stime) / items
    row["wall_s"] = wall
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", type=Path, default=Path("/tmp/batchinfer-peers"))
    p.add_argument("--workload", default="npy-2ms", choices=bench_peers.WORKLOADS)
    p.add_argument("--items", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--trees", default=".", help="source trees to alternate, comma-separated")
    args = p.parse_args(argv)
    bytecode_cache.ensure()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    for tree in trees:  # what bytecode_cache.ensure does, for each tree compared
        compileall.compile_dir(tree / "batchinfer", quiet=1)
    w = bench_peers.WORKLOADS[args.workload]
    dataset = bench_peers.dataset_for(w, args.workdir, args.items)
    setting = bench_peers.Setting(w, dataset, Path(model_path("pool224")), args.workdir)
    runs: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    calls = []
    for r in range(args.repeats):
        calls.append(setting.limits().call_cpu_ms or float("nan"))
        for i, tree in enumerate(trees):
            row = run_once(tree, setting, args.workdir / "out" / f"cpu-by-role-{i}")
            runs[tree].append(row)
            text = ", ".join(f"{k} {v:.3f}" for k, v in row.items())
            print(f"#{r + 1} {tree}: {text}", flush=True)
    call = statistics.median(calls)
    print(
        f"\n{args.workload}, {args.items} items, {args.repeats} repeats, medians, CPU ms per "
        f"item (emulator figures); one emulator call: {call:.3f} ms CPU"
    )
    print("| tree | command | coordinator | readers | workers (call) | startup | wall s |")
    print("|---|---|---|---|---|---|---|")
    for tree, rows in runs.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(
            f"| {tree} | {med['command']:.3f} | {med['coordinator']:.3f} | {med['readers']:.3f} "
            f"| {med['workers']:.3f} ({call:.3f}) | {med['startup']:.3f} | {med['wall_s']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
