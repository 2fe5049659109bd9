"""Drive rknn_runtime directly, importing RKNNLite from its own module, as public apps do.

usage: low_level_pipeline.py MODEL.rknn FRAMES.npy OUT.npz
FRAMES.npy holds N RGB uint8 frames (N, H, W, 3), at least as large as the model input.
The app sets up logging by level name before importing RKNNLite, reads the input size
through rknn_runtime.get_tensor_attr, then sets the next frame's inputs while a thread
gets the last frame's outputs (set_inputs / run / get_outputs of rknn_runtime). After the
loop it names a logging level again, which fails on a board (the real import renamed the
levels). OUT.npz: "low" (every frame's outputs this way) and "inference" (the same frames
through RKNNLite.inference).
"""

import logging
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

logging.basicConfig(level="INFO", format="%(levelname)s %(message)s")
log = logging.getLogger("app")

from rknnlite.api.rknn_lite import RKNNLite  # noqa: E402 - after logging, as in the apps


def main(model, frames_path, out):
    rknn_lite = RKNNLite()
    if rknn_lite.load_rknn(model) != 0:
        sys.exit("Load RKNN model failed")
    if rknn_lite.init_runtime(core_mask=RKNNLite.NPU_CORE_0) != 0:
        sys.exit("Init runtime environment failed")
    runtime = rknn_lite.rknn_runtime
    attr = runtime.get_tensor_attr(0)
    h, w = int(attr.dims[1]), int(attr.dims[2])
    frames = [f[None, :h, :w] for f in np.load(frames_path)]
    log.info("input %dx%d, %d frames", h, w, len(frames))

    low = []
    with ThreadPoolExecutor(max_workers=1) as executor:
        runtime.set_inputs([frames[0]], None, ["nhwc"], inputs_pass_through=None)
        for k in range(len(frames)):
            runtime.run(False)
            pending = executor.submit(runtime.get_outputs, False)
            if k + 1 < len(frames):
                runtime.set_inputs([frames[k + 1]], None, ["nhwc"], inputs_pass_through=None)
            low.append(pending.result()[0])
    through_inference = [rknn_lite.inference(inputs=[f])[0] for f in frames]
    rknn_lite.release()
    np.savez(out, low=np.concatenate(low), inference=np.concatenate(through_inference))
    log.setLevel("INFO")  # ValueError: Unknown level: 'INFO' on a board
    log.info("done")


if __name__ == "__main__":
    main(*sys.argv[1:4])
