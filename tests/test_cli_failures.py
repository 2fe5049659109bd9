"""The command group catches the library's errors for every command (cli/failures.py)."""

from __future__ import annotations

import click
from click.testing import CliRunner

from batchinfer.cli import Commands
from batchinfer.cli.failures import name_settings
from batchinfer.errors import ConfigError, RunFailedError
from batchinfer.messages import setting


class _Group(Commands):
    """The real group's invoke, with commands of the test's own."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.commands)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self.commands.get(cmd_name)


@click.group(cls=_Group)
def group() -> None:
    pass


@group.command("flags")
def _flags() -> None:
    raise ConfigError(setting("runtime.slots") + " is too small; raise it.", "runtime.slots")


@group.command("keys")
def _keys() -> None:
    name_settings(lambda field: f"[{field}]")
    raise ConfigError(setting("runtime.slots") + " is too small; raise it.", "runtime.slots")


@group.group("nested")
def _nested() -> None:
    pass


@_nested.command("deep")
def _deep() -> None:
    raise RunFailedError("the disk is full")


@group.command("ctrl-c")
def _ctrl_c() -> None:
    raise KeyboardInterrupt


def test_an_error_is_one_line_naming_the_flag_with_its_exit_code() -> None:
    result = CliRunner().invoke(group, ["flags"])
    assert result.exit_code == 2
    assert result.stderr == "error: --slots is too small; raise it.\n"


def test_a_command_names_settings_its_own_way() -> None:
    result = CliRunner().invoke(group, ["keys"])
    assert result.exit_code == 2
    assert result.stderr == "error: [runtime.slots] is too small; raise it.\n"


def test_a_subcommand_of_a_subgroup_is_caught_too() -> None:
    result = CliRunner().invoke(group, ["nested", "deep"])
    assert result.exit_code == 3
    assert result.stderr == "error: the disk is full\n"


def test_ctrl_c_outside_a_run_is_130_not_aborted() -> None:
    result = CliRunner().invoke(group, ["ctrl-c"])
    assert result.exit_code == 130
    assert result.stderr == "error: interrupted; nothing was started.\n"


def test_no_command_catches_the_library_errors_itself() -> None:
    import inspect

    from batchinfer.cli import bench, demo, eval, export, info, run

    for module in (bench, demo, eval, export, info, run):
        assert "except BatchinferError" not in inspect.getsource(module), module.__name__
