"""A detector whose outputs are NaN or infinite is said, not only counted (issue 40, item 6):
every image had 0 boxes and the run said `complete: 20 succeeded` with no word on the
console; and the canary compared NaN with NaN and named one core as differing from itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from detect_models import colour_detector
from onnx import helper, numpy_helper
from PIL import Image
from runs import config

from batchinfer import run
from batchinfer.engine.canary import Canary, canary_difference
from batchinfer.results import read_run


def _nan_detector(directory: Path) -> Path:
    """The colour detector with every output multiplied by NaN."""
    path = colour_detector(directory)
    model = onnx.load(str(path))
    graph = model.graph
    graph.initializer.append(numpy_helper.from_array(np.array([np.nan], np.float32), "nan"))
    for out in graph.output:
        for node in graph.node:
            node.output[:] = [f"{o}_finite" if o == out.name else o for o in node.output]
        graph.node.append(helper.make_node("Mul", [f"{out.name}_finite", "nan"], [out.name]))
    onnx.save(model, str(path))
    return path


def test_a_detector_giving_nan_says_so_at_the_end_of_the_run(tmp_path):
    data = tmp_path / "images"
    data.mkdir()
    for i in range(3):
        Image.new("RGB", (64, 48), (40 * i, 0, 0)).save(data / f"{i}.png")
    model = _nan_detector(tmp_path)
    result = run(config(data, model, backend="onnx", cores=(0,), out=tmp_path / "o"))
    assert (result.status, result.succeeded, result.errors) == ("complete", 3, 0)
    (said,) = [w for w in result.warnings if "NaN or infinite" in w]
    cells = 8 * 8 + 4 * 4 + 2 * 2  # the 64x64 input's cells over strides 8, 16, 32
    assert f"{3 * cells:,} candidate boxes dropped as non-finite in 3 of 3 images" in said
    record = read_run(result.out).manifest.raw
    assert record["detect"]["nonfinite_dropped"] == 3 * cells
    assert record["detect"]["nonfinite_items"] == 3
    assert any("NaN or infinite" in w for w in record["warnings"])


def test_the_canary_compares_nan_as_equal_where_both_have_it():
    a = [np.array([1.0, np.nan, np.inf, 4.0])]
    assert canary_difference(a, [a[0].copy()]) == 0.0
    # NaN where the other has a number is a difference, as large as can be.
    assert canary_difference(a, [np.array([1.0, 2.0, np.inf, 4.0])]) == np.inf
    assert canary_difference(a, [np.array([1.0, np.nan, np.inf, 4.04])]) == pytest.approx(0.01)


def test_a_core_is_never_said_to_differ_from_itself():
    nan = [np.full(4, np.nan)]
    canary = Canary()
    canary.add(0, nan)
    canary.add(1, [x.copy() for x in nan])
    assert canary.settle() == []
    odd = Canary()
    odd.add(0, nan)
    odd.add(1, [np.ones(4)])
    odd.add(2, [x.copy() for x in nan])
    (warning,) = odd.settle()
    assert warning.startswith("core 1 gives different outputs from core 0 ")
    assert "(one gives NaN or infinite values where the other does not)" in warning


def test_the_bench_report_says_the_figures_timed_boxes_that_were_not_there():
    from batchinfer.bench.report import _postprocess

    post = {"items": 20, "cpu_ms_per_item": 0.1, "nonfinite_dropped": 168_000}
    lines = _postprocess({"postprocess": {**post, "nonfinite_items": 20}})
    assert lines[-1].startswith("  NOT FINITE: 168,000 candidate boxes dropped as NaN or ")
    assert "in 20 of 20 items" in lines[-1]
    assert len(_postprocess({"postprocess": {**post, "nonfinite_dropped": 0}})) == 1
