"""Files read whole (labels, job files, COCO JSON, data.yaml, a split's .txt list) and the
files a run reads (list files, items) are checked to be regular files, of a bounded size,
before they are read (issue 40, items 8 and 9).

The checks that a regression would turn into a memory bomb or a blocked read run in a child
with its memory and time bounded (tests/hostile_child.py).
"""

from __future__ import annotations

import json
import os

import pytest
from hostile_child import run_child

from batchinfer.data.classes import read_labels_file
from batchinfer.errors import DatasetError
from batchinfer.evaluate import JobError, load_job
from batchinfer.evaluate.groundtruth import GroundTruthError, read_coco


def test_labels_from_dev_zero_are_refused_before_a_byte_is_read():
    # Before: 1.7 GB in 1.1 s, then MemoryError (a traceback) at the child's 2 GiB.
    (line,) = run_child(
        """
        from batchinfer.data.classes import read_labels_file
        said(lambda: read_labels_file("/dev/zero"))
        """
    )
    assert line.startswith("DatasetError 2: The labels file /dev/zero is a character device")


def test_fifos_are_refused_at_once_wherever_a_file_is_read(tmp_path):
    # Before: the labels, job and ground-truth FIFOs blocked until killed (the timeout);
    # the lists, the COCO JSON and the data.yaml were said "not to exist".
    names = ["labels.txt", "job.toml", "gt.json", "p.json", "p.yaml", "p.csv", "p.txt",
             "p.jsonl", "p.parquet"]  # fmt: skip
    for name in names:
        os.mkfifo(tmp_path / name)
    lines = run_child(
        f"""
        from pathlib import Path
        from batchinfer.data.classes import read_labels_file
        from batchinfer.data.sources import open_source
        from batchinfer.evaluate import load_job
        from batchinfer.evaluate.groundtruth import read_coco
        d = Path({str(tmp_path)!r})
        said(lambda: read_labels_file(d / "labels.txt"))
        said(lambda: load_job(d / "job.toml"))
        said(lambda: read_coco(d / "gt.json", ["a.png"]))
        for name in {names[3:]!r}:
            said(lambda: open_source(d / name))
        """,
        timeout=60,
    )
    assert len(lines) == len(names)
    for name, line in zip(names, lines, strict=True):
        assert f"{tmp_path / name} is a FIFO (named pipe), not a regular file" in line, line
        assert " 2: " in line, line  # a usage error


def test_a_file_over_its_bound_is_refused_naming_its_size_and_the_bound(tmp_path, monkeypatch):
    big = tmp_path / "labels.txt"
    with open(big, "wb") as f:  # sparse: 17 MiB of NULs, which used to be one class name
        f.truncate(17 << 20)
    with pytest.raises(DatasetError) as info:
        read_labels_file(big)
    message = str(info.value)
    assert f"The labels file {big} is 17.0 MiB ({17 << 20} bytes)" in message
    assert "over the 16.0 MiB batchinfer reads of such a file" in message

    job = tmp_path / "job.toml"
    job.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(
        JobError, match=r"job file .* is 1\.0 MiB \(1048579 bytes\), over the 1\.0 MiB"
    ):
        load_job(job)

    monkeypatch.setattr("batchinfer.data.coco_file.COCO_BOUND", 100)
    gt = tmp_path / "gt.json"
    gt.write_text(json.dumps({"images": [], "annotations": [], "categories": []}) + " " * 100)
    with pytest.raises(GroundTruthError, match=r"gt\.json is 151 bytes, over the 100 bytes"):
        read_coco(gt, [])


def test_read_whole_reads_at_most_the_bound_of_a_file_that_says_it_is_small():
    # /proc files say their size is 0: the check that stops a read is the bytes read.
    from batchinfer.data.whole_file import read_whole

    with pytest.raises(DatasetError, match=r"not a regular file .*size says 0 but it has content"):
        read_whole("/proc/self/environ", "The file", 1 << 20)
    assert read_whole(__file__, "This test", 1 << 20).startswith(b'"""Files read whole')
    with pytest.raises(DatasetError, match=r"is .* over the 10 bytes"):
        read_whole(__file__, "This test", 10)


def test_items_that_are_devices_fifos_or_proc_files_are_not_called_empty(tmp_path):
    # Before: /dev/zero, /dev/urandom, /proc/self/environ... were "the file is empty", and
    # a FIFO blocked its reader until the run's timeout killed it.
    os.mkfifo(tmp_path / "fifo.png")
    os.mkfifo(tmp_path / "fifo.npy")
    (tmp_path / "empty.png").write_bytes(b"")
    lines = run_child(
        f"""
        import numpy as np
        from batchinfer.data.preprocess import _open
        from batchinfer.data.npy import read_npy
        class Spec:
            shape, dtype = (1, 2), "float32"
        for path in ["/dev/zero", "/dev/urandom", "/proc/self/environ", "/proc/self/mem",
                     {str(tmp_path / "fifo.png")!r}, {str(tmp_path / "empty.png")!r}]:
            said(lambda: _open(path, path, None).close())
        for path in ["/dev/zero", {str(tmp_path / "fifo.npy")!r}]:
            said(lambda: read_npy(path, Spec, np.zeros((1, 2), np.float32), path))
        """
    )
    assert [line.split(": it ", 1)[-1] for line in lines] == [
        "is a character device, not a regular file.",
        "is a character device, not a regular file.",
        "is not a regular file (its size says 0 but it has content: a /proc or /sys file).",
        "is not a regular file (its size says 0, and reading it fails: a /proc file).",
        "is a FIFO (named pipe), not a regular file.",
        f"InputError 3: Cannot read {tmp_path / 'empty.png'}: the file is empty.",
        "is a character device, not a regular file.",
        "is a FIFO (named pipe), not a regular file.",
    ]


def test_a_list_line_is_read_at_most_its_bound(tmp_path, monkeypatch):
    from batchinfer.data import manifest
    from batchinfer.data.sources import open_source

    monkeypatch.setattr(manifest, "LINE_BOUND", 100)
    for name in ("l.txt", "l.jsonl", "l.csv"):
        lst = tmp_path / name
        header = "path\n" if name.endswith(".csv") else ""
        lst.write_text(header + "a.png\n" + "b" * 20_000 + "\n")  # past a block read
        start = len(header) + len("a.png\n")
        with pytest.raises(
            DatasetError, match=f"has a line longer than 100 bytes .from byte {start}"
        ):
            open_source(lst)
