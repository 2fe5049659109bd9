"""Infer a batch of frames with one RKNNLite per NPU core (0, 1, 2) and a thread pool.

usage: thread_pool.py MODEL.rknn FRAMES.npy OUT.npy [INSTANCES]
FRAMES.npy holds N RGB uint8 frames (N, H, W, 3); OUT.npy the N outputs in frame order.
"""

import sys
from concurrent.futures import ThreadPoolExecutor
from queue import Queue

import numpy as np
from rknnlite.api import RKNNLite


def init_rknn(model, core):
    rknn_lite = RKNNLite()
    ret = rknn_lite.load_rknn(model)
    if ret != 0:
        print("Load RKNN model failed")
        exit(ret)
    if core == 0:
        ret = rknn_lite.init_runtime(core_mask=RKNNLite.NPU_CORE_0)
    elif core == 1:
        ret = rknn_lite.init_runtime(core_mask=RKNNLite.NPU_CORE_1)
    else:
        ret = rknn_lite.init_runtime(core_mask=RKNNLite.NPU_CORE_2)
    if ret != 0:
        print("Init runtime environment failed")
        exit(ret)
    print(model, "\t\tdone")
    return rknn_lite


class RknnPoolExecutor:
    def __init__(self, model, tpes):
        self.tpes = tpes
        self.queue = Queue()
        self.rknn_pool = [init_rknn(model, i % 3) for i in range(tpes)]
        self.pool = ThreadPoolExecutor(max_workers=tpes)
        self.num = 0

    def put(self, frame):
        rknn_lite = self.rknn_pool[self.num % self.tpes]
        self.queue.put(self.pool.submit(infer, rknn_lite, frame))
        self.num += 1

    def get(self):
        if self.queue.empty():
            return None, False
        return self.queue.get().result(), True

    def release(self):
        self.pool.shutdown()
        for rknn_lite in self.rknn_pool:
            rknn_lite.release()


def infer(rknn_lite, frame):
    outputs = rknn_lite.inference(inputs=[np.expand_dims(frame, 0)])
    return outputs[0]


if __name__ == "__main__":
    model, frames_path, out = sys.argv[1:4]
    tpes = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    frames = np.load(frames_path)
    pool = RknnPoolExecutor(model, tpes)
    for frame in frames[: tpes + 1]:
        pool.put(frame)
    results = []
    for frame in frames[tpes + 1 :]:
        pool.put(frame)
        result, ok = pool.get()
        results.append(result)
    while True:
        result, ok = pool.get()
        if not ok:
            break
        results.append(result)
    pool.release()
    np.save(out, np.concatenate(results))
