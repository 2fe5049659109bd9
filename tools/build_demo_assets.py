"""Rebuild the bundled demo assets: the digits array and the three ONNX models.

    python tools/build_demo_assets.py             # extract (scikit-learn), train, export
    python tools/build_demo_assets.py --from-npz  # keep digits.npz, rebuild the models

Everything is deterministic: the held-out split, the weight initialisation and the
mini-batch order all come from fixed seeds, and training runs in float64 so that BLAS
summation order cannot amplify into different weights. Writes into
``batchinfer/demo/assets/``: digits.npz, digits.onnx, digits-int8.onnx, pool224.onnx and
MODELS.md (with the accuracies measured here by onnxruntime).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

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


def build_float_model(weights: MlpWeights) -> onnx.ModelProto:
    """Return digits.onnx: uint8 NHWC image in, softmax probabilities out."""
    image, probs = _image_io([1, 8, 8, 1], 10)
    nodes, inits = _normalisation(weights)
    nodes += [
        helper.make_node("MatMul", ["x_norm", "w1"], ["h_mm"]),
        helper.make_node("Add", ["h_mm", "b1"], ["h_pre"]),
        helper.make_node("Relu", ["h_pre"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["l_mm"]),
        helper.make_node("Add", ["l_mm", "b2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
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


def build_int8_model(weights: MlpWeights, act_scales: dict[str, np.float32]) -> onnx.ModelProto:
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
    return _finish(graph, "Digits MLP 64-64-10, int8 QDQ per-tensor symmetric; see MODELS.md.")


def build_pool224(seed: int = POOL_SEED) -> onnx.ModelProto:
    """Return pool224.onnx: a near-free model of mobilenet's shape for throughput tests.

    Every 16th pixel of each channel is averaged (so the output depends on the input at a
    cost of microseconds), centred to -1..1 and sent through a fixed random [3,1000]
    linear layer and a softmax.
    """
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((3, 1000)) * 2.0
    b = rng.standard_normal(1000) * 0.1
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
    inits = [
        _init("starts", np.array([0, 0], np.int64)),
        _init("ends", np.array([224, 224], np.int64)),
        _init("axes", np.array([1, 2], np.int64)),
        _init("steps", np.array([16, 16], np.int64)),
        _init("w", w_folded),
        _init("b", b_folded),
    ]
    graph = helper.make_graph(nodes, "pool224", [image], [probs], inits)
    return _finish(graph, "A cheap stand-in for a 224x224 classifier (throughput tests only).")


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


# --------------------------------------------------------------------------- main


def build_models(images: np.ndarray, labels: np.ndarray, test_index: np.ndarray) -> dict:
    """Return the three ModelProtos (by file name) trained on the non-held-out digits."""
    pixels = to_pixels(images)
    train = np.setdiff1d(np.arange(len(labels)), test_index)
    weights = train_mlp(pixels[train], labels[train])
    scales = calibrate(weights, pixels[train])
    return {
        "digits.onnx": build_float_model(weights),
        "digits-int8.onnx": build_int8_model(weights, scales),
        "pool224.onnx": build_pool224(),
    }


def main() -> None:
    """Extract the digits (unless --from-npz), train, export, measure, write MODELS.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--from-npz", action="store_true", help="reuse digits.npz (no scikit-learn needed)"
    )
    args = parser.parse_args()
    ASSETS.mkdir(parents=True, exist_ok=True)
    npz_path = ASSETS / "digits.npz"
    if not args.from_npz:
        write_digits_npz(npz_path, *extract_digits())
    with np.load(npz_path) as data:
        images, labels, test_index = data["images"], data["labels"], data["test_index"]

    t0 = time.perf_counter()
    models = build_models(images, labels, test_index)
    train_s = time.perf_counter() - t0
    for name, model in models.items():
        onnx.save(model, ASSETS / name)

    pixels = to_pixels(images)
    train = np.setdiff1d(np.arange(len(labels)), test_index)
    probs = {
        n: run_digits(ort_session(ASSETS / n), pixels) for n in ("digits.onnx", "digits-int8.onnx")
    }
    acc = {
        (n, part): float((p[idx].argmax(1) == labels[idx]).mean())
        for n, p in probs.items()
        for part, idx in (("train", train), ("test", test_index))
    }
    f, q = probs["digits.onnx"][test_index], probs["digits-int8.onnx"][test_index]
    mad = float(np.abs(f - q).mean())
    max_diff = float(np.abs(f - q).max())
    agree = float((f.argmax(1) == q.argmax(1)).mean())
    latency = pool224_latency_us(ort_session(ASSETS / "pool224.onnx"))

    (ASSETS / "MODELS.md").write_text(
        _models_md(len(labels), len(test_index), acc, mad, max_diff, agree, latency, train_s)
    )
    for (n, part), a in acc.items():
        print(f"{n:18s} {part:5s} top-1 {a:.4f}")
    print(
        f"int8 vs float (held-out): mean |dp| {mad:.5f}, max {max_diff:.4f}, "
        f"top-1 agreement {agree:.4f}"
    )
    print(f"pool224 latency (onnxruntime, 1 thread, median): {latency:.1f} us")


def _models_md(n, n_test, acc, mad, max_diff, agree, latency, train_s) -> str:
    pct = {k: f"{100 * v:.2f} %" for k, v in acc.items()}
    return f"""# Demo models

Made by `python tools/build_demo_assets.py` (add `--from-npz` to skip the scikit-learn
extraction and rebuild only the models from `digits.npz`). The build is deterministic:
same seeds, same weights. Numbers below were measured by that tool with onnxruntime.

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
  {EPOCHS} epochs, L2 {WEIGHT_DECAY}, cross-entropy ({train_s:.1f} s for all three models here).
- Top-1: **{pct[("digits.onnx", "test")]} held-out**, {pct[("digits.onnx", "train")]} train.

## digits-int8.onnx (QDQ int8)
- Same input/output names and shapes. The float model with int8 per-tensor symmetric
  quantisation as QuantizeLinear/DequantizeLinear: weights int8, biases int32 (scale
  input_scale*weight_scale), activations (normalised input, hidden layer, logits) int8 with
  scales max|x|/127 calibrated on the train images.
- Top-1: **{pct[("digits-int8.onnx", "test")]} held-out**,
  {pct[("digits-int8.onnx", "train")]} train.
- Against the float model on the held-out split: mean |probs difference| {mad:.5f}
  (max {max_diff:.4f}), top-1 agreement {100 * agree:.2f} %.

## pool224.onnx (throughput stand-in)
- Input `image` uint8 [1,224,224,3] NHWC, output `probs` float32 [1,1000].
- Slice every 16th row and column -> Cast -> ReduceMean over H,W -> [1,3] -> centre to -1..1
  -> MatMul with a fixed random [3,1000] (seed {POOL_SEED}) + bias -> Softmax. Meaningless
  classes; the output depends on the input.
- onnxruntime 1 thread, median of 2,000 calls: **{latency:.1f} µs** on the build machine.

All models: opset {OPSET}, ir_version {IR_VERSION};
`onnx.checker.check_model(full_check=True)` passes.
"""


if __name__ == "__main__":
    main()
