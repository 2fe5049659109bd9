"""What a DATASET argument names, and the dataset it opens: the one dispatch.

:data:`OPENERS` is an ordered list of (recogniser, opener) pairs: the first recogniser
that says yes to the argument (a path or a pattern, as given) opens it. A new form is one
more pair (and its own module). The forms:

- a folder (batchinfer.data.dataset);
- a list file ``.txt`` / ``.csv`` / ``.jsonl`` / ``.parquet`` (batchinfer.data.manifest);
- a COCO JSON ``.json`` (batchinfer.data.coco_source);
- an Ultralytics ``data.yaml`` (batchinfer.data.yolo_yaml);
- a glob such as ``images/**/*.jpg`` (batchinfer.data.globbing);
- WebDataset-style tar shards, ``shards/train-{000..099}.tar`` (batchinfer.data.shards);
- a video file ``.mp4`` / ``.mkv`` / ``.mov`` / ``.avi`` / ``.webm`` (batchinfer.data.video).

A folder, list or glob whose items are videos is opened as their frames too (one item per
frame: batchinfer.data.video.dataset), with the sampling and decoder of ``video``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from batchinfer.data.dataset import PROGRESS_EVERY, VIDEO_EXTENSIONS, Dataset
from batchinfer.data.folder import open_dataset
from batchinfer.data.listed import open_listed
from batchinfer.data.listing import ProgressCallback
from batchinfer.data.manifest import FORMS, list_entries, list_form
from batchinfer.data.video.dataset import VideoSettings, open_videos
from batchinfer.errors import DatasetError
from batchinfer.messages import Message, setting


@dataclass(frozen=True)
class SourceOptions:
    """What opening a dataset may need besides its name."""

    labels_file: Path | str | None = None
    #: the folder a list's (or a COCO file's) relative paths are read against
    image_root: Path | str | None = None
    progress: ProgressCallback | None = None
    progress_every: int = PROGRESS_EVERY
    #: how videos become items (None: every frame, PyAV)
    video: VideoSettings | None = None


def _root(options: SourceOptions) -> Path | None:
    if options.image_root is None:
        return None
    root = Path(os.path.abspath(Path(options.image_root).expanduser()))
    if not root.is_dir():
        raise DatasetError(f"The image root {root} is not a folder.")
    return root


def _file(spec: str) -> Path:
    return Path(os.path.abspath(spec))


def _open_folder(spec: str, o: SourceOptions) -> Dataset:
    return open_dataset(
        spec, labels_file=o.labels_file, progress=o.progress, progress_every=o.progress_every
    )


def _open_list(spec: str, o: SourceOptions) -> Dataset:
    entries = list_entries(_file(spec), _root(o))
    return open_listed(
        entries, labels_file=o.labels_file, progress=o.progress, progress_every=o.progress_every
    )


def _open_coco(spec: str, o: SourceOptions) -> Dataset:
    from batchinfer.data.coco_source import coco_entries

    return open_listed(coco_entries(_file(spec), _root(o)), labels_file=o.labels_file)


def _open_yaml(spec: str, o: SourceOptions) -> Dataset:
    from batchinfer.data.yolo_yaml import yaml_entries

    return open_listed(yaml_entries(_file(spec)), labels_file=o.labels_file)


def _open_glob(spec: str, o: SourceOptions) -> Dataset:
    from batchinfer.data.globbing import glob_entries

    return open_listed(glob_entries(spec), labels_file=o.labels_file)


def _open_shards(spec: str, o: SourceOptions) -> Dataset:
    from batchinfer.data.shards import open_shards

    return open_shards(spec, labels_file=o.labels_file, progress=o.progress)


def _is_shards(spec: str) -> bool:
    from batchinfer.data.shard_names import is_shard_spec

    return is_shard_spec(spec)


def _is_glob(spec: str) -> bool:
    from batchinfer.data.globbing import is_glob

    return is_glob(spec)


def _is_file_with(test: Callable[[str], bool]) -> Callable[[str], bool]:
    # Not only regular files: a FIFO or a device named list.csv is opened as a list, and
    # its opener says what it is (batchinfer.data.whole_file), not that it does not exist.
    return lambda spec: os.path.exists(spec) and not os.path.isdir(spec) and test(spec)


def _open_video(spec: str, o: SourceOptions) -> Dataset:
    return open_videos(None, o.video, single=str(_file(spec)))


def _is_video(spec: str) -> bool:
    return os.path.splitext(spec)[1].lower() in VIDEO_EXTENSIONS


#: (recogniser, opener), tried in order (module docstring).
OPENERS: list[tuple[Callable[[str], bool], Callable[[str, SourceOptions], Dataset]]] = [
    (os.path.isdir, _open_folder),
    (_is_shards, _open_shards),
    (_is_file_with(_is_video), _open_video),
    (_is_file_with(lambda s: list_form(s) is not None), _open_list),
    (_is_file_with(lambda s: s.lower().endswith(".json")), _open_coco),
    (_is_file_with(lambda s: s.lower().endswith((".yaml", ".yml"))), _open_yaml),
    (_is_glob, _open_glob),
]

#: The openers whose relative paths an image root moves.
_ROOTED = (_open_list, _open_coco)


def _no_image_root(spec: str, opener: Callable[[str, SourceOptions], Dataset]) -> Message:
    """An image root given with a dataset whose paths it cannot move: said, not ignored."""
    kinds: dict[Callable[[str, SourceOptions], Dataset], str] = {
        _open_folder: "a folder",
        _open_shards: "tar shards",
        _open_yaml: "a data.yaml, whose split paths start at its path: key",
        _open_glob: "a glob",
        _open_video: "a video",
    }
    what = kinds[opener]
    return (
        setting("image_root")
        + f" moves the relative paths of a list file or a COCO JSON; {spec} is {what}, so "
        "leave it out."
    )


_FORMS_TEXT = (
    f"a folder of images or .npy tensors, a list file ({', '.join(FORMS)}), a COCO .json, "
    "an Ultralytics data.yaml, a glob such as 'images/**/*.jpg', tar shards "
    "('shards/train-{000..099}.tar'), a video file or a folder of videos"
)


def open_source(
    spec: Path | str,
    *,
    labels_file: Path | str | None = None,
    image_root: Path | str | None = None,
    progress: ProgressCallback | None = None,
    progress_every: int = PROGRESS_EVERY,
    video: VideoSettings | None = None,
) -> Dataset:
    """The dataset ``spec`` names (module docstring); DatasetError (exit 2) if none.
    ``video``: how the videos of a video dataset become items (default: every frame)."""
    text = os.path.expanduser(str(spec))
    options = SourceOptions(labels_file, image_root, progress, progress_every, video)
    for recognises, opener in OPENERS:
        if recognises(text):
            if image_root is not None and opener not in _ROOTED:
                raise DatasetError(_no_image_root(text, opener))
            return frames_of_videos(opener(text, options), video)
    if os.path.isfile(text):
        raise DatasetError(
            f"The dataset {os.path.abspath(text)} is a file, not a folder nor a list of a "
            f"known form; pass {_FORMS_TEXT}."
        )
    if list_form(text) or text.lower().endswith((".json", ".yaml", ".yml")):
        raise DatasetError(
            f"The dataset {os.path.abspath(text)} does not exist; pass {_FORMS_TEXT}."
        )
    return _open_folder(text, options)  # says the folder does not exist


def frames_of_videos(dataset: Dataset, video: VideoSettings | None) -> Dataset:
    """A dataset whose items are video files, as the frames of each; any other as it is."""
    if dataset.kind != "video":
        return dataset
    return open_videos(dataset, video)


def is_folder(spec: Path | str) -> bool:
    """Whether ``spec`` names a dataset folder (what OUT must stay out of)."""
    return os.path.isdir(os.path.expanduser(str(spec)))
