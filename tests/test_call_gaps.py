"""tools/bench_call_gaps.py's split of a core's time: npu, late calls, and time between calls."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "bench_call_gaps.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("bench_call_gaps", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered while it runs: its dataclass looks its own module up by name.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def _calls(durations_ms: list[float], gap_ms: float, start: float = 100.0) -> list:
    calls, t = [], start
    for d in durations_ms:
        calls.append((t, t + d / 1e3))
        t += (d + gap_ms) / 1e3
    return calls


def test_one_instance_splits_late_calls_from_time_between(tool) -> None:
    # 8 calls of 1.02 ms, one of 1.5 ms (woken late), 0.05 ms between calls; npu 1 ms.
    durations = [1.02] * 4 + [1.5] + [1.02] * 4
    split = tool.split_core(0, _calls(durations, 0.05), npu_ms=1.0, k=1, trim=0.0)
    span = sum(durations) + 0.05 * (len(durations) - 1)
    assert split.calls == 9
    assert split.npu == pytest.approx(9 * 1.0 / span)
    assert split.late == pytest.approx(8 * 0.02 / span)
    assert split.woken_late == pytest.approx(0.5 / span)
    assert split.between == pytest.approx(8 * 0.05 / span)
    assert split.npu + split.late + split.woken_late + split.between == pytest.approx(1.0)
    assert split.late_calls == pytest.approx(1 / 9)
    assert split.waits == pytest.approx(0.0) and split.gaps_waited == pytest.approx(0.0)


def test_waits_for_an_item_are_told_from_the_engines_own_gaps(tool) -> None:
    # Ten 1 ms calls, 0.02 ms apart except one 1 ms wait for an item (the queue ran dry).
    calls = _calls([1.0] * 5, 0.02) + _calls([1.0] * 5, 0.02, start=100.0 + 6.1e-3)
    split = tool.split_core(0, calls, npu_ms=1.0, k=1, trim=0.0)
    span = 10 * 1.0 + 8 * 0.02 + (6.1 - 5.08)
    assert split.between == pytest.approx((8 * 0.02 + 1.02) / span)
    assert split.waits == pytest.approx(1.02 / span)
    assert split.gaps_waited == pytest.approx(1 / 9)


def test_overlapping_calls_count_once_and_late_is_not_split(tool) -> None:
    # Two instances on one core: calls overlap (each queues behind the other on the core),
    # so only the time with no call in flight is "between", and lateness is not defined.
    a = _calls([2.0] * 5, 0.0)
    b = _calls([2.0] * 5, 0.0, start=100.0 + 1e-3)
    split = tool.split_core(1, a + b, npu_ms=1.0, k=2, trim=0.0)
    assert split.late is None and split.woken_late is None and split.late_calls is None
    assert split.between == pytest.approx(0.0, abs=1e-9)
    assert split.npu == pytest.approx(10 * 1.0 / 11.0)


def test_trim_leaves_out_each_end(tool) -> None:
    # A slow start and end (ramp) must not count in the steady part.
    durations = [5.0] + [1.0] * 18 + [5.0]
    split = tool.split_core(0, _calls(durations, 0.0), npu_ms=1.0, k=1, trim=0.05)
    assert split.calls == 18
    assert split.npu == pytest.approx(1.0)
    assert split.woken_late == pytest.approx(0.0)
