"""What the decode benchmarks (bench_detect_decode.py, bench_seg_decode.py,
bench_pose_obb_decode.py) share: int8 outputs as a runtime returns them, and the CPU time
of a call. Imported by those scripts (run as ``python tools/bench_*_decode.py``, so this
folder is on the path)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np


def quantise(outputs: list[np.ndarray]) -> tuple[list[np.ndarray], list[tuple[float, int]]]:
    """int8 outputs and their (scale, zero point), as a runtime returns them unconverted:
    one scale and zero point per output, spanning its values."""
    q, params = [], []
    for o in outputs:
        lo, hi = float(o.min()), float(o.max())
        scale = max(hi - lo, 1e-6) / 255
        zp = round(-128 - lo / scale)
        q.append(np.clip(np.round(o / scale + zp), -128, 127).astype(np.int8))
        params.append((scale, zp))
    return q, params


def cpu_ms(fn: Callable[[], object], number: int, repeats: int) -> float:
    """Median over ``repeats`` of the CPU milliseconds per call of ``number`` calls
    (``time.process_time``: a loaded machine slows it less than a wall clock)."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(number):
            fn()
        times.append((time.process_time() - start) / number * 1e3)
    return statistics.median(times)
