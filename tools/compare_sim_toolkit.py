"""How far the emulator's numerics are from the NPU's: ``sim`` against ``toolkit`` on the demo.

    .venv-toolkit/bin/python tools/compare_sim_toolkit.py [--platform rk3588] [--markdown]

Runs in the toolkit's environment (bash tools/toolkit-env.sh). For each demo model that has
an .rknn (digits, digits-lowcal, pool224) it computes the outputs of:

- ``toolkit``: the .rknn's quantised numerics (rknn-toolkit2's simulator) on raw uint8 NHWC;
- ``sim float``: the float model the .rknn was converted from (``<model>-convert.onnx``)
  on the sim backend, fed the input normalised as the conversion settings say;
- ``sim QDQ``: the same float model quantised with onnxruntime.quantization
  (``quant_pre_process``, then ``quantize_static``: QDQ, int8 per-channel weights, int8
  asymmetric activations, MinMax calibration on the same calibration images as the .rknn,
  the final Softmax left in float as the toolkit leaves it), on the sim backend, fed the
  same input;

and prints, for each sim variant against the toolkit, the top-1 agreement and the cosine
similarity of the output vectors (mean and worst), with each one's top-1 accuracy for the
digits models. Inputs: the 1,797 digits; for pool224, 64 seeded random uint8 images.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from batchinfer import demo

POOL224_INPUTS = 64


@dataclass(frozen=True)
class Row:
    model: str
    variant: str
    agreement: float
    cos_mean: float
    cos_worst: float
    accuracy: float | None
    items: int


def inputs_for(recipe: demo.RknnRecipe) -> tuple[np.ndarray, np.ndarray | None]:
    """Raw uint8 NHWC inputs (n, 1, H, W, C) and their labels (None for pool224)."""
    if recipe.name.startswith("digits"):
        images, labels = demo.load_digits()
        return images.reshape(-1, 1, 8, 8, 1), labels
    rng = np.random.default_rng(2)
    return rng.integers(0, 256, (POOL224_INPUTS, 1, 224, 224, 3), dtype=np.uint8), None


def normalised(raw: np.ndarray, settings: dict) -> np.ndarray:
    """What the NPU computes from ``raw`` before the first layer: (x - mean) / std, float32."""
    mean = np.asarray(settings["mean_values"][0], dtype=np.float64)
    std = np.asarray(settings["std_values"][0], dtype=np.float64)
    return ((raw - mean) / std).astype(np.float32)


def quantise_qdq(source: Path, target: Path, calibration: list[np.ndarray]) -> Path:
    """``source`` quantised by onnxruntime.quantization as QDQ int8, calibrated on NCHW arrays."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(calibration)

        def get_next(self) -> dict | None:
            item = next(self.items, None)
            return None if item is None else {"image": item}

    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = target.with_suffix(".prepared.onnx")
    quant_pre_process(str(source), str(prepared))
    # The toolkit leaves the final Softmax in float (its output is not quantised): so here.
    ops = {node.op_type for node in onnx.load(str(prepared)).graph.node} - {"Softmax"}
    quantize_static(
        str(prepared),
        str(target),
        Reader(),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=sorted(ops),
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )
    return target


def run(runtime, inputs: np.ndarray) -> np.ndarray:
    """The flattened first output for each input of ``inputs`` (n, 1, ...)."""
    outs = []
    for x in inputs:
        out = runtime.inference(inputs=[x])
        if out is None:
            raise SystemExit(f"{type(runtime).__module__} returned None; see its E lines above")
        outs.append(np.asarray(out[0], dtype=np.float64).ravel())
    return np.stack(outs)


def compare(model: str, variant: str, sim: np.ndarray, npu: np.ndarray, labels) -> Row:
    norms = np.linalg.norm(sim, axis=1) * np.linalg.norm(npu, axis=1)
    cos = np.divide((sim * npu).sum(1), norms, out=np.zeros(len(sim)), where=norms > 0)
    return Row(
        model=model,
        variant=variant,
        agreement=float((sim.argmax(1) == npu.argmax(1)).mean()),
        cos_mean=float(cos.mean()),
        cos_worst=float(cos.min()),
        accuracy=None if labels is None else float((sim.argmax(1) == labels).mean()),
        items=len(sim),
    )


def measure(stem: str, work: Path, state: Path) -> list[Row]:
    from batchinfer.runtime.sim import RKNNLite as Sim
    from batchinfer.runtime.toolkit import RKNNLite as Toolkit
    from batchinfer.runtime.toolkit import load_settings

    recipe, _ = demo.rknn_stems()[stem]
    folder = work / stem
    folder.mkdir()
    rknn_path = demo.write_rknn_model(folder, stem)
    settings = load_settings(folder / f"{stem}.config.json")
    raw, labels = inputs_for(recipe)
    x = normalised(raw, settings)  # NHWC, as the runtimes take it

    toolkit = Toolkit()
    if toolkit.load_rknn(str(rknn_path)) != 0 or toolkit.init_runtime() != 0:
        raise SystemExit(f"the toolkit backend could not run {rknn_path}")
    try:
        npu = run(toolkit, raw)
    finally:
        toolkit.release()

    # The sim runs plain .onnx copies, with nothing beside them: the input is normalised here.
    float_onnx = work / f"{stem}-float.onnx"
    float_onnx.write_bytes((demo.ASSETS / recipe.source).read_bytes())
    calibration = [
        normalised(image.reshape(1, *image.shape[:2], -1), settings).transpose(0, 3, 1, 2)
        for _, image in demo.calibration_images(recipe.calibration)
    ]
    qdq_onnx = quantise_qdq(float_onnx, work / f"{stem}-qdq.onnx", calibration)

    rows = []
    for variant, path in (("sim float", float_onnx), ("sim QDQ", qdq_onnx)):
        sim = Sim(npu_ms=0.0, host_ms=0.0, state_dir=state, faults="")
        if sim.load_rknn(str(path)) != 0 or sim.init_runtime() != 0:
            raise SystemExit(f"the sim backend could not run {path}")
        try:
            rows.append(compare(recipe.name, variant, run(sim, x), npu, labels))
        finally:
            sim.release()
    rows.append(compare(recipe.name, "toolkit", npu, npu, labels))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", default="rk3588", choices=demo.RKNN_PLATFORMS)
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the toolkit's import warns about pkg_resources
        for recipe in demo.RKNN_RECIPES:
            work = Path(tmp) / recipe.name
            work.mkdir()
            rows += measure(f"{recipe.name}-{args.platform}", work, Path(tmp) / "sim-state")
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1) + "\n")
    print(table(rows, args.markdown))


def table(rows: list[Row], markdown: bool) -> str:
    head = [
        "model",
        "run",
        "items",
        "top-1 agreement with toolkit",
        "cosine mean",
        "cosine worst",
        "top-1 accuracy",
    ]
    body = [
        [
            r.model,
            r.variant,
            f"{r.items:,}",
            "—" if r.variant == "toolkit" else f"{100 * r.agreement:.2f} %",
            "—" if r.variant == "toolkit" else f"{r.cos_mean:.5f}",
            "—" if r.variant == "toolkit" else f"{r.cos_worst:.5f}",
            "—" if r.accuracy is None else f"{100 * r.accuracy:.2f} %",
        ]
        for r in rows
    ]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    return "\n".join(
        "  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)) for row in [head, *body]
    )


if __name__ == "__main__":
    main()
