"""Run several input sizes through a dynamic-shape model, NCHW data, like Rockchip's example.

usage: dynamic_shape_nchw.py MODEL.rknn IMAGE.npy OUT.npz SIZE [SIZE ...]
IMAGE.npy holds an RGB uint8 image (H, W, 3) at least as large as every SIZE. For each
size the top-left SIZE x SIZE crop is fed as NCHW with data_format=['nchw']; OUT.npz holds
the outputs by size (a size the model rejects is stored as an empty array).
"""

import sys

import numpy as np
from rknnlite.api import RKNNLite

if __name__ == "__main__":
    model, image, out, *sizes = sys.argv[1:]
    rknn_lite = RKNNLite()
    if rknn_lite.load_rknn(model) != 0:
        print("Load RKNN model failed")
        exit(-1)
    if rknn_lite.init_runtime(core_mask=RKNNLite.NPU_CORE_0) != 0:
        print("Init runtime environment failed")
        exit(-1)

    img = np.load(image)
    results = {}
    for size in (int(s) for s in sizes):
        print(f"input shape: 1,3,{size},{size}")
        real_img = img[:size, :size]
        real_img = np.expand_dims(real_img, 0)
        real_img = np.transpose(real_img, (0, 3, 1, 2))
        outputs = rknn_lite.inference(inputs=[real_img], data_format=["nchw"])
        results[str(size)] = outputs[0] if outputs is not None else np.empty(0)
    np.savez(out, **results)
    rknn_lite.release()
