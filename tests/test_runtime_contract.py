"""The RKNNLite contract (docs/rknnlite-contract.md), row by row, against every runtime.

``sim`` runs every row; ``onnx`` the rows that are not about chips; the real runtime
runs the model-agnostic rows under ``-m board`` with ``BATCHINFER_BOARD_MODEL`` set to a
.rknn (input shape from an .onnx beside it, or ``BATCHINFER_BOARD_INPUT=1,224,224,3``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import models as M  # tests/ is on sys.path under pytest (no tests/__init__.py)
import numpy as np
import pytest

from batchinfer.runtime import constants as C
from batchinfer.runtime import describe_model

ALL = ["sim", "onnx", pytest.param("board", marks=pytest.mark.board)]
CPU = ["sim", "onnx"]


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
    if shape_env:
        shape = tuple(int(s) for s in shape_env.split(","))
        return lambda: [np.zeros(shape, dtype=np.uint8)]
    try:
        info = describe_model(model)
    except Exception as exc:
        pytest.skip(
            f"cannot tell the board model's input shape ({exc}); set BATCHINFER_BOARD_INPUT"
        )
    return lambda: [np.zeros(t.shape, dtype=t.dtype) for t in info.inputs]


@pytest.fixture(params=ALL)
def rt(request: pytest.FixtureRequest, model_dir: Path, tmp_path: Path) -> Case:
    kind = request.param
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


@pytest.fixture(params=CPU)
def cpu(request: pytest.FixtureRequest, model_dir: Path, tmp_path: Path) -> Case:
    rng = np.random.default_rng(0)
    return Case(
        request.param,
        _factory(request.param, tmp_path / "state"),
        model_dir / "nhwc_uint8.onnx",
        lambda: [rng.integers(0, 256, (1, 8, 8, 1), dtype=np.uint8)],
    )


def ready(case: Case, model: Path | None = None, **kw: object) -> object:
    """A runtime of ``case`` with its model loaded and initialised."""
    r = case.make(**kw)
    assert r.load_rknn(str(model or case.model)) == 0
    assert r.init_runtime() == 0
    return r


# ---------------------------------------------------------------- constructor, constants
def test_constants_have_rknnlite_values(rt: Case) -> None:
    cls = type(rt.make())
    assert (cls.NPU_CORE_AUTO, cls.NPU_CORE_0, cls.NPU_CORE_1, cls.NPU_CORE_2) == (0, 1, 2, 4)
    assert (cls.NPU_CORE_0_1, cls.NPU_CORE_0_1_2, cls.NPU_CORE_ALL) == (3, 7, 0xFFFF)


def test_constructor_touches_no_state(tmp_path: Path) -> None:
    from batchinfer.runtime.sim import RKNNLite

    RKNNLite(verbose=True, verbose_file=str(tmp_path / "log.txt"), state_dir=tmp_path / "s")
    assert not (tmp_path / "s").exists()
    assert not (tmp_path / "log.txt").exists()


# ---------------------------------------------------------------- load_rknn
def test_load_rknn_returns(rt: Case, tmp_path: Path) -> None:
    r = rt.make()
    assert r.load_rknn(str(rt.model)) == 0
    assert r.load_rknn("") == -1
    assert r.load_rknn(str(tmp_path / "missing.rknn")) == -1
    with pytest.raises(TypeError):
        r.load_rknn(None)


def test_bad_model_fails_in_init_not_load(cpu: Case, model_dir: Path) -> None:
    r = cpu.make()
    assert r.load_rknn(str(model_dir / "corrupt.onnx")) == 0
    assert r.init_runtime() == -1
    assert r.inference(inputs=cpu.sample()) is None


def test_rknn_file_runs_from_onnx_beside_it(cpu: Case, tmp_path: Path) -> None:
    onnx_path = M.nhwc_uint8_model(tmp_path, name="net.onnx")
    rknn = M.fake_rknn(onnx_path)
    r = ready(cpu, rknn)
    x = cpu.sample()
    np.testing.assert_allclose(r.inference(inputs=x)[0], M.nhwc_uint8_reference(x[0]), rtol=1e-5)


def test_rknn_without_onnx_fails_init_saying_what_to_put_where(
    cpu: Case, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    rknn = M.fake_rknn(tmp_path / "lonely.onnx")
    r = cpu.make()
    assert r.load_rknn(str(rknn)) == 0
    assert r.init_runtime() == -1
    err = capfd.readouterr().err
    assert "E RKNN:" in err and "lonely.onnx" in err and str(tmp_path) in err


# ---------------------------------------------------------------- init_runtime, lifecycle
def test_init_without_model_fails(rt: Case) -> None:
    assert rt.make().init_runtime() == -1


def test_init_with_target_fails_on_cpu_runtimes(cpu: Case) -> None:
    r = cpu.make()
    r.load_rknn(str(cpu.model))
    assert r.init_runtime(target="rk3588") == -1


def test_inference_before_init_returns_none_with_e_line(
    rt: Case, capfd: pytest.CaptureFixture
) -> None:
    r = rt.make()
    r.load_rknn(str(rt.model))
    assert r.inference(inputs=rt.sample()) is None
    if rt.kind != "board":
        assert "E RKNN:" in capfd.readouterr().err


def test_release_is_idempotent_and_allows_reinit(rt: Case) -> None:
    r = ready(rt)
    assert isinstance(r.inference(inputs=rt.sample()), list)
    assert r.release() is None
    r.release()
    assert r.inference(inputs=rt.sample()) is None
    assert r.get_sdk_version() is None
    assert r.init_runtime() == 0  # model bytes were kept
    assert isinstance(r.inference(inputs=rt.sample()), list)
    r.release()


def test_init_again_replaces_the_runtime(rt: Case) -> None:
    r = ready(rt)
    assert r.init_runtime() == 0
    assert isinstance(r.inference(inputs=rt.sample()), list)
    r.release()


# ---------------------------------------------------------------- sdk version, platforms
def test_sdk_version_only_while_initialised(rt: Case) -> None:
    r = rt.make()
    assert r.get_sdk_version() is None
    r.load_rknn(str(rt.model))
    assert r.get_sdk_version() is None
    r.init_runtime()
    text = r.get_sdk_version()
    assert isinstance(text, str) and "API" in text and "DRV" in text and "\n" in text
    r.release()
    assert r.get_sdk_version() is None


def test_sdk_text_names_the_runtime(cpu: Case) -> None:
    import onnxruntime

    text = ready(cpu).get_sdk_version()
    assert f"onnxruntime {onnxruntime.__version__}" in text
    if cpu.kind == "sim":
        assert "batchinfer sim" in text and "emulated rk3588" in text


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


def test_list_devices_is_empty(cpu: Case) -> None:
    assert cpu.make().list_devices() == ([], [])


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


def test_inference_never_raises(cpu: Case) -> None:
    r = ready(cpu)
    for bad in (None, ["text"], [np.zeros((1, 8, 8, 1), np.uint8)] * 2, [], 5):
        assert r.inference(inputs=bad) is None
    assert r.inference(inputs=cpu.sample(), data_type=["uint8", "uint8"]) is None


def test_non_list_inputs_only_warn(cpu: Case, capfd: pytest.CaptureFixture) -> None:
    r = ready(cpu)
    x = cpu.sample()[0]
    assert isinstance(r.inference(inputs=(x,)), list)
    assert "W RKNN:" in capfd.readouterr().err


def test_log_goes_to_verbose_file(cpu: Case, tmp_path: Path) -> None:
    log = tmp_path / "rknn.log"
    r = ready(cpu, verbose=True, verbose_file=str(log))
    r.inference(inputs=[np.zeros((8, 8, 1), np.uint8)])
    text = log.read_text()
    assert "E RKNN:" in text and "need 4dims input, but 3dims" in text


# ---------------------------------------------------------------- input rules
def test_float64_is_rejected(rt: Case, capfd: pytest.CaptureFixture) -> None:
    r = ready(rt)
    x = rt.sample()[0].astype(np.float64)
    assert r.inference(inputs=[x]) is None
    if rt.kind != "board":
        assert "float64" in capfd.readouterr().err


def test_missing_batch_axis_is_rejected(rt: Case, capfd: pytest.CaptureFixture) -> None:
    r = ready(rt)
    x = rt.sample()[0]
    assert r.inference(inputs=[x[0]]) is None
    if rt.kind != "board":
        assert f"need {x.ndim}dims input, but {x.ndim - 1}dims" in capfd.readouterr().err


def test_wrong_size_is_rejected(cpu: Case) -> None:
    assert ready(cpu).inference(inputs=[np.zeros((1, 9, 8, 1), np.uint8)]) is None


@pytest.mark.parametrize("dtype", C.SUPPORTED_DTYPES)
def test_every_supported_dtype_is_converted(cpu: Case, dtype: str) -> None:
    r = ready(cpu)
    x = (np.arange(64).reshape(1, 8, 8, 1) % 2).astype(dtype)  # 0/1 fits every dtype
    out = r.inference(inputs=[x], data_type=dtype)
    np.testing.assert_allclose(out[0], M.nhwc_uint8_reference(x.astype(np.uint8)), rtol=1e-4)


def test_data_type_must_equal_array_dtype(cpu: Case, capfd: pytest.CaptureFixture) -> None:
    r = ready(cpu)
    x = cpu.sample()
    assert r.inference(inputs=x, data_type="float32") is None
    assert "data_type" in capfd.readouterr().err
    assert isinstance(r.inference(inputs=x, data_type="uint8"), list)
    assert isinstance(r.inference(inputs=x, data_type=["uint8"]), list)


def test_nhwc_data_for_an_nchw_model_is_transposed(cpu: Case, model_dir: Path) -> None:
    r = ready(cpu, model_dir / "nchw_float.onnx")
    x = np.random.default_rng(1).random((1, 3, 8, 8), dtype=np.float32)
    expected = M.nchw_float_reference(x)
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    np.testing.assert_allclose(r.inference(inputs=[nhwc])[0], expected, rtol=1e-5)
    np.testing.assert_allclose(
        r.inference(inputs=[nhwc], data_format="nhwc")[0], expected, rtol=1e-5
    )
    np.testing.assert_allclose(r.inference(inputs=[x], data_format="nchw")[0], expected, rtol=1e-5)
    # NCHW data without saying so has the wrong shape for the NHWC view.
    assert r.inference(inputs=[x]) is None


def test_nchw_data_for_an_nhwc_model_is_transposed_with_warning(
    cpu: Case, capfd: pytest.CaptureFixture
) -> None:
    r = ready(cpu)
    x = cpu.sample()[0]
    out = r.inference(inputs=[np.ascontiguousarray(x.transpose(0, 3, 1, 2))], data_format="nchw")
    np.testing.assert_allclose(out[0], M.nhwc_uint8_reference(x), rtol=1e-5)
    assert "W RKNN:" in capfd.readouterr().err


def test_bad_data_format_is_rejected(cpu: Case) -> None:
    assert ready(cpu).inference(inputs=cpu.sample(), data_format="hwc") is None


def test_pass_through_sends_the_buffer_unconverted(cpu: Case, model_dir: Path) -> None:
    r = ready(cpu, model_dir / "nchw_float.onnx")
    x = np.random.default_rng(2).random((1, 3, 8, 8), dtype=np.float32)
    out = r.inference(inputs=[x], inputs_pass_through=[1])
    np.testing.assert_allclose(out[0], M.nchw_float_reference(x), rtol=1e-5)
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    assert r.inference(inputs=[nhwc], inputs_pass_through=[1]) is None  # wrong layout
    as_u8 = (x * 255).astype(np.uint8)
    assert r.inference(inputs=[as_u8], inputs_pass_through=[1]) is None  # wrong dtype
    assert r.inference(inputs=[as_u8], data_format="nchw", inputs_pass_through=[0]) is not None


# ---------------------------------------------------------------- outputs, frame id
def test_reuse_outputs_returns_views_that_the_next_call_overwrites(rt: Case) -> None:
    r = ready(rt)
    first = r.inference(inputs=rt.sample(), reuse_outputs=True)
    kept = [o.copy() for o in first]
    second = r.inference(inputs=rt.sample(), reuse_outputs=True)
    assert all(np.shares_memory(a, b) for a, b in zip(first, second, strict=True))
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    if rt.kind != "board":  # different random inputs give different outputs
        assert not np.array_equal(first[0], kept[0])


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
    ("rk3588", 5, -1, (), "E RKNN: [.*] init_runtime: The core mode 5 is not supported"),
    ("rk3588", 6, -1, (), "The core mode 6 is not supported currently."),
    ("rk3576", C.NPU_CORE_AUTO, 0, (), None),
    ("rk3576", C.NPU_CORE_1, 0, (1,), None),
    ("rk3576", C.NPU_CORE_2, 0, (0,), "W RKNN:"),
    ("rk3576", C.NPU_CORE_0_1_2, 0, (0, 1), "W RKNN:"),
    ("rk3576", C.NPU_CORE_ALL, 0, (0, 1), None),
    ("rk3576", 6, -1, (), "The core mode 6 is not supported currently."),
    ("rk3566", C.NPU_CORE_AUTO, 0, (), None),
    ("rk3566", C.NPU_CORE_0, -1, (), "The core_mask is only supported by ['RK3588', 'RK3576']"),
    ("rk3566", C.NPU_CORE_ALL, -1, (), "only supported by"),
]


@pytest.mark.parametrize(("chip", "mask", "ret", "cores", "log"), SIM_MASKS)
def test_sim_core_mask_rules(
    model_dir: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture,
    chip: str,
    mask: int,
    ret: int,
    cores: tuple[int, ...],
    log: str | None,
) -> None:
    make = _factory("sim", tmp_path)
    r = make(chip=chip)
    r.load_rknn(str(model_dir / "nhwc_uint8.onnx"))
    assert r.init_runtime(core_mask=mask) == ret
    assert r.cores == cores
    err = capfd.readouterr().err
    if log is None:
        assert "RKNN:" not in err
    elif "[.*]" in log:
        head, tail = log.split("[.*]")
        assert head in err and tail in err
    else:
        assert log in err
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

input_data = np.zeros((1, 8, 8, 1), dtype=np.uint8)
outputs = rknn_lite.inference(inputs=[input_data])
print('top1', int(np.argmax(outputs[0])))
print(rknn_lite.get_sdk_version())

rknn_lite.release()
"""


def test_a_users_rknnlite_script_runs_on_sim_with_only_the_import_changed(
    model_dir: Path, tmp_path: Path
) -> None:
    model = M.fake_rknn(model_dir / "nhwc_uint8.onnx")
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
    expected = int(np.argmax(M.nhwc_uint8_reference(np.zeros((1, 8, 8, 1), np.uint8))))
    assert f"top1 {expected}" in proc.stdout
    assert "batchinfer sim" in proc.stdout
