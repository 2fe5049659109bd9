"""The machine doctor looks at: every file it reads goes through one root folder.

The root is "/" on a real machine. Tests and ``doctor --board`` give a folder holding a
fake board (batchinfer/doctor/board.py), so the same code paths read an emulated device
tree, debugfs, librknnrt and sysfs. What is not a file (the CPU architecture, installed
Python packages, /dev/shm's free space, the open-files limit) is a field here too, so a
test can plant it.
"""

from __future__ import annotations

import os
import platform
import resource
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


def _nofile() -> tuple[int, int]:
    return resource.getrlimit(resource.RLIMIT_NOFILE)


@dataclass(frozen=True)
class Machine:
    """Where and how the checks read this machine."""

    root: Path = Path("/")
    #: platform.machine() of the machine checked ("aarch64" on a board).
    arch: str = field(default_factory=platform.machine)
    #: The environment (LD_LIBRARY_PATH is read from it).
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    #: Where installed Python packages are looked for (None: this Python's sys.path).
    python_path: tuple[str, ...] | None = None
    #: os.statvfs, for the free space of /dev/shm.
    statvfs: Callable[[str], os.statvfs_result] = os.statvfs
    #: (soft, hard) limits on open files, as resource.getrlimit(RLIMIT_NOFILE).
    nofile: Callable[[], tuple[int, int]] = _nofile
    #: os.access, for the NPU device node's permissions (root passes every check).
    access: Callable[[Path, int], bool] = os.access
    #: The CPUs a run may use (sizes the default plan's readers).
    cpus: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    emulated: bool = False

    def path(self, name: str) -> Path:
        """``name`` (an absolute path on the machine) under the root."""
        return self.root / name.lstrip("/")

    def read(self, name: str) -> str | None:
        """The stripped text of a small file, or None when missing or unreadable."""
        return read_text(self.path(name))

    def readable_writable(self, name: str) -> bool:
        return self.access(self.path(name), os.R_OK | os.W_OK)

    def exists(self, name: str) -> bool:
        return os.path.lexists(self.path(name))


def read_text(path: Path) -> str | None:
    """The stripped text of a small file (NULs as line ends: device-tree strings), or None
    when missing or unreadable."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError):
        return None
    return text.replace("\x00", "\n").strip()


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """(0, 9, 6) from "v0.9.6", "2.5.0 (abc@...)" or "2.5.0+1.g2a"; None when none is there."""
    import re

    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not match:
        return None
    return tuple(int(g) for g in match.groups() if g is not None)


def dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(v) for v in version)
