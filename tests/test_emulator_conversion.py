"""Conversion settings beside a .rknn, and what describe_model makes of them."""

from __future__ import annotations

import json
from pathlib import Path

import emulator_models as EM
import models as M  # tests/ is on sys.path under pytest (no tests/__init__.py)
import numpy as np
import pytest

from batchinfer.errors import ModelError
from batchinfer.runtime import TensorInfo, describe_model
from batchinfer.runtime.conversion import ConversionSettings, normalise, settings_path


# ---------------------------------------------------------------- the file
def test_settings_live_beside_the_rknn_with_the_same_stem(tmp_path: Path) -> None:
    rknn = tmp_path / "resnet18_for_rk3588.rknn"
    assert settings_path(rknn) == tmp_path / "resnet18_for_rk3588.config.json"
    assert ConversionSettings.load_beside(rknn) is None


def test_settings_hold_rknn_config_keywords_and_keep_unknown_ones(tmp_path: Path) -> None:
    cfg = dict(
        mean_values=[[123.675, 116.28, 103.53]],
        std_values=[[58.395, 57.12, 57.375]],
        quant_img_RGB2BGR=False,
        target_platform="rk3588",
        quantized_dtype="w8a8",
        quantized_algorithm="normal",
        optimization_level=3,
        some_future_key={"kept": True},
    )
    rknn = tmp_path / "m.rknn"
    with open(settings_path(rknn), "w") as fh:  # what a conversion script writes
        json.dump(cfg, fh)
    s = ConversionSettings.load_beside(rknn)
    assert s is not None and s.path == settings_path(rknn)
    assert s.mean(0) == (123.675, 116.28, 103.53) and s.std(0) == (58.395, 57.12, 57.375)
    assert s.mean(1) is None and s.normalises(0) and not s.normalises(1)
    assert (s.target_platform, s.quantized_dtype, s.quantized_algorithm) == (
        "rk3588",
        "w8a8",
        "normal",
    )
    assert s.quant_img_rgb2bgr == (False,) and s.dynamic_input is None
    assert s.raw == cfg  # unknown keys kept, ignored
    again = tmp_path / "copy.rknn"
    s.write_beside(again)
    assert ConversionSettings.load_beside(again).raw == cfg


def test_one_flat_list_is_one_inputs_values() -> None:
    s = ConversionSettings.from_dict({"mean_values": [0, 0, 0], "std_values": [255, 255, 255]})
    assert s.mean(0) == (0.0, 0.0, 0.0) and s.std(0) == (255.0, 255.0, 255.0)


@pytest.mark.parametrize(
    ("cfg", "words"),
    [
        ([1, 2], "JSON object"),
        ({"mean_values": "128"}, "mean_values must be a list"),
        ({"mean_values": [[1, "2", 3]]}, "mean_values must be a list"),
        ({"mean_values": [[True, 0, 0]]}, "mean_values must be a list"),
        ({"std_values": [[1, 0, 1]]}, "zero or non-finite"),
        ({"target_platform": 3588}, "target_platform must be a string"),
        ({"quant_img_RGB2BGR": "yes"}, "quant_img_RGB2BGR"),
        ({"dynamic_input": [[1, 3, 224, 224]]}, "dynamic_input must be a list of shape sets"),
        ({"dynamic_input": [[[1, 3, 0, 224]]]}, "dynamic_input"),
        ({"dynamic_input": [[[1, 3, 8, 8]], [[1, 3, 8, 8], [1, 4]]]}, "dynamic_input"),
    ],
)
def test_wrong_types_are_a_clear_model_error(cfg: object, words: str) -> None:
    with pytest.raises(ModelError, match=words):
        ConversionSettings.from_dict(cfg)  # type: ignore[arg-type]


def test_a_file_that_is_not_json_names_itself(tmp_path: Path) -> None:
    rknn = tmp_path / "m.rknn"
    settings_path(rknn).write_text("{mean_values: [[0, 0, 0]]}")
    with pytest.raises(ModelError, match=r"m\.config\.json is not valid JSON"):
        ConversionSettings.load_beside(rknn)


# ---------------------------------------------------------------- applying it
def test_normalise_is_per_channel_on_the_last_axis_without_reordering() -> None:
    x = np.array([[[[10, 20, 30]]]], dtype=np.uint8)  # NHWC, channels R, G, B as given
    out = normalise(x, (1.0, 2.0, 3.0), (1.0, 2.0, 3.0))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[0, 0, 0], [9.0, 9.0, 9.0])
    # quant_img_RGB2BGR is not recorded in a .rknn (toolkit2 API reference, config):
    # channels keep the caller's order.
    s = ConversionSettings.from_dict({"mean_values": [[1, 2, 3]], "quant_img_RGB2BGR": True})
    np.testing.assert_allclose(s.normalise(x)[0, 0, 0], [9.0, 18.0, 27.0])
    np.testing.assert_allclose(normalise(x, (10.0,), None)[0, 0, 0], [0.0, 10.0, 20.0])
    with pytest.raises(ValueError, match="2 value"):
        normalise(x, (1.0, 2.0), None)


# ---------------------------------------------------------------- describe_model
def test_rknn_with_settings_takes_raw_uint8_nhwc(tmp_path: Path) -> None:
    onnx_path = EM.conv_classifier(tmp_path)
    rknn = EM.rknn_for(onnx_path, mean_values=[EM.IMAGENET_MEAN], std_values=[EM.IMAGENET_STD])
    info = describe_model(rknn)
    assert info.inputs == (
        TensorInfo(
            "input",
            (1, 16, 16, 3),
            "uint8",
            "nchw",
            normalised_inside=True,
            mean=tuple(EM.IMAGENET_MEAN),
            std=tuple(EM.IMAGENET_STD),
        ),
    )
    assert info.settings is not None and info.settings.path == settings_path(rknn)
    # The .onnx run directly is the float model: it takes what the graph takes.
    assert describe_model(onnx_path).inputs[0] == TensorInfo(
        "input", (1, 16, 16, 3), "float32", "nchw"
    )


def test_settings_without_mean_or_std_leave_the_input_as_the_graph_takes_it(tmp_path: Path) -> None:
    rknn = EM.rknn_for(EM.conv_classifier(tmp_path), target_platform="rk3588")
    tensor = describe_model(rknn).inputs[0]
    assert (tensor.dtype, tensor.normalised_inside) == ("float32", False)


def test_dynamic_input_lists_the_compiled_shapes_nhwc(tmp_path: Path) -> None:
    rknn = EM.rknn_for(
        EM.conv_classifier(tmp_path, dynamic_hw=True),
        mean_values=[[0, 0, 0]],
        dynamic_input=[[[1, 3, 16, 16]], [[1, 3, 12, 12]]],
    )
    tensor = describe_model(rknn).inputs[0]
    assert tensor.shape == (1, 16, 16, 3)
    assert tensor.shapes == ((1, 16, 16, 3), (1, 12, 12, 3))


@pytest.mark.parametrize(
    ("cfg", "words"),
    [
        ({"mean_values": [[0, 0]]}, r"mean_values\[0\] has 2 value\(s\) but input 'input' has 3"),
        ({"mean_values": [[0, 0, 0], [0, 0, 0]]}, "2 lists but .* has 1 input"),
        ({"dynamic_input": [[[1, 3, 16, 16]], [[1, 3, 12, 12]]]}, "only its dynamic axes"),
    ],
)
def test_settings_that_do_not_fit_the_graph_are_model_errors(
    tmp_path: Path, cfg: dict, words: str
) -> None:
    rknn = EM.rknn_for(EM.conv_classifier(tmp_path), **cfg)
    with pytest.raises(ModelError, match=words):
        describe_model(rknn)


def test_mean_std_for_an_integer_input_is_a_model_error(tmp_path: Path) -> None:
    rknn = M.fake_rknn(M.nhwc_uint8_model(tmp_path))
    settings_path(rknn).write_text(json.dumps({"mean_values": [[0]]}))
    with pytest.raises(ModelError, match="float inputs only"):
        describe_model(rknn)


def test_a_dynamic_rknn_needs_its_compiled_shapes(tmp_path: Path) -> None:
    rknn = EM.rknn_for(EM.conv_classifier(tmp_path, dynamic_hw=True), mean_values=[[0, 0, 0]])
    with pytest.raises(
        ModelError, match=r'list them as "dynamic_input" in .*classifier\.config\.json'
    ):
        describe_model(rknn)


@pytest.mark.parametrize(
    ("shape", "rknn_view", "direct_view"),
    [
        ((1, 3, 8, 8), (1, 8, 8, 3), (1, 8, 8, 3)),
        ((1, 96, 8, 8), (1, 8, 8, 96), (1, 8, 8, 96)),
        ((1, 8, 8, 96), (1, 8, 96, 8), (1, 8, 96, 8)),
        ((1, 6, 6, 3), (1, 6, 3, 6), (1, 6, 6, 3)),  # channels-last graph run directly: kept
        ((1, 4, 4, 3), (1, 4, 3, 4), (1, 4, 4, 3)),
        ((1, 3, 8, 3), (1, 8, 3, 3), (1, 8, 3, 3)),  # a tie is NCHW, ONNX's convention
    ],
)
def test_every_4d_input_is_nhwc_in_the_rknn_view(
    tmp_path: Path, shape: tuple, rknn_view: tuple, direct_view: tuple
) -> None:
    onnx_path = EM.dense_model(tmp_path, "m.onnx", shape)
    assert describe_model(M.fake_rknn(onnx_path)).inputs[0].shape == rknn_view
    assert describe_model(onnx_path).inputs[0].shape == direct_view


# ---------------------------------------------------------------- the engine
def test_the_engine_feeds_raw_pixels_to_a_model_that_normalises_itself(tmp_path: Path) -> None:
    from PIL import Image
    from runs import config, fast_sim

    from batchinfer import run
    from batchinfer.results import read_predictions

    onnx_path = EM.conv_classifier(tmp_path / "model")
    rknn = EM.rknn_for(onnx_path, mean_values=[EM.IMAGENET_MEAN], std_values=[EM.IMAGENET_STD])
    rng = np.random.default_rng(8)
    images = rng.integers(0, 256, (5, 16, 16, 3), dtype=np.uint8)
    (tmp_path / "data" / "a").mkdir(parents=True)
    for n, pixels in enumerate(images):
        Image.fromarray(pixels).save(tmp_path / "data" / "a" / f"{n}.png")
    result = run(
        config(
            dataset=tmp_path / "data",
            model=rknn,
            backend="sim",
            sim=fast_sim(),
            cores=(0,),
            save_outputs=True,
            out=tmp_path / "out",
        )
    )
    assert result.errors == 0
    table = read_predictions(result.out)
    ids, outputs = table["id"].to_pylist(), table["out_output0"].to_pylist()
    got = {Path(i).stem: o for i, o in zip(ids, outputs, strict=True)}
    for n, pixels in enumerate(images):
        x = EM.nchw_normalised(pixels[None], EM.IMAGENET_MEAN, EM.IMAGENET_STD)
        expected = EM.ort(onnx_path, input=x)[0][0]
        np.testing.assert_allclose(got[str(n)], expected, rtol=1e-5, atol=1e-5)
