"""What the emulator's wait at the end of each call costs (emulator figures, not a board's).

An emulated call ends at its deadline: it sleeps, then yields the CPU in a loop for the
last ``_SPIN_S`` (runtime/sim.py: a timer wake-up lands late, which would make every call
slower than the NPU it stands for). A board's NPU wait blocks and costs no CPU, so the
loop's CPU is the emulator's own. This runs one instance on one core, alternately with
the loop and without it (``_SPIN_S`` = 0), and prints CPU and wall ms per call, medians
of the repeats:

    python tools/bench_sim_wait.py --npu-ms 0.5,1,2 --calls 1500 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from batchinfer.demo import model_path
from batchinfer.runtime import sim
from batchinfer.runtime.sim import RKNNLite


def per_call(
    model: str, shape: tuple[int, ...], npu_ms: float, calls: int, spin_s: float
) -> tuple[float, float]:
    """(CPU ms, wall ms) per call of one instance on core 0, given uint8 inputs."""
    kept = sim._SPIN_S
    sim._SPIN_S = spin_s
    rknn = RKNNLite(verbose=False, npu_ms=npu_ms, host_ms=0)
    try:
        assert rknn.load_rknn(model) == 0
        assert rknn.init_runtime(core_mask=RKNNLite.NPU_CORE_0) == 0
        x = np.zeros(shape, np.uint8)
        for _ in range(50):
            rknn.inference(inputs=[x])
        c0, t0 = time.process_time(), time.monotonic()
        for _ in range(calls):
            rknn.inference(inputs=[x])
        return 1e3 * (time.process_time() - c0) / calls, 1e3 * (time.monotonic() - t0) / calls
    finally:
        rknn.release()
        sim._SPIN_S = kept


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--npu-ms", default="0.5,1,2")
    p.add_argument("--calls", type=int, default=1500)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default=str(model_path("pool224")))
    p.add_argument("--shape", default="1,224,224,3", help="the model's input, NHWC uint8")
    args = p.parse_args()
    shape = tuple(int(v) for v in args.shape.split(","))
    print("npu ms | CPU ms/call with the loop, without | wall ms/call with, without")
    for npu in (float(v) for v in args.npu_ms.split(",")):
        runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for _ in range(args.repeats):
            for loop in (True, False):
                spin = sim._SPIN_S if loop else 0.0
                runs[loop].append(per_call(args.model, shape, npu, args.calls, spin))
        med = {k: [statistics.median(r[i] for r in v) for i in (0, 1)] for k, v in runs.items()}
        print(
            f"{npu:6g} | {med[True][0]:.3f}, {med[False][0]:.3f} | "
            f"{med[True][1]:.3f}, {med[False][1]:.3f}"
        )


if __name__ == "__main__":
    main()
