"""``batchinfer info``: a model's tensors, its runtime and that runtime's version."""

from __future__ import annotations

from pathlib import Path

import click

from batchinfer.options import BACKEND_NAMES


@click.command("info")
@click.argument("model", type=click.Path(path_type=Path))
@click.option(
    "--backend",
    type=click.Choice(list(BACKEND_NAMES)),
    default="auto",
    show_default=True,
    help="The runtime to ask (auto: .rknn -> rknnlite, .onnx -> onnx).",
)
def command(model: Path, backend: str) -> None:
    """Show MODEL's inputs and outputs, the runtime that would run it and its version.

    \b
    Example:
      batchinfer info demo/models/digits.onnx --backend sim
    """
    from batchinfer.cli import fail_cleanly

    fail_cleanly(_info)(model, backend)


def _info(model: Path, backend: str) -> None:
    from batchinfer.inspect import model_report

    click.echo(model_report(model, backend))
