"""``export draw``: a run's items drawn with their results into a folder of images.

    from batchinfer.export_draw import export_draw
    done = export_draw("runs/digits", "drawn", conf=0.25)

Each successful item's image is read from where the run read it (the dataset the manifest
records, reopened; a tar shard's member by one read of its bytes), within the run's bounds
(``preprocess.max_pixels``, ``preprocess.max_item_bytes``), made upright as the run saw it,
and drawn by :mod:`batchinfer.draw`: a row's ``boxes`` (with whatever masks, keypoints or
rotated boxes they hold) scoring at least ``conf``; a row with a ``pred`` (classification)
gets its top-1 class and score as a caption. Items whose row is an error are skipped and
counted, as are items whose image cannot be read now. A run over videos is drawn into
one video file per video instead (:mod:`batchinfer.export_video`: every frame at the
source's rate, the frames the run did not infer written undrawn).

Files are named after the item's id made filesystem-safe (``clips/a.jpg`` ->
``clips_a.png``), with ``-<index>`` added where two ids would give one name. The folder
must be empty or new; with ``overwrite`` the files an earlier ``export draw`` wrote there
(listed with their SHA-256 in its record file, :data:`RECORD`) are deleted first, and
nothing else is: not a file the user has since replaced (its bytes differ from what was
written), and a name held by a file it did not write gets ``-<index>`` too.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchinfer.errors import DatasetError, RunFailedError, UsageError
from batchinfer.export_video import is_video_run
from batchinfer.results import read_run
from batchinfer.sink.atomic import write_bytes_atomically

if TYPE_CHECKING:
    from batchinfer.tasks import Task

#: The record of the files ``export draw`` wrote in a folder: one ``<sha256> <name>`` a line.
RECORD = ".batchinfer-drawn.txt"
FORMATS = {"png": "PNG", "jpg": "JPEG"}
#: Images smaller than this on their long side are enlarged (whole times) before drawing.
MIN_SIDE = 256
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_STEM = 150  # far below any filesystem's 255-byte name limit, with room for -index


@dataclass(frozen=True)
class DrawExport:
    """What :func:`export_draw` did."""

    folder: Path
    written: list[str]  # file names, in item order
    error_rows: int  # items skipped: their row is an error
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (id, why not)
    deleted: int = 0  # files of an earlier export draw removed (overwrite)
    #: A run over videos: the video files written (``written`` names them too).
    videos: list[Any] = field(default_factory=list)  # export_video.VideoWritten


def safe_name(item_id: str) -> str:
    """A file name stem for an item id: its extension dropped, every run of characters
    other than letters, digits, ``.``, ``_`` and ``-`` one ``_``, no leading dot."""
    stem = item_id.rsplit(".", 1)[0] if "." in item_id.rsplit("/", 1)[-1] else item_id
    stem = _UNSAFE.sub("_", stem).strip("._") or "item"
    return stem[:_MAX_STEM]


def _read_record(folder: Path) -> list[tuple[str, str]]:
    """(sha256, name) of each file the record lists."""
    try:
        lines = (folder / RECORD).read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):
        return []
    return [(line[:64], line[65:]) for line in lines if len(line) > 65 and line[64] == " "]


def _ours(path: Path, sha256: str) -> bool:
    """Whether ``path`` is a plain file holding what export draw wrote there."""
    if path.is_symlink() or not path.is_file():
        return False
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest() == sha256


def _check_folder(folder: Path, overwrite: bool) -> None:
    """UsageError unless ``folder`` is new, empty, or given with ``overwrite``."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} is a file, not a folder; give --out a folder to draw into.")
    if folder.exists() and os.listdir(folder) and not overwrite:
        raise UsageError(
            f"The folder {folder} is not empty; give an empty or new folder, or --overwrite "
            "to replace the images an earlier export draw wrote there (nothing else is deleted)."
        )


def _prepare(folder: Path) -> int:
    """Make the folder (checked by :func:`_check_folder`) ready: the number of files of an
    earlier export draw deleted."""
    folder.mkdir(parents=True, exist_ok=True)
    deleted = 0
    for sha256, name in _read_record(folder):
        # only a file directly in the folder (a record naming ../x deletes nothing), and
        # only if it still holds what was written
        if Path(name).name == name and name not in ("", ".", "..") and _ours(folder / name, sha256):
            (folder / name).unlink()
            deleted += 1
    (folder / RECORD).unlink(missing_ok=True)
    return deleted


def _dataset_places(manifest: Mapping[str, Any], ids: list[str]) -> dict[str, Any]:
    """Where the run read each of ``ids``: :func:`~batchinfer.evaluate.evaluation.item_places`
    on the dataset the manifest records, reopened."""
    from batchinfer.data.sources import open_source
    from batchinfer.evaluate.evaluation import item_places

    recorded = manifest.get("dataset") or {}
    config = manifest.get("config") or {}
    spec = recorded.get("source") or recorded.get("root")
    if not spec:
        raise UsageError("The run's manifest records no dataset; its images cannot be found.")
    root = recorded.get("root") if config.get("image_root") else None
    try:
        dataset = open_source(spec, image_root=root)
    except DatasetError as exc:
        raise DatasetError(f"The run's dataset cannot be opened now: {exc}") from None
    return item_places(dataset, ids)


def _caption(row: Mapping[str, Any], names: list[str]) -> str | None:
    """A classification row's top-1: its class (name) and score."""
    if row.get("pred") is None:
        return None
    pred = int(row["pred"])
    name = names[pred] if 0 <= pred < len(names) else str(pred)
    scores = row.get("topk_score") or []
    return f"{name} {scores[0]:.2f}" if scores else name


def _rows(run: Any, ids: Collection[str] | None) -> tuple[list[dict[str, Any]], str]:
    """The prediction rows to draw, and which result column they carry."""
    for wanted, what in ((["boxes"], "boxes"), (["pred", "topk_score"], "pred")):
        try:
            table = run.predictions(["index", "id", "error", *wanted])
        except RunFailedError:
            continue
        rows = sorted(table.to_pylist(), key=lambda r: r["index"])
        if ids is not None:
            wanted_ids = set(ids)
            rows = [r for r in rows if r["id"] in wanted_ids]
            unknown = sorted(wanted_ids - {r["id"] for r in rows})
            if unknown:
                raise UsageError(
                    f"{len(unknown)} of the ids given name no item of the run {run.path} "
                    f"(first: {unknown[0]!r}); give ids as the id column has them."
                )
        return rows, what
    raise UsageError(
        f"The run {run.path} has no results to draw (no boxes nor pred column: a run of "
        "--task raw); draw a classification or detection run."
    )


def export_draw(
    run_dir: Path | str,
    out: Path | str,
    *,
    conf: float = 0.25,
    limit: int | None = None,
    ids: Collection[str] | None = None,
    overwrite: bool = False,
    image_format: str = "png",
    max_boxes: int = 100,
) -> DrawExport:
    """Draw the run in ``run_dir`` into the folder ``out`` (module docstring): at most
    ``limit`` items (in dataset order), only ``ids`` when given. UsageError for a folder
    that is not empty (without ``overwrite``) or a run with nothing to draw."""
    from batchinfer.data.input_spec import item_bytes_for
    from batchinfer.evaluate.thumbnails import open_item, picture_source
    from batchinfer.tasks import task_from_record

    if image_format not in FORMATS:
        raise UsageError(f"Unknown image format {image_format!r}; use one of {sorted(FORMATS)}.")
    if limit is not None and limit < 0:
        raise UsageError(f"--limit must be 0 or more, not {limit}.")
    run = read_run(run_dir)
    rows, _ = _rows(run, ids)
    error_rows = sum(1 for r in rows if r.get("error") is not None)
    todo = [r for r in rows if r.get("error") is None][:limit]
    folder = Path(out)
    _check_folder(folder, overwrite)
    manifest = run.manifest.raw
    preprocess = (manifest.get("config") or {}).get("preprocess") or {}
    max_pixels = preprocess.get("max_pixels")
    max_pixels = max_pixels if isinstance(max_pixels, int) else None
    max_bytes = preprocess.get("max_item_bytes", "auto")
    max_bytes = item_bytes_for(max_pixels) if max_bytes == "auto" else max_bytes
    max_bytes = max_bytes if isinstance(max_bytes, int) else None
    upright = bool(preprocess.get("exif_orientation", True))
    task = task_from_record(manifest.get("task") or {})  # it draws its rows (Task.draw)
    names = list((manifest.get("task") or {}).get("names") or [])
    names = names or list(((manifest.get("dataset") or {}).get("classes") or {}).get("names", []))
    if is_video_run(manifest):  # each video rendered back into a video file
        return _export_videos(folder, todo, manifest, error_rows, task, conf, max_boxes, names)
    places = _dataset_places(manifest, [r["id"] for r in todo]) if todo else {}
    deleted = _prepare(folder)  # only once the images can be found: a failure deletes nothing
    taken = {name.lower() for name in os.listdir(folder)}
    written: list[str] = []
    unreadable: list[tuple[str, str]] = []
    suffix = "." + image_format
    with open(folder / RECORD, "a", encoding="utf-8") as record:
        for row in todo:
            place = places.get(row["id"])
            if place is None:
                unreadable.append((row["id"], "not in the dataset now"))
                continue
            image, note = open_item(picture_source(place), max_pixels, max_bytes, upright)
            if image is None:
                unreadable.append((row["id"], note or "unreadable"))
                continue
            drawn = _drawn(image, row, task, names, conf, max_boxes)
            name = _unique(safe_name(str(row["id"])), int(row["index"]), suffix, taken)
            buf = io.BytesIO()
            drawn.save(buf, format=FORMATS[image_format], **_save_options(image_format))
            # recorded before the file exists: a crash leaves at most a name with no file,
            # never a file of ours that a later --overwrite would not know to delete
            data = buf.getvalue()
            record.write(f"{hashlib.sha256(data).hexdigest()} {name}\n")
            record.flush()
            write_bytes_atomically(data, folder / name)
            written.append(name)
    return DrawExport(folder, written, error_rows, unreadable, deleted)


def _drawn(
    image: Any,
    row: Mapping[str, Any] | None,
    task: Task,
    names: list[str],
    conf: float,
    max_boxes: int,
) -> Any:
    """``image`` (PIL) with ``row``'s result drawn by the run's task (Task.draw; None: only
    enlarged, as a video frame the run did not infer)."""
    from PIL import Image

    from batchinfer.draw import as_image

    image = as_image(image)
    # a small image is enlarged (whole times, pixels kept sharp) so labels can be read
    scale = max(1, -(-MIN_SIDE // max(image.size)))
    if scale > 1:
        size = (image.width * scale, image.height * scale)
        image = image.resize(size, Image.Resampling.NEAREST)
    if row is None:
        return image
    return task.draw(image, row, conf=conf, max_boxes=max_boxes, scale=scale,
                     caption=_caption(row, names))  # fmt: skip


def _export_videos(
    folder: Path,
    todo: list[dict[str, Any]],
    manifest: Mapping[str, Any],
    error_rows: int,
    task: Task,
    conf: float,
    max_boxes: int,
    names: list[str],
) -> DrawExport:
    """A run over videos drawn: one video file per video (batchinfer.export_video)."""
    from batchinfer.export_video import SUFFIX, draw_videos, open_run_videos

    if todo:
        open_run_videos(manifest)  # refused here, before anything is deleted
    deleted = _prepare(folder)
    taken = {name.lower() for name in os.listdir(folder)}
    with open(folder / RECORD, "a", encoding="utf-8") as record:
        videos, unreadable = draw_videos(
            folder,
            todo,
            manifest,
            lambda row, rgb: _drawn(rgb, row, task, names, conf, max_boxes),
            record,
            lambda video_id, index: _unique(safe_name(video_id), index, SUFFIX, taken),
        )
    written = [v.name for v in videos]
    return DrawExport(folder, written, error_rows, unreadable, deleted, videos)


def _unique(stem: str, index: int, suffix: str, taken: set[str]) -> str:
    """``stem + suffix``, else with ``-index`` (then ``-index-2``, ...) while a file of the
    folder (any case: case-insensitive filesystems) or an earlier item holds the name."""
    name, k = stem + suffix, 1
    while name.lower() in taken:
        name = f"{stem}-{index}{suffix}" if k == 1 else f"{stem}-{index}-{k}{suffix}"
        k += 1
    taken.add(name.lower())
    return name


def _save_options(image_format: str) -> dict[str, Any]:
    # JPEG: 4:4:4 chroma, or thin coloured lines fade into their background
    return {"quality": 90, "subsampling": 0} if image_format == "jpg" else {}


__all__ = ["RECORD", "DrawExport", "export_draw", "safe_name"]
