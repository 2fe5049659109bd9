"""A glob over class folders keeps their labels, as the folder itself gives them (issue 40,
item 20: a glob dropped them without a word)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from batchinfer.data.sources import open_source


def _images(folder: Path, names: list[str]) -> None:
    for i, name in enumerate(names):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8), i * 20, np.uint8)).save(path)


def _labels(dataset) -> dict[str, tuple[int | None, str | None]]:
    return {item.id: (item.label, item.label_name) for item in dataset}


def test_a_glob_over_named_class_folders_labels_as_the_folder_does(tmp_path):
    _images(tmp_path / "pets", ["cat/1.png", "cat/2.png", "dog/3.png", "zebra/deep/4.png"])
    folder = _labels(open_source(tmp_path / "pets"))
    assert folder["cat/1.png"] == (0, "cat") and folder["zebra/deep/4.png"] == (2, "zebra")
    globbed = open_source(str(tmp_path / "pets" / "**" / "*.png"))
    assert _labels(globbed) == folder
    assert globbed.class_map.labels == {"cat": 0, "dog": 1, "zebra": 2}


def test_integer_class_folders_are_their_own_labels_and_the_root_has_none(tmp_path):
    _images(tmp_path / "digits", ["3/a.png", "7/b.png", "7/c.png", "flat.png"])
    assert _labels(open_source(str(tmp_path / "digits" / "**" / "*.png"))) == {
        "3/a.png": (3, "3"),
        "7/b.png": (7, "7"),
        "7/c.png": (7, "7"),
        "flat.png": (None, None),  # directly under the fixed folder: no class, as in a folder
    }


def test_the_class_is_the_folder_under_the_fixed_prefix(tmp_path):
    _images(tmp_path / "pets", ["cat/1.png", "cat/sub/2.png", "dog/3.png"])
    # the fixed folder is pets/cat: its files have no class, its subfolder is one
    inside = _labels(open_source(str(tmp_path / "pets" / "cat" / "**" / "*.png")))
    assert inside == {"1.png": (None, None), "sub/2.png": (0, "sub")}


def test_a_labels_file_names_a_globs_class_folders(tmp_path):
    _images(tmp_path / "pets", ["cat/1.png", "dog/2.png"])
    names = tmp_path / "names.txt"
    names.write_text("dog\ncat\nbird\n")
    globbed = open_source(str(tmp_path / "pets" / "*" / "*.png"), labels_file=names)
    assert _labels(globbed) == {"cat/1.png": (1, "cat"), "dog/2.png": (0, "dog")}
