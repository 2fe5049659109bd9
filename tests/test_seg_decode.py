"""Instance segmentation decoding (batchinfer.detect.seg_decode) against an independent
reference, on fake constant-output models of each head layout (tests/seg_scenes.py).

The reference below is written plainly after the model zoo's Python post-processing
(examples/yolov8_seg/python/yolov8_seg.py, examples/yolov5_seg/python/yolov5_seg.py and
py_utils/coco_utils.py) and Ultralytics' non_max_suppression / process_mask: every cell
decoded, greedy NMS one box at a time with the zoo's class offset, dense sigmoid masks over
the whole prototype, upsampled to the canvas (bilinear, align_corners=False), cropped to
the box there, thresholded at 0.5, then the unpadded canvas resized to the original image.
The decoder must match it per instance: class, score within 1e-3, box corners within 3 px,
mask IoU >= 0.85 (masks read back with pycocotools).
"""

from __future__ import annotations

import numpy as np
import pycocotools.mask as mask_api
import pytest
import seg_scenes

from batchinfer.detect import DetectSettings, letterbox_geometry
from batchinfer.detect.seg_decode import SegmentDecoder
from batchinfer.detect.seg_heads import recognise_segment
from batchinfer.errors import InferenceError

# pycocotools' decode warns under numpy 2 (its __array__ takes no copy keyword)
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

CONF, IOU, MAX_DET = 0.25, 0.45, 300

# --- the reference --------------------------------------------------------------------------


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _flatten(a):
    """(1, ch, H, W) -> (H*W, ch), the zoo's sp_flatten."""
    return a.transpose(0, 2, 3, 1).reshape(-1, a.shape[1])


def _zoo_v8_candidates(outputs, input_hw):
    boxes, classes_conf, seg_part = [], [], []
    for i in range(3):
        position = outputs[4 * i].astype(np.float64)
        _, _, gh, gw = position.shape
        y = position.reshape(1, 4, 16, gh, gw)
        y = np.exp(y - y.max(axis=2, keepdims=True))
        y = y / y.sum(axis=2, keepdims=True)
        dist = (y * np.arange(16).reshape(1, 1, 16, 1, 1)).sum(axis=2)
        col, row = np.meshgrid(np.arange(gw), np.arange(gh))
        grid = np.stack([col, row])[None]
        stride = np.array([input_hw[1] // gw, input_hw[0] // gh]).reshape(1, 2, 1, 1)
        xyxy = np.concatenate(
            [(grid + 0.5 - dist[:, :2]) * stride, (grid + 0.5 + dist[:, 2:]) * stride], axis=1
        )
        boxes.append(_flatten(xyxy))
        classes_conf.append(_flatten(outputs[4 * i + 1]))
        seg_part.append(_flatten(outputs[4 * i + 3]))
    cls = np.concatenate(classes_conf)
    return np.concatenate(boxes), cls.max(axis=1), cls.argmax(axis=1), np.concatenate(seg_part)


def _zoo_v5_candidates(outputs, input_hw):
    boxes, scores, classes, seg_part = [], [], [], []
    for i in range(3):
        det = outputs[2 * i].reshape(3, -1, *outputs[2 * i].shape[-2:]).astype(np.float64)
        seg = outputs[2 * i + 1].reshape(3, -1, *outputs[2 * i + 1].shape[-2:])
        _, _, gh, gw = det.shape
        col, row = np.meshgrid(np.arange(gw), np.arange(gh))
        grid = np.stack([col, row])[None]
        stride = np.array([input_hw[1] // gw, input_hw[0] // gh]).reshape(1, 2, 1, 1)
        anchors = np.array(seg_scenes.ANCHORS[i], np.float64).reshape(3, 2, 1, 1)
        xy = (det[:, :2] * 2 - 0.5 + grid) * stride
        wh = (det[:, 2:4] * 2) ** 2 * anchors
        xyxy = np.concatenate([xy - wh / 2, xy + wh / 2], axis=1)
        boxes.append(_flatten(xyxy))
        obj = _flatten(det[:, 4:5]).reshape(-1)
        cls = _flatten(det[:, 5:])
        scores.append(cls.max(axis=1) * obj)
        classes.append(cls.argmax(axis=1))
        seg_part.append(_flatten(seg) * obj[:, None])  # as the zoo does: sign unchanged
    return (np.concatenate(boxes), np.concatenate(scores), np.concatenate(classes),
            np.concatenate(seg_part))  # fmt: skip


def _ultralytics_candidates(outputs, num_classes):
    raw = outputs[0][0].astype(np.float64)
    cx, cy, w, h = raw[:4]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    cls = raw[4 : 4 + num_classes].T
    return boxes, cls.max(axis=1), cls.argmax(axis=1), raw[4 + num_classes :].T


def _iou(a, b):
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _reference_nms(boxes, scores, classes):
    shifted = boxes + classes[:, None] * 7680.0  # the zoo's class offset (max_wh)
    order = [int(i) for i in np.argsort(-scores, kind="stable")]
    keep = []
    while order:
        i = order.pop(0)
        keep.append(i)
        order = [j for j in order if _iou(shifted[i], shifted[j]) <= IOU]
    return keep[:MAX_DET]


def _bilinear(img, out_h, out_w):
    """F.interpolate(mode="bilinear", align_corners=False) of a 2-D array."""
    h, w = img.shape
    ys = np.clip((np.arange(out_h) + 0.5) * h / out_h - 0.5, 0, None)
    xs = np.clip((np.arange(out_w) + 0.5) * w / out_w - 0.5, 0, None)
    y0 = np.minimum(np.floor(ys).astype(int), h - 1)
    x0 = np.minimum(np.floor(xs).astype(int), w - 1)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None], (xs - x0)[:, None]
    img = img.astype(np.float32)
    cols = (img[y0] * (1 - fy) + img[y1] * fy).T  # separable: along y, then along x
    return (cols[x0] * (1 - fx) + cols[x1] * fx).T


def reference(family, outputs, input_hw, num_classes, lb):
    """(boxes in original pixels, scores, classes, dense masks in original pixels)."""
    if family == "yolov8-seg-zoo":
        boxes, scores, classes, coefs = _zoo_v8_candidates(outputs, input_hw)
    elif family == "yolov5-seg-zoo":
        boxes, scores, classes, coefs = _zoo_v5_candidates(outputs, input_hw)
    else:
        boxes, scores, classes, coefs = _ultralytics_candidates(outputs, num_classes)
    passing = np.flatnonzero(scores >= CONF)
    keep = passing[_reference_nms(boxes[passing], scores[passing], classes[passing])]
    proto = outputs[-1][0].astype(np.float64)
    in_h, in_w = input_hw
    new_w, new_h = lb.resized
    top, left = int(lb.pad_y), int(lb.pad_x)
    masks = []
    for i in keep:
        canvas = _bilinear(_sigmoid(np.tensordot(coefs[i], proto, axes=1)), in_h, in_w)
        x1, y1, x2, y2 = boxes[i]
        r, c = np.arange(in_w)[None, :], np.arange(in_h)[:, None]
        canvas = canvas * ((r >= x1) & (r < x2) & (c >= y1) & (c < y2))  # the zoo's _crop_mask
        binary = (canvas > 0.5).astype(np.float64)[top : top + new_h, left : left + new_w]
        masks.append(_bilinear(binary, lb.src_h, lb.src_w) > 0.5)  # get_real_seg's resize
    real = boxes[keep].copy()  # the zoo's get_real_box: minus the padding, over the ratio
    real[:, 0::2] = np.clip((real[:, 0::2] - lb.pad_x) / lb.scale, 0, lb.src_w)
    real[:, 1::2] = np.clip((real[:, 1::2] - lb.pad_y) / lb.scale, 0, lb.src_h)
    return real, scores[keep], classes[keep], masks


# --- the cases --------------------------------------------------------------------------------

# (layout, model input (h, w), classes, original image (w, h))
CASES = [
    ("yolov8-seg-zoo", (640, 640), 80, (640, 640)),
    ("yolov8-seg-zoo", (640, 640), 80, (960, 540)),
    ("yolov8-seg-zoo", (320, 320), 20, (333, 517)),
    ("yolov5-seg-zoo", (640, 640), 12, (480, 640)),
    ("yolov5-seg-zoo", (320, 320), 12, (1920, 1080)),
    ("yolov5-seg-zoo", (256, 320), 12, (640, 640)),
    ("yolov8-seg-ultralytics", (640, 640), 80, (517, 333)),
    ("yolov8-seg-ultralytics", (256, 320), 12, (320, 256)),
    ("yolov8-seg-ultralytics", (320, 320), 12, (97, 200)),
]


def _scene_outputs(family, input_hw, num_classes, src, seed=0, count=8):
    rng = np.random.default_rng(seed)
    lb = letterbox_geometry(src[0], src[1], input_hw[1], input_hw[0])
    new_w, new_h = lb.resized
    area = (lb.pad_x, lb.pad_y, lb.pad_x + new_w, lb.pad_y + new_h)
    scene = seg_scenes.make_scene(rng, input_hw, area, num_classes, count)
    return scene, seg_scenes.OUTPUTS[family](scene, rng), lb


def _decoder(family, input_hw, outputs, quant=()):
    head = recognise_segment(input_hw, [o.shape for o in outputs])
    assert head is not None and head.family == family
    return SegmentDecoder(head, input_hw, DetectSettings(CONF, IOU, MAX_DET), quant)


def _mask(counts, height, width):
    return mask_api.decode({"size": [height, width], "counts": counts.encode()}).astype(bool)


def _mask_iou(a, b):
    union = np.count_nonzero(a | b)
    return np.count_nonzero(a & b) / union if union else 1.0


@pytest.mark.parametrize(("family", "input_hw", "num_classes", "src"), CASES)
def test_decoder_matches_the_reference(family, input_hw, num_classes, src):
    scene, outputs, lb = _scene_outputs(family, input_hw, num_classes, src)
    dets = _decoder(family, input_hw, outputs).decode(outputs, lb)
    boxes, scores, classes, masks = reference(family, outputs, input_hw, num_classes, lb)
    planted = scene.instances[:-1]  # the last scores under conf
    assert sorted(classes.tolist()) == sorted(p.cls for p in planted)  # the reference sees them
    assert (dets.height, dets.width) == (src[1], src[0])
    assert len(dets) == len(scores)
    assert dets.class_ids.tolist() == classes.tolist()
    np.testing.assert_allclose(dets.scores, scores, atol=1e-3)
    np.testing.assert_allclose(dets.boxes, boxes, atol=3)
    for i, mask in enumerate(masks):
        got = _mask(dets.masks[i], dets.height, dets.width)
        assert mask.sum() > 100, "a planted mask too small to test"
        assert _mask_iou(got, mask) >= 0.85, (i, _mask_iou(got, mask))
    assert dets.mask_structs()[0] == {"counts": dets.masks[0], "height": src[1], "width": src[0]}


def test_int8_outputs_decode_as_their_float_values():
    """Outputs quantised per output (scale, zero point), as a runtime returns them raw: the
    instances are those of the dequantised outputs (the reference reads those)."""
    family, input_hw, nc, src = "yolov8-seg-zoo", (320, 320), 20, (400, 300)
    _, outputs, lb = _scene_outputs(family, input_hw, nc, src, seed=3)
    quantised, quant = [], []
    for o in outputs:
        scale = max(float(np.abs(o).max()), 1e-6) / 127
        quantised.append(np.clip(np.round(o / scale), -128, 127).astype(np.int8))
        quant.append((scale, 0))
    real = [
        q.astype(np.float32) * np.float32(s) for q, (s, _) in zip(quantised, quant, strict=True)
    ]
    dets = _decoder(family, input_hw, quantised, quant).decode(quantised, lb)
    boxes, scores, classes, masks = reference(family, real, input_hw, nc, lb)
    assert len(dets) == len(scores) >= 6
    assert dets.class_ids.tolist() == classes.tolist()
    np.testing.assert_allclose(dets.scores, scores, atol=1e-3)
    np.testing.assert_allclose(dets.boxes, boxes, atol=3)
    for i, mask in enumerate(masks):
        assert _mask_iou(_mask(dets.masks[i], dets.height, dets.width), mask) >= 0.85
    with pytest.raises(InferenceError, match="quantisation"):
        _decoder(family, input_hw, quantised).decode(quantised, lb)


def test_masks_lie_inside_their_boxes_and_nothing_below_conf_is_kept():
    family, input_hw, nc, src = "yolov8-seg-ultralytics", (640, 640), 80, (1280, 720)
    scene, outputs, lb = _scene_outputs(family, input_hw, nc, src, seed=5)
    dets = _decoder(family, input_hw, outputs).decode(outputs, lb)
    assert scene.instances[-1].cls not in dets.class_ids.tolist()
    assert (dets.scores >= CONF).all()
    for box, counts in zip(dets.boxes, dets.masks, strict=True):
        ys, xs = np.nonzero(_mask(counts, dets.height, dets.width))
        assert xs.size
        assert xs.min() + 0.5 >= box[0] and xs.max() + 0.5 < box[2]
        assert ys.min() + 0.5 >= box[1] and ys.max() + 0.5 < box[3]


def test_no_candidate_gives_no_instance():
    family, input_hw, nc, src = "yolov5-seg-zoo", (320, 320), 12, (320, 320)
    _, outputs, lb = _scene_outputs(family, input_hw, nc, src)
    for o in outputs[0:6:2]:
        o.reshape(3, -1, *o.shape[-2:])[:, 4] = 0.01  # every object score low
    dets = _decoder(family, input_hw, outputs).decode(outputs, lb)
    assert len(dets) == 0 and dets.masks == [] and dets.boxes.shape == (0, 4)


def test_nan_scores_are_counted_and_nan_prototypes_give_empty_masks():
    family, input_hw, nc, src = "yolov8-seg-zoo", (320, 320), 20, (320, 320)
    _, outputs, lb = _scene_outputs(family, input_hw, nc, src)
    outputs[1][0, 0, 0, :5] = np.nan  # five cells' scores
    outputs[-1][:] = np.nan
    dets = _decoder(family, input_hw, outputs).decode(outputs, lb)
    assert dets.nonfinite == 5
    assert len(dets) == 8
    for counts in dets.masks:  # valid RLE of the whole image, nothing in it
        assert mask_api.area({"size": [src[1], src[0]], "counts": counts.encode()}) == 0


def test_outputs_of_the_wrong_shape_are_refused():
    family, input_hw, nc, src = "yolov8-seg-ultralytics", (320, 320), 12, (320, 320)
    _, outputs, lb = _scene_outputs(family, input_hw, nc, src)
    decoder = _decoder(family, input_hw, outputs)
    with pytest.raises(InferenceError, match="outputs of shapes"):
        decoder.decode([outputs[0][:, :-1], outputs[1]], lb)


def test_no_letterbox_means_the_image_is_the_model_input():
    family, input_hw, nc, src = "yolov8-seg-zoo", (256, 320), 20, (320, 256)
    _, outputs, lb = _scene_outputs(family, input_hw, nc, src)
    assert (lb.scale, lb.pad_x, lb.pad_y) == (1.0, 0.0, 0.0)
    decoder = _decoder(family, input_hw, outputs)
    plain, boxed = decoder.decode(outputs, None), decoder.decode(outputs, lb)
    assert (plain.height, plain.width) == (256, 320)
    assert plain.masks == boxed.masks and len(plain) == 8
    np.testing.assert_array_equal(plain.boxes, boxed.boxes)
