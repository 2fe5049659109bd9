"""COCO compressed RLE in numpy (batchinfer.detect.rle) against pycocotools: the same
bytes on many random masks, and round trips through pycocotools.mask.decode."""

from __future__ import annotations

import numpy as np
import pycocotools.mask as mask_api
import pytest

from batchinfer.detect import rle

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _coco(mask: np.ndarray) -> str:
    return mask_api.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"].decode()


def _masks(rng: np.random.Generator, count: int):
    """Random masks of many shapes and densities, blobs and noise, edge cases first."""
    yield np.zeros((1, 1), bool)
    yield np.ones((1, 1), bool)
    yield np.ones((7, 3), bool)
    yield np.zeros((3, 7), bool)
    yield np.eye(5, dtype=bool)
    yield np.ones((1000, 700), bool)  # counts past 2^16 and 2^19: several chunks
    for _ in range(count):
        h, w = rng.integers(1, 90, 2)
        if rng.random() < 0.5:
            yield rng.random((h, w)) < rng.random()
        else:  # blobs: long runs, deltas of both signs
            y, x = np.mgrid[0:h, 0:w]
            cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(1, max(h, w))
            yield (y - cy) ** 2 + (x - cx) ** 2 < r**2


def test_encode_gives_pycocotools_bytes_and_decodes_back():
    rng = np.random.default_rng(0)
    for mask in _masks(rng, 250):
        counts = rle.encode(mask)
        assert counts == _coco(mask)
        h, w = mask.shape
        back = mask_api.decode({"size": [int(h), int(w)], "counts": counts.encode()})
        assert np.array_equal(back.astype(bool), mask)
        assert np.array_equal(rle.decode(counts, int(h), int(w)), mask)
        assert rle.area(counts) == int(mask.sum())


def test_a_region_in_an_empty_image_encodes_as_the_whole_image():
    rng = np.random.default_rng(1)
    for _ in range(300):
        h, w = (int(v) for v in rng.integers(1, 60, 2))
        y0, x0 = int(rng.integers(0, h)), int(rng.integers(0, w))
        rh, rw = int(rng.integers(0, h - y0 + 1)), int(rng.integers(0, w - x0 + 1))
        region = rng.random((rh, rw)) < rng.choice([0.1, 0.5, 0.95, 1.0])
        whole = np.zeros((h, w), bool)
        whole[y0 : y0 + rh, x0 : x0 + rw] = region
        assert rle.encode_region(region, x0, y0, h, w) == _coco(whole)
    with pytest.raises(ValueError, match="does not fit"):
        rle.encode_region(np.ones((3, 3)), 8, 0, 10, 10)


def test_counts_strings_are_encoded_together_as_one_by_one():
    rng = np.random.default_rng(2)
    masks = list(_masks(rng, 50))
    counts = [rle.counts_from_string(_coco(m)) for m in masks]
    assert rle.strings_from_counts(counts) == [_coco(m) for m in masks]
    assert rle.strings_from_counts([]) == []


def test_toggles_make_counts_the_way_pycocotools_counts_runs():
    assert rle.counts_from_toggles(np.array([], np.int64), 12).tolist() == [12]
    assert rle.counts_from_toggles(np.array([0, 12]), 12).tolist() == [0, 12]
    assert rle.counts_from_toggles(np.array([3, 5]), 12).tolist() == [3, 2, 7]
    # two flips at one place (a column's end, the next column's start) are none
    assert rle.cancel_pairs(np.array([9, 4, 4, 2, 4])).tolist() == [2, 4, 9]
