"""``batchinfer demo``: the first-run kit."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("demo")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--overwrite", is_flag=True, help="Replace a demo kit already in TARGET.")
def command(target: Path, overwrite: bool) -> None:
    """Write a first-run kit to TARGET: 1,797 digit images and small models.

    \b
    Then:
      batchinfer run TARGET/dataset --model TARGET/models/digits.onnx --cores 0,1,2
    """
    _demo(target, overwrite)


def _demo(target: Path, overwrite: bool) -> None:
    from batchinfer.demo import PROMPT_ITEMS, write_demo

    kit = write_demo(target, overwrite=overwrite)
    click.echo(f"wrote {kit.count} images to {kit.dataset} and models to {kit.root / 'models'}")
    if kit.detection is not None:
        det = kit.detection
        click.echo(
            f"wrote {det.count} detection images ({det.boxes} boxes) to {det.images}, "
            f"boxes in {det.instances}"
        )
    if kit.prompt is not None:
        click.echo(
            f"wrote {PROMPT_ITEMS} .npz items (arrays image and prompt) for the two-input "
            f"model {kit.models['digits-prompt'].name} to {kit.prompt}"
        )
    if kit.video is not None:
        clip = kit.video
        click.echo(
            f"wrote a {clip.frames}-frame clip of moving digits ({clip.codec}) to {clip.video}, "
            f"boxes in {clip.instances} (COCO) and {clip.mot} (MOT)"
        )
    else:
        click.echo("no demo clip: PyAV is not installed (pip install 'batchinfer[video]')")
    click.echo(f"next: batchinfer run {kit.dataset} --model {kit.models['digits']} --cores 0,1,2")
