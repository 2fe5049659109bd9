"""Tests for the dataset listing: one pass per directory, compact memory, stable order, progress."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from batchinfer.data import listing, open_dataset


def touch(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


def ids(ds) -> list[str]:
    return [item.id for item in ds]


@pytest.fixture
def scandir_calls(monkeypatch) -> dict[str, int]:
    """Count os.scandir calls per directory basename."""
    calls: dict[str, int] = {}
    real = os.scandir

    def counting(path):
        name = os.path.basename(os.fspath(path))
        calls[name] = calls.get(name, 0) + 1
        return real(path)

    monkeypatch.setattr(os, "scandir", counting)
    return calls


def test_a_big_directory_is_listed_once_per_walk(
    tmp_path: Path, monkeypatch, scandir_calls: dict[str, int]
) -> None:
    # With runs of 4 entries, a folder of 40 is 10 runs: earlier versions listed it once
    # per run (quadratic in the folder's size); it must be listed once per walk.
    monkeypatch.setattr(listing, "_RUN", 4)
    root = tmp_path / "flat"
    touch(root, *(f"{i:03d}.png" for i in range(40)))
    ds = open_dataset(root)
    assert len(ds) == 40
    assert scandir_calls["flat"] == 1
    assert next(iter(ds)).id == "000.png"
    assert scandir_calls["flat"] == 2


def test_sorted_runs_merge_into_the_same_order(tmp_path: Path, monkeypatch) -> None:
    names = [f"{n}.png" for n in ("k", "a", "q", "b", "z", "c", "m", "d", "y", "e", "x")]
    touch(tmp_path, *names, "f/1.png", "f/0.png", "f/2.png", "g/readme.txt", "ab/9.png")
    expected = ids(open_dataset(tmp_path))
    assert expected == sorted(expected)  # one level per name here, so plain sorting agrees
    for run in (1, 2, 3, 5):
        monkeypatch.setattr(listing, "_RUN", run)
        ds = open_dataset(tmp_path)
        assert len(ds) == 15
        assert ids(ds) == expected
        assert ds.classes == ("ab", "f", "g")


def test_non_utf8_names_sort_as_surrogates_deterministically(tmp_path: Path, monkeypatch) -> None:
    # U+D55C < the surrogate U+DCFF (from byte 0xFF) < U+E000 in Python's str order; byte
    # order would put 0xFF last. The order must not depend on how the listing is split.
    raw = [b"a\xed\x95\x9c.png", b"a\xff.png", b"a\xee\x80\x80.png", b"a.png", b"b.png"]
    for name in raw:
        with open(os.path.join(os.fsencode(tmp_path), name), "wb"):
            pass
    expected = [b"a.png", b"a\xed\x95\x9c.png", b"a\xff.png", b"a\xee\x80\x80.png", b"b.png"]
    for run in (1, 2, 16384):
        monkeypatch.setattr(listing, "_RUN", run)
        assert [item.key for item in open_dataset(tmp_path)] == expected


def test_progress_is_reported_every_n_entries_and_at_the_end(tmp_path: Path) -> None:
    touch(tmp_path, *(f"{i:02d}.png" for i in range(23)), "sub/a.png", "sub/b.txt", ".hidden")
    seen: list[int] = []
    ds = open_dataset(tmp_path, progress=seen.append, progress_every=10)
    # 23 files + "sub" + its 2 files = 26 visible entries; hidden ones are not listed.
    assert seen == [10, 20, 26]
    assert len(ds) == 24
    with pytest.raises(ValueError, match="at least 1"):
        open_dataset(tmp_path, progress=seen.append, progress_every=0)


def test_memory_of_a_listing_is_a_few_bytes_per_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(listing, "_RUN", 256)
    small, big = tmp_path / "small", tmp_path / "big"
    touch(small, *(f"{i:06d}.png" for i in range(500)))
    touch(big, *(f"{i:06d}.png" for i in range(5500)))

    def peak(root: Path) -> int:
        tracemalloc.start()
        try:
            assert sum(1 for _ in listing.sorted_entries(str(root))) in (500, 5500)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    per_name = (peak(big) - peak(small)) / 5000
    # Names of 10 characters packed into runs cost ~12 bytes each; a list of
    # (name, type) tuples would cost ~130.
    assert per_name < 30, per_name
