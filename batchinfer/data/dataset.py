"""Dataset folders, walked as a stream: the coordinator never holds a list of every path.

A dataset is a folder of images, of ``.npy`` tensors or of ``.npz`` files (one array per
model input), searched recursively. Its order is fixed by the names alone (see
:mod:`batchinfer.data.listing`), so a run and its ``--resume`` agree on every item's index.
``open_dataset`` (data/folder.py) lists the folder once to count items, find the classes
and note skipped files; each iteration lists it again and yields items one at a time. Each
directory is listed once per walk, in time linear in its size.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from batchinfer.data.classes import (
    ClassMap,
    label_rule,
    odd_folder_names,
)
from batchinfer.data.listing import DIR, FILE, LOOP, walk

#: File extensions (compared in lower case) read as images. Chosen, not every extension
#: Pillow registers: single raster pictures (or the first frame of an animation or
#: multi-page TIFF) that Pillow decodes with its own codecs. Left out on purpose: formats
#: Pillow only writes (.pdf, .palm), documents and vector art (.eps, .ps, .wmf, .emf),
#: video and animation containers (.mpg, .fli, .flc), multi-page fax (.dcx), layered or
#: scientific files (.psd, .fits, .h5, .grib, .bufr), texture/icon/cursor/brush formats
#: (.dds, .blp, .ftc, .icns, .cur, .gbr), X bitmaps that are C source (.xbm, .xpm), the
#: float map .pfm, and extensions that usually mean raw dumps elsewhere (.rgb, .raw).
#: HEIC is not here: Pillow cannot read it without a plugin, so such files are skipped
#: and counted (see Dataset.skipped).
IMAGE_EXTENSIONS = frozenset(
    {
        # JPEG, and the names cameras, scanners and browsers give it
        ".jpg",
        ".jpeg",
        ".jpe",
        ".jfif",
        ".png",
        ".apng",
        ".gif",
        ".bmp",
        ".dib",
        ".tif",
        ".tiff",
        ".webp",
        ".avif",  # read by Pillow >= 11.3 wheels; older builds give an error row
        # Netpbm (scanner and image-processing tools' output)
        ".ppm",
        ".pgm",
        ".pbm",
        ".pnm",
        ".tga",
        ".ico",
        # JPEG 2000 (archives, scanners, medical imaging)
        ".jp2",
        ".j2k",
        ".j2c",
        ".jpc",
        ".jpf",
        ".jpx",
        ".qoi",
        ".pcx",
        ".sgi",
        ".ras",
    }
)
log = logging.getLogger("batchinfer")

NPY_EXTENSIONS = frozenset({".npy"})
#: ``.npz`` items hold one array per model input, named after it (batchinfer.data.feeds).
NPZ_EXTENSIONS = frozenset({".npz"})
#: Video files (batchinfer.data.video): a folder, list or glob of them is opened as the
#: frames of each (batchinfer.data.sources wraps it in a VideoDataset).
VIDEO_EXTENSIONS = frozenset({".mp4", ".mkv", ".mov", ".avi", ".webm"})
KINDS = ("images", "npy", "npz", "video")

#: How many skipped files are named in :attr:`Skipped.first`.
SKIPPED_NAMES_KEPT = 10
#: The key of :attr:`Skipped.by_extension` for FIFOs, sockets and devices.
NOT_A_FILE = "(not a regular file)"
#: Default for open_dataset's ``progress_every``.
PROGRESS_EVERY = 10_000


class Locator(Protocol):
    """Where an item is inside the file at ``Item.path``: a tar shard's :class:`Member`, a
    video's frame (data/video/dataset.py VideoFrame). The data layer's loader reads the item
    by it (data/preprocess.py load_into); the engine carries it to a reader unopened and
    asks it nothing but its ``group``."""

    @property
    def group(self) -> Hashable | None:
        """Items of one group are read by one reader, in order (a video's keyframe range,
        decoded once); None: any reader may read the item."""


@dataclass(frozen=True)
class Member:
    """Where an item's bytes are inside the tar shard at ``Item.path`` (data/shards.py
    lists shards; defined here, with the Item that carries it): a :class:`Locator`."""

    offset: int  # of the member's data, in bytes from the start of the shard
    size: int
    name: str  # the member's name in the shard (valid UTF-8), for messages
    #: Why the item cannot be read (a corrupt header, a truncated shard), found when the
    #: shard was listed; its row is this error.
    fault: str | None = None

    @property
    def group(self) -> None:
        """A shard's members are read by any reader (each keeps its last shard open)."""
        return None


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
    # Where the item is inside the file at ``path`` (a tar shard's Member, a video's
    # VideoFrame: a Locator); None for an item that is a file of its own.
    member: Locator | None = None
    # A list's other columns for this item (JSON-able values), carried into the
    # predictions' ``meta`` column; None for a folder's items (batchinfer.data.listed).
    # Model inputs may be fed from them (``--input NAME=COLUMN``, batchinfer.data.feeds).
    columns: Mapping[str, object] | None = None

    @property
    def group(self) -> Hashable | None:
        """Items of one group are read by one reader, in order (Locator.group)."""
        member = self.member
        return None if member is None else member.group

    @property
    def key(self) -> bytes:
        """The exact relative path as bytes: what output rows are matched by."""
        return self.id_bytes if self.id_bytes is not None else self.id.encode("utf-8")


@dataclass(frozen=True)
class Skipped:
    """Files under the dataset root that are not items (leftovers, hidden entries
    included, are counted in :attr:`Dataset.leftovers` instead)."""

    count: int = 0
    #: lower-case extension ("" for none, NOT_A_FILE for FIFOs and devices) -> count
    by_extension: dict[str, int] = field(default_factory=dict, hash=False)
    #: ids (as Item.id shows them) of the first SKIPPED_NAMES_KEPT, in dataset order
    first: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        """A JSON-ready record: count, per-extension counts (most first), first names."""
        ranked = sorted(self.by_extension.items(), key=lambda kv: (-kv[1], kv[0]))
        return {"count": self.count, "by_extension": dict(ranked), "first": list(self.first)}


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
    """A dataset folder: its kind, class map and size, and a stream of its Items.

    Holds no paths: ``len()`` was counted when it was opened and ``iter()`` walks the
    folder again. Picklable (it is only a few small fields), so it can go to a process.
    """

    #: How the dataset was given ("folder"; lists: batchinfer.data.listed).
    form = "folder"
    #: The Arrow struct type of the items' ``columns`` (the predictions' ``meta`` column),
    #: None when items carry none.
    meta_type = None
    #: Whether a run's fingerprint covers each item file's size and time (``resume_check``
    #: "stat"): a folder's listing names its files only. A list file's fingerprint is its
    #: content hash and row count (batchinfer.data.listed): a pass over a million files
    #: before the first row would cost more than it guards.
    stat_files = True

    def __init__(
        self,
        root: Path,
        kind: str,
        class_map: ClassMap,
        count: int,
        skipped: Skipped,
        listing_sha256: str = "",
        leftovers: dict[str, int] | None = None,
    ) -> None:
        self.root = root
        self.kind = kind
        #: the labels used, with where they came from (folders or a labels file)
        self.class_map = class_map
        #: files under root that are not items, by extension, with the first few names
        self.skipped = skipped
        #: sha256 over every item's relative path, in order: the dataset's listing, which
        #: a --resume must find unchanged
        self.listing_sha256 = listing_sha256
        #: entries tools leave behind (``__MACOSX``, ``._*``, ``.DS_Store``, hidden names),
        #: by kind, most first: never walked, never items or classes (a skipped folder
        #: counts once, its contents not at all)
        self.leftovers = dict(sorted((leftovers or {}).items(), key=lambda kv: (-kv[1], kv[0])))
        self._count = count

    @property
    def light_reads(self) -> bool:
        """Whether reading an item is a plain copy into its slot (a .npy or .npz tensor,
        no decode), never what the cores wait for: the engine's readers then yield to the
        core workers from the start (engine/sources.py, ItemSource.light_reads)."""
        return self.kind in ("npy", "npz")

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names in label order (empty for a dataset without class folders)."""
        return self.class_map.names

    @property
    def labels(self) -> dict[str, int]:
        """Class folder name -> label."""
        return self.class_map.labels

    @property
    def ignored(self) -> int:
        """How many files were skipped (``skipped.count``)."""
        return self.skipped.count

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return (
            f"Dataset(root={str(self.root)!r}, kind={self.kind!r}, items={self._count}, "
            f"classes={len(self.classes)}, skipped={self.skipped.count})"
        )

    @property
    def label_rule(self) -> str | None:
        """How labels were assigned, in words; None for a dataset without classes."""
        return label_rule(self.class_map) if self.class_map.labels else None

    def check_found(self) -> None:
        """DatasetError when the dataset's files are plainly read against the wrong folder
        (a list's, batchinfer.data.found); a folder's files were found by listing it."""

    def notes(self) -> tuple[list[str], list[str]]:
        """(lines to say once per run, warnings) about how this dataset was read."""
        lines, warnings = [], []
        if self.label_rule is not None:
            lines.append(f"labels: {self.label_rule} ({len(self.classes)} classes)")
        left = {kind: n for kind, n in self.leftovers.items() if kind != LOOP}
        if left:
            kinds = ", ".join(f"{kind} {n}" for kind, n in left.items())
            lines.append(f"skipped what other tools leave behind (never items or classes): {kinds}")
        if self.leftovers.get(LOOP):
            warnings.append(
                f"{self.leftovers[LOOP]} folder link(s) in {self.root} lead back to a folder "
                "holding them (a loop); they are neither read nor classes: remove them."
            )
        odd = odd_folder_names(self.class_map)
        if odd:
            shown = ", ".join(repr(display_name(name)[0]) for name in odd[:5])
            more = f" and {len(odd) - 5} more" if len(odd) > 5 else ""
            warnings.append(
                f"the class folders of {self.root} mix integer names with other names "
                f"({shown}{more} stand out), so labels are positions among the sorted names "
                "and a folder's number is not its label; rename or remove those folders, "
                "or pass a labels file."
            )
        return lines, warnings

    def manifest_json(self) -> dict[str, object]:
        """What a run's manifest records about its dataset."""
        return {
            "root": str(self.root),
            "kind": self.kind,
            "items": self._count,
            "listing_sha256": self.listing_sha256,
            "classes": self.class_map.to_json(),
            "label_rule": self.label_rule,
            "skipped": self.skipped.to_json(),
            "leftovers": self.leftovers,
            "warnings": self.notes()[1],
        }

    def __iter__(self) -> Iterator[Item]:
        return self.iter_from()

    @property
    def location(self) -> str:
        """What the dataset was opened from (the folder; a list's file), for fingerprints."""
        return str(self.root)

    def paths_of(self, ids: Collection[str]) -> dict[str, str]:
        """Item id -> its file's path, for a few items (eval's pictures of the worst)."""
        return {i: str(self.root / i) for i in ids}

    def item_files(self) -> Iterator[tuple[bytes, str | None]]:
        """(Item.key, its file's path relative to :attr:`root` or absolute, None for an item
        with no file) for every item in order: what the files' fingerprint reads."""
        for rel in self.item_paths():
            yield os.fsencode(rel), rel

    def item_paths(self) -> Iterator[str]:
        """Every item's path relative to the root (``/``-separated), in the order of
        :meth:`iter_from`, without building Items (what a pass over the files needs)."""
        for rel, entry_type in walk(str(self.root)):
            if entry_type != DIR and kind_of(rel, entry_type) == self.kind:
                yield rel

    def iter_from(self, skip: Callable[[bytes], bool] | None = None) -> Iterator[Item]:
        """Yield the Items in order, leaving out those whose key ``skip`` says to skip.

        ``skip`` gets an item's exact relative path as bytes (:attr:`Item.key`). Indexes
        are those of the full dataset, so a resumed run keeps them; a resume checks that
        the listing has not changed (``listing_sha256``).
        """
        root = str(self.root)
        labels = self.labels
        index = 0
        for rel, entry_type in walk(root):
            if entry_type == DIR or kind_of(rel, entry_type) != self.kind:
                continue
            if skip is None or not skip(os.fsencode(rel)):
                label_name = rel.split("/", 1)[0] if "/" in rel and labels else None
                id_text, id_bytes = display_name(rel)
                yield Item(
                    index=index,
                    path=os.path.join(root, *rel.split("/")),
                    id=id_text,
                    label=None if label_name is None else labels.get(label_name),
                    label_name=None if label_name is None else display_name(label_name)[0],
                    id_bytes=id_bytes,
                )
            index += 1


def say_notes(dataset: Dataset, *, labels: bool = True) -> None:
    """Log :meth:`Dataset.notes` (the CLI shows them): once per run, when it starts.

    ``labels=False`` leaves out what concerns the folders' labels (for a caller that maps
    the classes itself).
    """
    lines, warnings = dataset.notes()
    for line in lines:
        if labels or not line.startswith("labels: "):
            log.info(line)
    for warning in warnings if labels else ():
        log.warning(warning)


_KIND_BY_EXTENSION = {
    **dict.fromkeys(IMAGE_EXTENSIONS, "images"),
    **dict.fromkeys(NPY_EXTENSIONS, "npy"),
    **dict.fromkeys(NPZ_EXTENSIONS, "npz"),
    **dict.fromkeys(VIDEO_EXTENSIONS, "video"),
}


def _extension(rel: str) -> str:
    """The lower-case extension of the last name in ``rel`` ("" for none).

    What os.path.splitext gives, for the names a walk yields (never starting with '.').
    """
    dot = rel.rfind(".")
    return rel[dot:].lower() if dot > rel.rfind("/") else ""


def kind_of(rel: str, entry_type: str) -> str | None:
    """The kind of item a walked entry is ("images", "npy", "npz", "video"), or None."""
    if entry_type != FILE:
        return None  # a FIFO or device named like an image would block or mislead a reader
    return _KIND_BY_EXTENSION.get(_extension(rel))


def skip_key(rel: str, entry_type: str) -> str:
    """The :attr:`Skipped.by_extension` key a skipped entry is counted under."""
    if entry_type != FILE:
        return NOT_A_FILE
    return display_name(_extension(rel))[0]
