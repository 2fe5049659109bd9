"""RuntimeAdapter: the one place that turns RKNNLite's return conventions into exceptions.

Runtimes keep RKNNLite's shape (0/-1, None, E log lines); the engine talks to them
only through this class, which raises errors from :mod:`batchinfer.errors` whose
messages say what failed and what to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from batchinfer.errors import InferenceError, ModelError


def leave_core_out(core: int) -> str:
    """The advice, in an init failure's message, to run without ``core``."""
    return f"leave core {core} out of {{runtime.cores}}, or "


class RuntimeAdapter:
    """An RKNNLite-shaped runtime whose failures raise ModelError / InferenceError."""

    def __init__(
        self, rknn: Any, *, core: int | None, model: Path, hint: str = "check the E lines above"
    ) -> None:
        self.rknn = rknn
        self.core = core
        self.model = Path(model)
        self.hint = hint  # what to check when the runtime fails (from its backend)

    @property
    def _where(self) -> str:
        return "the NPU" if self.core is None else f"NPU core {self.core}"

    def _hint(self) -> str:
        return self.hint

    def load(self) -> None:
        """Load the model file into the runtime; ModelError if it cannot be read."""
        try:
            ret = self.rknn.load_rknn(str(self.model))
        except Exception as exc:
            raise ModelError(
                f"Model {self.model} could not be loaded ({exc}); check the path."
            ) from exc
        if ret != 0:
            raise ModelError(
                f"Model {self.model} could not be loaded (load_rknn returned {ret}); "
                "check that the file exists and is readable."
            )

    def init(self, core_mask: int) -> None:
        """Initialise the runtime on ``core_mask``; InferenceError naming the core if it fails."""
        try:
            ret = self.rknn.init_runtime(core_mask=core_mask)
        except Exception as exc:
            raise InferenceError(
                f"{self._where} could not be initialised (init_runtime raised {exc!r}); "
                f"{self._hint()}."
            ) from exc
        if ret != 0:
            leave_out = "" if self.core is None else leave_core_out(self.core)
            raise InferenceError(
                f"{self._where} could not be initialised (init_runtime returned {ret}); "
                f"{leave_out}{self._hint()}."
            )

    def infer(
        self,
        inputs: list,
        reuse_outputs: bool = True,
        data_format: str | list[str] | None = None,
    ) -> list[np.ndarray]:
        """The outputs for ``inputs`` (views reused by the next call when ``reuse_outputs``);
        ``data_format`` is one string for every input, or a list with one per input."""
        outputs = self.rknn.inference(
            inputs=inputs, data_format=data_format, reuse_outputs=reuse_outputs
        )
        if outputs is None:
            core = "the NPU" if self.core is None else f"core {self.core}"
            raise InferenceError(
                f"Inference returned None on {core}; the runtime's E log lines above say why."
            )
        return outputs

    def sdk_version(self) -> str | None:
        """The runtime's multi-line version text, or None when it gives none."""
        try:
            return self.rknn.get_sdk_version()
        except Exception:
            return None

    def set_current_item(self, index: int | None) -> None:
        """Tell the runtime which item comes next, when it wants to know (the sim does)."""
        setter = getattr(self.rknn, "set_current_item", None)
        if callable(setter):
            setter(index)

    def release(self) -> None:
        """Release the runtime (idempotent)."""
        self.rknn.release()
