"""Hostile lists, COCO files and folders (issue 40, items 5, 7 and 8): a label the
predictions cannot hold, JSON nested past Python's stack, folders nested past the system's
path limit; each a usage error (exit 2) in one line, or that row's error row.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_cli import assert_error, invoke, run_args

from batchinfer.data.classes import read_labels_file
from batchinfer.data.listing import walk
from batchinfer.data.preprocess import BAD_ROW
from batchinfer.data.sources import open_source
from batchinfer.errors import DatasetError
from batchinfer.evaluate.groundtruth import GroundTruthError, read_coco

BIG = 2**63  # one past what Arrow's int64 label column holds
DEEP = "[" * 100_000 + "]" * 100_000


# ----------------------------------------------------------------------------- item 5
@pytest.mark.parametrize(
    ("name", "write", "where", "shown"),
    [
        ("l.txt", lambda p: p.write_text(f"a.png 1\nb.png {BIG}\n"), "line 2", str(BIG)),
        ("l.csv", lambda p: p.write_text(f"path,label\na.png,1\nb.png,{BIG}\n"), "line 3",
         str(BIG)),
        ("l.jsonl", lambda p: p.write_text(f'{{"path": "a.png", "label": {BIG}}}\n'), "line 1",
         str(BIG)),
        ("l.parquet", lambda p: pq.write_table(
            pa.table({"path": ["a.png", "b.png"], "label": pa.array([1, BIG], pa.uint64())}), p),
         "rows 1-2", str(BIG)),
        ("d.txt", lambda p: p.write_text("a.png " + "9" * 5000 + "\n"), "line 1",
         "an integer of 5000 digits"),
    ],
)  # fmt: skip
def test_a_label_the_predictions_cannot_hold_is_refused_naming_its_line(
    tmp_path, demo_kit, name, write, where, shown
):
    # Before: the run stopped at its first part with "Could not write ...part-00000.parquet
    # (Python int too large to convert to C long); free disk space", and --resume failed
    # the same way for ever (5,000 digits: a ValueError traceback when the list was read).
    lst = tmp_path / name
    write(lst)
    words = f"The label column of {lst} holds {shown} at {where}; a label is a non-negative"
    with pytest.raises(DatasetError, match="below 2\\*\\*63") as info:
        open_source(lst)
    assert words in str(info.value)
    result = invoke(*run_args(lst, demo_kit.models["digits"], tmp_path / "o"))
    assert_error(result, 2, words)
    assert not (tmp_path / "o").exists()


def test_the_largest_label_arrow_holds_is_kept(tmp_path):
    lst = tmp_path / "l.txt"
    lst.write_text(f"a.png {BIG - 1}\n")
    (item,) = open_source(lst)
    assert item.label == BIG - 1


# ----------------------------------------------------------------------------- item 7
def test_a_jsonl_line_nested_too_deep_is_that_rows_error_row(tmp_path):
    # Before: a RecursionError traceback, rc 1.
    lst = tmp_path / "l.jsonl"
    lst.write_text(
        '{"path": "a.png"}\n'
        + DEEP
        + "\n"
        + '{"path": "b.png", "x": '
        + "1" * 5000
        + "}\n"
        + '{"path": "c.png"}\n'
    )
    ds = open_source(lst)
    assert (len(ds), ds.bad_rows) == (4, 2)
    items = list(ds)
    assert [i.path.startswith(BAD_ROW) for i in items] == [False, True, True, False]
    assert items[1].path.endswith(
        "line 2 of " + str(lst) + ": it nests JSON deeper than it can be read"
    )
    assert (
        "line 3 of" in items[2].path
        and "it holds an integer of more than 4300 digits" in items[2].path
    )


def test_a_coco_file_nested_too_deep_is_a_usage_error_in_run_and_eval(tmp_path, demo_kit):
    coco = tmp_path / "instances.json"
    coco.write_text('{"images": ' + DEEP + "}")
    words = f"{coco} nests JSON deeper than it can be read; give a COCO instances file."
    with pytest.raises(DatasetError, match="nests JSON deeper"):
        open_source(coco)
    assert_error(invoke(*run_args(coco, demo_kit.models["digits"], tmp_path / "o")), 2, words)
    with pytest.raises(GroundTruthError) as info:
        read_coco(coco, ["a.png"])
    assert str(info.value) == f"the ground truth {words}"
    assert info.value.exit_code == 2


def test_a_coco_image_entry_is_named_without_its_repr(tmp_path):
    # Before: the message held repr() of the entry: a traceback when it nested deep.
    coco = tmp_path / "instances.json"
    nested = "[" * 900 + "]" * 900
    coco.write_text(
        '{"images": [{"id": ' + nested + ', "file_name": "a.png"}], "annotations": [], '
        '"categories": []}'
    )
    with pytest.raises(
        GroundTruthError,
        match=r"image 0 \(counting from 0\) has no integer id \(a list of 1 values\)",
    ):
        read_coco(coco, ["a.png"])


def test_a_labels_file_nested_too_deep_is_a_usage_error(tmp_path):
    labels = tmp_path / "labels.json"
    labels.write_text(DEEP)
    with pytest.raises(DatasetError, match="nests JSON deeper than it can be read"):
        read_labels_file(labels)


def test_a_job_file_nested_too_deep_is_a_usage_error(tmp_path):
    from batchinfer.evaluate import JobError, load_job

    job = tmp_path / "job.toml"
    job.write_text("a = " + DEEP + "\n")
    with pytest.raises(JobError, match="nested too deeply to read"):
        load_job(job)


# ----------------------------------------------------------------------------- item 8
def _nest(root: Path, depth: int) -> None:
    """``root/d/d/.../d`` ``depth`` folders deep, made relative to each folder's handle (an
    absolute path that long cannot even be named)."""
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)


def _unnest(root: Path) -> None:
    """Remove what :func:`_nest` made, a level at a time with short paths (pytest's rmtree
    recurses once per level, and fails past Python's recursion limit)."""
    while (root / "d" / "d").exists():
        os.rename(root / "d" / "d", root / "up")
        os.rmdir(root / "d")
        os.rename(root / "up", root / "d")
    os.rmdir(root / "d")


def test_folders_nested_past_the_path_limit_say_so_not_permissions(tmp_path):
    # Before: "Cannot read /…/d/d/… (File name too long); fix its permissions or move it out
    # of the dataset", the whole 4,000-character path in the line.
    _nest(tmp_path, 2100)  # 2 bytes a level: past Linux's 4,096-byte PATH_MAX
    try:
        with pytest.raises(DatasetError) as info:
            for _ in walk(str(tmp_path)):
                pass
    finally:
        _unnest(tmp_path)
    message = str(info.value)
    assert "its path is longer than the system allows (File name too long)" in message
    assert "folders nest too deep" in message and "permissions" not in message
    assert "folders deep)" in message and len(message) < 400


def test_a_folder_that_vanishes_while_listed_is_said_so(tmp_path):
    # /proc/self/fd lists the descriptor the listing itself uses, gone when it is entered.
    with pytest.raises(DatasetError) as info:
        for _ in walk("/proc/self/fd"):
            pass
    message = str(info.value)
    assert "disappeared while the dataset was being listed" in message
    assert "permissions" not in message
