"""``classify``: one output holding one score per class, (1, N); top-1 and top-k per row.

Decoded in the coordinator, not the core workers: the collector hands a batch of rows to
:meth:`Classify.collect`, which ranks them all with one vectorised top-k
(sink/predictions.py's ``top_k_batch``): a few µs per row, cheaper than sending the rows'
results back one by one from the workers. Its rows' ``pred``, ``topk_index`` and
``topk_score`` are the prediction schema's own columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from batchinfer.tasks.base import ModelFacts, Task

if TYPE_CHECKING:
    from collections.abc import Mapping

    from PIL import Image

    from batchinfer.options import DetectOptions
    from batchinfer.sink.rows import Row


@dataclass(frozen=True)
class Classify(Task):
    """Top-1 and top-k of the first output (module docstring)."""

    scorer = "batchinfer.evaluate.scorers.classify:ClassifyScorer"

    name = "classify"
    decodes_in_worker = False

    @classmethod
    def recognise(cls, facts: ModelFacts, options: DetectOptions, asked: bool) -> Classify | None:
        common = {"output_shapes": facts.output_shapes, "model_task": facts.model_task}
        if facts.output_shapes and facts.one_score_vector:
            return cls(reason=f"one output of {facts.scores} scores", **common)  # type: ignore[arg-type]
        if asked:
            return cls(reason="asked for", **common)  # type: ignore[arg-type]
        if not facts.output_shapes:
            reason = "output shapes unknown (a .rknn without its .onnx): taken as a classifier"
            return cls(reason=reason, **common)  # type: ignore[arg-type]
        return None

    def part_metadata(self) -> dict[bytes, bytes]:
        return {}  # classification parts never named their task: they stay as they were

    def fingerprint(self) -> dict[str, Any] | None:
        """None: classification runs keep the fingerprint they had before tasks existed."""
        return None

    def collect(self, rows: Sequence[Row], topk: int) -> None:
        from batchinfer.sink.columns import top_k_batch

        first = rows[0].outputs[0] if rows and rows[0].outputs else None
        if first is None or first.size <= 1:
            return
        scores = np.stack([r.outputs[0].reshape(-1) for r in rows])  # type: ignore[index]
        if topk:
            index, score = top_k_batch(scores, topk)
            for r, i, s, p in zip(rows, index, score, index[:, 0].tolist(), strict=True):
                r.pred, r.topk_index, r.topk_score = p, i, s
        else:
            for r, p in zip(rows, np.argmax(scores, axis=1).tolist(), strict=True):
                r.pred = p

    def fields(self) -> list[pa.Field]:
        from batchinfer.sink.columns import CLASSIFY_FIELDS

        return list(CLASSIFY_FIELDS)

    def columns(self) -> Any:
        from batchinfer.sink.columns import TopKColumns

        return TopKColumns()

    def draw(self, canvas: Image.Image, row: Mapping[str, Any], **style: Any) -> Image.Image:
        from batchinfer.draw import draw_result

        return draw_result(canvas, None, **style)
