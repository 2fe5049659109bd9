"""Walking a dataset folder in its fixed order: one listing per directory, compact memory.

Leftovers. Hidden names (a leading '.') and what tools leave beside data (see
:func:`leftover_kind`: ``__MACOSX/`` in every zip made on a Mac, AppleDouble ``._*``,
``.DS_Store``, ``Thumbs.db``, ``desktop.ini``, Synology's ``@eaDir``,
``.ipynb_checkpoints``) are not listed and not entered: they never become items or classes.
A walk counts them by kind when given a ``Counter``.

Order. Within a directory, the visible entries (names not starting with '.') come sorted
by name as Python compares ``str``, files and folders interleaved; a folder is walked
where its name sorts (depth first). Names come from ``os.scandir`` as ``str``; bytes that
are not valid UTF-8 arrive as lone surrogates U+DC80..U+DCFF (surrogateescape). So the
order is code-point order, which for valid UTF-8 names is also their byte order; a
non-UTF-8 byte sorts after U+D7FF and before U+E000 (byte order would put it after every
character). Either is deterministic; this one is what earlier versions produced, so item
indexes and listing hashes of existing outputs stay valid.

Cost. Each directory is listed once (one ``os.scandir`` pass, closed before anything is
yielded), so a walk is O(N log N) in time whatever the directory sizes. A directory's
entries are kept in sorted runs of ``RUN``, each packed into blocks of ``BLOCK`` entries
joined into one ``str`` (``name NUL type``, joined by '/', which no name contains), and the
runs are merged a block at a time (see ``_merge``): about (name length + 3) bytes per entry
for ASCII names, instead of ~130 bytes for a list of (name, type) tuples. Besides the
packed runs, a run being filled holds ``RUN`` strings and the merge one block per run.
"""

from __future__ import annotations

import bisect
import errno
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from batchinfer.errors import DatasetError

#: Called with the number of directory entries listed so far (see :class:`Progress`).
ProgressCallback = Callable[[int], None]

#: How many entries of one directory are sorted as one run before being packed (the
#: default of ``run``; tests pass small ones to exercise the merge on small folders).
RUN = 16384
#: Entries per packed block of a run (the unit the merge unpacks at a time; ``block``).
BLOCK = 1024

#: Entry types, one character each so a run's types pack into one str.
DIR, FILE, OTHER = "d", "f", "o"

#: Names (compared in lower case) that tools leave in folders, with the key they are
#: counted under. Matched at any depth; a folder is skipped with everything under it.
_LEFTOVER_NAMES = {
    "__macosx": "__MACOSX",  # macOS Archive Utility: resource forks of every zipped file
    "@eadir": "@eaDir",  # Synology DSM: thumbnails and metadata beside every file
    ".ipynb_checkpoints": ".ipynb_checkpoints",  # Jupyter's autosave copies
    ".ds_store": ".DS_Store",  # macOS Finder's view settings
    "thumbs.db": "Thumbs.db",  # Windows Explorer's thumbnail cache
    "desktop.ini": "desktop.ini",  # Windows Explorer's folder settings
}
#: Keys for AppleDouble files (``._name``: a Mac file's metadata on a non-Mac disk) and
#: for any other hidden name.
APPLEDOUBLE, HIDDEN = "._*", ".*"
#: The key for a link to a folder that holds it (a loop): neither entered nor yielded.
LOOP = "link back to an enclosing folder"


_LEFTOVER_FIRST = frozenset("._@tTdD")


def leftover_kind(name: str) -> str | None:
    """The key a name is skipped and counted under, or None for a name that is walked."""
    kind = _LEFTOVER_NAMES.get(name.lower())
    if kind is not None:
        return kind
    if name.startswith("._"):
        return APPLEDOUBLE
    if name.startswith("."):
        return HIDDEN
    return None


class Progress:
    """Counts listed entries and calls ``callback(count)`` every ``every`` of them.

    ``finish()`` calls it once more with the final count, so a console can show the total.
    """

    __slots__ = ("callback", "count", "every")

    def __init__(self, callback: ProgressCallback | None, every: int) -> None:
        if every < 1:
            raise ValueError(f"progress_every must be at least 1, not {every}")
        self.callback = callback
        self.every = every
        self.count = 0

    def add(self) -> None:
        self.count += 1
        if self.callback is not None and self.count % self.every == 0:
            self.callback(self.count)

    def finish(self) -> None:
        if self.callback is not None:
            self.callback(self.count)


@dataclass(frozen=True)
class Listing:
    """How a walk lists its folders (one object, as :func:`walk` hands it to each folder's
    :func:`sorted_entries`).

    ``progress`` hears of every visible entry listed; ``leftovers`` counts leftovers by kind
    (and, in a walk, links back to an enclosing folder as ``LOOP``). ``run``: entries sorted
    as one run before being packed; ``block``: entries per packed block (see the module's
    "Cost"; tests pass small ones to exercise the merge on small folders).
    """

    progress: Progress | None = None
    leftovers: Counter[str] | None = None
    run: int = RUN
    block: int = BLOCK

    def __post_init__(self) -> None:
        if self.run < 1 or self.block < 1:
            raise ValueError(f"run ({self.run}) and block ({self.block}) must be at least 1")


def walk(root: str, listing: Listing | None = None) -> Iterator[tuple[str, str]]:
    """Yield (POSIX path relative to root, DIR | FILE | OTHER) for every visible entry.

    A folder is yielded just before its contents. Leftovers (see :func:`leftover_kind`)
    and links back to an enclosing folder (``LOOP``) are not yielded nor entered;
    ``listing.leftovers`` counts them by kind. Raises DatasetError for a folder that
    cannot be listed.
    """
    listing = listing or Listing()
    try:
        top = os.stat(root)
    except OSError as exc:
        raise unreadable(root, exc) from exc
    # The folders on the way down, each with the rest of its listing, on a stack of our
    # own: a dataset may nest deeper than Python's recursion limit (~1,000 levels).
    # ``ancestors`` holds the (device, inode) of every one of them: a symlink back to one
    # would loop forever, so it is neither entered nor yielded. Symlinks elsewhere are
    # followed (a dataset assembled from links is a normal thing to do).
    root_key = (top.st_dev, top.st_ino)
    ancestors = {root_key}
    stack = [(root, "", root_key, sorted_entries(root, listing))]
    while stack:
        directory, rel, key, entries = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            ancestors.discard(key)
            continue
        name, entry_type = entry
        child_rel = f"{rel}/{name}" if rel else name
        if entry_type != DIR:
            yield child_rel, entry_type
            continue
        child = os.path.join(directory, name)
        try:
            st = os.stat(child)
        except OSError as exc:
            raise unreadable(child, exc) from exc
        child_key = (st.st_dev, st.st_ino)
        if child_key in ancestors:
            # Not yielded either: a link back to the root listed as a folder became a
            # class, shifting every other class's label by one.
            if listing.leftovers is not None:
                listing.leftovers[LOOP] += 1
            continue
        yield child_rel, entry_type
        ancestors.add(child_key)
        entries = sorted_entries(child, listing)
        stack.append((child, child_rel, child_key, entries))


def sorted_entries(directory: str, listing: Listing | None = None) -> Iterator[tuple[str, str]]:
    """Yield (name, DIR | FILE | OTHER) for the visible entries of ``directory``, by name.

    Leftovers are left out (counted in ``listing.leftovers`` when given). The directory is
    listed once and closed before the first entry is yielded.
    """
    listing = listing or Listing()
    # Locals: the loop below runs once per entry (millions in a big folder).
    progress, leftovers = listing.progress, listing.leftovers
    run, block = listing.run, listing.block
    runs: list[list[str]] = []
    batch: list[str] = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                name = entry.name
                # One cheap test for the usual name: leftovers start with '.', '_', '@',
                # 't' or 'd' (any case).
                if name[0] in _LEFTOVER_FIRST and (kind := leftover_kind(name)) is not None:
                    if leftovers is not None:
                        leftovers[kind] += 1
                    continue
                # "name\0type": NUL is below every character a name can hold, so these
                # strings sort exactly as the names do, and no tuples are needed.
                batch.append(f"{name}\0{_entry_type(entry)}")
                if progress is not None:
                    progress.add()
                if len(batch) == run:
                    runs.append(_pack(batch, block))
                    batch = []
    except OSError as exc:
        raise unreadable(directory, exc) from exc
    if runs:
        if batch:
            runs.append(_pack(batch, block))
        del batch
        ordered: Iterable[str] = _merge(runs)
    else:  # the usual directory: one sort, nothing packed
        batch.sort()
        ordered = batch
    for item in ordered:
        yield item[:-2], item[-1]


def _pack(batch: list[str], block: int) -> list[str]:
    """A sorted run as blocks of ``block`` entries, each block one '/'-joined str."""
    batch.sort()
    return ["/".join(batch[i : i + block]) for i in range(0, len(batch), block)]


def _merge(runs: list[list[str]]) -> Iterator[str]:
    """Merge sorted runs of packed blocks, a block's worth at a time, sorting in C.

    Each round takes, from every run's current block, the entries up to the smallest of
    the blocks' last entries (``bound``): nothing left unread in any run can be smaller,
    so those entries, sorted (timsort merges sorted pieces in about linear time), come
    next. At least one block is used up per round.
    """
    blocks = [iter(run) for run in runs]
    current = [next(it).split("/") for it in blocks]
    starts = [0] * len(runs)
    while current:
        bound = min(block[-1] for block in current)
        out: list[str] = []
        for i, block in enumerate(current):
            cut = bisect.bisect_right(block, bound, starts[i])
            out.extend(block[starts[i] : cut])
            starts[i] = cut
        out.sort()
        yield from out
        for i in reversed(range(len(current))):
            if starts[i] == len(current[i]):
                following = next(blocks[i], None)
                if following is None:
                    del current[i], starts[i], blocks[i]
                else:
                    current[i], starts[i] = following.split("/"), 0


def _entry_type(entry: os.DirEntry[str]) -> str:
    # is_dir()/is_file() follow symlinks. A broken symlink counts as a file: reading it
    # fails and makes an error row, which is better than a silent skip.
    try:
        if entry.is_file():  # first: most entries are files
            return FILE
        if entry.is_dir():
            return DIR
        if entry.is_symlink():
            return FILE
    except OSError:
        return FILE
    return OTHER


#: A path longer than this is shown by its start and end (a message stays one line).
_PATH_SHOWN = 160


def unreadable(path: str, exc: OSError) -> DatasetError:
    """The DatasetError for a folder that cannot be listed or entered: what is wrong (by
    the error's errno), and what to do about it."""
    reason = exc.strerror or str(exc)
    shown = path
    if len(path) > _PATH_SHOWN:
        shown = f"{path[:80]}...{path[-60:]} ({path.count(os.sep)} folders deep)"
    if exc.errno == errno.ENAMETOOLONG:
        return DatasetError(
            f"Cannot read {shown}: its path is longer than the system allows ({reason}), "
            "since its folders nest too deep; move them out of the dataset or flatten them."
        )
    if exc.errno == errno.ENOENT:
        return DatasetError(
            f"Cannot read {shown}: it disappeared while the dataset was being listed "
            f"({reason}); a dataset must not change while it is read (and /proc or /sys, "
            "whose entries come and go, are not datasets)."
        )
    if exc.errno == errno.ELOOP:
        return DatasetError(
            f"Cannot read {shown}: its symbolic links loop ({reason}); fix or remove them."
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return DatasetError(
            f"Cannot read {shown} ({reason}); fix its permissions or move it out of the dataset."
        )
    return DatasetError(f"Cannot read {shown} ({reason}); fix it or move it out of the dataset.")
