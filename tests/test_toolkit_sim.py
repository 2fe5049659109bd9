"""The toolkit backend against rknn-toolkit2 itself (``toolkit`` marker).

Run in the toolkit's environment: ``bash tools/toolkit-env.sh && .venv-toolkit/bin/pytest
-m toolkit``. Skipped wherever ``rknn.api`` cannot be imported.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from batchinfer import demo
from batchinfer.runtime import constants as C
from batchinfer.runtime.rknn_file import read_rknn_metadata

pytestmark = pytest.mark.toolkit


def _toolkit_importable() -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import rknn.api  # noqa: F401
        except Exception:
            return False
    return True


if not _toolkit_importable():
    pytest.skip(
        "rknn-toolkit2 is not installed here (bash tools/toolkit-env.sh makes its environment)",
        allow_module_level=True,
    )

from batchinfer.runtime import toolkit as T  # noqa: E402  (after the skip)

TOOL = Path(__file__).resolve().parents[1] / "tools" / "build_demo_assets.py"
MEASURED = json.loads((demo.ASSETS / "measured.json").read_text())


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    """One build cache for the module (builds are shared between its tests)."""
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("toolkit-cache")
        mp.setenv(T.CACHE_ENV, str(root))
        yield root


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> Path:
    folder = tmp_path_factory.mktemp("models")
    for stem in ("digits-rk3588", "digits-lowcal-rk3566"):
        demo.write_rknn_model(folder, stem)
    return folder


def _ready(path: Path, **init: object) -> T.RKNNLite:
    r = T.RKNNLite()
    assert r.load_rknn(str(path)) == 0
    assert r.init_runtime(**init) == 0
    return r


def _probs(r: T.RKNNLite, pixels: np.ndarray) -> np.ndarray:
    return np.concatenate([r.inference(inputs=[p.reshape(1, 8, 8, 1)])[0] for p in pixels])


@pytest.fixture(scope="module")
def held_out() -> tuple[np.ndarray, np.ndarray]:
    images, labels = demo.load_digits()
    split = demo.test_split()
    return images[split], labels[split]


@pytest.mark.parametrize("stem", ["digits-rk3588", "digits-lowcal-rk3566"])
def test_demo_rknn_gives_its_recorded_accuracy(models: Path, held_out, stem: str) -> None:
    pixels, labels = held_out
    r = _ready(models / f"{stem}.rknn")
    try:
        accuracy = float((_probs(r, pixels).argmax(1) == labels).mean())
    finally:
        r.release()
    assert accuracy == pytest.approx(MEASURED["rknn"]["models"][stem]["top1_test"], abs=1e-12)


def test_the_cached_build_computes_what_a_plain_build_does(models: Path, held_out) -> None:
    pixels = held_out[0][:60]
    r = _ready(models / "digits-rk3588.rknn")
    try:
        ours = _probs(r, pixels)
    finally:
        r.release()
    model = T.toolkit_model(models / "digits-rk3588.rknn")
    rknn = T.load_rknn_class()(verbose=False)
    with T.quiet():
        assert rknn.config(**model.settings) == 0
        assert rknn.load_onnx(model=str(model.onnx)) == 0
        dataset = model.onnx.parent / "absolute.txt"
        dataset.write_text("".join(f"{s[0]}\n" for s in model.dataset))
        assert rknn.build(do_quantization=True, dataset=str(dataset)) == 0
        assert rknn.init_runtime() == 0
        plain = np.concatenate(
            [
                rknn.inference(inputs=[p.reshape(1, 8, 8, 1)], data_format=["nhwc"])[0]
                for p in pixels
            ]
        )
        rknn.release()
    np.testing.assert_array_equal(ours, plain)
    # ... and the quantisation is real: not the float model's outputs.
    float_probs = _digits_float(pixels)
    assert np.abs(ours - float_probs).max() > 1e-4


def _digits_float(pixels: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(
        str(demo.model_path("digits")), providers=["CPUExecutionProvider"]
    )
    return np.concatenate(
        [session.run(["probs"], {"image": p.reshape(1, 8, 8, 1)})[0] for p in pixels]
    )


def test_a_build_is_made_once_and_found_again(models: Path, tmp_path: Path, cache: Path) -> None:
    model = T.toolkit_model(models / "digits-rk3588.rknn")
    entry = T.ensure_build(model)
    record = json.loads((entry / "build.json").read_text())
    assert record["fingerprint"] == T.fingerprint(model)
    assert record["calibration_samples"] == 100 and record["toolkit"] == T.toolkit_version()
    stamp = (entry / "build.json").stat().st_mtime_ns
    _ready(models / "digits-rk3588.rknn").release()
    assert (entry / "build.json").stat().st_mtime_ns == stamp  # not built again
    # Other settings, another build.
    folder = tmp_path / "mmse"
    folder.mkdir()
    demo.write_rknn_model(folder, "digits-rk3588")
    settings_path = folder / "digits-rk3588.config.json"
    settings = json.loads(settings_path.read_text())
    settings_path.write_text(json.dumps({**settings, "quantized_algorithm": "mmse"}))
    other = T.ensure_build(T.toolkit_model(folder / "digits-rk3588.rknn"))
    assert other != entry and other.parent == cache


def test_inference_gives_the_answers_of_rknnlite(models: Path, capsys) -> None:
    r = _ready(models / "digits-rk3588.rknn")
    image = demo.load_digits()[0][7].reshape(1, 8, 8, 1)
    try:
        want = r.inference(inputs=[image])[0]
        assert want.dtype == np.float32 and want.shape == (1, 10)
        floats = r.inference(inputs=[image.astype(np.float32)])[0]
        np.testing.assert_array_equal(floats, want)
        nchw = r.inference(inputs=[image.transpose(0, 3, 1, 2)], data_format="nchw")[0]
        np.testing.assert_array_equal(nchw, want)
        capsys.readouterr()
        # Where the simulator is lenient, the board is not: neither is this backend.
        for inputs, kwargs, said in [
            ([image[0]], {}, "need 4dims input, but 3dims"),
            ([image.astype(np.float64)], {}, "dtype float64 is not supported"),
            ([image, image], {}, "needs 1 inputs, but 2 inputs"),
            ([image], {"data_type": "float32"}, "does not match the array dtype"),
            ([image], {"data_format": "hwcn"}, "data_format 'hwcn' is invalid"),
            ([image], {"inputs_pass_through": [1]}, "inputs_pass_through is not supported"),
            ([np.zeros((1, 9, 9, 1), np.uint8)], {}, "simulator failed"),
        ]:
            assert r.inference(inputs=inputs, **kwargs) is None
            assert said in capsys.readouterr().err
        first = r.inference(inputs=[image], reuse_outputs=True)[0]
        second = r.inference(inputs=[image], reuse_outputs=True)[0]
        assert np.shares_memory(first, second)
        out = r.inference(inputs=image, get_frame_id=True)  # not a list: a warning
        assert "inputs should be a list" in capsys.readouterr().err
        assert isinstance(out[-1], int) and out[-1] > 1
        np.testing.assert_array_equal(out[0], want)
    finally:
        r.release()
        r.release()  # idempotent
    assert r.inference(inputs=[image]) is None


def test_sdk_text_says_it_has_no_timing(models: Path) -> None:
    r = T.RKNNLite()
    assert r.load_rknn(str(models / "digits-lowcal-rk3566.rknn")) == 0
    assert r.get_sdk_version() is None
    assert r.init_runtime() == 0
    try:
        text = r.get_sdk_version()
    finally:
        r.release()
    assert "rknn-toolkit2 simulator, rk3566 numerics" in text
    assert "no timing model" in text


def test_core_masks_are_checked_and_recorded(models: Path, capsys) -> None:
    r = T.RKNNLite()
    assert r.load_rknn(str(models / "digits-rk3588.rknn")) == 0
    try:
        assert r.init_runtime(core_mask=C.NPU_CORE_0_1_2) == 0 and r.core_mask == 7
        assert r.init_runtime(core_mask=5) == -1
        assert "core mode 5 is not supported" in capsys.readouterr().err
    finally:
        r.release()


def test_bad_settings_and_failed_builds_are_said_in_one_line(
    models: Path, tmp_path: Path, capsys
) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    demo.write_rknn_model(folder, "digits-rk3566")
    settings_path = folder / "digits-rk3566.config.json"
    settings = json.loads(settings_path.read_text())
    settings_path.write_text(json.dumps({**settings, "mean_value": [[0]]}))
    r = T.RKNNLite()
    assert r.load_rknn(str(folder / "digits-rk3566.rknn")) == 0
    assert r.init_runtime() == -1
    assert "'mean_value', which rknn.config() does not take" in capsys.readouterr().err

    settings_path.write_text(json.dumps({**settings, "target_platform": "rk3588"}))
    np.save(folder / "wrong.npy", np.zeros((1, 8, 8, 1), np.float32))  # NHWC: refused
    (folder / "digits-rk3566.dataset.txt").write_text("wrong.npy\n")
    assert r.init_runtime() == -1
    err = capsys.readouterr().err
    # The .rknn says rk3566, the settings rk3588: said, then the build fails and says why.
    assert "converted for ['rk3566'] but digits-rk3566.config.json says rk3588" in err
    assert "rknn-toolkit2 could not build digits-rk3566.onnx" in err
    log = Path(err.split("its whole log is ")[1].split()[0].rstrip("."))
    assert log.is_file() and "wrong.npy" in log.read_text()


def test_a_rebuilt_demo_rknn_says_what_the_committed_one_says(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("build_demo_assets", TOOL)
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool
    try:
        spec.loader.exec_module(tool)
        rebuilt = tool.convert("pool224-rk3566", tmp_path)
    finally:
        del sys.modules[spec.name]
    committed = demo.ASSETS / "pool224-rk3566.rknn"
    # The bytes differ (the toolkit writes addresses into them); the description does not.
    assert read_rknn_metadata(rebuilt).raw == read_rknn_metadata(committed).raw
    assert rebuilt.stat().st_size == committed.stat().st_size


def test_metadata_of_a_toolkit_model_over_one_mib(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    weights = (rng.standard_normal((1024, 1536)) * 0.03).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1536])],
        [numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "big.onnx")
    for i in range(4):
        np.save(tmp_path / f"c{i}.npy", rng.standard_normal((1, 1024)).astype(np.float32))
    (tmp_path / "list.txt").write_text("".join(f"{tmp_path / f'c{i}.npy'}\n" for i in range(4)))
    rknn = T.load_rknn_class()(verbose=False)
    with T.quiet():
        assert rknn.config(target_platform="rk3576") == 0
        assert rknn.load_onnx(model=str(tmp_path / "big.onnx")) == 0
        assert rknn.build(do_quantization=True, dataset=str(tmp_path / "list.txt")) == 0
        assert rknn.export_rknn(str(tmp_path / "big.rknn")) == 0
        rknn.release()
    assert os.path.getsize(tmp_path / "big.rknn") > 1 << 20
    meta = read_rknn_metadata(tmp_path / "big.rknn")
    assert meta.platforms == ("rk3576",)
    assert [(t.name, t.shape, t.dtype) for t in meta.inputs] == [("x", (1, 1024), "int8")]
    assert [(t.name, t.shape) for t in meta.outputs] == [("y", (1, 1536))]


def test_a_run_on_the_toolkit_backend_gives_the_simulators_predictions(
    models: Path, demo_kit, tmp_path: Path
) -> None:
    from runs import config

    from batchinfer import run
    from batchinfer.results import read_predictions

    model = models / "digits-lowcal-rk3566.rknn"
    result = run(
        config(
            demo_kit.dataset,
            model,
            limit=300,
            backend="toolkit",
            instances_per_core=2,
            out=tmp_path / "out",
        )
    )
    assert (result.status, result.errors) == ("complete", 0)
    table = read_predictions(result.out)
    assert table.num_rows == 300
    images, _ = demo.load_digits()
    index = np.array([int(Path(i).stem) for i in table["id"].to_pylist()])
    r = _ready(model)
    try:
        direct = _probs(r, images[index]).argmax(1)
    finally:
        r.release()
    np.testing.assert_array_equal(table["pred"].to_numpy(), direct)
    manifest = json.loads((result.out / "manifest.json").read_text())
    assert all("no timing model" in v for v in manifest["sdk_versions"].values())


def test_a_build_dies_with_the_process_that_started_it(models: Path, tmp_path: Path) -> None:
    import subprocess

    import psutil

    folder = tmp_path / "m"
    folder.mkdir()
    demo.write_rknn_model(folder, "pool224-rk3576")
    script = (
        "import sys; from batchinfer.runtime import toolkit as T; "
        "T.ensure_build(T.toolkit_model(sys.argv[1]))"
    )
    env = {**os.environ, T.CACHE_ENV: str(tmp_path / "cache")}
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(folder / "pool224-rk3576.rknn")], env=env
    )
    try:
        build = None
        deadline = time.monotonic() + 60
        while build is None and time.monotonic() < deadline and parent.poll() is None:
            children = psutil.Process(parent.pid).children()
            build = next((c for c in children if "build" in c.cmdline()), None)
            time.sleep(0.05)
        assert build is not None, "the build child never started"
        parent.kill()
        parent.wait()
        _, alive = psutil.wait_procs([build], timeout=10)
        assert not alive, "the build outlived the process that started it"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
