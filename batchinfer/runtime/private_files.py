"""Folders and files in shared places (/tmp) that only we may use.

A predictable name in /tmp (``batchinfer-sim-<uid>``) can be created first by another
local user, as a symlink or a folder they can write to; whoever then writes "our" file
there writes wherever they point. So such a folder is created with mode 0700, and an
existing one is used only if it is a real folder (not a symlink), owned by us and closed
to others; files in it are opened without following symlinks.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` (mode 0700) or check that the existing one is private and ours.

    Raises PermissionError naming what is wrong. Parent folders are created as needed
    but not checked: they are the caller's choice (the temp dir, or a configured path).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    problem = None
    if stat.S_ISLNK(st.st_mode):
        problem = "it is a symlink"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "it is not a folder"
    elif st.st_uid != os.getuid():
        problem = f"it belongs to uid {st.st_uid}, not to us (uid {os.getuid()})"
    elif st.st_mode & 0o077:
        problem = f"others may use it (mode {stat.S_IMODE(st.st_mode):o}, not 700)"
    if problem:
        raise PermissionError(
            f"{path} is not a private folder ({problem}); remove it, or point the emulator "
            "at a folder of your own with BATCHINFER_SIM_STATE"
        )


def open_private_file(path: Path) -> int:
    """Open (creating with mode 0600) a regular file of ours, never through a symlink."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        raise PermissionError(f"{path} is not a regular file of ours; remove it")
    return fd
