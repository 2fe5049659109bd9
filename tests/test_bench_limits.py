"""bench.limits: the NPU and decode limits a throughput is judged against."""

from __future__ import annotations

import threading
import time

import numpy as np
from PIL import Image

from batchinfer.bench.limits import Limits, call_cpu_ms, decode_cpu_ms, measure
from batchinfer.data.preprocess import preprocess_for


def test_fractions_of_each_limit_and_none_where_unknown():
    lim = Limits(cpus=2, npu_per_s=1500.0, decode_per_s=1000.0, decode_cpu_ms=1.9)
    assert lim.fractions(750.0) == {"npu": 0.5, "decode": 0.75}
    assert Limits(cpus=2).fractions(750.0) == {"npu": None, "decode": None}


def test_decode_limit_from_the_files_and_the_call(tmp_path):
    for i in range(4):
        Image.fromarray(np.full((48, 64, 3), 40 * i, np.uint8)).save(tmp_path / f"{i}.jpg")
    Image.new("RGB", (1, 1)).save(tmp_path / "bad.jpg")
    (tmp_path / "bad.jpg").write_bytes(b"not a jpeg")  # an error row: skipped, not timed
    paths = sorted(str(p) for p in tmp_path.glob("*.jpg"))
    spec = preprocess_for((1, 16, 16, 3), "uint8")
    assert decode_cpu_ms(paths, spec, "images") > 0
    lim = measure(2, 3, 2.0, spec, paths, "images")
    assert lim.npu_per_s == 1500.0 and lim.call_cpu_ms is None  # no emulator given
    assert lim.decode_per_s == 2 * 1e3 / lim.decode_cpu_ms
    assert measure(2, 3, None).to_json() == {
        "cpus": 2, "npu_per_s": None, "decode_per_s": None, "decode_cpu_ms": None,
        "call_cpu_ms": None,
    }  # fmt: skip


def _spin(cpu_s: float) -> None:
    """Spend at least ``cpu_s`` of this thread's CPU time."""
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        pass


def test_call_cpu_is_the_calling_threads():
    class Spinning:  # each call spends 3 ms of CPU in the calling thread
        calls = 0

        def infer(self, inputs, reuse_outputs, data_format):
            self.calls += 1
            _spin(0.003)

    class Handing:  # each call has another thread spend 3 ms of CPU, and waits for it
        def infer(self, inputs, reuse_outputs, data_format):
            helper = threading.Thread(target=_spin, args=(0.003,))
            helper.start()
            helper.join()

    spec = preprocess_for((1, 4, 4, 3), "uint8")
    adapter = Spinning()
    spinning = call_cpu_ms(adapter, spec, calls=5)
    assert adapter.calls == 6  # a warm-up call, then the 5 timed
    # CPU time, not wall time: at least the 3 ms each call spent, however loaded the machine
    assert 3.0 <= spinning < 30.0, spinning
    # only the calling thread's: work done elsewhere (an emulator's worker) is not counted
    assert call_cpu_ms(Handing(), spec, calls=5) < 1.5


def test_timing_the_emulators_call_prints_none_of_its_runtime_lines(demo_kit, tmp_path, capfd):
    """`bench --dataset` on the emulator printed six raw RKNN start-up lines (I RKNN: ...,
    W rknn-toolkit-lite2 version) into its report: the instance made here to time a call
    is as quiet as run's core workers' (issue 40, item 15)."""
    import os

    from batchinfer.options import RuntimeOptions, SimOptions
    from batchinfer.runtime.backends import make_backend

    image = tmp_path / "0.png"
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(image)
    sim = RuntimeOptions(backend="sim", sim=SimOptions(npu_ms=0.1, host_ms=0.0))
    backend = make_backend(demo_kit.models["digits"], sim)
    spec = preprocess_for((1, 8, 8, 1), "uint8")
    level = os.environ.get("BATCHINFER_RKNN_LOG_LEVEL")
    lim = measure(2, 3, 0.1, spec, [str(image)], "images", backend)
    assert lim.call_cpu_ms is not None and lim.call_cpu_ms > 0
    assert capfd.readouterr().err == ""
    assert os.environ.get("BATCHINFER_RKNN_LOG_LEVEL") == level  # the process's is left alone
