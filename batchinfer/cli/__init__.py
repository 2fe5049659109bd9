"""The ``batchinfer`` command: parse, call the library, turn errors into messages and exit codes.

Nothing here does work of its own; every command is a call into the library. Errors of the
one tree (``batchinfer.errors``) become one line on stderr, with settings named as the
flags the user typed, and their exit code: 0 ok, 1 some items failed (or an evaluation
regressed), 2 usage/configuration, 3 the run could not proceed, 130 interrupted.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

import click

from batchinfer import __version__
from batchinfer.cli import failures
from batchinfer.cli.options import flag_of
from batchinfer.errors import BatchinferError
from batchinfer.messages import Message

# The prefixes by level number, not record.levelname: importing the real rknnlite (or the
# emulator's, runtime/emulate.py) renames logging's level names to letters ("W").
_PREFIXES = {logging.WARNING: "warning", logging.ERROR: "error", logging.CRITICAL: "critical"}


class _CliLogHandler(logging.Handler):
    """Library log lines on the stderr of the moment, ``warning: ...`` for warnings."""

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if isinstance(record.msg, Message) and not record.args:  # settings named as flags
            ctx = click.get_current_context(silent=True)
            text = record.msg.render(failures.setting_names(ctx) if ctx else flag_of)
        if record.levelno >= logging.WARNING:
            level = max(k for k in _PREFIXES if k <= record.levelno)
            text = f"{_PREFIXES[level]}: {text}"
        click.echo(text, err=True)


def _setup_logging() -> None:
    log = logging.getLogger("batchinfer")
    # Replace our own handler (never anyone else's), so that repeated in-process calls
    # (tests, notebooks) each print to their current stderr exactly once.
    log.handlers = [h for h in log.handlers if not isinstance(h, _CliLogHandler)]
    log.addHandler(_CliLogHandler())
    log.setLevel(logging.INFO)
    log.propagate = False


class Commands(click.Group):
    """The commands, each imported only when it runs (click's lazy-loading recipe:
    ``batchinfer run`` need not import the evaluation and benchmark code, which would cost
    its start-up about a tenth of a second), and the one place their failures are caught
    (batchinfer.cli.failures): an error of the library's tree becomes one line and its
    exit code, whichever command raised it."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BatchinferError as e:
            failures.fail(ctx, e)
        except KeyboardInterrupt:
            failures.interrupted()

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return None
        return importlib.import_module(f"batchinfer.cli.{cmd_name}").command


#: The commands, each the ``command`` of the module batchinfer.cli.<name>.
_COMMANDS = ("run", "bench", "eval", "info", "demo", "export", "doctor")


@click.group(
    cls=Commands,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="batchinfer")
def main() -> None:
    """Batch inference over the NPU cores of Rockchip RK3588-class boards.

    \b
    First run (x86 or board):
      batchinfer demo demo
      batchinfer run demo/dataset --model demo/models/digits.onnx --cores 0,1,2
    """
    _setup_logging()
