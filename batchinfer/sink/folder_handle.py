"""Folders held open: a run writes, renames and deletes relative to a handle, never a path.

A path is looked up again at every use: swap ``OUT/predictions`` for a symbolic link
between two writes and the second write goes through the link, into someone else's
folder. A :class:`Folder` is a folder opened once (its descriptor); every name is looked
up inside it (``dir_fd``) without following a link (``O_NOFOLLOW``), so whatever is done
to the path meanwhile, a write lands in the folder that was opened, or fails.
:meth:`Folder.still_at` tells whether a name still leads to that folder, so a swap is
found and said rather than silently written around.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path
from typing import BinaryIO

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def identity(st: os.stat_result) -> tuple[int, int]:
    """What tells one file or folder from another: (device, inode)."""
    return st.st_dev, st.st_ino


class Folder:
    """A folder opened once; names are resolved inside it and links are never followed.

    ``path`` is where the folder was when it was opened: for messages, and for
    :meth:`still_at`. Methods raise OSError as the system calls do (ELOOP for a name that
    is a symbolic link); callers turn it into their own error.
    """

    def __init__(self, fd: int, path: Path, *, owned: bool = True) -> None:
        self.fd = fd
        self.path = Path(path)
        self.owned = owned  # close() closes fd (False: someone else's, e.g. OUT's lock)
        self.identity = identity(os.fstat(fd))

    @classmethod
    def open(cls, path: Path) -> Folder:
        """The folder at ``path`` (links in ``path`` are followed: the user named it)."""
        return cls(os.open(path, _DIR_FLAGS), Path(path))

    def sub(self, name: str, *, create: bool = False) -> Folder:
        """The folder ``name`` directly inside this one, made first when ``create``;
        OSError (ELOOP, ENOTDIR) when ``name`` is a symbolic link or not a folder."""
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=self.fd)
        fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=self.fd)
        return Folder(fd, self.path / name)

    # -- looking -------------------------------------------------------------------------
    def lstat(self, name: str) -> os.stat_result | None:
        """``name``'s own status (a link's, not its target's); None when nothing is there."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def names(self) -> list[str]:
        """The names in the folder, sorted."""
        return sorted(os.listdir(self.fd))

    def still_at(self, name: str, parent: Folder) -> bool:
        """True when ``name`` in ``parent`` is still this folder (not a link, not another)."""
        try:
            st = parent.lstat(name)
        except OSError:
            return False
        return st is not None and stat.S_ISDIR(st.st_mode) and identity(st) == self.identity

    def now_at(self) -> str | None:
        """Where the folder is now (Linux's /proc), None when unknown or deleted."""
        try:
            where = os.readlink(f"/proc/self/fd/{self.fd}")
        except OSError:
            return None
        return None if where.endswith(" (deleted)") else where

    # -- reading and writing -------------------------------------------------------------
    def open_read(self, name: str) -> BinaryIO:
        """``name`` opened for reading; OSError when it is a link or not a regular file."""
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(f"{self.path / name} is not a regular file")
        return os.fdopen(fd, "rb")

    def create(self, name: str) -> BinaryIO:
        """A new, empty regular file ``name`` opened for writing. Whatever was under the
        name (a leftover, a planted link) is unlinked first, never written through."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.fdopen(os.open(name, flags, 0o644, dir_fd=self.fd), "wb")

    def sha256(self, name: str, chunk_size: int = 1 << 20) -> str:
        """The hex SHA-256 of the regular file ``name``."""
        digest = hashlib.sha256()
        with self.open_read(name) as f:
            while chunk := f.read(chunk_size):
                digest.update(chunk)
        return digest.hexdigest()

    def replace(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst``, both in this folder (``dst`` replaced if there)."""
        os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        """Delete the file ``name`` (a link itself, never its target); none there is fine."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)

    def fsync(self) -> None:
        """Make renames in the folder durable (best effort: not every filesystem allows it)."""
        with contextlib.suppress(OSError):
            os.fsync(self.fd)

    def close(self) -> None:
        if self.owned and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def __del__(self) -> None:  # a writer dropped without close() leaks no descriptor
        with contextlib.suppress(OSError, AttributeError):
            self.close()

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
