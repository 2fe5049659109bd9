"""``batchinfer export``: a run folder's results in other tools' formats."""

from __future__ import annotations

from pathlib import Path

import click


@click.group("export")
def command() -> None:
    """Write a run's results in other tools' formats.

    \b
    Example:
      batchinfer export coco runs/night --out results.json --annotations instances_val2017.json
    """


@command.command("coco")
@click.argument("run", type=click.Path(path_type=Path))
@click.option(
    "--out",
    "-o",
    "dest",
    required=True,
    type=click.Path(path_type=Path),
    help="The COCO result JSON to write (replaced if it exists).",
)
@click.option(
    "--annotations",
    type=click.Path(path_type=Path),
    help="A COCO instances JSON of the same images: image ids by file name, category ids by "
    "class name. Without it: the ids of the COCO file the run read (its images' ids, its "
    "categories' ids), else numeric file names are the image ids (COCO's own), else the row "
    "index; COCO's category ids for COCO's 80 classes, else the class ids.",
)
def coco(run: Path, dest: Path, annotations: Path | None) -> None:
    """Write RUN's boxes (a detection run folder) as COCO result JSON:
    [{"image_id", "category_id", "bbox": [x, y, w, h], "score"}, ...], what pycocotools'
    loadRes and faster-coco-eval read."""
    _coco(run, dest, annotations)


def _coco(run: Path, dest: Path, annotations: Path | None) -> None:
    from batchinfer.export import export_coco

    done = export_coco(run, dest, annotations)
    click.echo(
        f"wrote {len(done.results)} boxes of {done.images} images to {done.path} "
        f"(image ids: {done.image_ids}; category ids: {done.category_ids})"
    )
