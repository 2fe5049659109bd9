"""How a command's failure reaches its user, said in one place for every command.

The library raises errors of one tree (batchinfer.errors); the command group
(:class:`batchinfer.cli.Commands`) catches them around whichever command runs and prints
one line, ``error: <message>``, with the settings the message names rendered as this
command's user set them, then exits with the error's code. A command whose settings are
not flags (``eval`` reads a job file) says how to name them with :func:`name_settings`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

import click

from batchinfer.cli.options import flag_of
from batchinfer.errors import BatchinferError

_NAMES = "batchinfer.setting_names"  # in click's Context.meta, which nested contexts share


def name_settings(name: Callable[[str], str]) -> None:
    """Name settings in the running command's messages with ``name`` (a field name such as
    ``runtime.slots`` -> what the user wrote); the default is the flag (:func:`flag_of`)."""
    click.get_current_context().meta[_NAMES] = name


def setting_names(ctx: click.Context) -> Callable[[str], str]:
    """How the command running in ``ctx`` names settings."""
    return ctx.meta.get(_NAMES, flag_of)


def fail(ctx: click.Context, error: BatchinferError) -> NoReturn:
    """Say ``error`` in one line on stderr and exit with its code."""
    click.echo(f"error: {error.render(setting_names(ctx))}", err=True)
    sys.exit(error.exit_code)


def interrupted() -> NoReturn:
    """Ctrl-C outside a run (click would say "Aborted!" and exit 1): nothing was started."""
    click.echo("error: interrupted; nothing was started.", err=True)
    sys.exit(130)
