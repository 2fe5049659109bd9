"""Backend selection, model description, the real runtime's diagnosis, and the adapter."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import models as M  # tests/ is on sys.path under pytest (no tests/__init__.py)
import numpy as np
import pytest

from batchinfer.errors import InferenceError, ModelError, RuntimeUnavailableError, UsageError
from batchinfer.runtime import (
    BACKENDS,
    ModelInfo,
    TensorInfo,
    _level_names,
    describe_model,
    resolve_backend,
    runtime_class,
)
from batchinfer.runtime import rknnlite as rk
from batchinfer.runtime.adapter import RuntimeAdapter


# ---------------------------------------------------------------- backends
@pytest.mark.parametrize(
    ("backend", "model", "expected"),
    [
        ("auto", "m.rknn", "rknnlite"),
        ("auto", "dir/M.RKNN", "rknnlite"),
        ("auto", "m.onnx", "onnx"),
        ("sim", "m.rknn", "sim"),
        ("onnx", "m.rknn", "onnx"),
        ("rknnlite", "m.onnx", "rknnlite"),
    ],
)
def test_resolve_backend(backend: str, model: str, expected: str) -> None:
    assert resolve_backend(backend, Path(model)) == expected


def test_resolve_backend_refuses_unknowns() -> None:
    with pytest.raises(UsageError, match=r"runtime\.backend"):
        resolve_backend("auto", Path("m.tflite"))
    with pytest.raises(UsageError, match="auto, rknnlite, onnx, sim"):
        resolve_backend("tensorrt", Path("m.onnx"))


def test_runtime_class() -> None:
    from batchinfer.runtime import onnx, sim

    assert BACKENDS == ("auto", "rknnlite", "onnx", "sim", "toolkit")
    assert runtime_class("onnx") is onnx.RKNNLite
    assert runtime_class("sim") is sim.RKNNLite
    with pytest.raises(UsageError):
        runtime_class("auto")


def test_runtime_class_rknnlite_says_why_not_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rk.platform, "machine", lambda: "x86_64")
    with pytest.raises(
        RuntimeUnavailableError, match=r"runtime\.backend onnx or runtime\.backend sim"
    ):
        runtime_class("rknnlite")


# ---------------------------------------------------------------- the real runtime
def test_unavailable_reasons_name_the_remedy(tmp_path: Path) -> None:
    lib = tmp_path / "librknnrt.so"
    assert "aarch64" in rk.unavailable_reason("x86_64", True, lib)
    assert "pip install 'batchinfer[rk]'" in rk.unavailable_reason("aarch64", False, lib)
    assert str(lib) in rk.unavailable_reason("aarch64", True, lib)
    lib.write_bytes(b"")
    assert rk.unavailable_reason("aarch64", True, lib) is None


@pytest.fixture
def fake_rknnlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A stand-in rknnlite package that, like the real one, breaks logging level names."""
    pkg = tmp_path / "rknnlite"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "api.py").write_text(
        "import logging\n"
        "logging._levelToName.clear(); logging._levelToName.update({20: 'I', 30: 'W'})\n"
        "logging._nameToLevel.clear(); logging._nameToLevel.update({'I': 20, 'W': 30})\n"
        "class RKNNLite:\n    pass\n"
    )
    lib = tmp_path / "librknnrt.so"
    lib.write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(rk.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(rk, "LIBRKNNRT", lib)
    yield
    for name in ("rknnlite.api", "rknnlite"):
        sys.modules.pop(name, None)


def test_loading_rknnlite_restores_logging_level_names(fake_rknnlite: None) -> None:
    before = dict(logging._levelToName), dict(logging._nameToLevel)
    cls = rk.load_rknnlite_class()
    assert cls.__name__ == "RKNNLite" and cls.__module__ == "rknnlite.api"
    assert (dict(logging._levelToName), dict(logging._nameToLevel)) == before
    assert logging.getLevelName("INFO") == logging.INFO
    logging.getLogger("batchinfer.test").setLevel("INFO")  # the reported crash


def test_level_names_rename_like_rknnlite_and_restore() -> None:
    # _level_names is the one module touching logging's private tables: this fails loudly
    # on an interpreter where they changed.
    assert isinstance(logging._levelToName, dict) and isinstance(logging._nameToLevel, dict)
    saved = _level_names.snapshot()
    try:
        _level_names.rename_like_rknnlite()
        assert logging.getLevelNamesMapping() == {"C": 50, "E": 40, "W": 30, "I": 20, "D": 10}
        assert logging.getLevelName(logging.INFO) == "I"
        with pytest.raises(ValueError, match="Unknown level: 'INFO'"):
            logging.getLogger("batchinfer.test").setLevel("INFO")
    finally:
        _level_names.restore(saved)
    assert logging.getLevelName("INFO") == logging.INFO
    assert _level_names.snapshot() == saved


# ---------------------------------------------------------------- describe_model
def test_describe_nhwc_model(tmp_path: Path) -> None:
    path = M.nhwc_uint8_model(tmp_path)
    info = describe_model(path)
    assert info == ModelInfo(
        path,
        path,
        (TensorInfo("image", (1, 8, 8, 1), "uint8", "nhwc"),),
        (TensorInfo("logits", (1, 10), "float32", None),),
    )


def test_describe_nchw_model_reports_the_nhwc_view(tmp_path: Path) -> None:
    info = describe_model(M.nchw_float_model(tmp_path))
    assert info.inputs == (TensorInfo("input", (1, 8, 8, 3), "float32", "nchw"),)


def test_describe_reports_float32_outputs_and_rank2_inputs(tmp_path: Path) -> None:
    info = describe_model(M.two_output_model(tmp_path))
    assert info.inputs == (TensorInfo("x", (1, 4), "float32", None),)
    assert [(o.name, o.shape, o.dtype) for o in info.outputs] == [
        ("double", (1, 4), "float32"),
        ("argmax", (1, 1), "float32"),
    ]


def test_describe_dynamic_batch_is_one(tmp_path: Path) -> None:
    info = describe_model(M.nhwc_uint8_model(tmp_path, dynamic_batch=True, size=4, channels=3))
    assert info.inputs[0].shape == (1, 4, 4, 3)
    assert info.outputs[0].shape == (1, 10)


def test_describe_rknn_reads_the_onnx_beside_it(tmp_path: Path) -> None:
    onnx_path = M.nchw_float_model(tmp_path, name="net.onnx")
    info = describe_model(M.fake_rknn(onnx_path))
    assert info.path.suffix == ".rknn" and info.onnx_path == onnx_path
    assert info.inputs[0].shape == (1, 8, 8, 3)
    assert info.settings is None and not info.inputs[0].normalised_inside


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda d: d / "missing.onnx", "does not exist"),
        (lambda d: M.corrupt_model(d), "not a valid ONNX model"),
        (
            lambda d: M.fake_rknn(d / "alone.onnx"),
            "put alone.onnx beside it or pass preprocess.size",
        ),
        (lambda d: M.corrupt_model(d, name="m.tflite"), ".rknn or .onnx"),
    ],
)
def test_describe_errors(tmp_path: Path, make, words: str) -> None:
    with pytest.raises(ModelError, match=words):
        describe_model(make(tmp_path))


# ---------------------------------------------------------------- adapter
class Scripted:
    """An RKNNLite-shaped stub returning scripted values."""

    def __init__(self, load=0, init=0, outputs=None, sdk="API: x\nDRV: y") -> None:
        self.load, self.init, self.outputs, self.sdk = load, init, outputs, sdk
        self.calls: list = []

    def load_rknn(self, path):
        self.calls.append(("load", path))
        return self.load

    def init_runtime(self, core_mask=0):
        self.calls.append(("init", core_mask))
        if isinstance(self.init, Exception):
            raise self.init
        return self.init

    def inference(self, inputs, data_format=None, reuse_outputs=False):
        self.calls.append(("infer", reuse_outputs))
        return self.outputs

    def get_sdk_version(self):
        return self.sdk

    def release(self):
        self.calls.append(("release",))


def test_adapter_passes_success_through() -> None:
    out = [np.zeros(3, np.float32)]
    stub = Scripted(outputs=out)
    a = RuntimeAdapter(stub, core=1, model=Path("m.rknn"))
    a.load()
    a.init(2)
    assert a.infer([np.zeros(1)]) is out
    assert a.sdk_version() == "API: x\nDRV: y"
    a.set_current_item(4)  # the stub has no such method: ignored
    a.release()
    assert stub.calls == [("load", "m.rknn"), ("init", 2), ("infer", True), ("release",)]


def test_adapter_load_failure_is_a_model_error() -> None:
    with pytest.raises(ModelError, match=r"Model m.rknn could not be loaded"):
        RuntimeAdapter(Scripted(load=-1), core=0, model=Path("m.rknn")).load()


def test_adapter_init_failure_names_the_core() -> None:
    a = RuntimeAdapter(Scripted(init=-1), core=2, model=Path("m.rknn"))
    with pytest.raises(
        InferenceError, match=r"NPU core 2 could not be initialised.*-1.*runtime.cores"
    ):
        a.init(4)
    b = RuntimeAdapter(Scripted(init=RuntimeError("no npu")), core=None, model=Path("m"))
    with pytest.raises(InferenceError, match="could not be initialised"):
        b.init(0)


def test_adapter_none_from_inference_names_the_core() -> None:
    a = RuntimeAdapter(Scripted(outputs=None), core=1, model=Path("m.rknn"))
    with pytest.raises(InferenceError, match="Inference returned None on core 1"):
        a.infer([np.zeros(1)])


def test_adapter_drives_the_sim_with_item_faults(tmp_path: Path) -> None:
    from batchinfer.runtime.sim import RKNNLite

    model = M.nhwc_uint8_model(tmp_path)
    sim = RKNNLite(npu_ms=0, host_ms=0, faults="none:item=1", state_dir=tmp_path / "s")
    a = RuntimeAdapter(sim, core=0, model=model)
    a.load()
    a.init(RKNNLite.NPU_CORE_0)
    x = [np.zeros((1, 8, 8, 1), np.uint8)]
    a.set_current_item(0)
    first = a.infer(x)
    assert np.shares_memory(first[0], a.infer(x)[0])  # reuse_outputs by default
    a.set_current_item(1)
    with pytest.raises(InferenceError, match=r"None on core 0.*E log lines") as failed:
        a.infer(x)
    # The row carries the runtime's own line (librknnrt's, its time left out), not the
    # wrapper's "Catch exception" line that follows it.
    said = a.row_error(failed.value)
    assert said.startswith("inference() returned None: E RKNN: failed to submit!, op id: 0")
    assert "injected fault" in said and "[" not in said.split("E RKNN: ")[1][:2]
    a.set_current_item(2)
    a.infer(x)  # a call that works says nothing, and the next failure only its own line
    assert a._errors.line is None
    assert "batchinfer sim" in a.sdk_version()
    a.release()
    assert a.sdk_version() is None


def test_the_row_says_the_last_line_of_a_logged_traceback(tmp_path: Path) -> None:
    from batchinfer.runtime.sim import RKNNLite

    model = M.nhwc_uint8_model(tmp_path)
    sim = RKNNLite(npu_ms=0, host_ms=0, state_dir=tmp_path / "s")
    a = RuntimeAdapter(sim, core=0, model=model)
    a.load()
    a.init(RKNNLite.NPU_CORE_0)
    with pytest.raises(InferenceError) as failed:
        a.infer([np.zeros((1, 8, 8, 1), np.float64)])  # RKNNLite refuses float64
    said = a.row_error(failed.value)
    assert said.startswith("inference() returned None: E ") and "float64" in said, said
    assert "\n" not in said
    a.release()


def test_the_row_says_only_the_old_words_when_the_runtime_logged_nothing() -> None:
    a = RuntimeAdapter(Scripted(outputs=None), core=1, model=Path("m.rknn"))
    with pytest.raises(InferenceError) as failed:
        a.infer([np.zeros(1)])
    assert a.row_error(failed.value) == "inference() returned None"
    assert a.row_error(ValueError("bad")) == "inference failed on core 1: ValueError: bad"
