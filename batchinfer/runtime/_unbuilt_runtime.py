"""``rknn_runtime`` after an ``init_runtime`` that failed in the wheel's build_graph step.

The real RKNNLite keeps the runtime object it made even when building the graph failed
(rknnlite/api/rknn_lite.py, init_runtime), so ``rknn_runtime`` is not None although
``init_runtime`` returned -1; :class:`UnbuiltRuntime` stands for it here
(batchinfer/runtime/_emulated_runtime.py has the working runtime).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from batchinfer.runtime._emulated_runtime import RKNNPerfRun, RKNNTensorAttr, missing_member


class UnbuiltRuntime:
    """``rknn_runtime`` after an ``init_runtime`` that failed in the wheel's build_graph
    step (see the module docstring): every call fails as on an invalid context [guess:
    the error code], and release() is safe."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise missing_member(name)

    def _fail(self, what: str) -> Exception:
        return Exception(
            f"{what} failed: init_runtime failed ({self.why}). error code: RKNN_ERR_CTX_INVALID"
        )

    def get_in_out_num(self) -> tuple[int, int]:
        raise self._fail("Query in/out num")

    def get_tensor_attr(self, index: int, is_output: bool = False) -> RKNNTensorAttr:
        raise self._fail(f"Query tensor attribute of {'output' if is_output else 'input'} {index}")

    def get_sdk_version(self) -> tuple[str, str, str]:
        raise self._fail("Query sdk version")

    def feeds(self, *args: Any, **kwargs: Any) -> dict[str, np.ndarray]:
        raise self._fail("Set inputs")

    def set_inputs(self, *args: Any, **kwargs: Any) -> None:
        raise self._fail("Set inputs")

    def run(self, get_frame_id: bool = False) -> int:
        raise self._fail("Run")

    def get_outputs(self, get_frame_id: bool = False) -> list[np.ndarray]:
        raise self._fail("Get outputs")

    def get_run_perf(self) -> RKNNPerfRun:
        raise self._fail("Query perf run")

    def get_output_shape(self, index: int) -> list[int]:
        raise self._fail(f"Query tensor attribute of output {index}")

    def set_core_mask(self, core_mask: int) -> int:
        raise self._fail("RKNN set core mask")

    def check_dynamic_shape(self) -> None:
        """Nothing to query."""

    def release(self) -> None:
        """Nothing to free."""
