"""Prepare the model's native input buffer and pass it through, next to the normal path.

usage: pass_through.py MODEL.rknn IMAGE.npy OUT.npz MEAN STD
IMAGE.npy holds an RGB uint8 (1, H, W, 3) array; MEAN and STD the model's normalisation
(one number each, for every channel). The script reads the native type, zero point and
scale through rknn_runtime.get_tensor_attr, normalises and (for an int8 model) quantises
the image itself, and passes it through with inputs_pass_through=[1]. OUT.npz holds
"normal" (raw pixels through the model's own normalisation), "passed" and "buffer".
"""

import sys

import numpy as np
from rknnlite.api import RKNNLite

RKNN_TENSOR_FLOAT16, RKNN_TENSOR_INT8 = 1, 2

if __name__ == "__main__":
    model, image, out = sys.argv[1:4]
    mean, std = float(sys.argv[4]), float(sys.argv[5])
    rknn_lite = RKNNLite()
    if rknn_lite.load_rknn(model) != 0 or rknn_lite.init_runtime() != 0:
        print("Load or init failed")
        exit(-1)
    attr = rknn_lite.rknn_runtime.get_tensor_attr(0)
    img = np.load(image)
    normalised = (img.astype(np.float32) - mean) / std
    if attr.type == RKNN_TENSOR_INT8:
        q = np.round(normalised / attr.scale) + attr.zp
        buffer = np.clip(q, -128, 127).astype(np.int8)
    elif attr.type == RKNN_TENSOR_FLOAT16:
        buffer = normalised.astype(np.float16)
    else:
        print(f"unexpected native type {attr.type}")
        exit(-1)
    assert buffer.nbytes == attr.size, (buffer.nbytes, attr.size)
    normal = rknn_lite.inference(inputs=[img])
    passed = rknn_lite.inference(inputs=[buffer], inputs_pass_through=[1])
    rknn_lite.release()
    np.savez(out, normal=normal[0], passed=passed[0], buffer=buffer)
