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
import os
import stat
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

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
from batchinfer.data.shard_names import COMPRESSED, expand_braces
from batchinfer.data.shard_reading import ClassMemberReader
from batchinfer.data.tar_headers import TarEntry, list_members
from batchinfer.errors import DatasetError

#: Source of a class map read from ``.cls`` members (ClassMap.source).
FROM_CLS_MEMBERS = "cls-members"
#: How many names a start-up warning shows (members named ``../x.png``, bad ``.cls``).
NAMES_IN_WARNINGS = 5
#: How many shard names the manifest records (``dataset.shards.names``).
SHARD_NAMES_KEPT = 1000

_IMAGE_EXT = frozenset(e[1:] for e in IMAGE_EXTENSIONS)
_NPY_EXT = frozenset(e[1:] for e in NPY_EXTENSIONS)


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
    image: TarEntry | None = None
    kind: str | None = None
    cls: TarEntry | None = None
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


def _set_aside(entry: TarEntry, name: str, tally: _Tally | None) -> bool:
    """True (counted in ``tally``) for a member that is no part of a sample: not a file, a
    name that climbs out of the shard, or what tools leave behind."""
    if not entry.regular:
        if tally is not None and not entry.directory:
            tally.skip(name, NOT_A_FILE)
        return True
    if _climbs(name):  # "../x.png": not a leftover, a name no tool should write
        if tally is not None:
            tally.climb(name)
        return True
    left = _leftover(name)
    if left is not None and tally is not None:
        tally.leftovers[left] += 1
    return left is not None


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
            if _set_aside(entry, name, tally):
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
        classes = ClassMemberReader()
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


def _shard_paths(text: str) -> list[str]:
    """The paths the pattern ``text`` names; DatasetError unless each is a regular,
    uncompressed tar file named once."""
    if text.lower().endswith(COMPRESSED):
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
    return shards


def _refuse_listed(
    text: str, duplicates: list[str], kinds: Counter[str], total: int, tally: _Tally
) -> None:
    """DatasetError when the listed samples cannot be a dataset: keys repeat, images and
    tensors are mixed, or no sample holds an item."""
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
    if not total:
        skipped = sum(tally.skipped.values())
        others = f" (only {skipped} other members)" if skipped else ""
        raise DatasetError(
            f"The shards {text} hold no samples with an image or .npy member{others}; pass {_WHAT}."
        )


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
    shards = _shard_paths(text)
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
    reader = ClassMemberReader()
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
    _refuse_listed(text, duplicates, kinds, sum(counts), tally)
    kind = "npy" if kinds["npy"] else "images"
    class_map = (
        given
        if given is not None
        else ClassMap(labels={str(n): n for n in sorted(classes)}, source=FROM_CLS_MEMBERS)
    )
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
