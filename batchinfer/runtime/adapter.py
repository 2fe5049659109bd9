"""RuntimeAdapter: the one place that turns RKNNLite's return conventions into exceptions.

Runtimes keep RKNNLite's shape (0/-1, None, E log lines); the engine talks to them
only through this class, which raises errors from :mod:`batchinfer.errors` whose
messages say what failed and what to do.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from batchinfer.errors import InferenceError, ModelError
from batchinfer.messages import Message, as_message, setting


class Mark(Enum):
    """Where a :class:`CoreReason` names its core, and where it advises leaving it out."""

    CORE = "core"
    ADVICE = "advice"


@dataclass(frozen=True)
class CoreReason:
    """Why a core could not start, as data: text with the core's name and the advice to
    leave it out marked (:class:`Mark`), not written in. The coordinator says one reason of
    every core that failed alike ("cores 0, 2 ...", engine/loop.py) by comparing reasons,
    never their text, and leaves the advice out when every core failed (it cannot help)."""

    parts: tuple[Message | Mark, ...]

    @classmethod
    def of(cls, *parts: str | Mark) -> CoreReason:
        return cls(tuple(p if isinstance(p, Mark) else as_message(p) for p in parts))

    def after(self, text: str) -> CoreReason:
        """This reason with ``text`` before it."""
        return CoreReason((as_message(text), *self.parts))

    @property
    def names_core(self) -> bool:
        return Mark.CORE in self.parts

    def said(self, cores: Sequence[int], *, advice: bool = True) -> Message:
        """The reason said of ``cores``, with the advice to leave them out if ``advice``."""
        name = f"core {cores[0]}" if len(cores) == 1 else f"cores {', '.join(map(str, cores))}"
        said = Message()
        for part in self.parts:
            if part is Mark.CORE:
                said += name
            elif part is Mark.ADVICE:
                if advice:
                    said += f"leave {name} out of " + setting("runtime.cores") + ", or "
            else:
                said += part
        return said


class CoreError(InferenceError):
    """An InferenceError on one core, with its :class:`CoreReason` (``reason``)."""

    def __init__(self, message: str, reason: CoreReason | None = None) -> None:
        super().__init__(message, reason)
        self.reason = reason or CoreReason.of(message)


# What a failed call's row says (the worker and the Ray actor's words since the first
# release): then, after a colon, the runtime's own last E line of that call, when it
# logged one through its logger (:class:`_LastErrorLine`).
RETURNED_NONE = "inference() returned None"

# librknnrt's lines carry the time ("RKNN: [12:00:01.234] ..."): a row keeps the words.
_STAMP = re.compile(r"^RKNN: \[[0-9:.]+\] ")


class _LastErrorLine(logging.Handler):
    """The last E line the runtime logged in this thread since :meth:`clear`.

    RKNNLite never raises from ``inference``: it logs why and returns None
    (runtime/CONTRACT.md). Which line says it: librknnrt's own (``E RKNN: failed to
    submit!, ...``) over the Python wrapper's that follows it (``E Catch exception when
    running RKNN model.``); of a multi-line record (a traceback), its last line (the
    exception). Per thread: should one logger serve several instances ([guess]: the real
    RKNNLite keeps one per object, as the emulator does), each call still reads only what
    was logged in its own thread. On a board librknnrt writes its lines to the descriptor,
    not through this logger: there only the wrapper's lines are seen.
    """

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self._seen = threading.local()

    def clear(self) -> None:
        self._seen.line = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            lines = [ln for ln in record.getMessage().splitlines() if ln.strip()]
        except Exception:  # a record that cannot be formatted says nothing here
            return
        if not lines:
            return
        line = _STAMP.sub("RKNN: ", lines[-1].strip())
        kept = getattr(self._seen, "line", None)
        if kept is None or not kept.startswith("RKNN: ") or line.startswith("RKNN: "):
            self._seen.line = line

    @property
    def line(self) -> str | None:
        return getattr(self._seen, "line", None)


class RuntimeAdapter:
    """An RKNNLite-shaped runtime whose failures raise ModelError / InferenceError."""

    def __init__(
        self, rknn: Any, *, core: int | None, model: Path, hint: str = "check the E lines above"
    ) -> None:
        self.rknn = rknn
        self.core = core
        self.model = Path(model)
        self.hint = hint  # what to check when the runtime fails (from its backend)
        self._logger = getattr(getattr(rknn, "rknn_log", None), "logger", None)
        self._errors = _LastErrorLine()
        if isinstance(self._logger, logging.Logger):
            self._logger.addHandler(self._errors)

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
            if self.core is None:
                raise InferenceError(
                    f"{self._where} could not be initialised (init_runtime returned {ret}); "
                    + self._hint()
                    + "."
                )
            raise self._on_core(
                "NPU ",
                Mark.CORE,
                f" could not be initialised (init_runtime returned {ret}); ",
                Mark.ADVICE,
                self._hint(),
                ".",
            )

    def infer(
        self,
        inputs: list,
        reuse_outputs: bool = True,
        data_format: str | list[str] | None = None,
    ) -> list[np.ndarray]:
        """The outputs for ``inputs`` (views reused by the next call when ``reuse_outputs``);
        ``data_format`` is one string for every input, or a list with one per input."""
        self._errors.clear()
        outputs = self.rknn.inference(
            inputs=inputs, data_format=data_format, reuse_outputs=reuse_outputs
        )
        if outputs is None:
            why = "; the runtime's E log lines above say why."
            if self.core is None:
                raise InferenceError("Inference returned None on the NPU" + why)
            raise self._on_core("Inference returned None on ", Mark.CORE, why)
        return outputs

    def row_error(self, exc: Exception) -> str:
        """What an item's row says when :meth:`infer` raised ``exc`` in this thread."""
        if isinstance(exc, InferenceError):
            line = self._errors.line
            return RETURNED_NONE if line is None else f"{RETURNED_NONE}: E {line}"
        return f"inference failed on core {self.core}: {type(exc).__name__}: {exc}"

    def _on_core(self, *parts: str | Mark) -> CoreError:
        """The error, on this adapter's core, whose reason is ``parts``."""
        assert self.core is not None
        reason = CoreReason.of(*parts)
        return CoreError(reason.said([self.core]), reason)

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

    def set_current_items(self, indexes: list[int]) -> None:
        """Tell the runtime which items the next call of a batch-N model holds (the sim's
        item faults fire when any of them is named); one item: :meth:`set_current_item`."""
        setter = getattr(self.rknn, "set_current_items", None)
        if callable(setter):
            setter(indexes)
        else:
            self.set_current_item(indexes[0] if indexes else None)

    def release(self) -> None:
        """Release the runtime (idempotent)."""
        if isinstance(self._logger, logging.Logger):
            self._logger.removeHandler(self._errors)
        self.rknn.release()
