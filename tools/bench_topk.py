"""Top-k of a batch of classifier outputs: argmax passes against argpartition and a sort.

``sink.predictions.top_k_batch`` takes k passes of argmax for k <= 16 (``_ARGMAX_K``) and
an argpartition (plus a sort of the k) above. This measures both paths, and a full stable
sort, on the same float32 scores, for batch sizes the collector sees (a flush carries a
few to 64 rows) and class counts of common heads. Microseconds per row, the best of
``--repeats`` timings (timeit's advice: the minimum is the least disturbed).

    python tools/bench_topk.py
    python tools/bench_topk.py --classes 1000 --rows 8 64 --k 5
"""

from __future__ import annotations

import argparse
import sys
import timeit
from unittest import mock

import numpy as np

from batchinfer.sink import predictions


def _argpartition_path(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    with mock.patch.object(predictions, "_ARGMAX_K", 0):
        return predictions.top_k_batch(scores, k)


def _stable_sort(scores: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--classes", type=int, nargs="+", default=[10, 1000, 21843])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    ways = {
        "argmax passes": lambda s: predictions.top_k_batch(s, args.k),
        "argpartition": lambda s: _argpartition_path(s, args.k),
        "stable sort": lambda s: _stable_sort(s, args.k),
    }
    print(f"top-{args.k}, float32 scores, µs per row (best of {args.repeats})")
    header = " ".join(f"{w:>14}" for w in ways)
    print(f"{'classes':>8} {'rows':>5} {header}  argpartition ÷ argmax")
    for classes in args.classes:
        for n in args.rows:
            scores = rng.standard_normal((n, classes)).astype(np.float32)
            expected = _stable_sort(scores, args.k)
            got = predictions.top_k_batch(scores, args.k)[0]
            part = _argpartition_path(scores, args.k)[0]
            if not (np.array_equal(got, expected) and np.array_equal(part, expected)):
                raise SystemExit(f"the ways disagree at {classes} classes, {n} rows")
            us = {}
            for name, way in ways.items():
                timer = timeit.Timer(lambda w=way, s=scores: w(s))
                number, _ = timer.autorange()
                us[name] = min(timer.repeat(args.repeats, number)) / number / n * 1e6
            cells = " ".join(f"{us[w]:14.2f}" for w in ways)
            ratio = us["argpartition"] / us["argmax passes"]
            print(f"{classes:8d} {n:5d} {cells}  {ratio:5.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
