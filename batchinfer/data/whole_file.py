"""Files read whole into memory (a labels file, a job file, a COCO JSON, a data.yaml and
the ``.txt`` lists its splits name): checked to be regular files of a bounded size before
a byte of them is read.

Without the check, ``--labels /dev/zero`` grows until memory runs out, a FIFO blocks
until Ctrl-C, and a mistyped path to a 40 GB file is read whole. So :func:`read_whole`
opens with ``O_NONBLOCK`` (a FIFO opens at once, without waiting for a writer), checks the
opened descriptor with ``fstat`` (what was checked is what is read: no race with a rename),
refuses what is not a regular file and what is over its bound, and reads at most
bound + 1 bytes (a file that grows while read, or a ``/proc`` file whose size says 0, is
still caught). The same checks serve files read in a stream (:func:`open_regular`: list
files) and items (:func:`not_regular_reason`).

Bounds (each many times what the largest real file of its kind holds; a file over one is
refused with its size and the bound, so a user who really has such a file knows why):

- labels files: 16 MiB (ImageNet-21k's 21,841 synsets are 0.2 MB as text);
- job files and data.yamls: 1 MiB (they are a few kB);
- the ``.txt`` image lists of a data.yaml's splits: 256 MiB (Open Images' 1.7 M train
  paths are about 100 MB);
- YOLO label files (one image's boxes): 16 MiB (400,000 boxes);
- COCO JSON files: 2 GiB (COCO's train2017 instances are 448 MB, LVIS v1's train 1.1 GB;
  parsing a JSON file takes about ten times its size in memory, so a larger one would
  not fit a board anyway).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

from batchinfer.errors import DatasetError, InputError

MiB = 1 << 20
GiB = 1 << 30

#: Bounds of the files read whole (module docstring).
LABELS_BOUND = 16 * MiB
JOB_BOUND = 1 * MiB
YAML_BOUND = 1 * MiB
PATH_LIST_BOUND = 256 * MiB
COCO_BOUND = 2 * GiB
YOLO_LABELS_BOUND = 16 * MiB

#: Errors a parser raises for input nested deeper than Python's stack allows (json,
#: PyYAML and tomllib recurse); callers turn them into "cannot be read", never a traceback.
NESTING_ERRORS = (RecursionError,)

_READ_CHUNK = 16 * MiB


def size_text(n: int) -> str:
    """A byte count as people read it (``2.0 GiB``, ``640 bytes``)."""
    if n < 1024:
        return f"{n} bytes"
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"  # pragma: no cover - unreachable


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


#: Tests only (tests/test_reliability.py, tools/soak.py): the resolved path of a FIFO that a
#: reader blocks on when an item is it, as a reader blocks on a file of a dead network mount.
#: Items are opened non-blocking and a FIFO is refused, so nothing else here can stand in for
#: such a file. Read once, when a reader's modules are imported; unset in real runs.
HANGING_FILE_ENV = "BATCHINFER_TEST_HANGING_FILE"
_HANGING_FILE = os.environ.get(HANGING_FILE_ENV) or None


def block_if_hanging(path: str) -> None:
    """Block in a plain open() of ``path`` when it is the tests' hanging file (above)."""
    if _HANGING_FILE is not None and os.path.realpath(path) == _HANGING_FILE:
        with open(path, "rb"):  # a FIFO nobody writes to: blocks until the reader is killed
            pass


def not_regular_reason(fd: int, st: os.stat_result | None = None) -> str | None:
    """Why the open file ``fd`` is not an ordinary regular file, or None when it is.

    A ``/proc`` or ``/sys`` file says it is regular and empty (size 0) but is not: one byte
    is read to tell (at offset 0 with ``pread``, so the caller's position is untouched; an
    empty file gives none).
    """
    st = st if st is not None else os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return f"is {kind_of(st.st_mode)}, not a regular file"
    if st.st_size == 0:
        try:
            first = os.pread(fd, 1, 0)
        except OSError:  # /proc/self/mem: unreadable at offset 0
            return "is not a regular file (its size says 0, and reading it fails: a /proc file)"
        if first:
            return (
                "is not a regular file (its size says 0 but it has content: a /proc or /sys file)"
            )
    return None


def open_item(path: str, label: str) -> tuple[int, os.stat_result]:
    """An item's file (an image, a tensor) open for reading, and its ``fstat``; InputError
    naming ``label`` when it cannot be opened or is not a regular file (/dev/zero, a FIFO,
    /proc/self/environ: not "empty"). The caller closes the descriptor."""
    # O_NONBLOCK: a FIFO opens at once (and is refused here) instead of blocking the reader.
    block_if_hanging(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"Cannot read {label}: {exc.strerror or exc}.") from exc
    try:
        st = os.fstat(fd)
        reason = not_regular_reason(fd, st)
        if reason is not None:
            raise InputError(f"Cannot read {label}: it {reason}.")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def open_regular(
    path: Path | str,
    what: str,
    error: Callable[[str], Exception] = DatasetError,
    hint: str = "give a regular file",
) -> int:
    """An ``O_RDONLY`` descriptor of ``path``, checked to be a regular file; ``error(message)``
    is raised otherwise: one line naming ``what`` (``"The labels file"``) and the file,
    why, then ``hint`` (what to do)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise error(f"{what} {path} cannot be read ({_reason(exc)}); {hint}.") from None
    try:
        reason = not_regular_reason(fd)
        if reason is not None:
            raise error(f"{what} {path} {reason}; {hint}.")
        # Regular files ignore O_NONBLOCK, but a reader handed this descriptor should not
        # have to think about it.
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_whole(
    path: Path | str,
    what: str,
    bound: int,
    error: Callable[[str], Exception] = DatasetError,
    hint: str = "give a regular file",
) -> bytes:
    """The bytes of the regular file ``path``, at most ``bound`` of them.

    ``error(message)`` is raised for a file that cannot be opened, is not a regular file
    (a FIFO, a device, a folder, a ``/proc`` file) or holds more than ``bound`` bytes; the
    message names ``what`` (``"The labels file"``), the file, and for a large file its size
    and the bound; ``hint`` says what to do about the others.
    """
    fd = open_regular(path, what, error, hint)
    try:
        size = os.fstat(fd).st_size
        if size > bound:
            raise error(_too_large(path, what, size, bound))
        parts, have = [], 0
        while have <= bound:
            chunk = os.read(fd, min(_READ_CHUNK, bound + 1 - have))
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        if have > bound:  # it grew while being read
            raise error(_too_large(path, what, have, bound, growing=True))
        return b"".join(parts)
    except OSError as exc:
        raise error(f"{what} {path} cannot be read ({_reason(exc)}); {hint}.") from None
    finally:
        os.close(fd)


def _too_large(path: Path | str, what: str, size: int, bound: int, growing: bool = False) -> str:
    if growing:
        held = f"grew past {size_text(bound)} while being read"
    else:
        exact = f" ({size} bytes)" if size >= 1024 else ""
        held = f"is {size_text(size)}{exact}"
    return (
        f"{what} {path} {held}, over the {size_text(bound)} batchinfer reads of such a file; "
        "check that it is the file you meant."
    )


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return "its path is longer than the system allows"
    return exc.strerror or str(exc)
