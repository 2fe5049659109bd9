"""Start a small pool the way a deployed application does, reading shapes from the runtime.

usage: shape_reading_pool.py MODEL.rknn IMAGE.npy OUT.npz [INSTANCES]
The logger is lowered to ERROR before loading (so warnings and info stay quiet), every
instance reads its input size and type through rknn_runtime.get_tensor_attr, and the
image (an RGB uint8 (H, W, 3) array, at least as large as the model input) is cropped to
that size. OUT.npz: the outputs of every instance and the shapes it read.
"""

import logging
import sys

import numpy as np
from rknnlite.api import RKNNLite

RKNN_TENSOR_TYPE = {0: "float32", 1: "float16", 2: "int8", 3: "uint8"}


def init_rknn(model_path):
    rknn_lite = RKNNLite()
    rknn_lite.rknn_log.logger.setLevel(logging.ERROR)
    ret = rknn_lite.load_rknn(model_path)
    if ret != 0:
        raise RuntimeError("Failed to load RKNN model")
    ret = rknn_lite.init_runtime(core_mask=RKNNLite.NPU_CORE_AUTO)
    if ret != 0:
        raise RuntimeError("Failed to init RKNN runtime")
    return rknn_lite


def signature(rknn_lite):
    n_in, n_out = rknn_lite.rknn_runtime.get_in_out_num()
    sig = []
    for i in range(n_in):
        at = rknn_lite.rknn_runtime.get_tensor_attr(i, is_output=False)
        sig.append(
            {
                "name": at.name.decode() if isinstance(at.name, bytes) else str(at.name),
                "type": RKNN_TENSOR_TYPE.get(int(at.type)),
                "dims": [int(d) for d in at.dims][: int(at.n_dims)],
            }
        )
    return sig, n_out


if __name__ == "__main__":
    model, image, out = sys.argv[1:4]
    instances = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    pool = [init_rknn(model) for _ in range(instances)]
    img = np.load(image)
    saved = {}
    for k, rknn_lite in enumerate(pool):
        sig, n_out = signature(rknn_lite)
        _, height, width, _ = sig[0]["dims"]
        print(
            f"instance {k}: input {sig[0]['name']} {sig[0]['dims']} {sig[0]['type']}, "
            f"{n_out} output(s)"
        )
        outputs = rknn_lite.inference(inputs=[np.expand_dims(img[:height, :width], 0)])
        saved[f"out{k}"] = outputs[0]
        saved[f"dims{k}"] = np.array(sig[0]["dims"])
    for rknn_lite in pool:
        rknn_lite.release()
    np.savez(out, **saved)
