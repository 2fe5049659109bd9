"""Classify one image the way Rockchip's lite2 resnet18 example does.

usage: resnet18_classifier.py MODEL.rknn IMAGE.npy OUT.npy
IMAGE.npy holds an RGB uint8 image (H, W, 3); the model normalises it itself.
"""

import platform
import sys

import numpy as np
from rknnlite.api import RKNNLite

# device tree for RK356x/RK3576/RK3588
DEVICE_COMPATIBLE_NODE = "/proc/device-tree/compatible"


def get_host():
    # get platform and device type
    system = platform.system()
    machine = platform.machine()
    os_machine = system + "-" + machine
    if os_machine == "Linux-aarch64":
        try:
            with open(DEVICE_COMPATIBLE_NODE) as f:
                device_compatible_str = f.read()
                if "rk3562" in device_compatible_str:
                    host = "RK3562"
                elif "rk3576" in device_compatible_str:
                    host = "RK3576"
                elif "rk3588" in device_compatible_str:
                    host = "RK3588"
                else:
                    host = "RK3566_RK3568"
        except OSError:
            print(f"Read device node {DEVICE_COMPATIBLE_NODE} failed.")
            exit(-1)
    else:
        host = os_machine
    return host


def show_top5(result):
    output = result[0].reshape(-1)
    output = np.exp(output - output.max()) / np.sum(np.exp(output - output.max()))
    top5 = np.argsort(output)[::-1][:5]
    print("-----TOP 5-----")
    for index in top5:
        print(f"[{index:>3d}] score:{output[index]:.6f}")


if __name__ == "__main__":
    model, image, out = sys.argv[1:4]
    host_name = get_host()
    if host_name not in ("RK3562", "RK3576", "RK3588", "RK3566_RK3568"):
        print(f"This demo cannot run on the current platform: {host_name}")
        exit(-1)

    rknn_lite = RKNNLite()
    print("--> Load RKNN model")
    ret = rknn_lite.load_rknn(model)
    if ret != 0:
        print("Load RKNN model failed")
        exit(ret)

    img = np.load(image)
    img = np.expand_dims(img, 0)

    print("--> Init runtime environment")
    if host_name in ["RK3576", "RK3588"]:
        ret = rknn_lite.init_runtime(core_mask=RKNNLite.NPU_CORE_0)
    else:
        ret = rknn_lite.init_runtime()
    if ret != 0:
        print("Init runtime environment failed")
        exit(ret)

    print("--> Running model")
    outputs = rknn_lite.inference(inputs=[img])
    show_top5(outputs)
    np.save(out, outputs[0])
    rknn_lite.release()
