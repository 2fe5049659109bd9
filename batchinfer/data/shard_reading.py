"""Reading the bytes of tar shard members (data/shards.py's "Reading"): a reader's open
shards (:class:`ShardFiles`), the size check decided from a header, how messages name a
member, and the ``.cls`` members read while shards are listed.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import BinaryIO

from batchinfer.data.dataset import (
    Member,
    display_name,
)
from batchinfer.data.list_columns import MAX_LABEL
from batchinfer.data.tar_headers import TarEntry
from batchinfer.errors import InputError
from batchinfer.messages import setting

#: Most bytes a ``.cls`` member may hold (an integer and some whitespace).
_CLS_MAX_BYTES = 64


class ClassMemberReader:
    """Reads ``.cls`` members while shards are listed, one shard open at a time."""

    def __init__(self) -> None:
        self._path: str | None = None
        self._file: BinaryIO | None = None

    def read(self, path: str, entry: TarEntry) -> tuple[int | None, str | None]:
        """(label, fault) from the ``.cls`` member ``entry`` of the shard at ``path``."""
        name = display_name(entry.name)[0]
        if entry.fault is not None:
            return None, f"its class member {name}: {entry.fault}"
        if entry.size > _CLS_MAX_BYTES:
            return None, f"its class member {name} holds {entry.size} bytes, not a class index"
        if self._path != path:
            self.close()
            self._file = open(path, "rb")  # noqa: SIM115 - closed by close()
            self._path = path
        assert self._file is not None
        self._file.seek(entry.offset)
        text = self._file.read(entry.size).strip()
        if not text.isdigit():
            return None, (
                f"its class member {name} holds {text[:20]!r}, not a non-negative integer "
                "class index"
            )
        label = int(text)
        if label > MAX_LABEL:
            return None, (
                f"its class member {name} holds {text[:20]!r}{'...' if len(text) > 20 else ''}, "
                f"a class index larger than {MAX_LABEL} (labels are 64-bit integers)"
            )
        return label, None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file, self._path = None, None


class ShardFiles:
    """The shards one reader has open: at most ``keep``, the least recently used closed
    first. Items come in dataset order, so a reader works through one shard at a time:
    one open file is enough (an item handed back after a reader died may cost a reopen)."""

    def __init__(self, keep: int = 1) -> None:
        self.keep = keep
        self._fds: OrderedDict[str, int] = OrderedDict()

    def _fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._fds[path] = fd
        while len(self._fds) > self.keep:
            os.close(self._fds.popitem(last=False)[1])
        return fd

    def read(self, path: str, member: Member, label: str, limit: int | None = None) -> bytes:
        """The member's bytes; InputError (naming ``label``) when they cannot be read, or
        when its header says it holds more than ``limit`` bytes (then nothing is read: a
        sparse shard of a few KiB can declare a member of gigabytes)."""
        if member.fault is not None:
            raise InputError(f"Cannot read {label}: {member.fault}.")
        if member.size == 0:
            raise InputError(f"Cannot read {label}: the member is empty.")
        check_item_size(member.size, limit, label, "the member")
        try:
            fd = self._fd(path)
            parts, got = [], 0
            while got < member.size:
                chunk = os.pread(fd, member.size - got, member.offset + got)
                if not chunk:
                    break
                parts.append(chunk)
                got += len(chunk)
        except OSError as exc:
            raise InputError(f"Cannot read {label}: {exc.strerror or exc}.") from exc
        if got < member.size:
            raise InputError(
                f"Cannot read {label}: the shard is truncated ({got} of the member's "
                f"{member.size} bytes are there)."
            )
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])

    def __len__(self) -> int:
        return len(self._fds)


def check_item_size(size: int, limit: int | None, label: str, what: str) -> None:
    """InputError naming ``label`` when an item of ``size`` bytes (as its tar header or
    its file's stat says; ``what`` says which: "the member", "the file") is larger than
    ``limit``, the most one item may hold (Preprocess.max_item_bytes; None: no limit)."""
    if limit is not None and size > limit:
        raise InputError(
            f"Cannot read {label}: {what} is {size:,} bytes, more than the {limit:,} "
            f"bytes{_in_mib(limit)} one item may hold ("
            + setting("preprocess.max_item_bytes")
            + "), so it is not read; raise that setting if the item is really that large."
        )


def _in_mib(n: int) -> str:
    return f" ({n / 2**20:,.4g} MiB)" if n >= 2**20 else ""


def member_label(path: str, member: Member, name: str | None) -> str:
    """How messages name an item read from a shard: its id, member and shard."""
    where = f"{member.name} in {os.path.basename(path)}"
    return f"{name} ({where})" if name else where
