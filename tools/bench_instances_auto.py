"""``-k auto`` against k = 1, 2, 3 on the emulator: does auto pick within a few % of the best?

For each emulated workload (``--sim-npu-ms`` / ``--sim-host-ms`` pairs), every setting
(k=1, k=2, k=3, auto) is one ``python -m batchinfer bench`` subprocess on synthetic inputs
(the inference path alone: what the instances decide), on cores 0,1,2, run interleaved
``--repeats`` times. Per setting: the median samples/s (min-max), and for auto the k it
chose (the bench JSON's ``config.instances_auto``). The last column is auto's median over
the best fixed setting's median; ``chosen/best`` is the median of the fixed setting auto chose
(most often) over the best: the quality of the choice, apart from the noise of auto's own
runs. Emulator figures on this machine, not a board's.

    python tools/bench_instances_auto.py --repeats 3
    python tools/bench_instances_auto.py --workloads 2:4,2:1 --duration 3 --repeats 5

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

#: npu_ms:host_ms pairs: the emulator's default (host-bound: 3 instances), host 1 ms
#: (2), balanced, NPU-bound, and no host time at all (1: today's default).
WORKLOADS = ("2:4", "2:1", "1:1", "4:0.5", "1:0", "0.5:0")
SETTINGS = ("1", "2", "3", "auto")


def one_bench(model: Path, npu: str, host: str, k: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-m", "batchinfer", "bench", "--model", str(model)]
        cmd += ["--backend", "sim", "--cores", "0,1,2", "-k", k]
        cmd += ["--sim-npu-ms", npu, "--sim-host-ms", host]
        cmd += ["--duration", str(args.duration), "--warmup", str(args.warmup)]
        cmd += ["--min-samples", "100", "--json", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode not in (0, 1):  # 1: INVALID (a loaded machine); still measured
            raise SystemExit(f"bench failed (exit {proc.returncode}):\n{proc.stderr}")
        data = json.loads(out.read_text())
    auto = (data.get("config") or {}).get("instances_auto")
    return {"samples_per_s": data["samples_per_s"], "chose": auto and auto["instances_per_core"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, help="default: the demo kit's digits.onnx")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/batchinfer-kauto"))
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="npu:host pairs in ms")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--warmup", type=float, default=1.0)
    args = p.parse_args()
    model = args.model
    if model is None:
        kit = args.workdir / "kit"
        if not (kit / "models" / "digits.onnx").is_file():
            subprocess.run(
                [sys.executable, "-m", "batchinfer", "demo", str(kit)],
                check=True,
                capture_output=True,
            )
        model = kit / "models" / "digits.onnx"
    print("emulator figures (batchinfer sim on this machine), synthetic inputs, cores 0,1,2")
    header = "".join(f"{'k=' + s:>22}" for s in SETTINGS)
    print(f"{'npu:host ms':<12}{header}  auto/best  chosen/best")
    for workload in args.workloads.split(","):
        npu, host = workload.split(":")
        runs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
        for _ in range(args.repeats):
            for s in SETTINGS:
                runs[s].append(one_bench(model, npu, host, s, args))
        med = {s: statistics.median(r["samples_per_s"] for r in runs[s]) for s in SETTINGS}
        cells = []
        for s in SETTINGS:
            rates = [r["samples_per_s"] for r in runs[s]]
            text = f"{med[s]:.0f} ({min(rates):.0f}-{max(rates):.0f})"
            if s == "auto":
                chose = sorted({r["chose"] for r in runs[s]})
                text = f"k={','.join(map(str, chose))}: " + text
            cells.append(f"{text:>22}")
        best = max(med[s] for s in SETTINGS if s != "auto")
        chosen = statistics.mode(r["chose"] for r in runs["auto"])
        ratios = f"  {med['auto'] / best:9.3f}  {med[str(chosen)] / best:11.3f}"
        print(f"{workload:<12}" + "".join(cells) + ratios, flush=True)


if __name__ == "__main__":
    main()
