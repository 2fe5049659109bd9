"""The ``onnx`` backend: RKNNLite's interface over ONNX Runtime on the CPU.

On x86 it stands in for the NPU; on a board it is the float reference that accuracy
jobs compare the NPU against. ``core_mask`` is checked against the seven RKNNLite values
and recorded in ``self.core_mask``, but no chip rule applies: this is a CPU. It writes no
board lines (no version line, no librknnrt lines): only what went wrong.
"""

from __future__ import annotations

import onnxruntime

from batchinfer.runtime._onnx_base import RKNN_API_VERSION, OnnxRKNNBase


class RKNNLite(OnnxRKNNBase):
    """``rknnlite.api.RKNNLite`` running the model's ONNX file with ONNX Runtime."""

    def _versions(self) -> tuple[str, str]:
        ort = onnxruntime.__version__
        return (
            f"{RKNN_API_VERSION} compatible (onnxruntime {ort}, batchinfer onnx)",
            f"none: CPU (onnxruntime {ort}, CPUExecutionProvider)",
        )
