"""``batchinfer doctor``: whether a run can go on this machine, one line per check."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import click

from batchinfer.cli.options import flag_of

BOARDS = ("rk3588", "rk3576", "rk3566")


@click.command("doctor")
@click.option(
    "--model",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Check librknnrt against the toolkit that converted this .rknn, its target "
    "platform against the SoC, and size memory and /dev/shm for its input.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON, for scripts.")
@click.option(
    "--board",
    type=click.Choice(BOARDS),
    default=None,
    help="Check an emulated healthy board of this chip instead of this machine (its device "
    "tree, debugfs, librknnrt, device node and sysfs are written in a temporary folder).",
)
def command(model: Path | None, as_json: bool, board: str | None) -> None:
    """Check everything a run needs on this machine: SoC, NPU driver and kernel,
    librknnrt, rknn-toolkit-lite2, the NPU device's permissions, memory and /dev/shm, the
    governors, the open-files limit. One line per check (✓ ok, ! works but see the fix,
    ✗ a blocker, with its fix). Without an NPU (x86), it says which backends run here.

    Exit status: 0 when a run can go, otherwise the number of blockers (✗).

    \b
    Examples:
      batchinfer doctor
      batchinfer doctor --board rk3588
      batchinfer doctor --model model.rknn --json
    """
    from batchinfer.doctor import BoardSpec, build_board, run_doctor

    if model is not None and not model.is_file():
        raise click.BadParameter(f"{model} is not a file.", param_hint="--model")
    with tempfile.TemporaryDirectory(prefix="batchinfer-doctor-board-") as folder:
        machine = build_board(Path(folder), BoardSpec(chip=board)) if board else None
        report = run_doctor(machine, model)
    if as_json:
        click.echo(json.dumps(report.to_json(flag_of), indent=2, ensure_ascii=False))
    else:
        click.echo(report.text(flag_of))
    sys.exit(report.blockers)
