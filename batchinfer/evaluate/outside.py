"""Labels outside the model's classes: counted and said, never given a per-class row.

The per-class tables (accuracy per class, the confusion matrix) are sized by the model's
classes (metrics.EvalInputs.n_classes); sizing them by the largest label let a list
labelled 0 and 2,000,000,000 ask for billions of rows. Such a label counts as wrong in
the accuracies; :class:`Outside` counts the items and names the first labels, for the
console, the record (``labels_outside``), the summary and the report.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: How many of the labels outside the model's classes the record and the summary name.
OUTSIDE_NAMED = 10


@dataclass(frozen=True)
class Outside:
    """``items`` labelled items have a label outside the model's ``classes`` classes:
    ``distinct`` labels, the smallest of which are ``first``."""

    items: int
    distinct: int
    first: list[int]
    classes: int

    def sentence(self) -> str:
        """One line for the console, the summary and the report ('' when there are none)."""
        if not self.items:
            return ""
        extra = self.distinct - len(self.first)
        more = f" and {extra} more" if extra > 0 else ""
        span = f" (0-{self.classes - 1})" if self.classes else ""
        return (
            f"{self.items} labelled item(s) have a label outside the model's {self.classes} "
            f"classes{span}: {', '.join(map(str, self.first))}{more}; they count as wrong "
            "and are in no per-class row. Check the labels (or dataset.labels) against the "
            "model's classes."
        )


def outside_labels(label: np.ndarray, classes: int) -> Outside:
    """The items of ``label`` (-1: unlabelled) at or above ``classes``."""
    beyond = label >= max(classes, 0)
    found = np.unique(label[beyond])
    return Outside(int(beyond.sum()), len(found), found[:OUTSIDE_NAMED].tolist(), classes)
