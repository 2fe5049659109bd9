"""Rebuild the bundled demo assets: the digits array, the ONNX models, the .rknn files.

    python tools/build_demo_assets.py             # extract (scikit-learn), train, export
    python tools/build_demo_assets.py --from-npz  # keep digits.npz, rebuild the models
    python tools/build_demo_assets.py --rknn      # convert to .rknn (toolkit environment)
    python tools/build_demo_assets.py --two-input [--rknn]  # only the two-input model

``--two-input`` builds only digits-prompt (two inputs: an image and a class prompt) from
the committed digits.npz, its conversion model and settings (with ``--rknn``: its .rknn
files, measured against the ONNX model with the toolkit backend).

The first two run in the project's environment. Everything they make is deterministic:
the held-out split, the weight initialisation and the mini-batch order all come from fixed
seeds, and training runs in float64 so that BLAS summation order cannot amplify into
different weights. They write into ``batchinfer/demo/assets/``: digits.npz, digits.onnx,
digits-int8.onnx, digits-lowcal.onnx, pool224.onnx, the float-input models the .rknn files
are converted from (digits-convert.onnx, pool224-convert.onnx) and the conversion settings
of each .rknn (``<model>-<chip>.config.json``).

``--rknn`` runs in the toolkit's environment (tools/toolkit-env.sh): it converts those
models with rknn-toolkit2 exactly as a user's script would (config, load_onnx, build with
the calibration list, export_rknn) into ``<model>-<chip>.rknn`` for rk3588, rk3576 and
rk3566, and measures them with the toolkit backend. The .rknn bytes differ from build to
build (the toolkit writes addresses into them); their outputs do not.

Every figure measured lands in ``measured.json``, from which MODELS.md is written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from batchinfer import demo
from batchinfer.demo import ASSETS, to_pixels

SPLIT_SEED = 0
TEST_SIZE = 360  # about 20 % of the 1,797 digits
TRAIN_SEED = 0
POOL_SEED = 0
OPSET = 17
IR_VERSION = 8  # onnxruntime >= 1.17 reads ir 8; newer onnx would write 10 by default

HIDDEN = 64
EPOCHS = 60
BATCH = 32
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 1e-4


# --------------------------------------------------------------------------- data


def extract_digits() -> tuple[np.ndarray, np.ndarray]:
    """Return scikit-learn's digits as uint8 images (1797, 8, 8), values 0..16, and labels."""
    from sklearn.datasets import load_digits  # only the extraction needs scikit-learn

    bunch = load_digits()
    images = bunch.images
    # The values are whole numbers stored as float64; refuse anything else rather than
    # silently truncating.
    if not np.array_equal(images, np.round(images)) or images.min() < 0 or images.max() > 16:
        raise ValueError("scikit-learn's digits are no longer integers 0..16")
    return images.astype(np.uint8), bunch.target.astype(np.uint8)


def split_indices(n: int, seed: int = SPLIT_SEED, test_size: int = TEST_SIZE) -> np.ndarray:
    """Return the sorted held-out indices: the last ``test_size`` of a seeded permutation."""
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[-test_size:])


def write_digits_npz(path: Path, images: np.ndarray, labels: np.ndarray) -> None:
    """Write images, labels and the held-out split as a compressed npz."""
    test_index = split_indices(len(labels)).astype(np.int32)
    np.savez_compressed(
        path, images=images, labels=labels, test_index=test_index, split_seed=SPLIT_SEED
    )


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class MlpWeights:
    """The trained 64-64-10 MLP and the input normalisation it was trained with."""

    mean: float  # of train pixels scaled to 0..1
    std: float
    w1: np.ndarray  # (64, HIDDEN)
    b1: np.ndarray
    w2: np.ndarray  # (HIDDEN, 10)
    b2: np.ndarray


def normalise(pixels: np.ndarray, mean: float, std: float) -> np.ndarray:
    """Return 0..255 pixels flattened to (n, 64) float64, scaled to 0..1 then standardised."""
    return (pixels.reshape(len(pixels), -1).astype(np.float64) / 255.0 - mean) / std


def train_mlp(pixels: np.ndarray, labels: np.ndarray, seed: int = TRAIN_SEED) -> MlpWeights:
    """Return an MLP trained with Adam on 0..255 pixels (n, 8, 8) and labels (n,)."""
    rng = np.random.default_rng(seed)
    unit = pixels.astype(np.float64) / 255.0
    mean, std = float(unit.mean()), float(unit.std())
    x = normalise(pixels, mean, std)
    y = np.eye(10)[labels]

    params = {
        "w1": rng.standard_normal((64, HIDDEN)) * np.sqrt(2.0 / 64),
        "b1": np.zeros(HIDDEN),
        "w2": rng.standard_normal((HIDDEN, 10)) * np.sqrt(2.0 / HIDDEN),
        "b2": np.zeros(10),
    }
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    step = 0
    for _ in range(EPOCHS):
        order = rng.permutation(len(x))
        for start in range(0, len(x), BATCH):
            idx = order[start : start + BATCH]
            grads = _gradients(params, x[idx], y[idx])
            step += 1
            for k, g in grads.items():
                if k.startswith("w"):
                    g = g + WEIGHT_DECAY * params[k]
                m[k] = beta1 * m[k] + (1 - beta1) * g
                v[k] = beta2 * v[k] + (1 - beta2) * g * g
                m_hat = m[k] / (1 - beta1**step)
                v_hat = v[k] / (1 - beta2**step)
                params[k] = params[k] - LEARNING_RATE * m_hat / (np.sqrt(v_hat) + eps)
    f32 = {k: p.astype(np.float32) for k, p in params.items()}
    return MlpWeights(mean=mean, std=std, **f32)


def _gradients(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> dict:
    """Return the cross-entropy gradients of a mini-batch (softmax folded into the loss)."""
    h_pre = x @ params["w1"] + params["b1"]
    h = np.maximum(h_pre, 0.0)
    logits = h @ params["w2"] + params["b2"]
    p = _softmax(logits)
    d_logits = (p - y) / len(x)
    d_h = (d_logits @ params["w2"].T) * (h_pre > 0)
    return {
        "w1": x.T @ d_h,
        "b1": d_h.sum(0),
        "w2": h.T @ d_logits,
        "b2": d_logits.sum(0),
    }


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def mlp_probs(weights: MlpWeights, pixels: np.ndarray) -> np.ndarray:
    """Return the float MLP's probabilities (n, 10) computed with numpy."""
    h = np.maximum(normalise(pixels, weights.mean, weights.std) @ weights.w1 + weights.b1, 0)
    return _softmax(h @ weights.w2 + weights.b2)


# --------------------------------------------------------------------------- ONNX export


def _finish(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="batchinfer tools/build_demo_assets.py",
        doc_string=doc,
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def _init(name: str, value: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _image_io(shape: list[int], classes: int) -> tuple[onnx.ValueInfoProto, ...]:
    """The graph's input ``image`` (uint8 NHWC) and output ``probs`` (float32 [1, classes])."""
    image = helper.make_tensor_value_info("image", TensorProto.UINT8, shape)
    probs = helper.make_tensor_value_info("probs", TensorProto.FLOAT, [shape[0], classes])
    return image, probs


def _normalisation(weights: MlpWeights) -> tuple[list, list]:
    """Nodes and initialisers turning image uint8 [1,8,8,1] into x_norm float [1,64]."""
    nodes = [
        helper.make_node("Cast", ["image"], ["image_f"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["image_f", "flat_shape"], ["flat"]),
        helper.make_node("Div", ["flat", "pixel_max"], ["unit"]),
        helper.make_node("Sub", ["unit", "mean"], ["centred"]),
        helper.make_node("Div", ["centred", "std"], ["x_norm"]),
    ]
    inits = [
        _init("flat_shape", np.array([-1, 64], np.int64)),
        _init("pixel_max", np.float32(255.0)),
        _init("mean", np.float32(weights.mean)),
        _init("std", np.float32(weights.std)),
    ]
    return nodes, inits


def _mlp_nodes() -> list[onnx.NodeProto]:
    """x_norm [1,64] -> MatMul w1 + b1 -> Relu -> MatMul w2 + b2 -> Softmax -> probs."""
    return [
        helper.make_node("MatMul", ["x_norm", "w1"], ["h_mm"]),
        helper.make_node("Add", ["h_mm", "b1"], ["h_pre"]),
        helper.make_node("Relu", ["h_pre"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["l_mm"]),
        helper.make_node("Add", ["l_mm", "b2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]


def build_float_model(weights: MlpWeights) -> onnx.ModelProto:
    """Return digits.onnx: uint8 NHWC image in, softmax probabilities out."""
    image, probs = _image_io([1, 8, 8, 1], 10)
    nodes, inits = _normalisation(weights)
    nodes += _mlp_nodes()
    inits += [_init(k, getattr(weights, k)) for k in ("w1", "b1", "w2", "b2")]
    graph = helper.make_graph(nodes, "digits_mlp", [image], [probs], inits)
    return _finish(graph, "Digits MLP 64-64-10 (float32); see batchinfer/demo/assets/MODELS.md.")


def _scale(max_abs: float) -> np.float32:
    """Per-tensor symmetric int8 scale for values within +-max_abs."""
    return np.float32(max(max_abs, 1e-8) / 127.0)


def calibrate(weights: MlpWeights, pixels: np.ndarray) -> dict[str, np.float32]:
    """Return the activation scales (x_norm, h, logits) from the max |value| on ``pixels``."""
    x = normalise(pixels, weights.mean, weights.std)
    h = np.maximum(x @ weights.w1 + weights.b1, 0)
    logits = h @ weights.w2 + weights.b2
    return {
        "x_norm": _scale(np.abs(x).max()),
        "h": _scale(h.max()),
        "logits": _scale(np.abs(logits).max()),
    }


def _quantise(values: np.ndarray, scale: np.float32, dtype: type) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(np.round(values / scale), info.min, info.max).astype(dtype)


def build_int8_model(
    weights: MlpWeights,
    act_scales: dict[str, np.float32],
    doc: str = "Digits MLP 64-64-10, int8 QDQ per-tensor symmetric; see MODELS.md.",
) -> onnx.ModelProto:
    """Return digits-int8.onnx: the float model as QDQ, int8 per-tensor symmetric.

    Weights are int8 initialisers behind DequantizeLinear; biases int32 with the scale
    input_scale * weight_scale (what an integer accelerator accumulates in); activations
    (the normalised input, the hidden layer and the logits) pass QuantizeLinear ->
    DequantizeLinear with scales calibrated on train images.
    """
    image, probs = _image_io([1, 8, 8, 1], 10)
    nodes, inits = _normalisation(weights)
    w_scales = {k: _scale(np.abs(getattr(weights, k)).max()) for k in ("w1", "w2")}
    b_scales = {
        "b1": np.float32(act_scales["x_norm"] * w_scales["w1"]),
        "b2": np.float32(act_scales["h"] * w_scales["w2"]),
    }

    def qdq(tensor: str) -> str:
        nodes.append(
            helper.make_node("QuantizeLinear", [tensor, f"{tensor}_s", "zp_int8"], [f"{tensor}_q"])
        )
        nodes.append(
            helper.make_node(
                "DequantizeLinear", [f"{tensor}_q", f"{tensor}_s", "zp_int8"], [f"{tensor}_dq"]
            )
        )
        inits.append(_init(f"{tensor}_s", act_scales[tensor]))
        return f"{tensor}_dq"

    def dq_const(name: str, scale: np.float32, dtype: type) -> str:
        zp = f"zp_{np.dtype(dtype).name}"
        inits.append(_init(f"{name}_q", _quantise(getattr(weights, name), scale, dtype)))
        inits.append(_init(f"{name}_s", scale))
        nodes.append(
            helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", zp], [f"{name}_dq"])
        )
        return f"{name}_dq"

    inits += [_init("zp_int8", np.int8(0)), _init("zp_int32", np.int32(0))]
    x = qdq("x_norm")
    nodes.append(helper.make_node("MatMul", [x, dq_const("w1", w_scales["w1"], np.int8)], ["h_mm"]))
    nodes.append(
        helper.make_node("Add", ["h_mm", dq_const("b1", b_scales["b1"], np.int32)], ["h_pre"])
    )
    nodes.append(helper.make_node("Relu", ["h_pre"], ["h"]))
    h = qdq("h")
    nodes.append(helper.make_node("MatMul", [h, dq_const("w2", w_scales["w2"], np.int8)], ["l_mm"]))
    nodes.append(
        helper.make_node("Add", ["l_mm", dq_const("b2", b_scales["b2"], np.int32)], ["logits"])
    )
    logits = qdq("logits")
    nodes.append(helper.make_node("Softmax", [logits], ["probs"], axis=-1))
    graph = helper.make_graph(nodes, "digits_mlp_int8", [image], [probs], inits)
    return _finish(graph, doc)


def build_digits_convert(weights: MlpWeights) -> onnx.ModelProto:
    """Return digits-convert.onnx: the float MLP taking normalised float NCHW [1,1,8,8].

    What a user exports for conversion: the normalisation ((pixel/255 - mean)/std) is not
    in the graph but in the conversion settings (digits_settings), so the .rknn takes
    raw uint8 pixels and normalises on the NPU.
    """
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 1, 8, 8])
    probs = helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])
    nodes = [helper.make_node("Reshape", ["image", "flat_shape"], ["x_norm"]), *_mlp_nodes()]
    inits = [_init("flat_shape", np.array([1, 64], np.int64))]
    inits += [_init(k, getattr(weights, k)) for k in ("w1", "b1", "w2", "b2")]
    graph = helper.make_graph(nodes, "digits_mlp_convert", [image], [probs], inits)
    return _finish(graph, "Digits MLP 64-64-10 for conversion: normalised float NCHW input.")


def digits_settings(weights: MlpWeights, platform: str) -> dict:
    """The rknn.config() arguments that put digits.onnx's normalisation on the NPU."""
    # (pixel/255 - mean)/std == (pixel - 255*mean) / (255*std)
    return {
        "mean_values": [[round(255.0 * weights.mean, 6)]],
        "std_values": [[round(255.0 * weights.std, 6)]],
        "target_platform": platform,
        "quantized_dtype": "w8a8",
    }


def build_pool224(seed: int = POOL_SEED) -> onnx.ModelProto:
    """Return pool224.onnx: a near-free model of mobilenet's shape for throughput tests.

    Every 16th pixel of each channel is averaged (so the output depends on the input at a
    cost of microseconds), centred to -1..1 and sent through a fixed random [3,1000]
    linear layer and a softmax.
    """
    w, b = _pool224_weights(seed)
    # logits = ((m - 127.5) / 127.5) @ w + b, folded into one MatMul and Add.
    w_folded = (w / 127.5).astype(np.float32)
    b_folded = (b - w.sum(axis=0)).astype(np.float32)
    image, probs = _image_io([1, 224, 224, 3], 1000)
    nodes = [
        helper.make_node("Slice", ["image", "starts", "ends", "axes", "steps"], ["sampled"]),
        helper.make_node("Cast", ["sampled"], ["sampled_f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["sampled_f"], ["means"], axes=[1, 2], keepdims=0),
        helper.make_node("MatMul", ["means", "w"], ["l_mm"]),
        helper.make_node("Add", ["l_mm", "b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    inits = _pool224_inits((1, 2), w_folded, b_folded)
    graph = helper.make_graph(nodes, "pool224", [image], [probs], inits)
    return _finish(graph, "A cheap stand-in for a 224x224 classifier (throughput tests only).")


def _pool224_inits(axes: tuple[int, int], w: np.ndarray, b: np.ndarray) -> list[TensorProto]:
    """Every 16th row and column of the H and W ``axes``, then the [3,1000] layer."""
    return [
        _init("starts", np.array([0, 0], np.int64)),
        _init("ends", np.array([224, 224], np.int64)),
        _init("axes", np.array(axes, np.int64)),
        _init("steps", np.array([16, 16], np.int64)),
        _init("w", w),
        _init("b", b),
    ]


def _pool224_weights(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((3, 1000)) * 2.0
    b = rng.standard_normal(1000) * 0.1
    return w, b


def build_pool224_convert(seed: int = POOL_SEED) -> onnx.ModelProto:
    """Return pool224-convert.onnx: pool224 taking float NCHW [1,3,224,224] in -1..1.

    The centring ((pixel - 127.5) / 127.5) moves to the conversion settings.
    """
    w, b = _pool224_weights(seed)
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 224, 224])
    probs = helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 1000])
    nodes = [
        helper.make_node("Slice", ["image", "starts", "ends", "axes", "steps"], ["sampled"]),
        helper.make_node("ReduceMean", ["sampled"], ["means"], axes=[2, 3], keepdims=0),
        helper.make_node("MatMul", ["means", "w"], ["l_mm"]),
        helper.make_node("Add", ["l_mm", "b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    inits = _pool224_inits((2, 3), w.astype(np.float32), b.astype(np.float32))
    graph = helper.make_graph(nodes, "pool224_convert", [image], [probs], inits)
    return _finish(graph, "pool224 for conversion: float NCHW input centred to -1..1.")


def pool224_settings(platform: str) -> dict:
    """The rknn.config() arguments that put pool224's centring on the NPU."""
    return {
        "mean_values": [[127.5, 127.5, 127.5]],
        "std_values": [[127.5, 127.5, 127.5]],
        "target_platform": platform,
        "quantized_dtype": "w8a8",
    }


# --------------------------------------------------------------------------- measuring


def ort_session(model: onnx.ModelProto | Path):  # -> onnxruntime.InferenceSession
    """Return a one-thread onnxruntime session for ``model``."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])


def run_digits(session, pixels: np.ndarray) -> np.ndarray:
    """Return the probabilities (n, 10) of a digits model, one [1,8,8,1] call per image."""
    return np.concatenate(
        [session.run(["probs"], {"image": img.reshape(1, 8, 8, 1)})[0] for img in pixels]
    )


def pool224_latency_us(session, calls: int = 2000) -> float:
    """Return the median latency of one pool224 call in microseconds."""
    img = np.random.default_rng(1).integers(0, 256, (1, 224, 224, 3), dtype=np.uint8)
    for _ in range(100):
        session.run(["probs"], {"image": img})
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        session.run(["probs"], {"image": img})
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e6)


def digits_scores(
    probs: np.ndarray, labels: np.ndarray, test_index: np.ndarray, reference: np.ndarray
) -> dict:
    """Top-1 on the held-out, train and whole sets, and agreement with ``reference``."""
    train = np.setdiff1d(np.arange(len(labels)), test_index)
    pred, ref = probs.argmax(1), reference.argmax(1)
    return {
        "top1_test": float((pred[test_index] == labels[test_index]).mean()),
        "top1_train": float((pred[train] == labels[train]).mean()),
        "top1_all": float((pred == labels).mean()),
        "agree_all": float((pred == ref).mean()),
        "flips_all": int((pred != ref).sum()),
        "mad_test": float(np.abs(probs[test_index] - reference[test_index]).mean()),
        "max_test": float(np.abs(probs[test_index] - reference[test_index]).max()),
        "agree_test": float((pred[test_index] == ref[test_index]).mean()),
    }


def measure_onnx(labels: np.ndarray, test_index: np.ndarray, pixels: np.ndarray) -> dict:
    """The figures MODELS.md gives for the ONNX models, measured with onnxruntime."""
    probs = {
        n: run_digits(ort_session(ASSETS / n), pixels)
        for n in ("digits.onnx", "digits-int8.onnx", "digits-lowcal.onnx")
    }
    return {
        "models": {
            n: digits_scores(p, labels, test_index, probs["digits.onnx"]) for n, p in probs.items()
        },
        "pool224_latency_us": pool224_latency_us(ort_session(ASSETS / "pool224.onnx")),
    }


# --------------------------------------------------------------------------- conversion


def convert(stem: str, folder: Path) -> Path:
    """Convert the demo model ``stem`` in ``folder`` as a user's script does; return the .rknn.

    ``folder`` receives what the demo kit holds beside the .rknn: ``<stem>.onnx``,
    ``<stem>.config.json``, ``<stem>.dataset.txt`` and the calibration images.
    """
    recipe, _ = demo.rknn_recipe(stem)
    shutil.copyfile(ASSETS / recipe.source, folder / f"{stem}.onnx")
    shutil.copyfile(ASSETS / f"{stem}.config.json", folder / f"{stem}.config.json")
    dataset = demo.write_calibration_list(folder, stem)
    with warnings.catch_warnings():
        # The toolkit's import and conversion warn (pkg_resources, onnx.mapping): not ours.
        warnings.simplefilter("ignore")
        return _convert(stem, folder, dataset)


def _convert(stem: str, folder: Path, dataset: Path) -> Path:
    from rknn.api import RKNN

    from batchinfer.runtime.toolkit import load_settings

    rknn = RKNN(verbose=False)
    cwd = os.getcwd()
    os.chdir(folder)  # the calibration list's paths are relative to its folder
    try:
        steps = (
            ("config", lambda: rknn.config(**load_settings(folder / f"{stem}.config.json"))),
            ("load_onnx", lambda: rknn.load_onnx(model=f"{stem}.onnx")),
            ("build", lambda: rknn.build(do_quantization=True, dataset=dataset.name)),
            ("export_rknn", lambda: rknn.export_rknn(f"{stem}.rknn")),
        )
        for step, call in steps:
            if call() != 0:
                raise SystemExit(f"rknn.{step}() failed for {stem}; see the toolkit's lines above")
    finally:
        os.chdir(cwd)
        rknn.release()
    return folder / f"{stem}.rknn"


def measure_rknn(path: Path, recipe: demo.RknnRecipe) -> dict:
    """Size, metadata and simulator results of one converted .rknn (toolkit backend)."""
    from batchinfer.runtime.rknn_file import read_rknn_metadata
    from batchinfer.runtime.toolkit import RKNNLite

    meta = read_rknn_metadata(path)
    figures = {
        "bytes": path.stat().st_size,
        "platforms": list(meta.platforms),
        "version": meta.version,
        "inputs": [[t.name, list(t.shape), t.dtype] for t in meta.inputs],
        "outputs": [[t.name, list(t.shape), t.dtype] for t in meta.outputs],
    }
    rknn = RKNNLite()
    if rknn.load_rknn(str(path)) != 0 or rknn.init_runtime() != 0:
        raise SystemExit(f"the toolkit backend could not run {path}")
    try:
        if recipe.name.startswith("digits"):
            images, labels = demo.load_digits()
            test_index = demo.test_split()
            probs = np.concatenate(
                [rknn.inference(inputs=[img.reshape(1, 8, 8, 1)])[0] for img in images]
            )
            reference = run_digits(ort_session(ASSETS / "digits.onnx"), images)
            figures.update(digits_scores(probs, labels, test_index, reference))
        else:
            figures.update(_pool224_agreement(rknn))
    finally:
        rknn.release()
    return figures


def _pool224_agreement(rknn, n: int = 64) -> dict:
    """Cosine and top-1 agreement with pool224.onnx on ``n`` seeded uint8 inputs."""
    session = ort_session(ASSETS / "pool224.onnx")
    rng = np.random.default_rng(2)
    cosines, agree = [], 0
    for _ in range(n):
        img = rng.integers(0, 256, (1, 224, 224, 3), dtype=np.uint8)
        q = rknn.inference(inputs=[img])[0].ravel()
        f = session.run(["probs"], {"image": img})[0].ravel()
        cosines.append(float(q @ f / (np.linalg.norm(q) * np.linalg.norm(f))))
        agree += int(q.argmax() == f.argmax())
    return {
        "inputs": n,
        "cos_mean": float(np.mean(cosines)),
        "cos_min": float(np.min(cosines)),
        "agree": agree / n,
    }


def convert_all() -> dict:
    """Convert every demo .rknn into the assets and return their measured figures."""
    from batchinfer.runtime.toolkit import CACHE_ENV, toolkit_version

    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[CACHE_ENV] = str(Path(tmp) / "cache")  # measure fresh builds
        for stem, (recipe, _) in demo.rknn_stems().items():
            folder = Path(tmp) / stem
            folder.mkdir()
            path = convert(stem, folder)
            figures[stem] = measure_rknn(path, recipe)
            shutil.copyfile(path, ASSETS / path.name)
            print(f"{stem:24s} {figures[stem]['bytes']:7d} bytes", flush=True)
    return {"toolkit": toolkit_version(), "models": figures}


# --------------------------------------------------------------------------- two inputs

PROMPT_STEPS = 400  # full-batch gradient steps of the prompt model's linear classifier
PROMPT_LEARNING_RATE = 0.5


@dataclass(frozen=True)
class LinearWeights:
    """A softmax regression 64 -> 10 on normalised pixels (the two-input demo's classifier)."""

    mean: float
    std: float
    w: np.ndarray  # (64, 10)
    b: np.ndarray  # (10,)


def train_linear(pixels: np.ndarray, labels: np.ndarray) -> LinearWeights:
    """Softmax regression on 0..255 pixels (n, 8, 8): full-batch gradient descent from zeros,
    float64, so the same data always gives the same weights."""
    unit = pixels.astype(np.float64) / 255.0
    mean, std = float(unit.mean()), float(unit.std())
    x = normalise(pixels, mean, std)
    y = np.eye(10)[labels]
    w, b = np.zeros((64, 10)), np.zeros(10)
    for _ in range(PROMPT_STEPS):
        d = (_softmax(x @ w + b) - y) / len(x)
        w -= PROMPT_LEARNING_RATE * (x.T @ d + WEIGHT_DECAY * w)
        b -= PROMPT_LEARNING_RATE * d.sum(0)
    return LinearWeights(mean, std, w.astype(np.float32), b.astype(np.float32))


def _prompt_nodes(x: str) -> list[onnx.NodeProto]:
    """x [1,64] -> MatMul w + b -> Softmax -> probs; scores = probs * prompt."""
    return [
        helper.make_node("MatMul", [x, "w"], ["l_mm"]),
        helper.make_node("Add", ["l_mm", "b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        helper.make_node("Mul", ["probs", "prompt"], ["scores"]),
    ]


def _prompt_io() -> tuple[onnx.ValueInfoProto, onnx.ValueInfoProto]:
    prompt = helper.make_tensor_value_info("prompt", TensorProto.FLOAT, [1, 10])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 10])
    return prompt, scores


def build_prompt_model(weights: LinearWeights) -> onnx.ModelProto:
    """digits-prompt.onnx: two inputs, ``image`` uint8 [1,8,8,1] NHWC and ``prompt`` float32
    [1,10] (a weight per class, e.g. 1 for the digits asked about, 0 for the others);
    output ``scores`` [1,10] = the classifier's probabilities times the prompt."""
    image = helper.make_tensor_value_info("image", TensorProto.UINT8, [1, 8, 8, 1])
    prompt, scores = _prompt_io()
    nodes = [
        helper.make_node("Cast", ["image"], ["image_f"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["image_f", "flat_shape"], ["flat"]),
        helper.make_node("Div", ["flat", "pixel_max"], ["unit"]),
        helper.make_node("Sub", ["unit", "mean"], ["centred"]),
        helper.make_node("Div", ["centred", "std"], ["x_norm"]),
        *_prompt_nodes("x_norm"),
    ]
    inits = [
        _init("flat_shape", np.array([-1, 64], np.int64)),
        _init("pixel_max", np.float32(255.0)),
        _init("mean", np.float32(weights.mean)),
        _init("std", np.float32(weights.std)),
        _init("w", weights.w),
        _init("b", weights.b),
    ]
    graph = helper.make_graph(nodes, "digits_prompt", [image, prompt], [scores], inits)
    return _finish(graph, "Two-input demo: digit probabilities times a class prompt.")


def build_prompt_convert(weights: LinearWeights) -> onnx.ModelProto:
    """digits-prompt-convert.onnx: digits-prompt taking the normalised image as float NCHW
    [1,1,8,8] (the normalisation goes to the conversion settings, as for digits)."""
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 1, 8, 8])
    prompt, scores = _prompt_io()
    nodes = [helper.make_node("Reshape", ["image", "flat_shape"], ["x_norm"])]
    nodes += _prompt_nodes("x_norm")
    inits = [_init("flat_shape", np.array([1, 64], np.int64))]
    inits += [_init("w", weights.w), _init("b", weights.b)]
    graph = helper.make_graph(nodes, "digits_prompt_convert", [image, prompt], [scores], inits)
    return _finish(graph, "digits-prompt for conversion: normalised float NCHW image.")


def prompt_settings(weights: LinearWeights, platform: str) -> dict:
    """rknn.config() for digits-prompt: the image's normalisation on the NPU, the prompt as
    it is (mean 0, std 1)."""
    return {
        "mean_values": [[round(255.0 * weights.mean, 6)], [0.0] * 10],
        "std_values": [[round(255.0 * weights.std, 6)], [1.0] * 10],
        "target_platform": platform,
        "quantized_dtype": "w8a8",
    }


def run_prompt(run, items: list) -> np.ndarray:
    """Scores (n, 10) of a two-input model: ``run(image, prompt)`` -> [scores]."""
    return np.concatenate([run(image, prompt)[0].reshape(1, 10) for _, image, prompt, _ in items])


def prompt_figures(scores: np.ndarray, reference: np.ndarray, items: list) -> dict:
    """Top-1 of the prompted scores on the demo set and agreement with ``reference``."""
    labels = np.array([label for *_, label in items])
    return {
        "items": len(items),
        "top1": float((scores.argmax(1) == labels).mean()),
        "agree": float((scores.argmax(1) == reference.argmax(1)).mean()),
        "max_abs": float(np.abs(scores - reference).max()),
        "mean_abs": float(np.abs(scores - reference).mean()),
    }


def build_prompt_assets() -> dict:
    """Write digits-prompt.onnx, its conversion model and settings; return its figures."""
    images, labels = demo.load_digits()
    test_index = demo.test_split()
    train = np.setdiff1d(np.arange(len(labels)), test_index)
    weights = train_linear(images[train], labels[train])
    model = build_prompt_model(weights)
    onnx.save(model, ASSETS / "digits-prompt.onnx")
    onnx.save(build_prompt_convert(weights), ASSETS / "digits-prompt-convert.onnx")
    for stem, (_, platform) in demo.rknn_stems(prompt=True).items():
        (ASSETS / f"{stem}.config.json").write_text(
            settings_json(prompt_settings(weights, platform))
        )
    session = ort_session(model)
    ones = np.ones((1, 10), np.float32)
    probs = np.concatenate(
        [session.run(None, {"image": i.reshape(1, 8, 8, 1), "prompt": ones})[0] for i in images]
    )
    items = demo.prompt_items()
    scores = run_prompt(lambda i, p: session.run(None, {"image": i, "prompt": p}), items)
    figures = {
        "top1_test_unprompted": float((probs.argmax(1) == labels)[test_index].mean()),
        "demo_set": prompt_figures(scores, scores, items),
        "bytes": (ASSETS / "digits-prompt.onnx").stat().st_size,
    }
    print(f"digits-prompt.onnx held-out top-1 (prompt all ones) {figures['top1_test_unprompted']}")
    return figures


def convert_prompt() -> dict:
    """Convert digits-prompt for every chip into the assets; compare them with the ONNX."""
    from batchinfer.runtime.toolkit import CACHE_ENV, RKNNLite, toolkit_version

    items = demo.prompt_items()
    session = ort_session(ASSETS / "digits-prompt.onnx")
    reference = run_prompt(lambda i, p: session.run(None, {"image": i, "prompt": p}), items)
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[CACHE_ENV] = str(Path(tmp) / "cache")
        for stem in demo.rknn_stems(prompt=True):
            folder = Path(tmp) / stem
            folder.mkdir()
            path = convert(stem, folder)
            rknn = RKNNLite()
            if rknn.load_rknn(str(path)) != 0 or rknn.init_runtime() != 0:
                raise SystemExit(f"the toolkit backend could not run {path}")
            try:
                scores = run_prompt(lambda i, p, r=rknn: r.inference(inputs=[i, p]), items)
            finally:
                rknn.release()
            measured = prompt_figures(scores, reference, items)
            figures[stem] = {"bytes": path.stat().st_size, **measured}
            shutil.copyfile(path, ASSETS / path.name)
            print(f"{stem:24s} {figures[stem]}", flush=True)
    return {"toolkit": toolkit_version(), "models": figures}


def prompt_md(two: dict | None) -> str:
    """The MODELS.md section on the two-input model."""
    if not two:
        return ""
    o = two["onnx"]
    rows = "\n".join(
        f"| `{stem}.rknn` | {f['bytes']:,} | {_pct(f['agree'])} | {f['max_abs']:.4f} |"
        for stem, f in two.get("rknn", {}).get("models", {}).items()
    )
    table = (
        "| file | bytes | top-1 agreement with the ONNX | max abs score difference |\n"
        f"|---|---|---|---|\n{rows}\n"
        if rows
        else "Not converted yet: `python tools/build_demo_assets.py --two-input --rknn`.\n"
    )
    return f"""
## digits-prompt.onnx (two inputs)
- Inputs `image` uint8 [1,8,8,1] NHWC (pixels 0..255) and `prompt` float32 [1,10] (a weight
  per digit: 1 for the digits asked about, 0 for the others); output `scores` [1,10] =
  softmax(linear(normalised image)) x prompt. The classifier is a softmax regression
  64 -> 10 ({PROMPT_STEPS} full-batch gradient steps from zeros, float64, train split):
  {_pct(o["top1_test_unprompted"])} held-out top-1 with a prompt of all ones. {o["bytes"]:,} bytes.
- `digits-prompt-convert.onnx` takes the normalised image as float NCHW [1,1,8,8]; its
  settings put the image's normalisation on the NPU and give the prompt mean 0 / std 1.
- The demo set (`batchinfer demo` writes it to `prompt/<label>/<index>.npz`): the first
  {demo.PROMPT_ITEMS} held-out digits, each with a seeded prompt naming its digit and
  {demo.PROMPT_CLASSES - 1} others.

{table}"""


# --------------------------------------------------------------------------- main


def build_all(images: np.ndarray, labels: np.ndarray, test_index: np.ndarray) -> tuple:
    """Return (ONNX ModelProtos by file name, conversion settings by file name)."""
    pixels = to_pixels(images)
    train = np.setdiff1d(np.arange(len(labels)), test_index)
    weights = train_mlp(pixels[train], labels[train])
    scales = calibrate(weights, pixels[train])
    # The mistake behind digits-lowcal: calibrating on the raw 0..16 values, not on pixels.
    raw_calibration = images[demo.calibration_indices(labels, test_index)]
    lowcal_scales = calibrate(weights, raw_calibration)
    models = {
        "digits.onnx": build_float_model(weights),
        "digits-int8.onnx": build_int8_model(weights, scales),
        "digits-lowcal.onnx": build_int8_model(
            weights,
            lowcal_scales,
            doc="Digits MLP, int8 QDQ calibrated on raw 0..16 values (poorly); see MODELS.md.",
        ),
        "pool224.onnx": build_pool224(),
        "digits-convert.onnx": build_digits_convert(weights),
        "pool224-convert.onnx": build_pool224_convert(),
    }
    settings = {}
    for stem, (recipe, platform) in demo.rknn_stems().items():
        if recipe.source == "digits-convert.onnx":
            settings[f"{stem}.config.json"] = digits_settings(weights, platform)
        else:
            settings[f"{stem}.config.json"] = pool224_settings(platform)
    return models, settings


def main() -> None:
    """Build the ONNX models (or, with --rknn, the .rknn files), measure, write MODELS.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--from-npz", action="store_true", help="reuse digits.npz (no scikit-learn needed)"
    )
    parser.add_argument(
        "--rknn",
        action="store_true",
        help="convert the committed models to .rknn with rknn-toolkit2 (toolkit environment)",
    )
    parser.add_argument(
        "--two-input",
        action="store_true",
        help="only the two-input model digits-prompt (with --rknn: only its .rknn files)",
    )
    args = parser.parse_args()
    measured_path = ASSETS / "measured.json"
    measured = json.loads(measured_path.read_text()) if measured_path.is_file() else {}
    if args.two_input:
        two = measured.setdefault("two_input", {})
        if args.rknn:
            two["rknn"] = convert_prompt()
        else:
            two["onnx"] = build_prompt_assets()
    elif args.rknn:
        measured["rknn"] = convert_all()
    else:
        measured["onnx"] = build_onnx_assets(from_npz=args.from_npz)
    measured_path.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
    (ASSETS / "MODELS.md").write_text(models_md(measured))
    print(f"wrote {measured_path} and {ASSETS / 'MODELS.md'}")


def build_onnx_assets(from_npz: bool) -> dict:
    """Write digits.npz (unless ``from_npz``), the ONNX models and settings; return figures."""
    ASSETS.mkdir(parents=True, exist_ok=True)
    npz_path = ASSETS / "digits.npz"
    if not from_npz:
        write_digits_npz(npz_path, *extract_digits())
    with np.load(npz_path) as data:
        images, labels, test_index = data["images"], data["labels"], data["test_index"]

    t0 = time.perf_counter()
    models, settings = build_all(images, labels, test_index)
    train_s = time.perf_counter() - t0
    for name, model in models.items():
        onnx.save(model, ASSETS / name)
    for name, value in settings.items():
        (ASSETS / name).write_text(settings_json(value))
    figures = measure_onnx(labels, test_index, to_pixels(images))
    figures.update(n=len(labels), n_test=len(test_index), train_s=train_s)
    for name, f in figures["models"].items():
        print(
            f"{name:20s} top-1 held-out {f['top1_test']:.4f} all {f['top1_all']:.4f} "
            f"agreement with float {f['agree_all']:.4f} ({f['flips_all']} flipped)"
        )
    latency = figures["pool224_latency_us"]
    print(f"pool224 latency (onnxruntime, 1 thread, median): {latency:.1f} us")
    return figures


def settings_json(settings: dict) -> str:
    """A settings file as a person would write it: one key per line."""
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in settings.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _pct(value: float) -> str:
    return f"{100 * value:.2f} %"


def models_md(measured: dict) -> str:
    """MODELS.md from the measured figures (measured.json)."""
    o = measured["onnx"]
    m = o["models"]
    f, q, low = m["digits.onnx"], m["digits-int8.onnx"], m["digits-lowcal.onnx"]
    n, n_test = o["n"], o["n_test"]
    return f"""# Demo models

Made by `python tools/build_demo_assets.py` (add `--from-npz` to skip the scikit-learn
extraction and rebuild only the models from `digits.npz`); the `.rknn` files by
`python tools/build_demo_assets.py --rknn` in the toolkit's environment
(`bash tools/toolkit-env.sh`). The ONNX build is deterministic: same seeds, same weights.
Numbers below were measured by that tool (ONNX models with onnxruntime, `.rknn` files
with rknn-toolkit2's simulator through the `toolkit` backend) and are kept in
`measured.json`.

## Split
The {n:,} digits are split by a fixed seeded permutation:
`numpy.random.default_rng({SPLIT_SEED}).permutation({n})`, whose last {n_test} entries (sorted)
are the held-out set. They are stored in `digits.npz` as `test_index` (and returned by
`batchinfer.demo.test_split()`); the other {n - n_test:,} are the train split. Models are
trained and calibrated on the train split only.

## digits.onnx (float32)
- Input `image` uint8 [1,8,8,1] NHWC, pixels 0..255 (the dataset's 0..16 as round(v*255/16)).
  Output `probs` float32 [1,10] (softmax inside the graph).
- Graph: Cast -> Reshape [1,64] -> /255 -> (x - mean)/std (scalars from the train pixels)
  -> MatMul 64x{HIDDEN} + bias -> Relu -> MatMul {HIDDEN}x10 + bias -> Softmax.
- Training: numpy, float64, He init (seed {TRAIN_SEED}), Adam lr {LEARNING_RATE}, batch {BATCH},
  {EPOCHS} epochs, L2 {WEIGHT_DECAY}, cross-entropy ({o["train_s"]:.1f} s for all the models here).
- Top-1: **{_pct(f["top1_test"])} held-out**, {_pct(f["top1_train"])} train,
  {_pct(f["top1_all"])} on all {n:,}.

## digits-int8.onnx (QDQ int8)
- Same input/output names and shapes. The float model with int8 per-tensor symmetric
  quantisation as QuantizeLinear/DequantizeLinear: weights int8, biases int32 (scale
  input_scale*weight_scale), activations (normalised input, hidden layer, logits) int8 with
  scales max|x|/127 calibrated on the train images.
- Top-1: **{_pct(q["top1_test"])} held-out**,
  {_pct(q["top1_train"])} train.
- Against the float model on the held-out split: mean |probs difference| {q["mad_test"]:.5f}
  (max {q["max_test"]:.4f}), top-1 agreement {_pct(q["agree_test"])}; on all {n:,}:
  agreement {_pct(q["agree_all"])} ({q["flips_all"]} flipped).

## digits-lowcal.onnx (QDQ int8, poorly calibrated)
- A device model whose quantisation visibly costs accuracy, for accuracy evaluations
  against digits.onnx. Built exactly like digits-int8.onnx, but its activation scales were
  calibrated on the {demo.CALIBRATION_PER_CLASS * 10} calibration digits as their raw 0..16
  values instead of 0..255 pixels (a real conversion mistake: a calibration set that
  skipped the preprocessing), so the normalised input and the hidden layer clip.
- Top-1: **{_pct(low["top1_test"])} held-out**, {_pct(low["top1_train"])} train,
  {_pct(low["top1_all"])} on all {n:,}.
- Against the float model on all {n:,} digits: top-1 agreement about {_pct(low["agree_all"])},
  **about {low["flips_all"]} items flipped** (ONNX Runtime's int8 kernels break a few
  near-ties differently on different CPUs: 77 and 75 seen); held-out: mean |probs difference|
  {low["mad_test"]:.5f} (max {low["max_test"]:.4f}).

## pool224.onnx (throughput stand-in)
- Input `image` uint8 [1,224,224,3] NHWC, output `probs` float32 [1,1000].
- Slice every 16th row and column -> Cast -> ReduceMean over H,W -> [1,3] -> centre to -1..1
  -> MatMul with a fixed random [3,1000] (seed {POOL_SEED}) + bias -> Softmax. Meaningless
  classes; the output depends on the input.
- onnxruntime 1 thread, median of 2,000 calls: **{o["pool224_latency_us"]:.1f} µs** on the
  build machine.

## Models for conversion
- `digits-convert.onnx`: the float digits MLP taking the normalised image as float NCHW
  [1,1,8,8] (Reshape -> MatMul ... Softmax): digits.onnx without its normalisation, as a
  model is exported for conversion. `pool224-convert.onnx`: pool224 taking float NCHW
  [1,3,224,224] already centred to -1..1.
- Their normalisation is in the conversion settings instead, `<model>-<chip>.config.json`:
  the keyword arguments given to `rknn.config()`. digits: `mean_values`
  255·mean, `std_values` 255·std (so (pixel - 255·mean)/(255·std) = (pixel/255 - mean)/std);
  pool224: 127.5 and 127.5 per channel; `quantized_dtype` w8a8 (int8); `target_platform`
  the chip.

{rknn_md(measured.get("rknn"))}{prompt_md(measured.get("two_input"))}
## The demo detector
`digits-det.onnx` and its `.rknn` files, trained on the synthetic detection set, are
described in `DETECTOR.md` (made by `tools/build_demo_detector.py`).

## The demo segmenter
`digits-seg.onnx` (the detector with a YOLOv8-seg mask head, the model zoo's yolov8_seg
layout) and its `.rknn` files are described in `SEGMENTER.md` (made by
`tools/build_demo_segmenter.py`).

All ONNX models: opset {OPSET}, ir_version {IR_VERSION};
`onnx.checker.check_model(full_check=True)` passes.
"""


def rknn_md(rknn: dict | None) -> str:
    """The MODELS.md section on the .rknn files."""
    if not rknn:
        return "## .rknn files\nNot converted yet: `python tools/build_demo_assets.py --rknn`.\n"
    rows, pool = [], []
    for stem in demo.rknn_stems():
        f = rknn["models"][stem]
        name = f"| `{stem}.rknn` | {f['bytes']:,} | {', '.join(f['platforms'])} |"
        if "top1_all" in f:
            rows.append(
                f"{name} {_pct(f['top1_test'])} | {_pct(f['top1_all'])} | "
                f"{_pct(f['agree_all'])} ({f['flips_all']} flipped) |"
            )
        else:
            pool.append(f"{name} {f['cos_mean']:.5f} | {f['cos_min']:.5f} | {_pct(f['agree'])} |")
    table, pool_table = "\n".join(rows), "\n".join(pool)
    digits = rknn["models"][f"digits-{demo.RKNN_PLATFORMS[0]}"]
    inp, out = digits["inputs"][0], digits["outputs"][0]
    return f"""## .rknn files (rknn-toolkit2 {rknn["toolkit"]})
Converted from the models above with their settings file and calibration list
(`<model>-<chip>.dataset.txt`, written by `batchinfer demo` with its images under
`calibration/`: for `digits` the first {demo.CALIBRATION_PER_CLASS} train digits of each
class as 0..255 pixels; for `digits-lowcal` the same digits as raw 0..16 values, the
mistake of digits-lowcal.onnx; for `pool224` {demo.POOL224_CALIBRATION} seeded colour
ramps). `build(do_quantization=True)`: int8, the toolkit's default asymmetric per-layer
activations and per-channel weights. Each takes raw uint8 NHWC and normalises on the NPU.

Top-1 measured with rknn-toolkit2's simulator (`--backend toolkit`: the NPU's quantised
numerics, no timing), against the labels and, for agreement, against digits.onnx on all
1,797 digits; pool224 against pool224.onnx on 64 seeded random images (its classes mean
nothing, so its argmax is unstable on noise: cosine is the figure to read).

| file | bytes | platforms (from the file) | top-1 held-out | top-1 all | agreement with float |
|---|---|---|---|---|---|
{table}

| file | bytes | platforms (from the file) | cosine, mean | cosine, worst | top-1 agreement |
|---|---|---|---|---|---|
{pool_table}

The trailing JSON of `digits-{demo.RKNN_PLATFORMS[0]}.rknn` says: input `{inp[0]}`
{inp[1]} {inp[2]} (the source model's NCHW shape; the runtime takes NHWC), output
`{out[0]}` {out[1]} {out[2] or "float (not quantised)"}, toolkit version {digits["version"]}.
"""


if __name__ == "__main__":
    main()
