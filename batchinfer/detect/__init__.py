"""Object detection (YOLO) post-processing: head recognition, decoding, NMS, letterbox.

numpy only at run time (it runs inside the core workers on the board). The pieces:

- :func:`recognise` reads a model's output shapes (and its input size) and returns the
  :class:`Head` layout it knows, or None (:func:`explain_no_head` says why, in one
  sentence). Recognised layouts (:data:`KNOWN_HEADS`):

  ``yolov5-zoo``          rknn_model_zoo YOLOv5/v7: per stride 8/16/32 one output
                          (1, A·(5+C), H, W), sigmoid applied in the graph, A=3 anchors.
  ``yolov8-zoo``          rknn_model_zoo YOLOv8/YOLO11: per stride a box output
                          (1, 64, H, W) of DFL logits (4 sides x 16 bins), class scores
                          (1, C, H, W) (sigmoid applied) and optionally a score sum
                          (1, 1, H, W): 6 or 9 outputs, stride 8 first.
  ``yolov8-ultralytics``  stock Ultralytics ONNX export of YOLOv8/YOLO11: (1, 4+C, N),
                          boxes cx, cy, w, h in input pixels, class scores sigmoided; or
                          transposed, (1, N, 4+C) (``Head.rows``).
  ``yolov5-ultralytics``  stock YOLOv5 ONNX export: (1, N, 5+C): cx, cy, w, h, object
                          score, class scores.

  N must be the cell count of the strides for the input size (8,400 for 640x640; times 3
  anchors for YOLOv5: 25,200). One output of N rows, (1, N, K), fits both a transposed
  YOLOv8 head and YOLOv5-style rows with an object score (``heads.readings``); a class
  count or a named head family chooses (``heads.choose``, ``recognise``'s arguments).
- :class:`Decoder` turns one image's outputs into :class:`Detections` in the model input's
  pixels: int8 outputs dequantised, candidates filtered on confidence before any box is
  decoded, class-aware greedy NMS (or class-agnostic; optionally of some classes only), at
  most ``max_det`` boxes, best first; candidates with a NaN/inf score or box are dropped
  and counted.
- :func:`letterbox_geometry` / :func:`letterbox_array` place an image on the model's
  canvas as the model zoo does (keep aspect, centre, pad); :func:`boxes_to_original` maps
  boxes back to the original image's pixels.
- :data:`COCO80` (YOLO class order), :data:`COCO80_CATEGORY_IDS` (YOLO class -> COCO
  category id) and :func:`coco_results` (COCO result-JSON dicts from prediction rows).
"""

from batchinfer.detect.coco import COCO80, COCO80_CATEGORY_IDS, coco_results
from batchinfer.detect.decode import Decoder, Detections, DetectSettings
from batchinfer.detect.heads import KNOWN_HEADS, Head, explain_no_head, recognise
from batchinfer.detect.letterbox import (
    Letterbox,
    boxes_to_original,
    letterbox_array,
    letterbox_geometry,
)

__all__ = [
    "COCO80",
    "COCO80_CATEGORY_IDS",
    "KNOWN_HEADS",
    "Decoder",
    "DetectSettings",
    "Detections",
    "Head",
    "Letterbox",
    "boxes_to_original",
    "coco_results",
    "explain_no_head",
    "letterbox_array",
    "letterbox_geometry",
    "recognise",
]
