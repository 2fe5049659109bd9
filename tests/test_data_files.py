"""Tests for which files are items: the image types Pillow reads, and skipped files counted."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from dataset_files import touch
from PIL import Image

from batchinfer.data import IMAGE_EXTENSIONS, load_into, open_dataset, preprocess_for


def test_every_listed_extension_is_one_pillow_opens() -> None:
    Image.init()
    readable = {ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN}
    # AVIF is read by Pillow >= 11.3 only; other builds make its files error rows.
    assert IMAGE_EXTENSIONS - readable <= {".avif"}
    for written_only in (".pdf", ".palm", ".eps", ".fits", ".h5", ".psd", ".xpm"):
        assert written_only not in IMAGE_EXTENSIONS


@pytest.mark.parametrize(
    ("ext", "fmt", "mode"),
    [
        (".jfif", "JPEG", "RGB"),
        (".jpe", "JPEG", "RGB"),
        (".ppm", "PPM", "RGB"),
        (".pgm", "PPM", "L"),
        (".pbm", "PPM", "1"),
        (".tga", "TGA", "RGB"),
        (".ico", "ICO", "RGBA"),
        (".jp2", "JPEG2000", "RGB"),
        (".qoi", "QOI", "RGB"),
        (".pcx", "PCX", "RGB"),
        (".sgi", "SGI", "RGB"),
        (".dib", "DIB", "RGB"),
    ],
)
def test_image_types_pillow_reads_are_items(tmp_path: Path, ext: str, fmt: str, mode: str) -> None:
    rng = np.random.default_rng(0)
    picture = Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).convert(mode)
    path = tmp_path / f"photo{ext.upper()}"
    picture.save(path, format=fmt)
    ds = open_dataset(tmp_path)
    assert [item.id for item in ds] == [path.name]
    assert ds.skipped.count == 0
    spec = preprocess_for((1, 16, 16, 3), "uint8")
    out = np.zeros(spec.shape, np.uint8)
    load_into(str(path), spec, out, ds.kind)
    assert out.any()


def test_skipped_files_are_counted_by_extension_with_the_first_names(tmp_path: Path) -> None:
    touch(
        tmp_path,
        "README.txt",
        "labels.csv",
        "a/cache.db",
        "a/1.png",
        "a/2.heic",
        "b/data.h5",
        "b/notes.TXT",
        "b/Makefile",
        ".DS_Store",  # a leftover: counted in Dataset.leftovers, not here
    )
    os.mkfifo(tmp_path / "b" / "pipe.png")
    ds = open_dataset(tmp_path)
    assert [item.id for item in ds] == ["a/1.png"]
    skipped = ds.skipped
    assert skipped.count == ds.ignored == 8
    assert skipped.by_extension == {
        ".txt": 2,
        ".csv": 1,
        ".db": 1,
        ".heic": 1,
        ".h5": 1,
        "": 1,
        "(not a regular file)": 1,
    }
    assert skipped.first[:4] == ("README.txt", "a/2.heic", "a/cache.db", "b/Makefile")
    record = ds.manifest_json()["skipped"]
    assert record["count"] == 8 and next(iter(record["by_extension"])) == ".txt"
    assert ds.leftovers == {".DS_Store": 1}


def test_only_the_first_names_are_kept(tmp_path: Path) -> None:
    touch(tmp_path, "x.png", *(f"{i:03d}.txt" for i in range(50)))
    ds = open_dataset(tmp_path)
    assert ds.skipped.count == 50
    assert ds.skipped.first == tuple(f"{i:03d}.txt" for i in range(10))
