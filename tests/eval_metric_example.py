"""An example custom metric for job files (``batchinfer eval``).

A job names it as ``metrics.custom = ["eval_metric_example.py:confidence"]`` (a path
relative to the job file) or, when this folder is importable, ``eval_metric_example:confidence``.
A custom metric gets the rows of one model (:class:`batchinfer.evaluate.ItemResults`:
labels, predictions, top-k, cores, errors and raw outputs as numpy arrays) and returns
named numbers; each can then be gated like a built-in metric (``[gates.margin_mean]``).
Detection users compute mAP from ``rows.outputs`` the same way.
"""

from __future__ import annotations

import numpy as np

from batchinfer.evaluate import ItemResults


def confidence(rows: ItemResults) -> dict[str, float]:
    """Mean top-1 score, and mean margin between the two best classes, of items with a result."""
    scores = rows.outputs[0].reshape(len(rows), -1)[rows.ok]
    if not len(scores):
        return {}
    best_two = np.sort(scores, axis=1)[:, -2:]
    return {
        "confidence_mean": float(best_two[:, 1].mean()),
        "margin_mean": float((best_two[:, 1] - best_two[:, 0]).mean()),
    }
