"""Item sources: where the engine's items come from.

- :class:`DatasetSource`: a dataset folder; reader processes decode each file straight into
  its slot (the main job, nightly evaluation).
- :class:`ArraySource`: tensors already in memory; the coordinator copies each into its slot.
- :class:`SyntheticSource`: tensors of the model's input shape written once into every slot
  at start, then reused, so only the inference path is measured (benchmarks). It runs until
  :meth:`SyntheticSource.finish` is called or its count is reached.

A source is iterated once, lazily: the engine takes the next item only when a slot is free,
so a source never holds more than the slots do.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import numpy as np

from batchinfer.data.dataset import Dataset, Item


class ItemSource(Protocol):
    """What the engine takes its items from: the sources below, api.ArrayItems, a test's.

    What the data layer knows and the engine needs is said here, as fields: whether
    readers decode the items, what they decode, whether that is light work. The pools read
    these fields, never a dataset kind by name. Sources below subclass this for its
    defaults (a source without readers, whose items fill their slots).
    """

    #: Readers decode the items (they have paths); else :meth:`fill` writes the slot.
    needs_reader: bool = False
    #: The dataset kind readers decode ("images", "npy" or "npz"), when ``needs_reader``:
    #: passed through to the data layer's loaders, not read by the engine.
    kind: str = ""
    #: The folder that relative paths in manifest columns are relative to ("": the current
    #: folder): a list file's folder, or a dataset folder itself.
    column_base: str = ""
    #: Reading an item is a plain copy into its slot (Dataset.light_reads), never what the
    #: cores wait for: readers yield to the core workers from the start.
    light_reads: bool = False

    @property
    def total(self) -> int | None:
        """How many items will come, when known (for progress)."""
        return None

    def __iter__(self) -> Iterator[Item]: ...

    def prefill(self, inputs: Callable[[int], list[np.ndarray]], slots: int) -> None:
        """Called once before the first item, with every slot's input views."""
        return  # a default (this is no empty protocol member): most sources need nothing

    def fill(self, item: Item, inputs: list[np.ndarray]) -> None:
        """Write ``item``'s tensors into its slot's input views (sources without readers)."""
        return  # a default: sources with readers never fill


class DatasetSource(ItemSource):
    """The items of a dataset folder, in its stable order, decoded by readers."""

    needs_reader = True

    def __init__(
        self,
        dataset: Dataset,
        skip: Callable[[bytes], bool] | None = None,
        limit: int | None = None,
        todo: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.kind = dataset.kind
        self.light_reads = dataset.light_reads
        root = str(dataset.root)
        self.column_base = root if os.path.isdir(root) else os.path.dirname(root)
        self.skip = skip
        self.limit = limit
        self._todo = todo

    @property
    def total(self) -> int | None:
        if self._todo is not None:
            return self._todo
        n = len(self.dataset)
        return n if self.limit is None else min(n, self.limit)

    def __iter__(self) -> Iterator[Item]:
        # A video dataset hands its items out range by range, not in index order
        # (batchinfer.data.video.dataset): past the limit is no reason to stop there.
        in_order = getattr(self.dataset, "in_order", True)
        for item in self.dataset.iter_from(skip=self.skip):
            if self.limit is not None and item.index >= self.limit:
                if in_order:
                    return
                continue
            yield item


class ArraySource(ItemSource):
    """Tensors in memory: ``arrays[i]`` is item i's input (the model's input shape)."""

    def __init__(
        self,
        arrays: Sequence[np.ndarray],
        ids: Sequence[str] | None = None,
        labels: Sequence[int | None] | None = None,
    ) -> None:
        self.arrays = arrays
        self.ids = ids
        self.labels = labels

    @property
    def total(self) -> int:
        return len(self.arrays)

    def __iter__(self) -> Iterator[Item]:
        for i in range(len(self.arrays)):
            yield Item(
                index=i,
                path="",
                id=self.ids[i] if self.ids is not None else f"array/{i}",
                label=None if self.labels is None else self.labels[i],
                label_name=None,
            )

    def fill(self, item: Item, inputs: list[np.ndarray]) -> None:
        src = np.asarray(self.arrays[item.index])
        dst = inputs[0]
        if src.shape != dst.shape and src.shape != dst.shape[1:]:
            raise ValueError(f"array {item.index} has shape {src.shape}, not {dst.shape}")
        np.copyto(dst, src.reshape(dst.shape), casting="same_kind")


class SyntheticSource(ItemSource):
    """Random tensors of the input shape, written once into every slot, then reused.

    Items keep coming until :meth:`finish` (or ``count`` items); the bench observer calls
    ``finish`` when it has measured enough.
    """

    def __init__(self, count: int | None = None, seed: int = 0) -> None:
        self.count = count
        self.seed = seed
        self._finished = False

    @property
    def total(self) -> int | None:
        return self.count

    def finish(self) -> None:
        """No more items after the ones already taken."""
        self._finished = True

    def __iter__(self) -> Iterator[Item]:
        i = 0
        while not self._finished and (self.count is None or i < self.count):
            yield Item(index=i, path="", id=f"synthetic/{i}", label=None, label_name=None)
            i += 1

    def prefill(self, inputs: Callable[[int], list[np.ndarray]], slots: int) -> None:
        rng = np.random.default_rng(self.seed)
        for slot in range(slots):
            for view in inputs(slot):
                if view.dtype.kind == "f":
                    view[...] = rng.standard_normal(view.shape)
                elif view.dtype.kind in "iu":
                    info = np.iinfo(view.dtype)
                    view[...] = rng.integers(max(info.min, 0), min(info.max, 255) + 1, view.shape)
                else:
                    view[...] = rng.integers(0, 2, view.shape)
