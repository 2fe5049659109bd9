"""Dataset folders, walked as a stream: the coordinator never holds a list of every path.

A dataset is a folder of images or of ``.npy`` tensors, searched recursively. Its order is
fixed by the names alone (see ``_sorted_entries``), so a run and its ``--resume`` agree on
every item's index. Memory stays flat whatever the dataset size: ``open_dataset`` counts
items in one walk, and each iteration is a fresh walk that yields items one at a time.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from batchinfer.errors import DatasetError

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"})
NPY_EXTENSIONS = frozenset({".npy"})
KINDS = ("images", "npy")

#: How many entries of one directory are sorted in memory at a time. A bigger directory
#: is read in several passes, each taking the next _CHUNK names in order (see
#: _sorted_entries): memory stays bounded at the cost of re-listing huge flat folders.
_CHUNK = 16384

_WHAT = (
    "a folder of images (.jpg, .png, ...) or of .npy tensors, optionally one subfolder per class"
)


@dataclass(frozen=True)
class Item:
    """One dataset item, as readers and result rows see it."""

    index: int  # position in the dataset's stable order, 0-based
    path: str  # absolute (undecodable bytes of the name kept as surrogates, as os does)
    id: str  # path relative to the dataset root, POSIX separators, valid UTF-8
    label: int | None  # class index, None when the item is not in a class folder
    label_name: str | None  # class folder name
    # The exact relative path when it is not valid UTF-8 (then ``id`` shows it with
    # its odd bytes as \xNN); None otherwise. See :func:`display_name`.
    id_bytes: bytes | None = None

    @property
    def key(self) -> bytes:
        """The exact relative path as bytes: what output rows are matched by."""
        return self.id_bytes if self.id_bytes is not None else self.id.encode("utf-8")


def display_name(rel: str) -> tuple[str, bytes | None]:
    """(valid UTF-8 text, raw bytes or None) for a name as os.scandir gives it.

    Names that are not valid UTF-8 (old Samba shares, Latin-1 zip files) come from the OS
    with their odd bytes as lone surrogates, which Parquet cannot store: the text shows
    them as ``\\xNN`` and the raw bytes are kept beside it, so nothing is lost.
    """
    try:
        rel.encode("utf-8")
        return rel, None
    except UnicodeEncodeError:
        raw = os.fsencode(rel)
        return raw.decode("utf-8", "backslashreplace"), raw


class Dataset:
    """A dataset folder: its kind, classes and size, and a stream of its Items.

    Holds no paths: ``len()`` was counted when it was opened and ``iter()`` walks the
    folder again. Picklable (it is only a few small fields), so it can go to a process.
    """

    def __init__(
        self,
        root: Path,
        kind: str,
        classes: tuple[str, ...],
        labels: dict[str, int],
        count: int,
        ignored: int,
        listing_sha256: str = "",
    ) -> None:
        self.root = root
        self.kind = kind
        self.classes = classes
        #: class folder name -> label index (int(name), or the position in ``classes``)
        self.labels = labels
        #: files under root with an extension of neither kind (hidden files not counted)
        self.ignored = ignored
        #: sha256 over every item's relative path, in order: the dataset's listing, which
        #: a --resume must find unchanged
        self.listing_sha256 = listing_sha256
        self._count = count

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return (
            f"Dataset(root={str(self.root)!r}, kind={self.kind!r}, items={self._count}, "
            f"classes={len(self.classes)}, ignored={self.ignored})"
        )

    def __iter__(self) -> Iterator[Item]:
        return self.iter_from()

    def iter_from(self, skip: Callable[[bytes], bool] | None = None) -> Iterator[Item]:
        """Yield the Items in order, leaving out those whose key ``skip`` says to skip.

        ``skip`` gets an item's exact relative path as bytes (:attr:`Item.key`). Indexes
        are those of the full dataset, so a resumed run keeps them; a resume checks that
        the listing has not changed (``listing_sha256``).
        """
        root = str(self.root)
        index = 0
        for rel, kind in _walk(root):
            if kind != self.kind:
                continue
            if skip is None or not skip(os.fsencode(rel)):
                label_name = rel.split("/", 1)[0] if "/" in rel and self.labels else None
                id_text, id_bytes = display_name(rel)
                yield Item(
                    index=index,
                    path=os.path.join(root, *rel.split("/")),
                    id=id_text,
                    label=None if label_name is None else self.labels.get(label_name),
                    label_name=None if label_name is None else display_name(label_name)[0],
                    id_bytes=id_bytes,
                )
            index += 1


def open_dataset(root: Path | str) -> Dataset:
    """Return the Dataset at ``root`` after one counting walk; DatasetError if it is unusable.

    Kind: images (any of IMAGE_EXTENSIONS, any case) or ``.npy``; a folder holding both is
    refused. Labels: when items sit in the root's subfolders, each subfolder holding items
    is a class; its label is ``int(name)`` if every class name is a non-negative integer,
    else its position among the sorted class names. Items directly in the root then have
    no label. Hidden files and folders (leading '.') are skipped; other files are counted
    in ``ignored``.
    """
    path = Path(os.path.abspath(root))
    if not path.exists():
        raise DatasetError(f"The dataset folder {path} does not exist; pass {_WHAT}.")
    if not path.is_dir():
        raise DatasetError(f"The dataset {path} is a file, not a folder; pass {_WHAT}.")

    counts = {"images": 0, "npy": 0}
    listings = {"images": hashlib.sha256(), "npy": hashlib.sha256()}
    ignored = 0
    # Top-level subfolders holding items, per kind: few, so a set is fine.
    class_dirs: dict[str, set[str]] = {"images": set(), "npy": set()}
    for rel, kind in _walk(str(path)):
        if kind is None:
            ignored += 1
            continue
        counts[kind] += 1
        listings[kind].update(os.fsencode(rel) + b"\0")
        if "/" in rel:
            class_dirs[kind].add(rel.split("/", 1)[0])

    if counts["images"] and counts["npy"]:
        raise DatasetError(
            f"The dataset folder {path} mixes {counts['images']} images and {counts['npy']} "
            ".npy tensors; keep one kind of item per dataset folder."
        )
    kind = "images" if counts["images"] else "npy"
    if not counts[kind]:
        others = f" (only {ignored} other files)" if ignored else ""
        raise DatasetError(f"The dataset folder {path} holds no items{others}; it must be {_WHAT}.")
    classes = tuple(sorted(class_dirs[kind]))
    return Dataset(
        root=path,
        kind=kind,
        classes=classes,
        labels=_label_indexes(path, classes),
        count=counts[kind],
        ignored=ignored,
        listing_sha256=listings[kind].hexdigest(),
    )


def _label_indexes(root: Path, classes: tuple[str, ...]) -> dict[str, int]:
    """Map class names to label indexes: int(name) when all are integers, else positions."""
    if classes and all(re.fullmatch(r"[0-9]+", name) for name in classes):
        labels = {name: int(name) for name in classes}
        if len(set(labels.values())) < len(labels):
            seen: dict[int, str] = {}
            for name, value in labels.items():
                if value in seen:
                    raise DatasetError(
                        f"The class folders {seen[value]!r} and {name!r} in {root} both mean "
                        f"label {value}; rename or merge one of them."
                    )
                seen[value] = name
        return labels
    return {name: i for i, name in enumerate(classes)}


def _kind_of(name: str) -> str | None:
    ext = os.path.splitext(name)[1].lower()
    if ext in IMAGE_EXTENSIONS:
        return "images"
    if ext in NPY_EXTENSIONS:
        return "npy"
    return None


def _walk(root: str) -> Iterator[tuple[str, str | None]]:
    """Yield (POSIX path relative to root, kind or None) for every visible file, in order."""
    try:
        top = os.stat(root)
    except OSError as exc:
        raise _unreadable(root, exc) from exc
    yield from _walk_dir(root, "", frozenset({(top.st_dev, top.st_ino)}))


def _walk_dir(
    directory: str, rel: str, ancestors: frozenset[tuple[int, int]]
) -> Iterator[tuple[str, str | None]]:
    # ``ancestors`` holds the (device, inode) of every directory on the way down: a
    # symlink back to one of them would loop forever, so it is not entered. Symlinks
    # elsewhere are followed (a dataset assembled from links is a normal thing to do).
    for name, entry_type in _sorted_entries(directory):
        child_rel = f"{rel}/{name}" if rel else name
        if entry_type == _DIR:
            child = os.path.join(directory, name)
            try:
                st = os.stat(child)
            except OSError as exc:
                raise _unreadable(child, exc) from exc
            key = (st.st_dev, st.st_ino)
            if key not in ancestors:
                yield from _walk_dir(child, child_rel, ancestors | {key})
        elif entry_type == _FILE:
            yield child_rel, _kind_of(name)
        else:
            # A fifo or device named like an image would block or mislead a reader.
            yield child_rel, None


_DIR, _FILE, _OTHER = "dir", "file", "other"


def _sorted_entries(directory: str) -> Iterator[tuple[str, str]]:
    """Yield (name, _DIR | _FILE | _OTHER) for the visible entries of ``directory``, by name.

    Files and folders are interleaved by name. At most 2 * _CHUNK entries are held at
    once: each pass lists the directory and keeps the _CHUNK smallest names after the
    last one yielded, so a flat folder of a million files does not become a million
    strings in memory. No directory handle stays open while the caller works.
    """
    last: str | None = None
    while True:
        chunk: list[tuple[str, str]] = []
        dropped = False
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    name = entry.name
                    if name.startswith(".") or (last is not None and name <= last):
                        continue
                    chunk.append((name, _entry_type(entry)))
                    if len(chunk) >= 2 * _CHUNK:
                        chunk.sort()
                        del chunk[_CHUNK:]
                        dropped = True
        except OSError as exc:
            raise _unreadable(directory, exc) from exc
        chunk.sort()
        more = dropped or len(chunk) > _CHUNK
        del chunk[_CHUNK:]
        yield from chunk
        if not more:
            return
        last = chunk[-1][0]


def _entry_type(entry: os.DirEntry[str]) -> str:
    # is_dir()/is_file() follow symlinks. A broken symlink counts as a file: reading it
    # fails and makes an error row, which is better than a silent skip.
    try:
        if entry.is_dir():
            return _DIR
        if entry.is_file() or entry.is_symlink():
            return _FILE
    except OSError:
        return _FILE
    return _OTHER


def _unreadable(path: str, exc: OSError) -> DatasetError:
    reason = exc.strerror or str(exc)
    return DatasetError(
        f"Cannot read {path} ({reason}); fix its permissions or move it out of the dataset."
    )
