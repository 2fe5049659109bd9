"""The npu_ms estimate: counting a graph's work, the calibration, and where it shows."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import emulator_models as EM
import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from batchinfer.errors import UsageError
from batchinfer.runtime import graph, timing
from batchinfer.runtime.sim import RKNNLite
from batchinfer.runtime.sim_settings import SimSettings

TOOL = Path(__file__).resolve().parents[1] / "tools" / "npu_ms_calibration.py"


def _tool():
    spec = importlib.util.spec_from_file_location("npu_ms_calibration", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(nodes: list, inputs: list, outputs: list, inits: list) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.zeros(shape, np.float32), name)


def _vi(name: str, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


# ---------------------------------------------------------------- counting
def test_macs_of_convolutions_and_matrix_products_are_exact() -> None:
    model = _model(
        [
            # 3x3 conv 4->8 on 10x10, pad 1: 8*10*10 outputs x 4*3*3 MACs = 28,800
            helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c1"], ["r1"]),  # applied inside the conv: free
            # depthwise 3x3, group 8, stride 2: 8*5*5 outputs x 1*3*3 = 1,800
            helper.make_node(
                "Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], group=8
            ),
            helper.make_node("Sigmoid", ["c2"], ["s2"]),  # 200 elements, not free
            # transposed 2x2 stride 2, 8->2: 8*5*5 inputs x 2*2*2 = 1,600
            helper.make_node("ConvTranspose", ["s2", "w3"], ["t3"], strides=[2, 2]),
            helper.make_node("Flatten", ["t3"], ["f"]),  # relabels only: free
            # Gemm (1,200) x (200,5): 5 outputs x 200 = 1,000
            helper.make_node("Gemm", ["f", "w4"], ["g"]),
            # MatMul (1,5) x (5,3): 3 x 5 = 15
            helper.make_node("MatMul", ["g", "w5"], ["y"]),
        ],
        [_vi("x", [1, 4, "H", "W"])],
        [_vi("y", None)],
        [
            _weight("w1", (8, 4, 3, 3)),
            _weight("w2", (8, 1, 3, 3)),
            _weight("w3", (8, 2, 2, 2)),
            _weight("w4", (200, 5)),
            _weight("w5", (5, 3)),
        ],
    )
    work = timing.count_work(model, {"x": (1, 4, 10, 10)})
    assert work.macs == 28_800 + 1_800 + 1_600 + 1_000 + 15
    assert work.conv_elements == 800 + 200 + 200 + 5 + 3
    assert work.other_elements == 200  # the sigmoid
    assert work.uncounted == ()


def test_the_calibration_builders_match_the_published_compute() -> None:
    tool = _tool()
    works = tool.calibration_work()
    for name, gmac in tool.PUBLISHED_GMAC.items():
        assert works[name].macs / 1e9 == pytest.approx(gmac, rel=0.02), name


def test_stored_coefficients_are_the_fit_of_the_calibration_tool() -> None:
    tool = _tool()
    fitted = tool.fit(tool.calibration_work())
    np.testing.assert_allclose(fitted, timing.COEFFICIENTS, rtol=1e-3, atol=1e-6)
    assert all(c >= 0 for c in fitted)


def test_estimate_is_within_the_documented_error_on_every_calibration_model() -> None:
    works = _tool().calibration_work()
    for name, _shape, fps in timing.CALIBRATION:
        error = timing.predict(works[name]) * fps / 1000.0 - 1
        assert abs(error) < 0.14, (name, error)  # docs: largest in-sample error 13 %


# ---------------------------------------------------------------- in the emulator
def test_sim_uses_and_labels_the_estimate(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    onnx_path = EM.conv_classifier(tmp_path, size=64)
    rknn = EM.rknn_for(onnx_path, mean_values=[[0, 0, 0]], std_values=[[255, 255, 255]])
    r = RKNNLite(npu_ms="estimate", host_ms=0, faults="", state_dir=tmp_path / "s")
    assert r.load_rknn(str(rknn)) == 0
    assert r.init_runtime() == 0
    expected = timing.estimate(onnx_path.read_bytes(), {"input": (1, 3, 64, 64)})
    assert r.npu_ms == pytest.approx(expected.npu_ms) and r.npu_ms > 0.01
    assert expected.work.macs == 8 * 64 * 64 * 27 + 16 * 32 * 32 * 72 + 16 * 10
    text = r.get_sdk_version()
    assert f"npu_ms={expected.npu_ms:.3g} (an estimate from the graph)" in text
    assert "I RKNN: " in capfd.readouterr().err.split("npu_ms estimate")[0]
    x = np.zeros((1, 64, 64, 3), np.uint8)
    assert r.inference(inputs=[x]) is not None
    r.release()


def test_estimate_is_accepted_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHINFER_SIM_NPU_MS", "Estimate")
    assert SimSettings.from_env().npu_ms == "estimate"


def test_estimate_without_onnx_says_so_in_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graph, "onnx_available", lambda: False)
    with pytest.raises(UsageError, match="the onnx package is not installed") as err:
        SimSettings.from_env(npu_ms="estimate")
    assert str(err.value).count(". ") == 0 and str(err.value).endswith(".")


def test_cli_parses_estimate_and_refuses_nonsense(tmp_path: Path) -> None:
    from batchinfer.cli import main

    args = ["run", str(tmp_path / "no-dataset"), "--model", str(tmp_path / "m.onnx")]
    bad = CliRunner().invoke(main, [*args, "--sim-npu-ms", "fast"])
    assert bad.exit_code == 2 and "Invalid value for '--sim-npu-ms'" in bad.output
    parsed = CliRunner().invoke(main, [*args, "--sim-npu-ms", "estimate"])
    assert "--sim-npu-ms" not in parsed.output  # accepted; the run fails on the paths


@pytest.mark.slow
def test_a_run_with_the_estimate(demo_kit, tmp_path: Path) -> None:
    from batchinfer.cli import main

    args = ["run", str(demo_kit.dataset), "--model", str(demo_kit.models["digits"])]
    args += ["--backend", "sim", "--limit", "6", "--no-progress", "--sim-host-ms", "0"]
    ok = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b"), "--sim-npu-ms", "estimate"])
    assert ok.exit_code == 0, ok.output
