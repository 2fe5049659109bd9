"""Tests for class maps: stable folder labels, labels files, and what the Dataset reports."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from dataset_files import touch

from batchinfer.data import open_dataset
from batchinfer.errors import DatasetError


def labels_of(ds) -> dict[str, int | None]:
    return {item.id: item.label for item in ds}


def test_an_empty_class_folder_keeps_its_place(tmp_path: Path) -> None:
    touch(tmp_path, "cat/1.png", "zebra/2.png")
    (tmp_path / "dog").mkdir()
    ds = open_dataset(tmp_path)
    assert ds.classes == ("cat", "dog", "zebra")
    assert labels_of(ds) == {"cat/1.png": 0, "zebra/2.png": 2}


def test_a_folder_of_other_files_keeps_its_place(tmp_path: Path) -> None:
    touch(tmp_path, "cat/1.png", "dog/Thumbs.db", "dog/notes.txt", "zebra/2.png")
    ds = open_dataset(tmp_path)
    assert labels_of(ds) == {"cat/1.png": 0, "zebra/2.png": 2}
    # Integer folders stay their integer, empty ones included (no shift to "0, 1").
    touch(tmp_path / "numbers", "3/a.png", "9/b.png")
    (tmp_path / "numbers" / "5").mkdir()
    ds = open_dataset(tmp_path / "numbers")
    assert ds.classes == ("3", "5", "9") and labels_of(ds) == {"3/a.png": 3, "9/b.png": 9}


def test_a_flat_folder_with_an_empty_subfolder_has_no_classes(tmp_path: Path) -> None:
    touch(tmp_path, "a.png", "b.png")
    (tmp_path / "empty").mkdir()
    ds = open_dataset(tmp_path)
    assert ds.classes == () and set(labels_of(ds).values()) == {None}


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("synsets.txt", "zebra\ncat\r\n dog \n\n"),  # CRLF, padding, a trailing empty line
        ("labels.json", json.dumps(["zebra", "cat", "dog"])),
        ("class_to_idx.json", json.dumps({"cat": 1, "dog": 2, "zebra": 0})),
        (
            "imagenet_class_index.json",
            json.dumps({"0": ["zebra", "Zebra"], "1": ["cat", "Cat"], "2": ["dog", "Dog"]}),
        ),
    ],
)
def test_a_labels_file_fixes_the_class_map(tmp_path: Path, name: str, content: str) -> None:
    data = tmp_path / "data"
    touch(data, "cat/1.png", "zebra/2.png", "root.png")
    labels = tmp_path / name
    labels.write_text(content, encoding="utf-8")
    ds = open_dataset(data, labels_file=labels)
    assert labels_of(ds) == {"cat/1.png": 1, "root.png": None, "zebra/2.png": 0}
    assert ds.classes == ("zebra", "cat", "dog")
    record = ds.manifest_json()["classes"]
    assert record["source"] == "labels-file" and record["file"] == str(labels)
    assert record["names"] == ["zebra", "cat", "dog"] and len(record["file_sha256"]) == 64
    assert pickle.loads(pickle.dumps(ds)).labels == ds.labels


def test_a_labels_file_overrides_integer_folders(tmp_path: Path) -> None:
    touch(tmp_path / "data", "0/a.png", "1/b.png")
    (tmp_path / "labels.txt").write_text("1\n0\n")
    ds = open_dataset(tmp_path / "data", labels_file=tmp_path / "labels.txt")
    assert labels_of(ds) == {"0/a.png": 1, "1/b.png": 0}


def test_folders_with_items_missing_from_the_labels_file_are_refused(tmp_path: Path) -> None:
    touch(tmp_path / "data", "cat/1.png", "Dog/2.png", "docs/readme.txt")
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    with pytest.raises(DatasetError, match=r"1 class folder\(s\) .* labels file .*: 'Dog'; add"):
        open_dataset(tmp_path / "data", labels_file=tmp_path / "labels.txt")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("l.txt", "cat\n\ndog\n", "Line 2 .* is empty"),
        ("l.txt", "cat\ndog\ncat\n", "Line 3 .* repeats 'cat' \\(line 1\\)"),
        ("l.txt", "", "names no class"),
        ("l.txt", "a/b\n", "cannot be a folder name"),
        ("l.txt", ".git\n", "hidden name"),
        ("l.json", "{", "not valid JSON"),
        ("l.json", '{"cat": "0"}', "unknown shape"),
        ("l.json", '{"cat": -1}', "unknown shape"),
        ("l.json", '["cat", "cat"]', "lists 'cat' twice"),
        ("missing.txt", None, "The labels file .*missing.txt cannot be read .No such file"),
    ],
)
def test_malformed_labels_files_are_refused(
    tmp_path: Path, name: str, content: str | None, message: str
) -> None:
    from batchinfer.data.classes import read_labels_file

    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(DatasetError, match=message):
        read_labels_file(path)


def test_a_labels_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    from batchinfer.data.classes import read_labels_file

    (tmp_path / "l.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(DatasetError, match="not UTF-8"):
        read_labels_file(tmp_path / "l.txt")


def test_several_names_may_share_a_label_in_a_json_map(tmp_path: Path) -> None:
    from batchinfer.data.classes import read_labels_file

    (tmp_path / "l.json").write_text(json.dumps({"tabby": 3, "siamese": 3, "dog": 1}))
    class_map = read_labels_file(tmp_path / "l.json")
    assert class_map.names == ("dog", "siamese", "tabby")
    assert class_map.labels == {"tabby": 3, "siamese": 3, "dog": 1}
