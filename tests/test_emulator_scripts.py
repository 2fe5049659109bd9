"""RKNNLite scripts in public clients' styles, run unchanged on the emulator.

Each script in tests/rknnlite_scripts/ imports ``from rknnlite.api import RKNNLite`` as on
a board and runs under ``python -m batchinfer.runtime.emulate`` (only that import is
redirected). Every output is compared with ONNX Runtime on the correctly normalised input
(or on the QDQ model's input), which is what a board computes up to its quantisation.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import emulator_models as EM  # tests/ is on sys.path under pytest (no tests/__init__.py)
import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parent / "rknnlite_scripts"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return tmp_path


def run(
    work: Path,
    script: str,
    *args: object,
    board: str | None = None,
    flags: tuple[str, ...] = (),
    **env: str,
):
    """Run a script unchanged under the emulator; the finished process (checked by callers)."""
    cmd = [sys.executable, "-m", "batchinfer.runtime.emulate", *flags]
    if board:
        cmd += ["--board", board]
    cmd += [str(SCRIPTS / script), *map(str, args)]
    full_env = {
        **os.environ,
        "BATCHINFER_SIM_STATE": str(work / "state"),
        "BATCHINFER_SIM_FAULTS": "",
        "BATCHINFER_SIM_NPU_MS": "0",
        "BATCHINFER_SIM_HOST_MS": "0",
        **env,
    }
    full_env.pop("BATCHINFER_SIM_CHIP", None)
    if "BATCHINFER_SIM_RENAME_LOG_LEVELS" not in env:
        full_env.pop("BATCHINFER_SIM_RENAME_LOG_LEVELS", None)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=full_env)


def image(work: Path, shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, Path]:
    pixels = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    path = work / f"image{seed}.npy"
    np.save(path, pixels)
    return pixels, path


def imagenet_classifier(work: Path, **kw: object) -> tuple[Path, Path]:
    onnx_path = EM.conv_classifier(work, **kw)  # type: ignore[arg-type]
    rknn = EM.rknn_for(
        onnx_path,
        mean_values=[EM.IMAGENET_MEAN],
        std_values=[EM.IMAGENET_STD],
        target_platform="rk3588",
        quantized_dtype="w8a8",
    )
    return onnx_path, rknn


def test_resnet18_style_classifier_with_mean_std_baked_in(work: Path) -> None:
    onnx_path, rknn = imagenet_classifier(work)
    pixels, img = image(work, (16, 16, 3))
    proc = run(work, "resnet18_classifier.py", rknn, img, work / "out.npy", board="rk3588")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "-----TOP 5-----" in proc.stdout
    expected = EM.ort(
        onnx_path, input=EM.nchw_normalised(pixels[None], EM.IMAGENET_MEAN, EM.IMAGENET_STD)
    )[0]
    np.testing.assert_allclose(np.load(work / "out.npy"), expected, rtol=1e-5, atol=1e-5)
    # Fed without its normalisation (the emulator's old behaviour) it would be far off.
    raw = EM.ort(onnx_path, input=np.ascontiguousarray(pixels[None].transpose(0, 3, 1, 2), "f4"))
    assert not np.allclose(raw[0], expected, rtol=0.1)


@pytest.mark.skipif(platform.machine() == "aarch64", reason="this machine passes the check")
def test_the_same_script_stops_at_its_platform_check_without_board(work: Path) -> None:
    _, rknn = imagenet_classifier(work)
    _, img = image(work, (16, 16, 3))
    proc = run(work, "resnet18_classifier.py", rknn, img, work / "out.npy")
    assert proc.returncode == 255
    assert f"cannot run on the current platform: Linux-{platform.machine()}" in proc.stdout


def test_nchw_dynamic_shape_script_runs_the_compiled_shapes_only(work: Path) -> None:
    onnx_path = EM.conv_classifier(work, dynamic_hw=True)
    compiled = (12, 16, 20)
    rknn = EM.rknn_for(
        onnx_path,
        mean_values=[[0, 0, 0]],
        std_values=[[255, 255, 255]],
        dynamic_input=[[[1, 3, s, s]] for s in compiled],
    )
    pixels, img = image(work, (24, 24, 3))
    proc = run(work, "dynamic_shape_nchw.py", rknn, img, work / "out.npz", *compiled, 14)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = np.load(work / "out.npz")
    for size in compiled:
        crop = pixels[None, :size, :size]
        expected = EM.ort(onnx_path, input=EM.nchw_normalised(crop, [0.0] * 3, [255.0] * 3))[0]
        np.testing.assert_allclose(out[str(size)], expected, rtol=1e-5, atol=1e-6)
    assert out["14"].size == 0  # 14 x 14 was not compiled into the model
    assert "[1,14,14,3] is not a shape this dynamic-shape model was compiled for" in proc.stderr
    assert "W The input[0] need NHWC data format, but NCHW set" in proc.stderr


def test_thread_pool_pinned_to_cores_0_1_2(work: Path) -> None:
    onnx_path, rknn = imagenet_classifier(work)
    frames = np.random.default_rng(5).integers(0, 256, (8, 16, 16, 3), dtype=np.uint8)
    np.save(work / "frames.npy", frames)
    proc = run(
        work,
        "thread_pool.py",
        rknn,
        work / "frames.npy",
        work / "out.npy",
        3,
        BATCHINFER_SIM_NPU_MS="1",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    normalised = [EM.nchw_normalised(f[None], EM.IMAGENET_MEAN, EM.IMAGENET_STD) for f in frames]
    expected = np.concatenate([EM.ort(onnx_path, input=x)[0] for x in normalised])
    np.testing.assert_allclose(np.load(work / "out.npy"), expected, rtol=1e-5, atol=1e-5)


def test_pool_that_lowers_the_logger_and_reads_shapes_from_the_runtime(work: Path) -> None:
    onnx_path, rknn = imagenet_classifier(work, size=12)
    pixels, img = image(work, (16, 16, 3))
    proc = run(work, "shape_reading_pool.py", rknn, img, work / "out.npz", 2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "instance 0: input input [1, 12, 12, 3] uint8" not in proc.stdout  # float model
    assert "instance 0: input input [1, 12, 12, 3] float16, 1 output(s)" in proc.stdout
    # Only the version line of each constructor shows: it comes before setLevel, as on a board.
    lines = proc.stderr.splitlines()
    assert lines == ["W rknn-toolkit-lite2 version: 2.5.0"] * 2, proc.stderr
    out = np.load(work / "out.npz")
    expected = EM.ort(
        onnx_path,
        input=EM.nchw_normalised(pixels[None, :12, :12], EM.IMAGENET_MEAN, EM.IMAGENET_STD),
    )[0]
    for k in range(2):
        assert out[f"dims{k}"].tolist() == [1, 12, 12, 3]
        np.testing.assert_allclose(out[f"out{k}"], expected, rtol=1e-5, atol=1e-5)


def test_pass_through_of_a_float_model_takes_float16_nhwc(work: Path) -> None:
    onnx_path = EM.conv_classifier(work, name="face.onnx")
    rknn = EM.rknn_for(onnx_path, mean_values=[[127.5] * 3], std_values=[[127.5] * 3])
    pixels, img = image(work, (1, 16, 16, 3))
    proc = run(work, "pass_through.py", rknn, img, work / "out.npz", 127.5, 127.5)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = np.load(work / "out.npz")
    normalised = EM.nchw_normalised(pixels, [127.5] * 3, [127.5] * 3)
    np.testing.assert_allclose(
        out["normal"], EM.ort(onnx_path, input=normalised)[0], rtol=1e-5, atol=1e-5
    )
    as_fp16 = normalised.astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(
        out["passed"], EM.ort(onnx_path, input=as_fp16)[0], rtol=1e-5, atol=1e-5
    )


def test_pass_through_of_a_qdq_model_takes_its_int8_and_matches_the_normal_path(
    work: Path,
) -> None:
    float_path = EM.conv_classifier(work, name="float.onnx")
    rng = np.random.default_rng(11)
    samples = [
        EM.nchw_normalised(rng.integers(0, 256, (1, 16, 16, 3), np.uint8), [127.5] * 3, [127.5] * 3)
        for _ in range(16)
    ]
    qdq = EM.qdq_model(float_path, work / "face_int8.onnx", samples)
    rknn = EM.rknn_for(qdq, mean_values=[[127.5] * 3], std_values=[[127.5] * 3])
    pixels, img = image(work, (1, 16, 16, 3), seed=3)
    proc = run(work, "pass_through.py", rknn, img, work / "out.npz", 127.5, 127.5)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = np.load(work / "out.npz")
    assert out["buffer"].dtype == np.int8
    normalised = EM.nchw_normalised(pixels, [127.5] * 3, [127.5] * 3)
    expected = EM.ort(qdq, input=normalised)[0]
    np.testing.assert_allclose(out["normal"], expected, rtol=1e-6, atol=1e-6)
    # The script quantised exactly as the model's first QuantizeLinear does.
    np.testing.assert_array_equal(out["passed"], out["normal"])
    # Quantisation error shows: close to the float model, not equal to it.
    float_out = EM.ort(float_path, input=normalised)[0]
    assert not np.array_equal(expected, float_out)
    np.testing.assert_allclose(expected, float_out, atol=0.15 * np.abs(float_out).max())


def _low_level_pipeline(work: Path, **kw: object):
    onnx_path, rknn = imagenet_classifier(work, size=12)
    frames = np.random.default_rng(7).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    np.save(work / "frames.npy", frames)
    proc = run(work, "low_level_pipeline.py", rknn, work / "frames.npy", work / "out.npz", **kw)
    return onnx_path, frames, proc


def test_script_importing_rknn_lite_module_drives_the_runtime_directly(work: Path) -> None:
    # The level names kept, so the script's last setLevel("INFO") works and it ends.
    onnx_path, frames, proc = _low_level_pipeline(work, flags=("--keep-log-levels",))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "INFO input 12x12, 4 frames" in proc.stderr and "INFO done" in proc.stderr
    out = np.load(work / "out.npz")
    expected = np.concatenate(
        [
            EM.ort(
                onnx_path,
                input=EM.nchw_normalised(f[None, :12, :12], EM.IMAGENET_MEAN, EM.IMAGENET_STD),
            )[0]
            for f in frames
        ]
    )
    np.testing.assert_allclose(out["low"], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out["low"], out["inference"])


@pytest.mark.parametrize("how", ["default", "flag", "env"])
def test_renamed_log_levels_break_a_script_here_as_on_a_board(work: Path, how: str) -> None:
    # The real import renames the levels (rknn-toolkit-lite2 2.5.0; airockchip/rknn-toolkit2
    # #414): the app's later setLevel("INFO") fails, on a board and, by default, here; its
    # own lines now carry the letters. The flag and the env var still force it on.
    if how == "default":
        _, _, proc = _low_level_pipeline(work)
    elif how == "flag":
        _, _, proc = _low_level_pipeline(
            work, flags=("--rename-log-levels",), BATCHINFER_SIM_RENAME_LOG_LEVELS="0"
        )
    else:
        _, _, proc = _low_level_pipeline(work, BATCHINFER_SIM_RENAME_LOG_LEVELS="1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ValueError: Unknown level: 'INFO'" in proc.stderr
    assert "I input 12x12, 4 frames" in proc.stderr
    assert (work / "out.npz").exists()  # everything before that line ran


@pytest.mark.parametrize("how", ["flag", "env"])
def test_level_names_can_be_kept(work: Path, how: str) -> None:
    if how == "flag":
        _, _, proc = _low_level_pipeline(work, flags=("--keep-log-levels",))
    else:
        _, _, proc = _low_level_pipeline(work, BATCHINFER_SIM_RENAME_LOG_LEVELS="0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "INFO done" in proc.stderr
