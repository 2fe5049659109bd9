"""The ``onnx`` backend: RKNNLite's interface over ONNX Runtime on the CPU.

On x86 it stands in for the NPU; on a board it is the float reference that accuracy
jobs compare the NPU against. ``core_mask`` is checked against the seven RKNNLite values
and recorded in ``self.core_mask``, but no chip rule applies: this is a CPU.
"""

from __future__ import annotations

import onnxruntime

from batchinfer.runtime._onnx_base import OnnxRKNNBase

RKNN_API_VERSION = "2.5.0"


class RKNNLite(OnnxRKNNBase):
    """``rknnlite.api.RKNNLite`` running the model's ONNX file with ONNX Runtime."""

    def _sdk_text(self) -> str:
        ort = onnxruntime.__version__
        return (
            f"API: {RKNN_API_VERSION} compatible (onnxruntime {ort})\n"
            f"DRV: none: CPU (onnxruntime {ort}, CPUExecutionProvider)"
        )
