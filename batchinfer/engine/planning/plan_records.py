"""How a plan's preprocessing is recorded (the manifest, the run's fingerprint, eval's run
records): JSON values that stay the same for runs that leave newer settings alone, so
resuming them is not refused.
"""

from __future__ import annotations

import dataclasses

from batchinfer.data.preprocess import Preprocess
from batchinfer.engine.planning.interface import EnginePlan


def preprocess_values(preprocess: Preprocess) -> dict:
    """The preprocessing's fields as JSON values. ``max_item_bytes`` only when it is not the
    one ``max_pixels`` gives, so the record of a run that leaves it alone is the one it had
    before the setting existed, and resuming such a run is not refused."""
    record = {
        k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(preprocess).items()
    }
    if preprocess.item_bytes_derived:
        record.pop("max_item_bytes")
    return record


def preprocess_record(preprocess: Preprocess) -> dict:
    """:func:`preprocess_values`, for the manifest and the fingerprint. The pad colour only
    where it is used (letterboxing), so a classification run's record is the one it had
    before detection existed, and resuming such a run is not refused."""
    record = preprocess_values(preprocess)
    if preprocess.resize != "letterbox":
        record.pop("pad", None)
    return record


def engine_preprocess_record(engine: EnginePlan) -> dict:
    """:func:`preprocess_record`, with each model input's feed when a plan has feeds (a
    single-input run's record is the one it had before feeds existed)."""
    record = preprocess_record(engine.preprocess)
    if engine.feeds:
        record["inputs"] = [
            {**feed.to_json(), "preprocess": preprocess_record(feed.preprocess)}
            if feed.preprocess is not None
            else feed.to_json()
            for feed in engine.feeds
        ]
    return record
