"""Datasets (folders, list files, COCO JSON, data.yaml, globs: see :func:`open_source`),
streamed in a stable order, and preprocessing into input buffers."""

from __future__ import annotations

from batchinfer.data.classes import ClassMap, read_labels_file
from batchinfer.data.dataset import IMAGE_EXTENSIONS, Dataset, Item, Skipped
from batchinfer.data.folder import open_dataset
from batchinfer.data.input_spec import DEFAULT_MAX_PIXELS
from batchinfer.data.preprocess import Preprocess, load_into, parse_background, preprocess_for
from batchinfer.data.sources import open_source

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "IMAGE_EXTENSIONS",
    "ClassMap",
    "Dataset",
    "Item",
    "Preprocess",
    "Skipped",
    "load_into",
    "open_dataset",
    "open_source",
    "parse_background",
    "preprocess_for",
    "read_labels_file",
]
