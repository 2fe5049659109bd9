"""The RKNNLite contract (batchinfer/runtime/CONTRACT.md), row by row, against every runtime.

``sim`` runs every row; ``onnx`` the rows that are not about chips or board lines; the
real runtime runs the model-agnostic rows under ``pytest -m board`` with:

- ``BATCHINFER_BOARD_MODEL``: a .rknn (input shape from an .onnx beside it, or
  ``BATCHINFER_BOARD_INPUT=1,224,224,3``); with ``<stem>.onnx`` and ``<stem>.config.json``
  beside it, the normalisation row compares the board with ONNX Runtime too;
- ``BATCHINFER_BOARD_DYNAMIC_MODEL`` and ``BATCHINFER_BOARD_DYNAMIC_SHAPES`` (its compiled
  NHWC shapes, ``1,224,224,3;1,160,160,3``) for the dynamic-shape row, e.g. Rockchip's
  rknn-toolkit-lite2/examples/dynamic_shape model.

Rows marked [guess] in the contract are asserted the way the emulator does it; on a board
such a row is the check of the guess.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import emulator_models as EM
import models as M  # tests/ is on sys.path under pytest (no tests/__init__.py)
import numpy as np
import pytest

from batchinfer.runtime import constants as C
from batchinfer.runtime import describe_model

BOARD = pytest.param("board", marks=pytest.mark.board)
ALL = ["sim", "onnx", BOARD]
CPU = ["sim", "onnx"]
BOARD_LIKE = ["sim", BOARD]  # rows about what a board prints
TYPES = {0: "float32", 1: "float16", 2: "int8", 3: "uint8", 4: "int16", 5: "uint16",
         6: "int32", 7: "uint32", 8: "int64", 9: "bool"}  # fmt: skip


@dataclass
class Case:
    """One runtime under test: how to make it, its model and a valid input for it."""

    kind: str
    make: Callable[..., object]
    model: Path
    sample: Callable[[], list[np.ndarray]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    M.nhwc_uint8_model(d)
    M.nchw_float_model(d)
    M.two_output_model(d)
    M.corrupt_model(d)
    return d


def _factory(kind: str, state_dir: Path) -> Callable[..., object]:
    if kind == "sim":
        from batchinfer.runtime.sim import RKNNLite

        def make(**kw: object) -> object:
            kw.setdefault("npu_ms", 0.0)
            kw.setdefault("host_ms", 0.0)
            kw.setdefault("state_dir", state_dir)
            kw.setdefault("faults", "")
            return RKNNLite(**kw)

        return make
    if kind == "onnx":
        from batchinfer.runtime.onnx import RKNNLite as OnnxRKNNLite

        def make_onnx(chip: str | None = None, **kw: object) -> object:
            return OnnxRKNNLite(**kw)

        return make_onnx
    from batchinfer.errors import RuntimeUnavailableError
    from batchinfer.runtime.rknnlite import load_rknnlite_class

    try:
        cls = load_rknnlite_class()
    except RuntimeUnavailableError as exc:
        pytest.skip(str(exc))

    def make_board(chip: str | None = None, **kw: object) -> object:
        return cls(**kw)

    return make_board


def _board_sample(model: Path) -> Callable[[], list[np.ndarray]]:
    shape_env = os.environ.get("BATCHINFER_BOARD_INPUT")
    rng = np.random.default_rng(0)
    if shape_env:
        shape = tuple(int(s) for s in shape_env.split(","))
        return lambda: [rng.integers(0, 256, shape, dtype=np.uint8)]
    try:
        info = describe_model(model)
    except Exception as exc:
        pytest.skip(
            f"cannot tell the board model's input shape ({exc}); set BATCHINFER_BOARD_INPUT"
        )
    return lambda: [_random(t.shape, t.dtype, rng) for t in info.inputs]


def _random(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    if np.dtype(dtype).kind == "f":
        return rng.random(shape).astype(dtype)
    return rng.integers(0, 2 if dtype == "bool" else 100, shape).astype(dtype)


@pytest.fixture(params=ALL)
def rt(request: pytest.FixtureRequest, model_dir: Path, tmp_path: Path) -> Case:
    return _case(request.param, model_dir, tmp_path)


@pytest.fixture(params=CPU)
def cpu(request: pytest.FixtureRequest, model_dir: Path, tmp_path: Path) -> Case:
    return _case(request.param, model_dir, tmp_path)


@pytest.fixture(params=BOARD_LIKE)
def boardlike(request: pytest.FixtureRequest, model_dir: Path, tmp_path: Path) -> Case:
    return _case(request.param, model_dir, tmp_path)


def _case(kind: str, model_dir: Path, tmp_path: Path) -> Case:
    make = _factory(kind, tmp_path / "state")
    if kind == "board":
        env_model = os.environ.get("BATCHINFER_BOARD_MODEL")
        if not env_model:
            pytest.skip("set BATCHINFER_BOARD_MODEL to a .rknn to run the board contract tests")
        return Case(kind, make, Path(env_model), _board_sample(Path(env_model)))
    rng = np.random.default_rng(0)
    return Case(
        kind,
        make,
        model_dir / "nhwc_uint8.onnx",
        lambda: [rng.integers(0, 256, (1, 8, 8, 1), dtype=np.uint8)],
    )


def ready(case: Case, model: Path | None = None, **kw: object) -> object:
    """A runtime of ``case`` with its model loaded and initialised."""
    r = case.make(**kw)
    assert r.load_rknn(str(model or case.model)) == 0
    assert r.init_runtime() == 0
    return r


def said(capfd: pytest.CaptureFixture) -> str:
    """Everything written to stdout and stderr so far (the board's logger may use either)."""
    out, err = capfd.readouterr()
    return out + err


# ---------------------------------------------------------------- constructor, attributes
def test_constants_have_rknnlite_values(rt: Case) -> None:
    cls = type(rt.make())
    assert (cls.NPU_CORE_AUTO, cls.NPU_CORE_0, cls.NPU_CORE_1, cls.NPU_CORE_2) == (0, 1, 2, 4)
    assert (cls.NPU_CORE_0_1, cls.NPU_CORE_0_1_2, cls.NPU_CORE_ALL) == (3, 7, 0xFFFF)


def test_constructor_sets_the_public_attributes(rt: Case) -> None:
    r = rt.make()
    assert isinstance(r.rknn_log.logger, logging.Logger)
    assert r.rknn_runtime is None
    assert r.rknn_data is None and r.rknn_user_key is None
    assert r.target == "simulator" and r.load_model_in_npu is False and r.verbose is False
    assert os.path.isdir(r.root_dir)
    assert r.load_rknn(str(rt.model)) == 0
    assert isinstance(r.rknn_data, bytes) and r.rknn_data == rt.model.read_bytes()


def test_constructor_touches_no_board_state(tmp_path: Path) -> None:
    from batchinfer.runtime.sim import RKNNLite

    RKNNLite(state_dir=tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_construction_logs_the_toolkit_version(boardlike: Case, capfd) -> None:
    if boardlike.kind == "board":
        pytest.importorskip("pkg_resources", reason="the wheel logs its version through it")
    boardlike.make()
    assert re.search(r"^W rknn-toolkit-lite2 version: \d+\.\d+", said(capfd), re.M)


def test_verbose_without_a_file_warns(rt: Case, capfd) -> None:
    rt.make(verbose=True)
    assert "W Verbose file path is invalid, debug info will not dump to file." in said(capfd)


def test_verbose_file_in_a_missing_folder_is_dropped_silently(
    rt: Case, tmp_path: Path, capfd
) -> None:
    r = rt.make(verbose=True, verbose_file=str(tmp_path / "no" / "such" / "log.txt"))
    assert r.load_rknn(str(tmp_path / "missing.rknn")) == -1
    text = said(capfd)
    assert not (tmp_path / "no").exists()
    assert text.count("Verbose file path is invalid") == 1  # dropped: as if none was given
    assert text.count("missing.rknn") == 1  # every line once, not once per sink


def test_log_goes_to_verbose_file_too(cpu: Case, tmp_path: Path, capfd) -> None:
    log = tmp_path / "rknn.log"
    r = ready(cpu, verbose=True, verbose_file=str(log))
    assert r.inference(inputs=[np.zeros((8, 8, 1), np.uint8)]) is None
    text = log.read_text()
    assert "E Catch exception when setting inputs." in text
    assert "need 4dims input, but 3dims" in text
    assert said(capfd).count("need 4dims input, but 3dims") == 1  # and once on the console


def test_lowering_the_logger_level_silences_warnings(rt: Case, capfd) -> None:
    r = ready(rt)
    x = rt.sample()[0]
    if x.ndim != 4:
        pytest.skip("needs a 4-D input")
    nchw = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    said(capfd)
    assert r.inference(inputs=[nchw], data_format="nchw") is not None
    assert "W The input[0] need NHWC data format, but NCHW set" in said(capfd)
    r.rknn_log.logger.setLevel(logging.ERROR)
    assert r.inference(inputs=[nchw], data_format="nchw") is not None
    assert "need NHWC data format" not in said(capfd)
    r.release()


# ---------------------------------------------------------------- load_rknn
def test_load_rknn_returns(rt: Case, tmp_path: Path) -> None:
    r = rt.make()
    assert r.load_rknn(str(rt.model)) == 0
    assert r.load_rknn("") == -1
    assert r.load_rknn(str(tmp_path / "missing.rknn")) == -1
    with pytest.raises(TypeError):
        r.load_rknn(None)


def test_load_rknn_with_a_missing_key_file_returns_minus_one(rt: Case, tmp_path: Path) -> None:
    r = rt.make()
    assert r.load_rknn(str(rt.model), key_path=str(tmp_path / "missing_key.bin")) == -1
    assert r.rknn_user_key is None


def test_bad_model_fails_in_init_not_load(cpu: Case, model_dir: Path, capfd) -> None:
    r = cpu.make()
    assert r.load_rknn(str(model_dir / "corrupt.onnx")) == 0
    assert r.init_runtime() == -1
    # The wheel keeps the runtime whose build_graph failed: not None, but nothing works.
    assert r.rknn_runtime is not None
    with pytest.raises(Exception, match="RKNN_ERR_CTX_INVALID"):
        r.rknn_runtime.get_in_out_num()
    said(capfd)
    assert r.inference(inputs=cpu.sample()) is None
    assert "E Catch exception when setting inputs." in said(capfd)
    assert r.get_sdk_version() is None
    lines = said(capfd)
    assert "E Catch exception when get sdk version" in lines and "not inited" not in lines
    r.release()
    assert r.rknn_runtime is None
    assert r.load_rknn(str(cpu.model)) == 0 and r.init_runtime() == 0  # the object recovers
    assert isinstance(r.inference(inputs=cpu.sample()), list)
    r.release()


def test_rknn_file_runs_from_onnx_beside_it(cpu: Case, tmp_path: Path) -> None:
    onnx_path = M.nchw_float_model(tmp_path, name="net.onnx")
    r = ready(cpu, M.fake_rknn(onnx_path))
    x = np.random.default_rng(1).random((1, 8, 8, 3), dtype=np.float32)
    expected = M.nchw_float_reference(x.transpose(0, 3, 1, 2))
    np.testing.assert_allclose(r.inference(inputs=[x])[0], expected, rtol=1e-5)


def test_rknn_without_onnx_fails_init_saying_what_to_put_where(
    cpu: Case, tmp_path: Path, capfd
) -> None:
    rknn = M.fake_rknn(tmp_path / "lonely.onnx")
    r = cpu.make()
    assert r.load_rknn(str(rknn)) == 0
    assert r.init_runtime() == -1
    errors = [line for line in said(capfd).splitlines() if line.startswith("E ")]
    assert any("lonely.onnx" in line and str(tmp_path) in line for line in errors), errors


# ---------------------------------------------------------------- init_runtime, lifecycle
def test_init_without_model_fails(rt: Case) -> None:
    assert rt.make().init_runtime() == -1


def test_init_with_target_fails_on_cpu_runtimes(cpu: Case) -> None:
    r = cpu.make()
    r.load_rknn(str(cpu.model))
    assert r.init_runtime(target="rk3588") == -1


def test_inference_before_init_returns_none_with_e_line(rt: Case, capfd) -> None:
    r = rt.make()
    r.load_rknn(str(rt.model))
    assert r.inference(inputs=rt.sample()) is None
    assert (
        "E Runtime environment is not inited, please call init_runtime to init it first!"
        in said(capfd)
    )


def test_release_is_idempotent_and_allows_reinit(rt: Case) -> None:
    r = ready(rt)
    assert isinstance(r.inference(inputs=rt.sample()), list)
    assert r.release() is None
    assert r.rknn_runtime is None
    r.release()
    assert r.inference(inputs=rt.sample()) is None
    assert r.get_sdk_version() is None
    assert r.init_runtime() == 0  # model bytes were kept
    assert isinstance(r.inference(inputs=rt.sample()), list)
    r.release()


def test_init_again_replaces_the_runtime(rt: Case) -> None:
    r = ready(rt)
    first = r.rknn_runtime
    assert r.init_runtime() == 0
    assert r.rknn_runtime is not first
    assert isinstance(r.inference(inputs=rt.sample()), list)
    r.release()


def test_init_writes_librknnrt_information_lines(boardlike: Case, capfd) -> None:
    ready(boardlike).release()
    text = said(capfd)
    stamp = r"^I RKNN: \[[\d:.]+\] "
    assert re.search(stamp + r"RKNN Runtime Information, librknnrt version: ", text, re.M)
    assert re.search(stamp + r"RKNN Driver Information, version: \d", text, re.M)
    assert "RKNN Model Information, version: " in text


def test_instances_dropped_without_release_keep_no_descriptor(rt: Case) -> None:
    fds = Path("/proc/self/fd")
    if not fds.is_dir():
        pytest.skip("needs /proc/self/fd")
    before = len(list(fds.iterdir()))
    for _ in range(200):
        r = rt.make()
        assert r.load_rknn(str(rt.model)) == 0
        assert r.init_runtime() == 0
        assert r.inference(inputs=rt.sample()) is not None
        del r  # no release(): what a script that forgets it does
    gc.collect()
    assert len(list(fds.iterdir())) <= before + 2


# ---------------------------------------------------------------- rknn_runtime queries
def test_rknn_runtime_reports_counts_and_tensor_attributes(rt: Case) -> None:
    r = ready(rt)
    sample = rt.sample()
    n_in, n_out = r.rknn_runtime.get_in_out_num()
    assert n_in == len(sample) and n_out >= 1
    for i, x in enumerate(sample):
        attr = r.rknn_runtime.get_tensor_attr(i, is_output=False)
        dims = [int(d) for d in attr.dims][: attr.n_dims]
        assert isinstance(attr.name, bytes) and attr.name
        assert attr.index == i and dims == list(x.shape)  # NHWC for 4-D, as fed
        assert attr.n_elems == x.size
        assert attr.size == attr.n_elems * np.dtype(TYPES[attr.type]).itemsize
        if x.ndim == 4:
            assert attr.fmt == 1  # RKNN_TENSOR_NHWC
    out = r.rknn_runtime.get_tensor_attr(0, is_output=True)
    result = r.inference(inputs=sample)
    assert out.n_elems == result[0].size
    with pytest.raises(Exception):  # noqa: B017 - the real runtime raises a bare Exception
        r.rknn_runtime.get_tensor_attr(n_in, is_output=False)
    r.release()


def test_rknn_runtime_set_inputs_run_get_outputs_as_inference_does(rt: Case) -> None:
    # Public clients drive the runtime directly (to overlap set_inputs with get_outputs).
    r = ready(rt)
    sample = rt.sample()
    expected = r.inference(inputs=sample)
    runtime = r.rknn_runtime
    runtime.set_inputs(sample, None, ["nhwc"], inputs_pass_through=None)
    ret = runtime.run(False)
    outputs = runtime.get_outputs(False)
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    with pytest.raises(Exception):  # noqa: B017 - the real runtime raises a bare Exception
        runtime.set_inputs([sample[0].astype(np.float64)])
    if rt.kind != "board":  # [guess] rows: what run returns, get_run_perf without a flag
        assert ret == 0
        runtime.set_inputs(sample)
        ret = runtime.run(True)  # ret[1] is the frame id inference appends
        assert ret[1] == r.inference(inputs=sample, get_frame_id=True)[-1] - 1
        assert runtime.get_run_perf().run_duration >= 0
    r.release()


@pytest.mark.parametrize("name", ["get_inputs", "context", "no_such_member"])
def test_rknn_runtime_members_it_lacks_are_attribute_errors_naming_the_real_api(
    cpu: Case, name: str
) -> None:
    r = ready(cpu)
    with pytest.raises(AttributeError) as info:
        getattr(r.rknn_runtime, name)
    message = str(info.value)
    assert f"{name}" in message and "get_tensor_attr(index, is_output=False)" in message
    assert "get_outputs(get_frame_id=False)" in message
    if name == "get_inputs":
        assert "get_tensor_attr(i).dims" in message
    if name == "context":
        assert "not emulated" in message
    assert not hasattr(r.rknn_runtime, name)
    r.release()


def test_every_4d_input_is_nhwc_whatever_the_channel_count(cpu: Case, tmp_path: Path) -> None:
    onnx_path = EM.dense_model(tmp_path, "wide.onnx", (1, 96, 8, 8))
    x = np.random.default_rng(4).random((1, 8, 8, 96), dtype=np.float32)
    expected = EM.ort(onnx_path, x=np.ascontiguousarray(x.transpose(0, 3, 1, 2)))[0]
    for model in (onnx_path, M.fake_rknn(onnx_path)):
        r = ready(cpu, model)
        attr = r.rknn_runtime.get_tensor_attr(0)
        assert [int(d) for d in attr.dims][:4] == [1, 8, 8, 96]
        np.testing.assert_allclose(r.inference(inputs=[x])[0], expected, rtol=1e-5)
        nchw = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        np.testing.assert_allclose(
            r.inference(inputs=[nchw], data_format="nchw")[0], expected, rtol=1e-5
        )
        r.release()
    assert describe_model(onnx_path).inputs[0].shape == (1, 8, 8, 96)


def test_a_converted_onnx_input_is_read_as_nchw_even_when_channels_last(
    cpu: Case, tmp_path: Path
) -> None:
    # rknn-toolkit2 makes ONNX [1,300,300,3] an NHWC [1,300,3,300] (airockchip/rknn-toolkit2#344).
    onnx_path = EM.dense_model(tmp_path, "tf_style.onnx", (1, 6, 6, 3))
    rknn = M.fake_rknn(onnx_path)
    assert describe_model(rknn).inputs[0].shape == (1, 6, 3, 6)
    assert describe_model(onnx_path).inputs[0].shape == (1, 6, 6, 3)  # run directly: as is
    r = ready(cpu, rknn)
    x = np.random.default_rng(5).random((1, 6, 3, 6), dtype=np.float32)
    expected = EM.ort(onnx_path, x=np.ascontiguousarray(x.transpose(0, 3, 1, 2)))[0]
    np.testing.assert_allclose(r.inference(inputs=[x])[0], expected, rtol=1e-5)
    r.release()


# ---------------------------------------------------------------- sdk version, platforms
SDK_BANNER = re.compile(r"^=+\nRKNN VERSION:\n  API: (\d+\.\d+\.\d+).*\n  DRV: (\S+).*\n=+$")


def test_sdk_version_only_while_initialised(rt: Case) -> None:
    r = rt.make()
    assert r.get_sdk_version() is None
    r.load_rknn(str(rt.model))
    assert r.get_sdk_version() is None
    r.init_runtime()
    match = SDK_BANNER.match(r.get_sdk_version())
    assert match, r.get_sdk_version()
    if rt.kind != "onnx":  # the CPU reference has no driver; boards and the sim do
        assert re.fullmatch(r"\d+\.\d+\.\d+", match[2])
    r.release()
    assert r.get_sdk_version() is None


def test_sdk_text_names_the_runtime(cpu: Case) -> None:
    import onnxruntime

    text = ready(cpu).get_sdk_version()
    assert f"onnxruntime {onnxruntime.__version__}" in text
    if cpu.kind == "sim":
        assert "batchinfer sim" in text and "emulated rk3588" in text and "npu_ms=0" in text


def test_list_support_target_platform(rt: Case, capsys: pytest.CaptureFixture) -> None:
    r = rt.make()
    platforms = r.list_support_target_platform()
    assert isinstance(platforms, dict) and platforms
    assert "RK3588" in str(platforms) and capsys.readouterr().out
    for missing in ("", "/nonexistent/model.rknn"):
        # RKNNLite 2.5.0 logs the missing model with rknn_log.e(), which raises ValueError.
        with pytest.raises(ValueError, match="does not exist"):
            r.list_support_target_platform(rknn_model=missing)


def test_platforms_of_an_rknn_file(cpu: Case, tmp_path: Path) -> None:
    rknn = M.fake_rknn(tmp_path / "m.onnx", target_platform="rk3576")
    result = cpu.make().list_support_target_platform(rknn_model=str(rknn))
    assert result["filled_target_platform"] == ["RK3576"]


def test_list_devices_is_empty(cpu: Case, capsys: pytest.CaptureFixture) -> None:
    assert cpu.make().list_devices() == ([], [])
    assert "None devices connected." in capsys.readouterr().out


# ---------------------------------------------------------------- inference results
def test_outputs_are_float32_in_model_order(cpu: Case, model_dir: Path) -> None:
    r = ready(cpu, model_dir / "two_output.onnx")
    out = r.inference(inputs=[np.array([[1.0, 7.0, 2.0, 3.0]], dtype=np.float32)])
    assert len(out) == 2 and all(o.dtype == np.float32 for o in out)
    np.testing.assert_array_equal(out[0], [[2.0, 14.0, 4.0, 6.0]])
    np.testing.assert_array_equal(out[1], [[1.0]])  # argmax, int64 in the graph


def test_outputs_match_the_model(cpu: Case) -> None:
    r = ready(cpu)
    x = cpu.sample()
    np.testing.assert_allclose(r.inference(inputs=x)[0], M.nhwc_uint8_reference(x[0]), rtol=1e-5)


def test_outputs_equal_onnx_runtime_on_the_normalised_input(rt: Case, tmp_path: Path) -> None:
    """A .rknn normalises raw pixels itself (mean/std from rknn.config); so does the sim."""
    if rt.kind == "board":
        rknn = rt.model
        onnx_path, settings = rknn.with_suffix(".onnx"), rknn.with_name(rknn.stem + ".config.json")
        if not (onnx_path.is_file() and settings.is_file()):
            pytest.skip(f"needs {onnx_path.name} and {settings.name} beside the board model")
    else:
        onnx_path = EM.conv_classifier(tmp_path)
        rknn = EM.rknn_for(onnx_path, mean_values=[EM.IMAGENET_MEAN], std_values=[EM.IMAGENET_STD])
    info = describe_model(rknn)
    tensor = info.inputs[0]
    assert tensor.normalised_inside and tensor.dtype == "uint8"
    pixels = np.random.default_rng(9).integers(0, 256, tensor.shape, dtype=np.uint8)
    r = ready(rt, rknn)
    got = r.inference(inputs=[pixels])[0]
    r.release()
    x = EM.nchw_normalised(pixels, list(tensor.mean or [0.0]), list(tensor.std or [1.0]))
    expected = EM.ort(onnx_path, **{tensor.name: x})[0].reshape(got.shape)
    if rt.kind == "board":  # int8 on the NPU: the same direction, not the same digits
        cosine = float(np.dot(got.ravel(), expected.ravel()))
        cosine /= float(np.linalg.norm(got) * np.linalg.norm(expected))
        assert cosine > 0.98
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_inference_never_raises(cpu: Case) -> None:
    r = ready(cpu)
    for bad in (None, ["text"], [np.zeros((1, 8, 8, 1), np.uint8)] * 2, [], 5):
        assert r.inference(inputs=bad) is None
    assert r.inference(inputs=cpu.sample(), data_type=["uint8", "uint8"]) is None


def test_non_list_inputs_only_warn(rt: Case, capfd) -> None:
    r = ready(rt)
    x = rt.sample()[0]
    assert isinstance(r.inference(inputs=(x,)), list)
    assert "W Inputs should be placed in a list" in said(capfd)


# ---------------------------------------------------------------- input rules
def test_float64_is_rejected(rt: Case, capfd) -> None:
    r = ready(rt)
    x = rt.sample()[0].astype(np.float64)
    assert r.inference(inputs=[x]) is None
    assert "float64" in said(capfd)


def test_missing_batch_axis_is_rejected(rt: Case, capfd) -> None:
    r = ready(rt)
    x = rt.sample()[0]
    assert r.inference(inputs=[x[0]]) is None
    assert f"need {x.ndim}dims input, but {x.ndim - 1}dims input buffer feed" in said(capfd)


def test_wrong_size_is_rejected(rt: Case) -> None:
    x = rt.sample()[0]
    smaller = x[:, :-1] if x.ndim > 1 and x.shape[1] > 1 else x[..., :-1]
    assert ready(rt).inference(inputs=[np.ascontiguousarray(smaller)]) is None


@pytest.mark.parametrize("dtype", C.SUPPORTED_DTYPES)
def test_every_supported_dtype_is_converted(cpu: Case, dtype: str) -> None:
    r = ready(cpu)
    x = (np.arange(64).reshape(1, 8, 8, 1) % 2).astype(dtype)  # 0/1 fits every dtype
    out = r.inference(inputs=[x], data_type=dtype)
    np.testing.assert_allclose(out[0], M.nhwc_uint8_reference(x.astype(np.uint8)), rtol=1e-4)


def test_data_type_must_equal_array_dtype(cpu: Case, capfd) -> None:
    r = ready(cpu)
    x = cpu.sample()
    assert r.inference(inputs=x, data_type="float32") is None
    assert "inputs[0].dtype: uint8 is not same as data_type" in said(capfd)
    assert isinstance(r.inference(inputs=x, data_type="uint8"), list)
    assert isinstance(r.inference(inputs=x, data_type=["uint8"]), list)


def test_nchw_data_is_transposed_to_nhwc(rt: Case, capfd) -> None:
    r = ready(rt)
    x = rt.sample()[0]
    if x.ndim != 4:
        pytest.skip("needs a 4-D input")
    nhwc = r.inference(inputs=[x])[0]
    nchw = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    said(capfd)
    np.testing.assert_array_equal(r.inference(inputs=[nchw], data_format="nchw")[0], nhwc)
    np.testing.assert_array_equal(r.inference(inputs=[nchw], data_format=["nchw"])[0], nhwc)
    assert (
        "W The input[0] need NHWC data format, but NCHW set, the data format and data buffer "
        "will be changed to NHWC." in said(capfd)
    )
    r.release()


def test_nchw_model_takes_nhwc_at_the_interface(cpu: Case, model_dir: Path) -> None:
    r = ready(cpu, model_dir / "nchw_float.onnx")
    x = np.random.default_rng(1).random((1, 3, 8, 8), dtype=np.float32)
    expected = M.nchw_float_reference(x)
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    np.testing.assert_allclose(r.inference(inputs=[nhwc])[0], expected, rtol=1e-5)
    np.testing.assert_allclose(r.inference(inputs=[x], data_format="nchw")[0], expected, rtol=1e-5)
    assert r.inference(inputs=[x]) is None  # NCHW data without saying so has the wrong shape


def test_bad_data_format_is_rejected(cpu: Case) -> None:
    assert ready(cpu).inference(inputs=cpu.sample(), data_format="hwc") is None


# ---------------------------------------------------------------- pass-through
def test_pass_through_flags_are_a_list(rt: Case) -> None:
    r = ready(rt)
    x = rt.sample()
    assert r.inference(inputs=x, inputs_pass_through=True) is None  # not a list: fails
    assert r.inference(inputs=x, inputs_pass_through=[0] * len(x)) is not None
    assert r.inference(inputs=x, inputs_pass_through=[0] * (len(x) + 1)) is None


def test_pass_through_sends_the_native_buffer(rt: Case) -> None:
    r = ready(rt)
    attr = r.rknn_runtime.get_tensor_attr(0)
    dims = tuple(int(d) for d in attr.dims[: attr.n_dims])
    native = np.zeros(dims, dtype=TYPES[attr.type])
    assert r.inference(inputs=[native], inputs_pass_through=[1]) is not None
    short = np.zeros((*dims[:-1], dims[-1] - 1), dtype=TYPES[attr.type])
    assert r.inference(inputs=[short], inputs_pass_through=[1]) is None
    r.release()


def test_pass_through_skips_normalisation_and_layout(cpu: Case, tmp_path: Path) -> None:
    onnx_path = EM.conv_classifier(tmp_path)
    rknn = EM.rknn_for(onnx_path, mean_values=[[127.5] * 3], std_values=[[127.5] * 3])
    r = ready(cpu, rknn)
    attr = r.rknn_runtime.get_tensor_attr(0)
    assert attr.type == 1 and attr.size == 2 * 16 * 16 * 3  # float16, the float model's native
    pixels = np.random.default_rng(2).integers(0, 256, (1, 16, 16, 3), dtype=np.uint8)
    normalised = (pixels.astype(np.float32) - 127.5) / 127.5
    passed = r.inference(inputs=[normalised.astype(np.float16)], inputs_pass_through=[1])[0]
    x16 = normalised.astype(np.float16).astype(np.float32).transpose(0, 3, 1, 2)
    expected = EM.ort(onnx_path, input=np.ascontiguousarray(x16))[0]
    np.testing.assert_allclose(passed, expected, rtol=1e-5, atol=1e-5)
    # Not converted: float32, raw pixels or NCHW are refused.
    assert r.inference(inputs=[normalised], inputs_pass_through=[1]) is None
    assert r.inference(inputs=[pixels], inputs_pass_through=[1]) is None
    nchw16 = np.ascontiguousarray(normalised.astype(np.float16).transpose(0, 3, 1, 2))
    assert r.inference(inputs=[nchw16], inputs_pass_through=[1]) is None


# ---------------------------------------------------------------- outputs, frame id, async
def test_reuse_outputs_returns_views_that_the_next_call_overwrites(rt: Case) -> None:
    r = ready(rt)
    first = r.inference(inputs=rt.sample(), reuse_outputs=True)
    kept = [o.copy() for o in first]
    second = r.inference(inputs=rt.sample(), reuse_outputs=True)
    assert all(np.shares_memory(a, b) for a, b in zip(first, second, strict=True))
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], kept[0])  # different random inputs


def test_default_outputs_are_owned_by_the_caller(rt: Case) -> None:
    r = ready(rt)
    first = r.inference(inputs=rt.sample())
    kept = [o.copy() for o in first]
    second = r.inference(inputs=rt.sample())
    assert not any(np.shares_memory(a, b) for a, b in zip(first, second, strict=True))
    for a, b in zip(first, kept, strict=True):
        np.testing.assert_array_equal(a, b)


def test_frame_id_is_appended_and_increments(rt: Case) -> None:
    r = ready(rt)
    a = r.inference(inputs=rt.sample(), get_frame_id=True)
    b = r.inference(inputs=rt.sample(), get_frame_id=True)
    assert isinstance(a[-1], int) and isinstance(b[-1], int)
    assert all(isinstance(o, np.ndarray) for o in a[:-1])
    if rt.kind != "board":
        assert b[-1] == a[-1] + 1
    assert len(r.inference(inputs=rt.sample())) == len(a) - 1


def test_async_mode_returns_the_previous_frames_outputs(rt: Case) -> None:
    """[guess] on boards: Rockchip documents it and also marks it not supported yet."""
    frames = [rt.sample() for _ in range(3)]
    sync = ready(rt)
    expected = [sync.inference(inputs=f)[0] for f in frames]
    sync.release()
    r = rt.make()
    assert r.load_rknn(str(rt.model)) == 0
    assert r.init_runtime(async_mode=True) == 0
    got = [r.inference(inputs=f)[0] for f in frames]
    r.release()
    np.testing.assert_array_equal(got[0], expected[0])  # no earlier frame: its own [guess]
    np.testing.assert_array_equal(got[1], expected[0])
    np.testing.assert_array_equal(got[2], expected[1])


# ---------------------------------------------------------------- dynamic shapes
@pytest.fixture(params=["sim", BOARD])
def dynamic(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Case, list[tuple]]:
    """A dynamic-shape model and its compiled NHWC shapes."""
    kind = request.param
    make = _factory(kind, tmp_path / "state")
    if kind == "board":
        model, shapes = (
            os.environ.get("BATCHINFER_BOARD_DYNAMIC_MODEL"),
            os.environ.get("BATCHINFER_BOARD_DYNAMIC_SHAPES"),
        )
        if not model or not shapes:
            pytest.skip("set BATCHINFER_BOARD_DYNAMIC_MODEL and BATCHINFER_BOARD_DYNAMIC_SHAPES")
        compiled = [tuple(int(d) for d in s.split(",")) for s in shapes.split(";")]
        return Case(kind, make, Path(model), lambda: []), compiled
    onnx_path = EM.conv_classifier(tmp_path, dynamic_hw=True)
    rknn = EM.rknn_for(
        onnx_path,
        mean_values=[[0, 0, 0]],
        std_values=[[255, 255, 255]],
        dynamic_input=[[[1, 3, 12, 12]], [[1, 3, 16, 16]]],
    )
    return Case(kind, make, rknn, lambda: []), [(1, 12, 12, 3), (1, 16, 16, 3)]


def test_only_compiled_shapes_run_on_a_dynamic_shape_model(dynamic) -> None:
    case, compiled = dynamic
    r = ready(case)
    rng = np.random.default_rng(6)
    for shape in compiled:
        x = rng.integers(0, 256, shape, dtype=np.uint8)
        assert r.inference(inputs=[x]) is not None, shape
        nchw = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        assert r.inference(inputs=[nchw], data_format=["nchw"]) is not None, shape
    n, h, w, c = compiled[0]
    other = (n, h + 2, w + 2, c)
    assert other not in compiled
    assert r.inference(inputs=[rng.integers(0, 256, other, dtype=np.uint8)]) is None
    r.release()


def test_dynamic_model_without_compiled_shapes_fails_init(cpu: Case, tmp_path: Path) -> None:
    rknn = EM.rknn_for(EM.conv_classifier(tmp_path, dynamic_hw=True), mean_values=[[0, 0, 0]])
    r = cpu.make()
    assert r.load_rknn(str(rknn)) == 0
    assert r.init_runtime() == -1


# ---------------------------------------------------------------- core masks
SIM_MASKS = [
    # chip, mask, init_runtime return, cores held, log fragment
    ("rk3588", C.NPU_CORE_AUTO, 0, (), None),
    ("rk3588", C.NPU_CORE_0, 0, (0,), None),
    ("rk3588", C.NPU_CORE_1, 0, (1,), None),
    ("rk3588", C.NPU_CORE_2, 0, (2,), None),
    ("rk3588", C.NPU_CORE_0_1, 0, (0, 1), None),
    ("rk3588", C.NPU_CORE_0_1_2, 0, (0, 1, 2), None),
    ("rk3588", C.NPU_CORE_ALL, 0, (0, 1, 2), None),
    ("rk3588", 5, -1, (), "E The core mode 5 is not supported currently."),
    ("rk3588", 6, -1, (), "E The core mode 6 is not supported currently."),
    ("rk3576", C.NPU_CORE_AUTO, 0, (), None),
    ("rk3576", C.NPU_CORE_1, 0, (1,), None),
    ("rk3576", C.NPU_CORE_2, 0, (0,), 'W The RK3576 platform has only two NPU cores. "NPU_CORE_2"'),
    ("rk3576", C.NPU_CORE_0_1_2, 0, (0, 1), 'replaced with "NPU_CORE_0_1"'),
    ("rk3576", C.NPU_CORE_ALL, 0, (0, 1), None),
    ("rk3576", 6, -1, (), "The core mode 6 is not supported currently."),
    ("rk3566", C.NPU_CORE_AUTO, 0, (), None),
    ("rk3566", C.NPU_CORE_0, -1, (), "E The core_mask is only supported by ['RK3588', 'RK3576']"),
    ("rk3566", C.NPU_CORE_ALL, -1, (), "Please do not set this parameter on other platforms."),
]


@pytest.mark.parametrize(("chip", "mask", "ret", "cores", "log"), SIM_MASKS)
def test_sim_core_mask_rules(
    model_dir: Path, tmp_path: Path, capfd, chip: str, mask: int, ret: int, cores, log
) -> None:
    make = _factory("sim", tmp_path)
    r = make(chip=chip)
    r.load_rknn(str(model_dir / "nhwc_uint8.onnx"))
    assert r.init_runtime(core_mask=mask) == ret
    assert r.cores == cores
    text = said(capfd)
    mask_lines = [
        line for line in text.splitlines() if line[:2] in ("W ", "E ") and "core" in line.lower()
    ]
    if log is None:
        assert not mask_lines, mask_lines
    else:
        assert log in text
    # A failed mask leaves the runtime alive (contract): inference still works.
    assert r.inference(inputs=[np.zeros((1, 8, 8, 1), np.uint8)]) is not None
    r.release()


@pytest.mark.parametrize("mask", sorted(C.VALID_CORE_MASKS))
def test_valid_masks_succeed(rt: Case, mask: int) -> None:
    r = rt.make()
    r.load_rknn(str(rt.model))
    assert r.init_runtime(core_mask=mask) == 0
    assert r.inference(inputs=rt.sample()) is not None
    r.release()


def test_onnx_records_the_mask_and_refuses_unknown_ones(model_dir: Path) -> None:
    from batchinfer.runtime.onnx import RKNNLite

    r = RKNNLite()
    r.load_rknn(str(model_dir / "nhwc_uint8.onnx"))
    assert r.init_runtime(core_mask=RKNNLite.NPU_CORE_2) == 0
    assert r.core_mask == RKNNLite.NPU_CORE_2
    assert r.init_runtime(core_mask=6) == -1


def test_sim_refuses_a_model_converted_for_another_chip(tmp_path: Path, capfd) -> None:
    rknn = EM.rknn_for(EM.conv_classifier(tmp_path), target_platform="rk3566")
    make = _factory("sim", tmp_path / "state")
    r = make(chip="rk3588")
    assert r.load_rknn(str(rknn)) == 0
    assert r.init_runtime() == -1
    assert "RKNN_ERR_TARGET_PLATFORM_UNMATCH" in said(capfd)
    assert make(chip="rk3568").load_rknn(str(rknn)) == 0
    other = make(chip="rk3568")
    other.load_rknn(str(rknn))
    assert other.init_runtime() == 0  # one model serves RK3566 and RK3568
    other.release()


def test_sim_emulates_the_chip_a_model_was_made_for_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BATCHINFER_SIM_CHIP", raising=False)
    make = _factory("sim", tmp_path / "state")
    by_settings = EM.rknn_for(EM.conv_classifier(tmp_path), target_platform="rk3576")
    by_metadata = M.fake_rknn(EM.dense_model(tmp_path, "d.onnx", (1, 4)), target_platform="rk3566")
    for model, chip in ((by_settings, "rk3576"), (by_metadata, "rk3566")):
        r = make()
        assert r.load_rknn(str(model)) == 0 and r.init_runtime() == 0
        assert f"emulated {chip}" in r.get_sdk_version()
        r.release()


# ---------------------------------------------------------------- a user's script
USER_SCRIPT = """
import sys
import numpy as np
from {module} import RKNNLite

rknn_lite = RKNNLite(verbose=True)

ret = rknn_lite.load_rknn({model!r})
if ret != 0:
    print('Load RKNN model failed')
    exit(ret)

ret = rknn_lite.init_runtime(
    core_mask=RKNNLite.NPU_CORE_AUTO
)
if ret != 0:
    print('Init runtime environment failed')
    exit(ret)

input_data = np.zeros((1, 8, 8, 3), dtype=np.float32)
outputs = rknn_lite.inference(inputs=[input_data])
print('top1', int(np.argmax(outputs[0])))
print(rknn_lite.get_sdk_version())

rknn_lite.release()
"""


def test_a_users_rknnlite_script_runs_on_sim_with_only_the_import_changed(
    model_dir: Path, tmp_path: Path
) -> None:
    model = M.fake_rknn(model_dir / "nchw_float.onnx")
    original = USER_SCRIPT.format(module="rknnlite.api", model=str(model))
    script = tmp_path / "user_script.py"
    script.write_text(
        original.replace("from rknnlite.api import", "from batchinfer.runtime.sim import")
    )
    env = dict(os.environ, BATCHINFER_SIM_STATE=str(tmp_path / "state"), BATCHINFER_SIM_FAULTS="")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 0, proc.stderr
    expected = int(np.argmax(M.nchw_float_reference(np.zeros((1, 3, 8, 8), np.float32))))
    assert f"top1 {expected}" in proc.stdout
    assert "batchinfer sim" in proc.stdout and "RKNN VERSION:" in proc.stdout
