"""WebDataset-style tar shards as a dataset: listed by their headers, read by seeking.

A shard set is named by one path with brace notation, ``shards/train-{000..099}.tar``
(:func:`expand_braces`), or one ``.tar`` file. Shards are read in the order the pattern
expands to, members in the order they are stored; nothing is ever extracted.

Samples. As in WebDataset, a member's key is its name up to the first dot of its last
path component (``a/000123.jpg`` and ``a/000123.cls`` have the key ``a/000123``), and the
consecutive members sharing a key are one sample. A sample's item is its first member
whose extension (after that dot) is an image extension or ``npy``; the item id is the key.
A ``.cls`` member holding a non-negative integer (ASCII, as WebDataset writes it) gives the
label (at most 2^63-1, :data:`MAX_LABEL`: labels are stored as int64); ``.txt`` members are
not labels (in public shard sets they are captions). Other members, samples without an
image or tensor, and non-file members are skipped and counted like a folder's other files;
what tools leave behind (``._*``, ``__MACOSX/``, hidden names) is counted as leftovers.
Members whose names climb out of the shard (``../x.png``) are skipped and named in a
start-up warning. A key seen twice (in one shard or two) is a DatasetError naming it: ids
must be unique for resume and joins.

Faults. Listing reads headers only (tarfile, seeking past the data). Where a header is
corrupt, the bytes up to the next valid header (found by its checksum, block by block)
are skipped, and that gap is one item of its own, ``SHARD:corrupt@OFFSET``, whose row is
an error saying how many bytes were lost (the members they held cannot be named); a
member whose data runs past the end of a truncated shard, a ``.cls`` that is not an
integer and a shard that is not a tar at all are error rows too. So every sample that
can be listed is an item, and nothing lost goes unreported.

Reading. :class:`Member` (in :attr:`Item.member`) is where the item's bytes are: a
reader reads them with one ``pread`` from the shard it keeps open (:class:`ShardFiles`:
items come to a reader in dataset order, so it works through one shard at a time and
holds one open file, whatever the number of shards). A member's size is what its header
declares, and a header is easily forged (a sparse shard of 8 KiB can declare a member of
3 GiB): a member larger than ``preprocess.max_item_bytes`` is its row's error, decided
from the header, and none of it is read (:func:`check_item_size`).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import stat
import tarfile
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

from batchinfer.data.classes import ClassMap, read_labels_file
from batchinfer.data.dataset import (
    IMAGE_EXTENSIONS,
    NOT_A_FILE,
    NPY_EXTENSIONS,
    SKIPPED_NAMES_KEPT,
    Dataset,
    Item,
    Member,
    Skipped,
    display_name,
)
from batchinfer.data.listing import leftover_kind
from batchinfer.errors import DatasetError, InputError
from batchinfer.messages import setting

#: Source of a class map read from ``.cls`` members (ClassMap.source).
FROM_CLS_MEMBERS = "cls-members"
#: Most bytes a ``.cls`` member may hold (an integer and some whitespace).
_CLS_MAX_BYTES = 64
#: The largest class index: labels are stored as 64-bit integers (Arrow's int64), so a
#: larger one would stop the run at its first Parquet part instead of being its row's error.
MAX_LABEL = 2**63 - 1
#: How many names a start-up warning shows (members named ``../x.png``, bad ``.cls``).
NAMES_IN_WARNINGS = 5
_BLOCK = tarfile.BLOCKSIZE
#: Bytes read at a time while headers are listed (see _Window).
_WINDOW = 1 << 16
#: How many shard names the manifest records (``dataset.shards.names``).
SHARD_NAMES_KEPT = 1000
#: Brace ranges expand to at most this many names (a typo such as {0..9999999} is refused).
MAX_SHARDS = 100_000

_IMAGE_EXT = frozenset(e[1:] for e in IMAGE_EXTENSIONS)
_NPY_EXT = frozenset(e[1:] for e in NPY_EXTENSIONS)
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")
_COMPRESSED = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")


# --------------------------------------------------------------------------- naming


def is_shard_spec(spec: str | os.PathLike[str]) -> bool:
    """True when ``spec`` names tar shards (a ``.tar`` path, braces allowed), not a folder."""
    text = os.fspath(spec).lower()
    return (text.endswith(".tar") or text.endswith(_COMPRESSED)) and not os.path.isdir(spec)


def expand_braces(pattern: str) -> list[str]:
    """Every name ``pattern`` stands for, in order: ``{000..099}`` is a range (zero-padded
    to the wider bound when one has a leading zero; descending when the first is larger),
    ``{a,b}`` a list; several braces give every combination, leftmost slowest (as bash).
    DatasetError for an unbalanced or empty brace, or more than MAX_SHARDS names."""
    parts: list[list[str]] = []
    pos = 0
    for match in re.finditer(r"\{([^{}]*)\}", pattern):
        parts.append([pattern[pos : match.start()]])
        parts.append(_alternatives(match.group(1), pattern))
        pos = match.end()
    parts.append([pattern[pos:]])
    if any("{" in p[0] or "}" in p[0] for p in parts[::2]):
        raise DatasetError(
            f"The shard pattern {pattern} has an unbalanced or nested brace; write ranges "
            "as {000..099} and lists as {a,b}, one level deep."
        )
    total = 1
    for options in parts:
        total *= len(options)
    if total > MAX_SHARDS:
        raise DatasetError(
            f"The shard pattern {pattern} stands for {total} names, more than {MAX_SHARDS}; "
            "check its ranges."
        )
    return ["".join(combo) for combo in itertools.product(*parts)]


def _alternatives(body: str, pattern: str) -> list[str]:
    match = _RANGE.fullmatch(body)
    if match:
        first, last = match.group(1), match.group(2)
        a, b = int(first), int(last)
        padded = any(len(s.lstrip("-")) > 1 and s.lstrip("-")[0] == "0" for s in (first, last))
        width = max(len(first), len(last)) if padded else 0
        step = 1 if b >= a else -1
        if abs(b - a) + 1 > MAX_SHARDS:
            raise DatasetError(
                f"The shard pattern {pattern} has a range {{{body}}} of more than {MAX_SHARDS} "
                "names; check it."
            )
        return [str(n).zfill(width) for n in range(a, b + step, step)]
    if "," in body:
        return body.split(",")
    raise DatasetError(
        f"The shard pattern {pattern} has a brace {{{body}}} that is neither a range "
        "{000..099} nor a list {a,b}; fix it (or quote the pattern so the shell leaves it)."
    )


# --------------------------------------------------------------------------- listing


@dataclass(frozen=True)
class _Entry:
    """One member as listed, or a fault (a span of bytes that held no readable header)."""

    name: str  # as tarfile gives it (surrogate escapes for non-UTF-8 bytes), "" for a fault
    offset: int
    size: int
    regular: bool
    fault: str | None = None
    directory: bool = False


def _is_zero_or_end(block: bytes) -> bool:
    """True for the end of a shard: no bytes, or zero bytes (the end-of-archive blocks)."""
    return block.count(0) == len(block)


#: Type flags of regular files, directories, and the headers only tarfile parses (pax,
#: GNU long names, sparse files): see :func:`_header`.
_REGULAR = frozenset(b"0\x007")
_DIRECTORY = ord("5")
_EXTENDED = frozenset(b"xgLKS")
_COMPLEX: Literal["complex"] = "complex"


def _header(block: bytes) -> tuple[str, int, int] | Literal["complex"] | None:
    """(name, data size, type flag) of a plain ustar/GNU header block; None when the
    block is not a header (its checksum is wrong); ``_COMPLEX`` for headers tarfile must
    read (pax, GNU long names and sparse files, base-256 sizes).

    Python's tarfile parses every field of every header (~20 µs each); this reads the
    three a listing needs (~3 µs), so a shard of small images lists several times faster.
    """
    field = block[148:156].split(b"\0", 1)[0].strip()
    try:
        stored = int(field, 8)
    except ValueError:
        return None
    unsigned = sum(block) - sum(block[148:156]) + 256
    if stored != unsigned:  # old tars summed signed bytes, and tarfile accepts both
        high = sum(b > 127 for b in block[:148]) + sum(b > 127 for b in block[156:])
        if stored != unsigned - 256 * high:
            return None
    flag = block[156]
    if flag in _EXTENDED or block[124] & 0x80:
        return _COMPLEX
    try:
        size = int(block[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return None
    name = block[:100].split(b"\0", 1)[0]
    if block[257:263] == b"ustar\0":  # POSIX ustar: a long name's head is in the prefix
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    if flag == 0 and name.endswith(b"/"):
        flag = _DIRECTORY  # a pre-POSIX tar's folder (as tarfile reads it)
    return name.decode("utf-8", "surrogateescape"), size, flag


class _Window:
    """Reads of a shard through a window of ``_WINDOW`` bytes: headers of small members
    lie a few blocks apart, so most come from the window and cost no system call."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.start = 0
        self.data = b""

    def read(self, offset: int, n: int) -> bytes:
        at = offset - self.start
        if at < 0 or at + n > len(self.data):
            self.data = os.pread(self.fd, max(n, _WINDOW), offset)
            self.start, at = offset, 0
        return self.data[at : at + n]


def _next_header(window: _Window, start: int, size: int) -> int:
    """The offset of the first block at or after ``start`` that is a tar header (by its
    checksum), or ``size`` when none is."""
    for at in range(start, size - _BLOCK + 1, _BLOCK):
        block = window.read(at, _BLOCK)
        if block.count(0) != _BLOCK and _header(block) is not None:
            return at
    return size


#: A member as listing needs it: (name, data offset, data size, type flag, next header).
_Parsed = tuple[str, int, int, int, int]


def _member_at(f: BinaryIO, window: _Window, at: int) -> _Parsed | None:
    """The member whose header starts at ``at``; None when no header is there."""
    block = window.read(at, _BLOCK)
    parsed = _header(block) if len(block) == _BLOCK else None
    if isinstance(parsed, tuple):
        name, length, flag = parsed
        data = at + _BLOCK
        return name, data, length, flag, data + -(-length // _BLOCK) * _BLOCK
    if parsed is None:
        return None
    f.seek(at)  # a header only tarfile reads (pax, a GNU long name, ...)
    try:
        tf = tarfile.TarFile(fileobj=f, mode="r", errors="surrogateescape")
    except tarfile.TarError:
        return None
    info = tf.firstmember  # type: ignore[attr-defined]  # read by TarFile() in mode "r"
    if info is None or tf.offset <= at:
        return None
    return info.name, info.offset_data, info.size, info.type[0], tf.offset


def list_members(path: str) -> Iterator[_Entry]:
    """The members of the tar at ``path`` in stored order (headers only), with a fault
    entry for each span of bytes skipped as corrupt (see the module docstring)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            yield _Entry("", 0, 0, False, "the shard is empty (0 bytes), not a tar file")
            return
        window = _Window(f.fileno())
        at = 0
        while at < size:
            if _is_zero_or_end(window.read(at, _BLOCK)):
                return  # the end-of-archive blocks: a clean end
            member = _member_at(f, window, at)
            if member is None:
                resume = _next_header(window, at + _BLOCK, size)
                yield _Entry("", at, resume - at, False, _corrupt(at, resume, size))
                at = resume
                continue
            name, data, length, flag, after = member
            regular = flag in _REGULAR
            fault = None
            if regular and data + length > size:
                got = max(0, size - data)
                fault = f"the shard is truncated: it ends {got} bytes into this member's {length}"
            yield _Entry(name, data, length, regular, fault, flag == _DIRECTORY)
            at = after


def _corrupt(at: int, resume: int, size: int) -> str:
    if at == 0 and resume == size:
        return f"the shard is not a tar file (no tar header in its {size} bytes)"
    tail = "up to the end of the shard" if resume == size else "up to the next header"
    return (
        f"the shard has a corrupt header at byte {at}: its {resume - at} bytes {tail} are "
        "skipped, with whatever members they held"
    )


def _split(name: str) -> tuple[str, str]:
    """(key, extension) as WebDataset splits a member name: at the first dot of its last
    path component; the extension is "" when there is no dot."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    return (name, "") if dot < 0 else (name[:dot], name[dot + 1 :])


def _normal(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name


def _climbs(name: str) -> bool:
    """True for a name with a ``..`` component: extracted, it would land outside the
    folder it is extracted into (so it is skipped, and named in a warning)."""
    return ".." in name.split("/")


def _leftover(name: str) -> str | None:
    for part in name.split("/"):
        if part and part != ".":
            kind = leftover_kind(part)
            if kind is not None:
                return kind
    return None


@dataclass
class _Sample:
    key: str
    shard: int
    image: _Entry | None = None
    kind: str | None = None
    cls: _Entry | None = None
    fault: str | None = None


@dataclass
class _Tally:
    skipped: Counter[str]
    skipped_first: list[str]
    leftovers: Counter[str]
    climbing: int = 0
    climbing_first: list[str] = field(default_factory=list)

    def climb(self, name: str) -> None:
        self.climbing += 1
        if len(self.climbing_first) < NAMES_IN_WARNINGS:
            self.climbing_first.append(display_name(name)[0])

    def skip(self, name: str, key: str) -> None:
        self.skipped[key] += 1
        if len(self.skipped_first) < SKIPPED_NAMES_KEPT:
            self.skipped_first.append(display_name(name)[0])


def _samples(shards: list[str], names: list[str], tally: _Tally | None) -> Iterator[_Sample]:
    """Every sample (and fault) of the shards, in order; skipped members go to ``tally``."""
    for index, (path, shard_name) in enumerate(zip(shards, names, strict=True)):
        current: _Sample | None = None
        for entry in list_members(path):
            if entry.fault is not None and not entry.regular:
                if current is not None:
                    yield current
                    current = None
                fault_key = f"{shard_name}:corrupt@{entry.offset}"
                yield _Sample(fault_key, index, entry, None, None, entry.fault)
                continue
            name = _normal(entry.name)
            if not entry.regular:
                if tally is not None and not entry.directory:
                    tally.skip(name, NOT_A_FILE)
                continue
            if _climbs(name):  # "../x.png": not a leftover, a name no tool should write
                if tally is not None:
                    tally.climb(name)
                continue
            left = _leftover(name)
            if left is not None:
                if tally is not None:
                    tally.leftovers[left] += 1
                continue
            key, ext = _split(name)
            if current is None or current.key != key:
                if current is not None:
                    yield current
                current = _Sample(key, index)
            lower = ext.lower()
            if current.image is None and (lower in _IMAGE_EXT or lower in _NPY_EXT):
                current.image = entry
                current.kind = "npy" if lower in _NPY_EXT else "images"
            elif lower == "cls" and current.cls is None:
                current.cls = entry
            elif tally is not None:
                tally.skip(name, display_name("." + ext.lower() if ext else "")[0])
        if current is not None:
            yield current


class _ClassReader:
    """Reads ``.cls`` members while shards are listed, one shard open at a time."""

    def __init__(self) -> None:
        self._path: str | None = None
        self._file: BinaryIO | None = None

    def read(self, path: str, entry: _Entry) -> tuple[int | None, str | None]:
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


# --------------------------------------------------------------------------- the set


class ShardSet(Dataset):
    """A set of tar shards: the Dataset interface over their samples (module docstring).

    ``root`` is the pattern as given (absolute); ``shards`` the expanded paths, each with
    how many items it holds (``counts``), so a ``limit`` knows which shards it reaches.
    """

    def __init__(
        self,
        root: Path,
        shards: list[str],
        names: list[str],
        counts: list[int],
        kind: str,
        class_map: ClassMap,
        skipped: Skipped,
        listing_sha256: str,
        leftovers: dict[str, int],
        faults: int,
        label_faults: tuple[int, tuple[str, ...]] = (0, ()),
        climbing: tuple[int, tuple[str, ...]] = (0, ()),
    ) -> None:
        super().__init__(
            root=root,
            kind=kind,
            class_map=class_map,
            count=sum(counts),
            skipped=skipped,
            listing_sha256=listing_sha256,
            leftovers=leftovers,
        )
        self.shards = shards
        self.names = names
        self.counts = counts
        #: items that are faults found while listing (corrupt headers, truncated members,
        #: and the items whose ``.cls`` member is not a class index)
        self.faults = faults
        #: of those, the items whose ``.cls`` is not a class index: (count, the first few
        #: as "key: why")
        self.label_faults = label_faults
        #: members skipped because their names climb out of the shard (``../x.png``):
        #: (count, the first few names)
        self.climbing = climbing

    def __repr__(self) -> str:
        return (
            f"ShardSet(root={str(self.root)!r}, shards={len(self.shards)}, kind={self.kind!r}, "
            f"items={len(self)}, faults={self.faults})"
        )

    @property
    def label_rule(self) -> str | None:
        if not self.class_map.labels:
            return None
        if self.class_map.source == FROM_CLS_MEMBERS:
            return "each sample's .cls member: label = its integer"
        return f"each sample's .cls member, named by the labels file {self.class_map.file}"

    def notes(self) -> tuple[list[str], list[str]]:
        lines, warnings = super().notes()
        bad_labels, label_examples = self.label_faults
        if self.faults > bad_labels:
            warnings.append(
                f"{self.faults - bad_labels} item(s) of {self.root} cannot be read (corrupt or "
                "truncated tar data); each is an error row naming its shard and member."
            )
        if bad_labels:
            more = bad_labels - len(label_examples)
            more_text = f"; and {more} more" if more else ""
            warnings.append(
                f"{bad_labels} item(s) of {self.root} have a .cls member that is not a class "
                f"index ({'; '.join(label_examples)}{more_text}); each is an error row saying so: "
                "a .cls member holds one integer from 0 to 2^63-1."
            )
        climbing, names = self.climbing
        if climbing:
            shown = ", ".join(repr(n) for n in names)
            others = f" and {climbing - len(names)} more" if climbing > len(names) else ""
            warnings.append(
                f"{climbing} member(s) of {self.root} have names that climb out of the shard "
                f"with '..' ({shown}{others}) and are skipped (never items); whoever wrote the "
                "shard should give them names inside it."
            )
        return lines, warnings

    def manifest_json(self) -> dict[str, object]:
        record = super().manifest_json()
        record.update(
            kind=self.kind,
            shards={
                "count": len(self.shards),
                "names": self.names[:SHARD_NAMES_KEPT],  # the first ones of a huge set
                "faults": self.faults,
                **({"label_faults": self.label_faults[0]} if self.label_faults[0] else {}),
                **({"climbing_names": list(self.climbing[1])} if self.climbing[0] else {}),
            },
        )
        return record

    def item_paths(self) -> Iterator[str]:
        for item in self.iter_from():
            yield item.id

    def iter_from(self, skip: Callable[[bytes], bool] | None = None) -> Iterator[Item]:
        labels = self.class_map
        names_by_label = {v: k for k, v in sorted(labels.labels.items(), reverse=True)}
        index = 0
        classes = _ClassReader()
        try:
            for sample in _samples(self.shards, self.names, None):
                if sample.image is None:
                    continue
                id_text, id_bytes = display_name(sample.key)
                if skip is not None and skip(os.fsencode(sample.key)):
                    index += 1
                    continue
                label, fault = None, sample.fault or sample.image.fault
                if sample.cls is not None and fault is None:
                    label, fault = classes.read(self.shards[sample.shard], sample.cls)
                entry = sample.image
                member_name = entry.name or f"bytes {entry.offset}-{entry.offset + entry.size}"
                yield Item(
                    index=index,
                    path=self.shards[sample.shard],
                    id=id_text,
                    label=label,
                    label_name=None if label is None else names_by_label.get(label, str(label)),
                    id_bytes=id_bytes,
                    member=Member(entry.offset, entry.size, display_name(member_name)[0], fault),
                )
                index += 1
        finally:
            classes.close()

    def files_sha256(self, check: str, limit: int | None = None) -> str:
        """What the shards are now (see data/fingerprint.py): each shard's name with its
        size and mtime (``stat``) or the sha256 of its bytes (``content``); only the shards
        holding the first ``limit`` items when given."""
        digest = hashlib.sha256()
        reached = 0
        for path, name, count in zip(self.shards, self.names, self.counts, strict=True):
            if limit is not None and reached >= limit:
                break
            reached += count
            key = os.fsencode(name)
            try:
                st = os.stat(path)
                if check == "stat":
                    digest.update(key + f"\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
                else:
                    digest.update(key + f"\0{st.st_size}\0".encode() + _sha256(path) + b"\0")
            except OSError:
                digest.update(key + b"\0missing\0")
        return digest.hexdigest()


def _sha256(path: str) -> bytes:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.digest()


_WHAT = "tar shards (one .tar, or a pattern such as shards/train-{000..099}.tar, quoted)"


def open_shards(
    spec: str | os.PathLike[str],
    *,
    labels_file: Path | str | None = None,
    progress: Callable[[int], None] | None = None,
) -> ShardSet:
    """List the shards ``spec`` names (headers only) and return their ShardSet.

    DatasetError when a shard is missing or not a regular file, a shard is compressed,
    keys repeat, or no sample holds an image or ``.npy`` tensor. ``labels_file`` names the
    ``.cls`` integers (its names become the items' label names); ``progress(count)`` is
    called with the number of samples listed after each shard.
    """
    text = os.path.abspath(os.path.expanduser(os.fspath(spec)))
    if text.lower().endswith(_COMPRESSED):
        raise DatasetError(
            f"The shards {text} are compressed, and a compressed tar cannot be read by "
            "seeking to a member; store them uncompressed (.tar): images compress little."
        )
    shards = expand_braces(text)
    missing = [p for p in shards if not os.path.exists(p)]
    if missing:
        more = f" and {len(missing) - 1} more of {len(shards)}" if len(missing) > 1 else ""
        raise DatasetError(f"The shard {missing[0]}{more} does not exist; pass {_WHAT}.")
    for path in shards:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise DatasetError(f"The shard {path} is not a regular file; pass {_WHAT}.")
    if len(set(shards)) != len(shards):
        dup = next(p for p, n in Counter(shards).items() if n > 1)
        raise DatasetError(f"The shard pattern {text} names {dup} twice; name each shard once.")
    base = os.path.dirname(text[: text.find("{")] if "{" in text else text)
    names = [os.path.relpath(p, base) for p in shards]
    given = None if labels_file is None else read_labels_file(labels_file)

    tally = _Tally(Counter(), [], Counter())
    counts = [0] * len(shards)
    kinds: Counter[str] = Counter()
    seen: set[str] = set()
    duplicates: list[str] = []
    listing = hashlib.sha256()
    classes: set[int] = set()
    faults = 0
    label_faults: list[str] = []
    bad_labels = 0
    reader = _ClassReader()
    try:
        for sample in _samples(shards, names, tally):
            if sample.image is None:  # no image or tensor: its other members were counted
                if sample.cls is not None:
                    tally.skip(sample.cls.name, ".cls")
                continue
            if sample.key in seen:
                if len(duplicates) < 5:
                    duplicates.append(sample.key)
                continue
            seen.add(sample.key)
            counts[sample.shard] += 1
            if sample.kind is not None:
                kinds[sample.kind] += 1
            entry = sample.image
            listing.update(os.fsencode(sample.key) + f"\0{entry.offset}\0{entry.size}\0".encode())
            label = None
            if not (sample.fault or entry.fault) and sample.cls is not None:
                label, why = reader.read(shards[sample.shard], sample.cls)
                if label is not None:
                    classes.add(label)
                elif sample.cls.fault is None:  # the member is there: its text is wrong
                    bad_labels += 1
                    if len(label_faults) < NAMES_IN_WARNINGS:
                        label_faults.append(f"{display_name(sample.key)[0]}: {why}")
            if sample.fault or entry.fault or (sample.cls is not None and label is None):
                faults += 1
            if progress is not None and counts[sample.shard] % 10_000 == 0:
                progress(sum(counts))
    except OSError as exc:
        raise DatasetError(f"Cannot read the shards {text}: {exc.strerror or exc}.") from exc
    finally:
        reader.close()
    if progress is not None:
        progress(sum(counts))
    if duplicates:
        shown = ", ".join(repr(display_name(k)[0]) for k in duplicates)
        raise DatasetError(
            f"The shards {text} hold samples with the same key more than once ({shown}); "
            "keys are the item ids and must be unique across the shard set, so rename them."
        )
    if kinds["images"] and kinds["npy"]:
        raise DatasetError(
            f"The shards {text} mix {kinds['images']} images and {kinds['npy']} .npy "
            "tensors; keep one kind of item per shard set."
        )
    total = sum(counts)
    if not total:
        skipped = sum(tally.skipped.values())
        others = f" (only {skipped} other members)" if skipped else ""
        raise DatasetError(
            f"The shards {text} hold no samples with an image or .npy member{others}; pass {_WHAT}."
        )
    kind = "npy" if kinds["npy"] else "images"
    if given is not None:
        class_map = given
    else:
        class_map = ClassMap(labels={str(n): n for n in sorted(classes)}, source=FROM_CLS_MEMBERS)
    return ShardSet(
        root=Path(text),
        shards=shards,
        names=names,
        counts=counts,
        kind=kind,
        class_map=class_map,
        skipped=Skipped(
            count=sum(tally.skipped.values()),
            by_extension=dict(tally.skipped),
            first=tuple(tally.skipped_first),
        ),
        listing_sha256=listing.hexdigest(),
        leftovers=dict(tally.leftovers),
        faults=faults,
        label_faults=(bad_labels, tuple(label_faults)),
        climbing=(tally.climbing, tuple(tally.climbing_first)),
    )


# --------------------------------------------------------------------------- reading


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
