"""Tests for the dataset listing: one pass per directory, compact memory, stable order, progress."""

from __future__ import annotations

import hashlib
import os
import random
import tracemalloc
from pathlib import Path

import pytest
from dataset_files import touch

from batchinfer.data import listing, open_dataset


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
    tmp_path: Path, scandir_calls: dict[str, int]
) -> None:
    # With runs of 4 entries, a folder of 40 is 10 runs: earlier versions listed it once
    # per run (quadratic in the folder's size); it must be listed once per walk.
    root = tmp_path / "flat"
    touch(root, *(f"{i:03d}.png" for i in range(40)))
    walked = list(listing.walk(str(root), listing.Listing(run=4, block=2)))
    assert [path for path, _ in walked] == [f"{i:03d}.png" for i in range(40)]
    assert scandir_calls["flat"] == 1
    ds = open_dataset(root)
    assert len(ds) == 40
    assert scandir_calls["flat"] == 2
    assert next(iter(ds)).id == "000.png"
    assert scandir_calls["flat"] == 3


def test_sorted_runs_merge_into_the_same_order(tmp_path: Path) -> None:
    names = [f"{n}.png" for n in ("k", "a", "q", "b", "z", "c", "m", "d", "y", "e", "x")]
    touch(tmp_path, *names, "f/1.png", "f/0.png", "f/2.png", "g/readme.txt", "ab/9.png")
    expected = ids(open_dataset(tmp_path))
    assert expected == sorted(expected)  # one level per name here, so plain sorting agrees
    whole = list(listing.walk(str(tmp_path)))  # one run: a plain sort
    pngs = [path for path, kind in whole if kind == listing.FILE and path.endswith(".png")]
    assert pngs == expected
    for run, block in ((1, 1), (2, 1), (3, 2), (5, 2), (5, 5), (7, 3)):
        assert list(listing.walk(str(tmp_path), listing.Listing(run=run, block=block))) == whole


def test_merged_runs_equal_a_plain_sort_of_random_names(tmp_path: Path) -> None:
    rng = random.Random(7)
    alphabet = "aAbB0_-. é한😀"
    names = set()
    while len(names) < 300:
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))
        if not name.startswith(".") and name.strip() == name:
            names.add(name)
    for name in names:
        (tmp_path / name).touch()
    for run, block in ((1, 1), (7, 3), (16, 16), (50, 4), (299, 2), (1000, 10)):
        listed = listing.sorted_entries(str(tmp_path), listing.Listing(run=run, block=block))
        assert [name for name, _ in listed] == sorted(names)


def test_non_utf8_names_sort_as_surrogates_deterministically(tmp_path: Path) -> None:
    # U+D55C < the surrogate U+DCFF (from byte 0xFF) < U+E000 in Python's str order; byte
    # order would put 0xFF last. The order must not depend on how the listing is split.
    raw = [b"a\xed\x95\x9c.png", b"a\xff.png", b"a\xee\x80\x80.png", b"a.png", b"b.png"]
    for name in raw:
        with open(os.path.join(os.fsencode(tmp_path), name), "wb"):
            pass
    expected = [b"a.png", b"a\xed\x95\x9c.png", b"a\xff.png", b"a\xee\x80\x80.png", b"b.png"]
    assert [item.key for item in open_dataset(tmp_path)] == expected
    for run, block in ((1, 1), (2, 1), (3, 2), (16384, 1024)):
        listed = listing.walk(str(tmp_path), listing.Listing(run=run, block=block))
        assert [os.fsencode(path) for path, _ in listed] == expected


def test_progress_is_reported_every_n_entries_and_at_the_end(tmp_path: Path) -> None:
    touch(tmp_path, *(f"{i:02d}.png" for i in range(23)), "sub/a.png", "sub/b.txt", ".hidden")
    seen: list[int] = []
    ds = open_dataset(tmp_path, progress=seen.append, progress_every=10)
    # 23 files + "sub" + its 2 files = 26 visible entries; hidden ones are not listed.
    assert seen == [10, 20, 26]
    assert len(ds) == 24
    with pytest.raises(ValueError, match="at least 1"):
        open_dataset(tmp_path, progress=seen.append, progress_every=0)


def test_memory_of_a_listing_is_a_few_bytes_per_name(tmp_path: Path) -> None:
    small, big = tmp_path / "small", tmp_path / "big"
    touch(small, *(f"{i:06d}.png" for i in range(500)))
    touch(big, *(f"{i:06d}.png" for i in range(2500)))

    def peak(root: Path) -> int:
        tracemalloc.start()
        try:
            # Runs of 256 in blocks of 16: the default ratio of run to block size.
            listed = listing.sorted_entries(str(root), listing.Listing(run=256, block=16))
            assert sum(1 for _ in listed) in (500, 2500)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    per_name = (peak(big) - peak(small)) / 2000
    # Names of 10 characters packed into runs cost ~13 bytes each, plus ~4 for the block
    # of each run that the merge holds; a list of (name, type) tuples would cost ~130.
    assert per_name < 30, per_name


def test_the_listing_hash_is_sha256_over_each_name_and_a_nul(tmp_path: Path) -> None:
    # What resumes compare against earlier manifests: the format must not change.
    touch(tmp_path, "b/2.png", "a.png", "notes.txt")
    with open(os.path.join(os.fsencode(tmp_path), b"c\xff.png"), "wb"):
        pass
    expected = hashlib.sha256(b"a.png\0b/2.png\0c\xff.png\0").hexdigest()
    assert open_dataset(tmp_path).listing_sha256 == expected


@pytest.fixture
def deep_tree(tmp_path: Path):
    """``deep/d/d/.../d/x.png``, 1,500 folders deep, removed after the test.

    Made and removed one level at a time relative to its parent's descriptor, so no path
    handed to the kernel grows with the depth. Removed here because shutil.rmtree
    (pytest's clean-up of old temporary folders) recurses and would fail on it.
    """
    levels, root = 1500, tmp_path / "deep"
    root.mkdir()
    fds = [os.open(root, os.O_RDONLY)]
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fds[-1])
            fds.append(os.open("d", os.O_RDONLY, dir_fd=fds[-1]))
        os.close(os.open("x.png", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fds[-1]))
        yield root, levels
    finally:
        if len(fds) == levels + 1:
            os.unlink("x.png", dir_fd=fds[-1])
        while len(fds) > 1:
            os.close(fds.pop())
            os.rmdir("d", dir_fd=fds[-1])
        os.close(fds.pop())


def test_a_dataset_nested_deeper_than_the_recursion_limit_is_listed(deep_tree) -> None:
    # 1,500 levels: walking them recursively raised RecursionError (a traceback).
    root, levels = deep_tree
    entries = list(listing.walk(str(root)))
    assert len(entries) == levels + 1
    assert entries[0] == ("d", listing.DIR)
    assert entries[-1] == ("d/" * levels + "x.png", listing.FILE)
    assert ids(open_dataset(root)) == ["d/" * levels + "x.png"]
