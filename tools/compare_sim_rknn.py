"""The emulator reading a real .rknn against rknn-toolkit2's simulation of that .rknn.

    .venv-toolkit/bin/python tools/compare_sim_rknn.py [--platform rk3588]

Runs in the toolkit's environment (bash tools/toolkit-env.sh). For each digits demo .rknn
of the platform, both runtimes load the .rknn itself and are fed the 1,797 digits as raw
uint8 NHWC pixels, as a script on a board feeds them:

- ``sim``: the emulator, which runs the ``.onnx`` beside the .rknn and applies the
  normalisation its ``.config.json`` gives (mean/std, as the NPU would);
- ``toolkit``: rknn-toolkit2's simulator of the .rknn's quantised numerics.

Prints one Markdown row per model: top-1 agreement, cosine similarity of the output
vectors (mean and worst) and each one's top-1 accuracy. The sim runs the float model, so
where quantisation hurts (digits-lowcal, calibrated on too few images) they part.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import warnings
from pathlib import Path

import numpy as np

from batchinfer import demo


def outputs(cls: type, model: Path, pixels: np.ndarray, **kw: object) -> np.ndarray:
    runtime = cls(**kw)
    runtime.rknn_log.logger.setLevel(logging.ERROR)
    if runtime.load_rknn(str(model)) != 0 or runtime.init_runtime() != 0:
        raise SystemExit(f"{cls.__module__} could not run {model}")
    try:
        return np.concatenate([runtime.inference(inputs=[x])[0] for x in pixels])
    finally:
        runtime.release()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--platform", default="rk3588", choices=("rk3566", "rk3576", "rk3588"))
    args = parser.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the toolkit's import warns about pkg_resources
        from batchinfer.runtime.sim import RKNNLite as Sim
        from batchinfer.runtime.toolkit import RKNNLite as Toolkit
    images, labels = demo.load_digits()
    pixels = images[:, None, :, :, None].astype(np.uint8)  # N x (1, 8, 8, 1)
    print("| model | top-1 agreement | cosine mean | cosine worst | top-1 sim | top-1 toolkit |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        kit = demo.write_demo(Path(tmp) / "kit")
        for name in (f"digits-{args.platform}", f"digits-lowcal-{args.platform}"):
            model = kit.rknn[name]
            sim = outputs(Sim, model, pixels, npu_ms=0, host_ms=0, faults="", state_dir=tmp)
            npu = outputs(Toolkit, model, pixels)
            cos = (sim * npu).sum(1) / (np.linalg.norm(sim, axis=1) * np.linalg.norm(npu, axis=1))
            print(
                f"| {name} | {np.mean(sim.argmax(1) == npu.argmax(1)):.4f} | {cos.mean():.4f} "
                f"| {cos.min():.4f} | {np.mean(sim.argmax(1) == labels):.4f} "
                f"| {np.mean(npu.argmax(1) == labels):.4f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
