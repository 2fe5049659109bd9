"""Start-up of ``batchinfer run``: how soon the run starts, and its fixed CPU cost.

Each run is its own ``python -m batchinfer run DATASET --model MODEL --backend sim
--cores 0,1,2 --no-progress`` subprocess (``python`` is the interpreter running this tool,
so the same tool measures any checkout: run it with that checkout's venv). Per run:

  started_s   seconds from starting the command to its ``started:`` line (the dataset is
              open and items start to flow; core workers may still be starting)
  first_row_s seconds from the command's start to its first row (the manifest's
              ``timings.first_row_s``, good to about 10 ms)
  total_s     seconds until the command exited
  startup_cpu the manifest's ``cpu_s.startup``: the coordinator until the run started, the
              fork server, and each child until it was ready (CPU seconds)

Medians and min-max over ``--repeats``. The default dataset is the digits demo kit
(written into ``--workdir`` once). Emulator figures on this machine, not a board's.

``--held-out`` measures a refusal instead: this tool holds the output folder's lock, and
each run (which must exit 2, "in use by another batchinfer run") is timed until it exits
(``refused_s``), with the CPU seconds it and its children used (``cpu_s``, which a loaded
machine disturbs less).

    python tools/bench_startup.py --repeats 5
    python tools/bench_startup.py --repeats 10 --held-out
    /path/to/other/checkout/.venv/bin/python tools/bench_startup.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import bytecode_cache


def one_run(dataset: Path, model: Path, out: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "batchinfer", "run", str(dataset), "--model", str(model)]
    cmd += ["--backend", "sim", "--cores", "0,1,2", "--out", str(out), "--overwrite"]
    cmd += ["--no-progress", *extra]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    started, lines = None, []
    for line in proc.stderr:
        lines.append(line)
        if started is None and line.startswith("started:"):
            started = time.monotonic() - t0
    if proc.wait() != 0 or started is None:
        raise SystemExit(f"run failed (exit {proc.returncode}):\n{''.join(lines)}")
    total = time.monotonic() - t0
    manifest = json.loads((out / "manifest.json").read_text())
    return {
        "started_s": started,
        "first_row_s": manifest["timings"]["first_row_s"],
        "total_s": total,
        "startup_cpu": manifest["cpu_s"]["startup"],
    }


def one_refusal(dataset: Path, model: Path, out: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "batchinfer", "run", str(dataset), "--model", str(model)]
    cmd += ["--backend", "sim", "--out", str(out), "--no-progress", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    total = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 2 or "in use by" not in proc.stderr:
        raise SystemExit(f"not refused (exit {proc.returncode}):\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"refused_s": total, "cpu_s": cpu}


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", type=Path, default=Path("/tmp/batchinfer-startup"))
    p.add_argument("--dataset", type=Path, help="default: the digits demo kit's dataset")
    p.add_argument("--model", type=Path, help="default: the demo kit's digits.onnx")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--held-out", action="store_true", help="time the refusal of a held output folder"
    )
    p.add_argument("extra", nargs="*", help="more `batchinfer run` options (after --)")
    args = p.parse_args(argv)
    bytecode_cache.ensure()  # what an installed batchinfer costs (tools/bytecode_cache.py)
    kit = args.workdir / "kit"
    if (args.dataset is None or args.model is None) and not (kit / "dataset").is_dir():
        from batchinfer.demo import write_demo

        write_demo(kit, overwrite=True)
    dataset = args.dataset or kit / "dataset"
    model = args.model or kit / "models" / "digits.onnx"
    if args.held_out:
        return _held_out(dataset, model, args)
    runs = []
    for r in range(args.repeats):
        runs.append(one_run(dataset, model, args.workdir / "out", args.extra))
        print(
            f"#{r + 1}: started {runs[-1]['started_s']:.3f} s, first row "
            f"{runs[-1]['first_row_s']:.3f} s, total {runs[-1]['total_s']:.3f} s, "
            f"start-up CPU {runs[-1]['startup_cpu']:.3f} s",
            flush=True,
        )
    print(f"{args.repeats} runs of `batchinfer run` on {dataset}; medians (min-max):")
    for key in ("started_s", "first_row_s", "total_s", "startup_cpu"):
        print(f"  {key:12} {_summary([run[key] for run in runs])}")
    return 0


def _held_out(dataset: Path, model: Path, args: argparse.Namespace) -> int:
    from batchinfer.sink.outdir import OutLock

    out = args.workdir / "held"
    with OutLock(out, command="tools/bench_startup.py --held-out"):
        runs = [one_refusal(dataset, model, out, args.extra) for _ in range(args.repeats)]
    print(f"{args.repeats} refusals of `batchinfer run` on a held --out; medians (min-max):")
    for key in ("refused_s", "cpu_s"):
        print(f"  {key:12} {_summary([run[key] for run in runs])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
