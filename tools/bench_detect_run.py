"""NPU-bound throughput of a detection run against the emulator's ideal (issue target).

Target: a detection run keeps >= 95 % of the emulated ideal when NPU-bound: npu 15 ms,
host 0 ms, cores 0,1,2, one instance per core: ideal = 3 / 15 ms = 200 items/s. Every
figure is an EMULATOR figure (``--backend sim``), never a board figure.

Each measured run is ``python -m batchinfer run`` of the demo detector
(``digits-det.onnx``, YOLOv8 model-zoo head, 256x256 input) with ``--task detect`` over the
demo's detection images (PNG scenes of 160-320 px, letterboxed by the readers; boxes
decoded in the core workers, as any detection run): ``--items`` items, the 500 images and
symlinks to them. Its items/s is the core_stats total (first dispatch to last completion:
start-up excluded), and the figure is the median over ``--repeats`` runs, with the
machine's load average and the other processes' CPU use beside each run (tools/bench_run.py
does the running and the accounting).

    python tools/bench_detect_run.py                         # 3 repeats of 3,000 items
    python tools/bench_detect_run.py --repeats 5 --quiet-wait 60 --json detect.json

Exit status: 0 the target met, 1 missed, 2 a run could not be measured, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import bench_run as B

from batchinfer.demo import write_demo

TARGET = B.IDEAL_TARGET  # 0.95 of the ideal


@dataclass(frozen=True)
class DetectSpec(B.RunSpec):
    """A ``batchinfer run --task detect`` of the float demo detector under the emulator."""

    def argv(self, dataset: Path, model: Path, out: Path) -> list[str]:
        return [
            *super().argv(dataset, model, out),
            "--task", "detect",
            # The float graph takes pixels / 255 (a .rknn has this built in).
            "--mean", "0,0,0", "--std", "255,255,255",
        ]  # fmt: skip


def prepare(workdir: Path, items: int) -> tuple[Path, Path]:
    """The demo kit in ``workdir`` and a dataset of ``items`` images (symlinks past 500)."""
    kit = write_demo(workdir / "demo")
    images = sorted((workdir / "demo" / "detection" / "images").glob("*.png"))
    data = workdir / "data"
    data.mkdir()
    for i in range(items):
        source = images[i % len(images)]
        (data / f"{i:06d}{source.suffix}").symlink_to(source)
    return data, kit.root / "models" / "digits-det.onnx"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=3000, help="items per run (default 3000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs to take the median of")
    parser.add_argument("--npu-ms", type=float, default=15.0)
    parser.add_argument("--host-ms", type=float, default=0.0)
    parser.add_argument("-k", "--instances-per-core", type=int, default=1)
    parser.add_argument(
        "--quiet-wait", type=float, default=0.0, metavar="S",
        help="before each run, wait up to S seconds for 3 idle seconds",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    spec = DetectSpec(
        f"detect-npu{args.npu_ms:g}-k{args.instances_per_core}",
        args.items,
        instances=args.instances_per_core,
        host_ms=args.host_ms,
        npu_ms=args.npu_ms,
    )
    with tempfile.TemporaryDirectory(prefix="bench-detect-") as tmp:
        work = Path(tmp)
        dataset, model = prepare(work, args.items)
        runs = work / "runs"
        runs.mkdir()
        bench = B.Bench(dataset, model, runs, args.repeats, args.quiet_wait)
        print(
            f"{spec.name}: {args.items} items x {args.repeats}, ideal "
            f"{spec.ideal_items_per_s:.0f} items/s (emulator); load average "
            f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}",
            flush=True,
        )
        try:
            (series,) = B.measure(bench, [spec])
        except B.BenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130
        where = B.breakdown(series.median_run, spec)
        manifest = json.loads((Path(series.median_run.out) / "manifest.json").read_text())
        cpu = manifest.get("cpu_ms_per_item") or {}
        loads = os.getloadavg()
    ratio = series.ratio
    print(
        f"median {series.median:.1f} items/s of the ideal {spec.ideal_items_per_s:.0f} "
        f"(emulator): {ratio:.3f} (target >= {TARGET:.2f}: "
        f"{'met' if ratio >= TARGET else 'MISSED'})"
        f"; runs {', '.join(f'{r.items_per_s:.1f}' for r in series.runs)}; other CPUs "
        f"{statistics.median(r.other_cpus for r in series.runs):.2f} (median); load average "
        f"after {' '.join(f'{v:.2f}' for v in loads)}"
    )
    print(
        f"median run: read {where.read_ms[0]:.2f} ms, wait {where.wait_ms[0]:.2f} ms, "
        f"inference {where.latency_ms[0]:.2f} ms per item (mean); coordinator "
        f"{where.collect_ms:.3f} ms per item; utilisation "
        + ", ".join(f"core {c} {u:.1%}" for c, u in sorted(where.utilization.items()))
    )
    if cpu.get("total"):
        # What this machine must give the run to reach the ideal: the emulator computes the
        # model's outputs on the CPU (ONNX Runtime, inside the core workers), which a board's
        # NPU does instead, so "workers" here is mostly emulation.
        print(
            "CPU per item (median run): "
            + ", ".join(f"{role} {ms:.2f} ms" for role, ms in cpu.items())
            + f"; at the ideal rate that is {cpu['total'] * spec.ideal_items_per_s / 1000:.2f} "
            f"CPUs of this machine's {os.cpu_count()}"
        )
    if args.json:
        record = {
            **series.summary(),
            "load_average_after": loads,
            "target": TARGET,
            "cpu_ms_per_item": cpu,
        }
        args.json.write_text(json.dumps(record, indent=1))
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
