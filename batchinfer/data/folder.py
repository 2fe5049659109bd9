"""Opening a dataset folder (or tar shards, by name): :func:`open_dataset` lists it once to
count its items, find the classes and note what it skips; the :class:`Dataset` it returns
walks it again for each iteration (data/dataset.py).
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from pathlib import Path

from batchinfer.data import shards
from batchinfer.data.classes import ClassMap, class_map_from_folders, read_labels_file
from batchinfer.data.dataset import (
    KINDS,
    PROGRESS_EVERY,
    SKIPPED_NAMES_KEPT,
    Dataset,
    Skipped,
    display_name,
    kind_of,
    skip_key,
)
from batchinfer.data.listing import DIR, Listing, Progress, ProgressCallback, walk
from batchinfer.data.shard_names import is_shard_spec
from batchinfer.errors import DatasetError

_WHAT = (
    "a folder of images (.jpg, .png, ...), of .npy tensors, of .npz files (one array per "
    "model input) or of videos (.mp4, .mkv, ...), optionally one subfolder per class"
)


def open_dataset(
    root: Path | str,
    *,
    labels_file: Path | str | None = None,
    progress: ProgressCallback | None = None,
    progress_every: int = PROGRESS_EVERY,
) -> Dataset:
    """Return the Dataset at ``root`` after one listing; DatasetError if it is unusable.

    Kind: images (any of IMAGE_EXTENSIONS, any case), ``.npy`` or ``.npz``; a folder holding
    more than one kind is refused. Other files are skipped and counted
    (:attr:`Dataset.skipped`); hidden files and folders (leading '.') and what tools leave
    behind (``__MACOSX``, ``Thumbs.db``, ...) are neither walked nor items nor classes, and
    are counted (:attr:`Dataset.leftovers`).

    Labels: when items sit in the root's subfolders, every visible top-level folder is a
    class, empty or not (see :mod:`batchinfer.data.classes`), and items directly in the
    root have no label. ``labels_file`` gives the class map instead (formats: see
    :func:`~batchinfer.data.classes.read_labels_file`); a folder holding items that the
    file does not name is refused, since its items could only get no label or a wrong one.

    ``progress(count)`` is called with the number of entries listed so far every
    ``progress_every`` entries and once at the end.

    A ``root`` ending in ``.tar`` names WebDataset-style tar shards instead (braces
    allowed: ``shards/train-{000..099}.tar``); see :mod:`batchinfer.data.shards`.
    """
    if is_shard_spec(root):
        return shards.open_shards(root, labels_file=labels_file, progress=progress)
    path = Path(os.path.abspath(root))
    if not path.exists():
        raise DatasetError(f"The dataset folder {path} does not exist; pass {_WHAT}.")
    if not path.is_dir():
        raise DatasetError(f"The dataset {path} is a file, not a folder; pass {_WHAT}.")
    given_map = None if labels_file is None else read_labels_file(labels_file)

    counts = dict.fromkeys(KINDS, 0)
    listings = {kind: hashlib.sha256() for kind in KINDS}
    # Top-level folders (few, so sets are fine): all of them, and those holding items.
    folders: set[str] = set()
    folders_with_items: dict[str, set[str]] = {kind: set() for kind in KINDS}
    skipped_extensions: Counter[str] = Counter()
    skipped_first: list[str] = []
    leftovers: Counter[str] = Counter()
    counter = Progress(progress, progress_every)
    # Names wait in batches to be hashed: one encode and one update per batch, not per name.
    pending: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for rel, entry_type in walk(str(path), Listing(counter, leftovers)):
        if entry_type == DIR:
            if "/" not in rel:
                folders.add(rel)
            continue
        kind = kind_of(rel, entry_type)
        if kind is None:
            skipped_extensions[skip_key(rel, entry_type)] += 1
            if len(skipped_first) < SKIPPED_NAMES_KEPT:
                skipped_first.append(display_name(rel)[0])
            continue
        counts[kind] += 1
        batch = pending[kind]
        batch.append(rel)
        if len(batch) == 4096:
            _hash_names(listings[kind], batch)
        if "/" in rel:
            folders_with_items[kind].add(rel[: rel.index("/")])
    for kind, batch in pending.items():
        _hash_names(listings[kind], batch)
    counter.finish()
    skipped = Skipped(
        count=sum(skipped_extensions.values()),
        by_extension=dict(skipped_extensions),
        first=tuple(skipped_first),
    )

    present = [kind for kind in KINDS if counts[kind]]
    if len(present) > 1:
        mixed = " and ".join(f"{counts[k]} {_KIND_WORDS[k]}" for k in present)
        raise DatasetError(
            f"The dataset folder {path} mixes {mixed}; keep one kind of item per dataset folder."
        )
    kind = present[0] if present else "images"
    if not counts[kind]:
        others = f" (only {skipped.count} other files)" if skipped.count else ""
        raise DatasetError(f"The dataset folder {path} holds no items{others}; it must be {_WHAT}.")
    if given_map is not None:
        _check_covered(given_map, folders_with_items[kind], path)
        class_map = given_map
    else:
        class_map = class_map_from_folders(folders if folders_with_items[kind] else (), path)
    return Dataset(
        root=path,
        kind=kind,
        class_map=class_map,
        count=counts[kind],
        skipped=skipped,
        listing_sha256=listings[kind].hexdigest(),
        leftovers=dict(leftovers),
    )


def _check_covered(class_map: ClassMap, folders: set[str], root: Path) -> None:
    missing = sorted(folders - class_map.labels.keys())
    if missing:
        shown = ", ".join(repr(display_name(name)[0]) for name in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise DatasetError(
            f"{len(missing)} class folder(s) of {root} hold items but are not in the labels "
            f"file {class_map.file}: {shown}{more}; add them to the file or move them out "
            "of the dataset."
        )


def _hash_names(listing: hashlib._Hash, names: list[str]) -> None:
    """Add each name's bytes and a NUL to ``listing``, then empty ``names``."""
    if names:
        names.append("")  # a NUL after the last name too
        listing.update(os.fsencode("\0".join(names)))
        names.clear()


_KIND_WORDS = {"images": "images", "npy": ".npy tensors", "npz": ".npz files", "video": "videos"}
