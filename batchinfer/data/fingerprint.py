"""What a dataset's files are now: one sha256 over every item's size and modification
time (``stat``), or over every item's bytes (``content``).

A ``--resume`` appends rows to those of earlier invocations, so it is refused when an
item's file changed in between (sink/fingerprint.py): the listing's hash sees names
only, not an image replaced under the same name.

Cost (20,000 PNGs of 4 KB, warm page cache, CPU time of one x86 core, best of three):
listing them 0.04 s; the ``stat`` pass 0.10 s more (a second walk and one stat per file,
about 5 µs an item, paid before the run starts); the ``content`` pass 0.34 s more, and
in general a read of the whole dataset plus sha256 at about 1.5 GB/s per core (some 2 s
of CPU for 3 GB of JPEGs, plus the disk's time to read them when they are not cached).
So ``stat`` is the default, and ``content`` an option for datasets whose files may be
rewritten with their size and time kept (``rsync -t``, ``cp -p``, ``touch -r``).
"""

from __future__ import annotations

import hashlib
import os
import stat

from batchinfer.data.dataset import Dataset
from batchinfer.data.shards import ShardSet
from batchinfer.data.video.dataset import VideoDataset
from batchinfer.errors import DatasetError

#: What a pass may look at (``output.resume_check``).
CHECKS = ("stat", "content")
_BATCH = 4096
_CHUNK = 1 << 20


def files_sha256(dataset: Dataset, check: str = "stat", limit: int | None = None) -> str:
    """The hex sha256 of every item's name with its size and mtime (``stat``) or the
    sha256 of its bytes (``content``), in dataset order; the first ``limit`` items only
    when given. A file that cannot be read counts as ``missing`` (its row will be an error)."""
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, not {check!r}")
    if isinstance(dataset, ShardSet):  # names, sizes and times of shards, not of files
        return dataset.files_sha256(check, limit)
    if isinstance(dataset, VideoDataset):  # each video's size, duration and frame count too
        return dataset.files_sha256(check, limit)
    digest = hashlib.sha256()
    try:
        root = os.open(dataset.root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise DatasetError(
            f"Cannot read {dataset.root} ({exc.strerror or exc}); fix its permissions."
        ) from exc
    try:
        pending: list[bytes] = []
        for index, (key, rel) in enumerate(dataset.item_files()):
            if limit is not None and index >= limit:
                break
            pending.append(key + b"\0bad row\0" if rel is None else _entry(key, rel, root, check))
            if len(pending) == _BATCH:
                digest.update(b"".join(pending))
                pending.clear()
        digest.update(b"".join(pending))
    finally:
        os.close(root)
    return digest.hexdigest()


def _entry(key: bytes, rel: str, root: int, check: str) -> bytes:
    # key: the item's exact name (Item.key); rel: its file, relative to root or absolute
    try:
        st = os.stat(rel, dir_fd=root)
        if check == "stat":
            return key + f"\0{st.st_size}\0{st.st_mtime_ns}\0".encode()
        if not stat.S_ISREG(st.st_mode):  # a link to a FIFO would block a read forever
            return key + b"\0not a regular file\0"
        return key + f"\0{st.st_size}\0".encode() + _content_sha256(rel, root) + b"\0"
    except OSError:
        return key + b"\0missing\0"


def _content_sha256(rel: str, root: int) -> bytes:
    digest = hashlib.sha256()
    fd = os.open(rel, os.O_RDONLY | os.O_NONBLOCK, dir_fd=root)
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.digest()
