"""What the demo model builders share (build_demo_detector, _segmenter, _pose): training
or reusing saved weights, running an ONNX file or a converted .rknn on letterboxed
canvases, converting a model for every chip, comparing int8 with float outputs, and the
command line that writes one section of ``measured.json`` and its page.

Nothing here imports torch or rknn-toolkit2 at module level: ``score`` runs in the
project's environment, ``train`` and ``rknn`` in the toolkit's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from batchinfer.demo import ASSETS

#: ``run(canvas uint8 (H, W, 3)) -> outputs``: a model on one letterboxed canvas.
Runner = Callable[[np.ndarray], list]


def load_detector(detector, path: Path) -> None:
    """Set ``detector``'s weights to those of the committed ONNX (batch norm folded there:
    here each norm becomes the identity, gamma 1, mean 0, var 1 - eps, beta the bias)."""
    import onnx
    import torch
    from onnx import numpy_helper

    weights = {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
    state = detector.state_dict()
    for key in state:
        module, _, leaf = key.rpartition(".")
        name = module.replace(".", "_")
        if leaf == "weight" and f"{name}_w" in weights:  # a plain conv (the outputs)
            state[key] = torch.from_numpy(weights[f"{name}_w"].copy())
        elif leaf == "bias" and f"{name}_b" in weights:
            state[key] = torch.from_numpy(weights[f"{name}_b"].copy())
        elif module.endswith(".0") and leaf == "weight":  # conv of a ConvBnRelu
            state[key] = torch.from_numpy(weights[f"{name[:-2]}_w"].copy())
        elif module.endswith(".1"):  # its batch norm
            b = torch.from_numpy(weights[f"{name[:-2]}_b"].copy())
            state[key] = {
                "weight": torch.ones_like(b),
                "bias": b,
                "running_mean": torch.zeros_like(b),
                "running_var": torch.full_like(b, 1 - 1e-5),
            }.get(leaf, state[key])
    detector.load_state_dict(state)


def ort_session(model):
    """A one-thread onnxruntime session for a ModelProto or a path."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    source = model if isinstance(model, (str, Path)) else model.SerializeToString()
    return ort.InferenceSession(str(source) if isinstance(source, Path) else source, opts)


def onnx_runner(path: Path, names: Sequence[str]) -> Runner:
    """The float model at ``path`` as a Runner (input ``images``: NCHW RGB / 255)."""
    session = ort_session(path)

    def run(canvas: np.ndarray) -> list:
        x = (canvas.transpose(2, 0, 1)[None] / np.float32(255.0)).astype(np.float32)
        return session.run(list(names), {"images": x})

    return run


@contextlib.contextmanager
def rknn_runner(path: Path) -> Iterator[Runner]:
    """The .rknn at ``path`` on rknn-toolkit2's simulator, as a Runner (uint8 NHWC in)."""
    from batchinfer.runtime.toolkit import RKNNLite

    rknn = RKNNLite()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if rknn.load_rknn(str(path)) != 0 or rknn.init_runtime() != 0:
            raise SystemExit(f"the toolkit backend could not run {path}")
    try:
        yield lambda canvas: rknn.inference(inputs=[canvas[None]])
    finally:
        rknn.release()


def worst_cosines(
    run: Runner, float_run: Runner, names: Sequence[str], canvases: Sequence[np.ndarray]
) -> dict[str, float]:
    """Per output name, the lowest cosine of ``run``'s outputs against ``float_run``'s over
    ``canvases`` (an int8 output all 0 against a float one near 0 has no direction and is
    passed over)."""
    cosines: dict[str, list[float]] = {name: [] for name in names}
    for canvas in canvases:
        for name, q, f in zip(names, run(canvas), float_run(canvas), strict=True):
            q, f = q.ravel().astype(np.float64), f.ravel().astype(np.float64)
            norms = np.linalg.norm(q) * np.linalg.norm(f)
            if norms > 0:
                cosines[name].append(float(q @ f / norms))
    return {k: min(v) for k, v in cosines.items() if v}


def train_or_reuse(work: Path, train: Callable[[], tuple]) -> dict:
    """The training figures; ``train() -> (model, figures)`` runs unless ``work`` holds the
    weights of an earlier run (``weights.pt``, ``train.json``: delete them to train again)."""
    import torch

    weights = work / "weights.pt"
    if weights.is_file():
        print(f"reusing {weights} (delete it to train again)")
        return json.loads((work / "train.json").read_text())
    work.mkdir(parents=True, exist_ok=True)
    model, figures = train()
    torch.save(model.state_dict(), weights)
    (work / "train.json").write_text(json.dumps(figures, indent=1) + "\n")
    return figures


def convert_all(
    stems: dict, measure: Callable[[Path, str], dict]
) -> dict:  # stems: demo.rknn_stems(...)
    """Convert every stem (recipe, platform) with build_demo_assets.convert, copy each
    .rknn into the assets and ``measure(path, platform)`` it; the toolkit's version."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import build_demo_assets  # the classifier's conversion: config, load_onnx, build, export

    from batchinfer.runtime.toolkit import CACHE_ENV, toolkit_version

    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[CACHE_ENV] = str(Path(tmp) / "cache")
        for stem, (_, platform) in stems.items():
            folder = Path(tmp) / stem
            folder.mkdir()
            path = build_demo_assets.convert(stem, folder)
            shutil.copyfile(path, ASSETS / path.name)
            figures[stem] = measure(path, platform)
            print(f"{stem:24s} {figures[stem]}", flush=True)
    return {"toolkit": toolkit_version(), "models": figures}


def main(
    doc: str,
    section_name: str,
    modes: dict[str, Callable[[Path], dict]],
    default_work: Path,
    pages: Callable[[dict, dict], dict[str, str]],
) -> None:
    """``python tools/build_demo_<x>.py MODE [--work DIR]``: run ``modes[MODE](work)``,
    store what it returns as ``measured.json[section_name][MODE]`` and write the pages
    ``pages(section, measured)`` returns (asset file name -> text)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("mode", choices=tuple(modes))
    parser.add_argument(
        "--work", type=Path, default=default_work, help=f"scratch folder ({default_work})"
    )
    args = parser.parse_args()
    measured_path = ASSETS / "measured.json"
    measured = json.loads(measured_path.read_text()) if measured_path.is_file() else {}
    section = measured.setdefault(section_name, {})
    args.work.mkdir(parents=True, exist_ok=True)
    section[{"train": "onnx", "rknn": "rknn", "score": "score"}[args.mode]] = modes[args.mode](
        args.work
    )
    written = pages(section, measured)
    measured_path.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
    for name, text in written.items():
        (ASSETS / name).write_text(text)
    print(f"wrote {measured_path} and {', '.join(written)}")


def fit(
    model,
    step_loss: Callable[[int], tuple],
    *,
    steps: int,
    batch: int,
    threads: int,
    learning_rate: float,
    weight_decay: float,
    logged: str,
    warmup: int = 25,
    log_every: int = 25,
) -> dict:
    """Train ``model``'s parameters that need a gradient (a head beside a frozen detector):
    AdamW (no decay on biases and norms), linear warm-up then cosine, gradients clipped at
    10; ``step_loss(step) -> (loss, value to log)``. Returns the training figures, the
    logged value's mean every ``log_every`` steps under ``logged``."""
    import math

    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.ndim > 1], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0},
        ],
        lr=learning_rate,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser,
        lambda k: min(1.0, (k + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * k / steps)),
    )
    model.train()
    t0, cpu0 = time.perf_counter(), time.process_time()
    history, running = [], 0.0
    for step in range(steps):
        loss, value = step_loss(step)
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        optimiser.step()
        schedule.step()
        running += value
        if (step + 1) % log_every == 0:
            history.append({"step": step + 1, logged: running / log_every})
            running = 0.0
            print(
                f"step {step + 1:5d} {logged} {history[-1][logged]:.4f}"
                f"  {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    model.eval()
    return {
        "steps": steps,
        "batch": batch,
        "images_seen": steps * batch,
        "threads": threads,
        "trained_params": sum(p.numel() for p in params),
        "train_s": time.perf_counter() - t0,
        "train_cpu_s": time.process_time() - cpu0,
        "loss_history": history,
    }


def on_frozen_detector(detector_class):
    """A torch module class holding ``self.det`` (a ``detector_class``) kept in eval mode
    while the rest trains: the segmenter's and pose model's base."""
    from torch import nn

    class OnDetector(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.det = detector_class()

        def train(self, mode: bool = True):
            super().train(mode)
            self.det.eval()  # frozen: its batch norms keep the detector's statistics
            return self

    return OnDetector


def freeze_detector(model, path: Path):
    """``model`` with ``model.det``'s weights read from the ONNX at ``path``, frozen."""
    load_detector(model.det, path)
    for p in model.det.parameters():
        p.requires_grad_(False)
    return model


def export(
    work: Path, train: Callable, build: Callable, to_onnx: Callable, check: Callable, name: str
):
    """Train (or reuse ``work``'s weights), export ``to_onnx(state)`` as the asset ``name``;
    (the figures with the export's max |ONNX - torch| and its bytes, the ModelProto)."""
    import onnx
    import torch

    figures = train_or_reuse(work, train)
    model = build()
    model.load_state_dict(torch.load(work / "weights.pt"))
    model.eval()
    proto = to_onnx(model.state_dict())
    onnx.save(proto, ASSETS / name)
    figures["onnx_vs_torch_max_abs"] = check(proto, model)
    figures["onnx_bytes"] = (ASSETS / name).stat().st_size
    return figures, proto


def decoded_val(run: Runner, n: int, letterbox: Callable, make_decoder: Callable):
    """Yield (image id from 1, the decoder's result in original pixels) for the first ``n``
    val scenes: ``letterbox(image) -> (canvas, scale, pad_x, pad_y)``, ``run(canvas)``, and
    ``make_decoder(output shapes) -> decoder(outputs, Letterbox)``, made once."""
    from batchinfer.demo import detection
    from batchinfer.detect.letterbox import Letterbox

    decoder = None
    for image_id, scene in enumerate(detection.scenes("val", n), start=1):
        h, w = scene.image.shape[:2]
        canvas, scale, px, py = letterbox(scene.image)
        outputs = run(canvas)
        if decoder is None:
            decoder = make_decoder([o.shape for o in outputs])
        yield image_id, decoder(outputs, Letterbox(w, h, scale, px, py))


def coco_maps(results: list[dict], n: int, kinds: Sequence[str], **ground_truth) -> dict:
    """pycocotools' mAP@0.5 and mAP@0.5:0.95 per evaluation kind ("bbox", "segm",
    "keypoints") of ``results`` on the first ``n`` val scenes' ground truth
    (``detection.coco_instances(..., **ground_truth)``); ``sigmas=`` the keypoints' OKS
    sigmas."""
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from batchinfer.demo import detection

    sigmas = ground_truth.pop("sigmas", None)
    items = [(f"{i:05d}.png", s) for i, s in enumerate(detection.scenes("val", n))]
    gt = COCO()
    gt.dataset = detection.coco_instances(items, **ground_truth)
    out = {}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        dt = gt.loadRes(results) if results else None
        for kind in kinds:
            ev = COCOeval(gt, dt, kind)
            if sigmas is not None:
                ev.params.kpt_oks_sigmas = np.asarray(sigmas, np.float64)
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
            out[kind] = {"map50": float(ev.stats[1]), "map50_95": float(ev.stats[0])}
    return out
