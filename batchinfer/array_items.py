"""Arrays as the items of :func:`batchinfer.infer` and :func:`batchinfer.infer_iter`
(batchinfer/api.py): each checked against the model's input and copied by the coordinator
into its slot, read from the caller's list or stream no faster than its rows are taken.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from batchinfer.data.dataset import Item
from batchinfer.engine.sources import ItemSource
from batchinfer.errors import UsageError

log = logging.getLogger("batchinfer")


def several_inputs() -> UsageError:
    return UsageError(
        "infer feeds arrays to models with one input; for a model with several inputs, "
        "save each item as an .npz (one array per input name) and use batchinfer.run."
    )


def check_array(i: int, array: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if isinstance(array, dict):
        raise several_inputs()
    if not isinstance(array, np.ndarray):
        raise UsageError(f"item {i} of data is a {type(array).__name__}, not a numpy array.")
    # Axes of size 1 (the batch, one channel) may be left out: the bytes are the same.
    if _squeezed(array.shape) != _squeezed(shape):
        raise UsageError(
            f"item {i} of data has shape {array.shape} but the model takes {shape}; give "
            "arrays of that shape (its axes of size 1 may be left out)."
        )
    if not np.can_cast(array.dtype, dtype, casting="same_kind"):
        raise UsageError(
            f"item {i} of data is {array.dtype} but the model takes {dtype}; convert it "
            f"first (e.g. array.astype('{dtype}')) as you mean it to be."
        )
    return array


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


class ArrayItems(ItemSource):
    """Arrays, from a list or read lazily from a stream, each copied by the coordinator
    into its slot (sources.ArraySource, with a stream's checks and its wait for the caller,
    see batchinfer/api.py's docstring)."""

    def __init__(
        self,
        arrays: Iterable[np.ndarray],
        total: int | None,
        shape: tuple[int, ...],
        dtype: np.dtype,
        waiting: int,
    ) -> None:
        self.arrays = arrays
        self._total = total
        self.shape, self.dtype = shape, dtype
        self.waiting = waiting
        self._next: np.ndarray | None = None
        self._ready = threading.Condition()
        self._unread = 0  # rows handed to the caller's queue and not yet taken
        self._closed = False

    @property
    def total(self) -> int | None:
        return self._total

    def rows_queued(self, n: int) -> None:
        """``n`` rows went to the caller's queue (the engine's thread)."""
        with self._ready:
            self._unread += n

    def rows_taken(self, n: int) -> None:
        """The caller took ``n`` rows (the caller's thread)."""
        with self._ready:
            self._unread -= n
            self._ready.notify_all()

    def close(self) -> None:
        """No more items: the caller has gone."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def __iter__(self) -> Iterator[Item]:
        for i, array in enumerate(self.arrays):
            with self._ready:
                # Never waits while the caller waits for rows: then nothing is unread.
                while self._unread >= self.waiting and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
            self._next = check_array(i, array, self.shape, self.dtype)
            yield Item(index=i, path="", id=f"array/{i}", label=None, label_name=None)

    def fill(self, item: Item, inputs: list[np.ndarray]) -> None:
        # The engine fills an item's slot as soon as it has taken the item from __iter__.
        assert self._next is not None
        dst = inputs[0]
        np.copyto(dst, self._next.reshape(dst.shape), casting="same_kind")
        self._next = None
