"""``batchinfer export``: a run folder's results in other tools' formats."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


@click.group("export")
def command() -> None:
    """Write a run's results in other tools' formats.

    \b
    Example:
      batchinfer export coco runs/night --out results.json --annotations instances_val2017.json
      batchinfer export draw runs/night --out drawn --conf 0.5
      batchinfer export dota runs/aerial --out dota-results
    """


def _out_option(help: str) -> Callable[[F], F]:
    """Every export's ``--out``/``-o`` (the ``dest`` argument); ``help`` says what it is."""
    option: Callable[[F], F] = click.option(
        "--out", "-o", "dest", required=True, type=click.Path(path_type=Path), help=help
    )
    return option


@command.command("coco")
@click.argument("run", type=click.Path(path_type=Path))
@_out_option("The COCO result JSON to write (replaced if it exists).")
@click.option(
    "--annotations",
    type=click.Path(path_type=Path),
    help="A COCO instances JSON of the same images: image ids by file name, category ids by "
    "class name. Without it: the ids of the COCO file the run read (its images' ids, its "
    "categories' ids), else numeric file names are the image ids (COCO's own), else the row "
    "index; COCO's category ids for COCO's 80 classes, else the class ids.",
)
def coco(run: Path, dest: Path, annotations: Path | None) -> None:
    """Write RUN's boxes (a detect, segment, pose or obb run folder) as COCO result JSON:
    [{"image_id", "category_id", "bbox": [x, y, w, h], "score"}, ...], what pycocotools'
    loadRes and faster-coco-eval read; with "segmentation" (RLE) for a segment run and
    "keypoints" for a pose run."""
    _coco(run, dest, annotations)


def _coco(run: Path, dest: Path, annotations: Path | None) -> None:
    from batchinfer.export import export_coco

    done = export_coco(run, dest, annotations)
    click.echo(
        f"wrote {len(done.results)} boxes of {done.images} images to {done.path} "
        f"(image ids: {done.image_ids}; category ids: {done.category_ids})"
    )


@command.command("dota")
@click.argument("run", type=click.Path(path_type=Path))
@_out_option(
    "The folder to write Task1_<class>.txt files into (made if missing; a class's "
    "file is replaced)."
)
def dota(run: Path, dest: Path) -> None:
    """Write RUN's rotated boxes (a --task obb run folder) as DOTA Task1 results: one
    Task1_<class>.txt per class, lines '<image> <score> x1 y1 x2 y2 x3 y3 x4 y4'."""
    from batchinfer.export import export_dota

    counts = export_dota(run, dest)
    click.echo(f"wrote {sum(counts.values())} rotated boxes in {len(counts)} files to {dest}")


@command.command("draw")
@click.argument("run", type=click.Path(path_type=Path))
@_out_option("The folder to draw into: empty or new (see --overwrite).")
@click.option(
    "--conf",
    type=float,
    default=0.25,
    show_default=True,
    help="Draw the boxes scoring at least this.",
)
@click.option("--limit", type=int, default=None, help="Draw at most N items (in dataset order).")
@click.option(
    "--ids",
    multiple=True,
    help="Draw only this item id (as in the id column); repeat it for more.",
)
@click.option(
    "--max-boxes",
    type=int,
    default=100,
    show_default=True,
    help="Draw at most this many boxes per image (the best scoring).",
)
@click.option(
    "--format",
    "image_format",
    type=click.Choice(["png", "jpg"]),
    default="png",
    show_default=True,
    help="The images' format.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Draw into a folder that is not empty: the images an earlier export draw wrote there "
    "(listed in its .batchinfer-drawn record) are deleted first; nothing else is.",
)
def draw(
    run: Path,
    dest: Path,
    conf: float,
    limit: int | None,
    ids: tuple[str, ...],
    max_boxes: int,
    image_format: str,
    overwrite: bool,
) -> None:
    """Draw RUN's items with their results into images, one per item that succeeded:
    boxes with class and score, masks, keypoints and rotated boxes (whatever the run's boxes
    hold); a classification's top-1 class and score as a caption. Images are read from
    where the run read them; items with an error row are skipped and counted. A run over
    videos gives one video per video (NAME.mp4, H.264, at the source's frame rate), every
    frame of it: the frames the run did not infer (sampling, --limit, --ids, error rows)
    undrawn.

    \b
    Example:
      batchinfer export draw runs/digits --out drawn --conf 0.5 --limit 20
    """
    from batchinfer.export_draw import export_draw

    done = export_draw(
        run,
        dest,
        conf=conf,
        limit=limit,
        ids=ids or None,
        overwrite=overwrite,
        image_format=image_format,
        max_boxes=max_boxes,
    )
    notes = [f"{_count(done.error_rows, 'error row')} skipped"]
    if done.unreadable:
        item, why = done.unreadable[0]
        notes.append(
            f"{_count(len(done.unreadable), 'image')} not readable now (first: {item}: {why})"
        )
    if done.deleted:
        notes.append(f"{_count(done.deleted, 'image')} of an earlier export draw deleted")
    if done.videos:
        notes += [f"{v.name}: {v.cut_short}" for v in done.videos if v.cut_short]
        click.echo(_video_line(done.videos, done.folder, notes))
        return
    drew = _count(len(done.written), "image")
    click.echo(f"drew {drew} into {done.folder} ({'; '.join(notes)})")


def _video_line(videos: list, folder: Path, notes: list[str]) -> str:
    """What export draw of a run over videos did, in one line."""
    frames, drawn = sum(v.frames for v in videos), sum(v.drawn for v in videos)
    first = videos[0]
    how = f"{first.codec}, {float(first.fps):g} fps" + (", ..." if len(videos) > 1 else "")
    return (
        f"drew {drawn} of {_count(frames, 'frame')} into {_count(len(videos), 'video')} in "
        f"{folder} (first: {first.name}, {how}; the frames the run did not infer are written "
        f"undrawn; {'; '.join(notes)})"
    )


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"
