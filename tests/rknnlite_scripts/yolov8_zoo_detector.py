"""Detect objects in a folder of images the way rknn_model_zoo's YOLOv8 Python demo does.

usage: yolov8_zoo_detector.py MODEL.rknn IMAGE_FOLDER OUT.json SIZE CLASS_NAMES

Written for these tests, following examples/yolov8/python/yolov8.py step by step: the
sorted image files of a folder, each letterboxed to SIZE x SIZE with black padding (the
demo's "rga init with (0,0,0)"), fed as uint8 RGB NHWC; per branch of three outputs the box
output goes through DFL (softmax over 16 bins, expectation) around the cell centres, the
class scores are read as they are and the score sum is ignored; candidates whose best
class score reaches OBJ_THRESH are kept, then NMS per class (with the demo's +0.00001 in
the overlap width and height), classes in the order set() gives them; boxes back to the
original image by undoing the letterbox (with the demo's half paddings) and clipping.
Prints the demo's "name @ (x1 y1 x2 y2) score" lines and writes the boxes to OUT.json.
Pillow stands in for OpenCV (same bilinear resize rule for the letterbox).
"""

import json
import os
import sys

import numpy as np
from PIL import Image
from rknnlite.api import RKNNLite

OBJ_THRESH = 0.25
NMS_THRESH = 0.45


def letterbox(img, size, pad=(0, 0, 0)):
    h, w = img.shape[:2]
    ratio = min(size / h, size / w)
    new_w, new_h = round(w * ratio), round(h * ratio)
    dw, dh = (size - new_w) / 2, (size - new_h) / 2
    left, top = round(dw - 0.1), round(dh - 0.1)
    canvas = np.empty((size, size, 3), np.uint8)
    canvas[:] = pad
    resized = np.asarray(Image.fromarray(img).resize((new_w, new_h), Image.BILINEAR))
    canvas[top : top + new_h, left : left + new_w] = resized
    # The demo maps boxes back with these halves of the padding, not with left/top: half
    # a pixel off where the padding is odd. Kept, since that is what the demo computes.
    return canvas, ratio, (dw, dh)


def dfl(box):
    n, c, h, w = box.shape
    bins = c // 4
    x = box.reshape(n, 4, bins, h, w).astype(np.float32)
    e = np.exp(x - x.max(axis=2, keepdims=True))
    p = e / e.sum(axis=2, keepdims=True)
    return (p * np.arange(bins, dtype=np.float32).reshape(1, 1, bins, 1, 1)).sum(axis=2)


def branch_boxes(box, size):
    h, w = box.shape[2:4]
    col, row = np.meshgrid(np.arange(w), np.arange(h))
    grid = np.stack([col, row])[None]  # (1, 2, h, w): x then y
    stride = np.array([size // h, size // w]).reshape(1, 2, 1, 1)
    d = dfl(box)
    top_left = (grid + 0.5 - d[:, 0:2]) * stride
    bottom_right = (grid + 0.5 + d[:, 2:4]) * stride
    return np.concatenate([top_left, bottom_right], axis=1)


def flat(x):
    return x.transpose(0, 2, 3, 1).reshape(-1, x.shape[1])


def nms(boxes, scores):
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1) * (y2 - y1)
    order = scores.argsort()[::-1]
    keep = []
    while order.size:
        i, rest = order[0], order[1:]
        keep.append(i)
        w = np.maximum(0.0, np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]) + 0.00001)
        h = np.maximum(0.0, np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]) + 0.00001)
        inter = w * h
        order = rest[inter / (areas[i] + areas[rest] - inter) <= NMS_THRESH]
    return np.array(keep, dtype=np.int64)


def post_process(outputs, size):
    per_branch = len(outputs) // 3
    boxes = np.concatenate([flat(branch_boxes(outputs[per_branch * i], size)) for i in range(3)])
    probs = np.concatenate([flat(outputs[per_branch * i + 1]) for i in range(3)])
    best, classes = probs.max(axis=-1), probs.argmax(axis=-1)
    keep = best >= OBJ_THRESH  # times an object score of ones, as the demo does
    boxes, classes, scores = boxes[keep], classes[keep], best[keep]
    found = []
    for c in set(classes):
        where = np.where(classes == c)
        kept = nms(boxes[where], scores[where])
        found += [(boxes[where][k], int(c), float(scores[where][k])) for k in kept]
    return found


def main():
    model, folder, out, size, names = sys.argv[1:6]
    size, names = int(size), names.split(",")
    rknn = RKNNLite()
    if rknn.load_rknn(model) != 0 or rknn.init_runtime() != 0:
        print("Load or init of the RKNN model failed")
        sys.exit(-1)
    results = {}
    for name in sorted(os.listdir(folder)):
        if not name.lower().endswith((".jpg", ".jpeg", ".png", ".bmp")):
            continue
        with Image.open(os.path.join(folder, name)) as im:
            src = np.asarray(im.convert("RGB"))
        img, ratio, (dw, dh) = letterbox(src, size)
        outputs = rknn.inference(inputs=[np.expand_dims(img, 0)])
        rows = []
        for box, c, score in post_process(outputs, size):
            x1, y1, x2, y2 = box
            real = [
                float(np.clip((x1 - dw) / ratio, 0, src.shape[1])),
                float(np.clip((y1 - dh) / ratio, 0, src.shape[0])),
                float(np.clip((x2 - dw) / ratio, 0, src.shape[1])),
                float(np.clip((y2 - dh) / ratio, 0, src.shape[0])),
            ]
            corners = " ".join(str(int(v)) for v in real)
            print(f"{names[c]} @ ({corners}) {score:.3f}")
            rows.append({"class_id": c, "score": score, "box": real})
        results[name] = rows
    rknn.release()
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
