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
@click.option(
    "--input",
    "inputs",
    multiple=True,
    metavar="NAME=COLUMN",
    help="As run's --input: show that the manifest column COLUMN feeds the input NAME.",
)
def command(model: Path, backend: str, inputs: tuple[str, ...]) -> None:
    """Show MODEL's inputs and outputs, the runtime that would run it and its version.

    \b
    Example:
      batchinfer info demo/models/digits.onnx --backend sim
    """
    _info(model, backend, inputs)


def _info(model: Path, backend: str, inputs: tuple[str, ...]) -> None:
    from batchinfer.cli.options import flag_of
    from batchinfer.inspect import model_report

    click.echo(model_report(model, backend, inputs, flag_of))
