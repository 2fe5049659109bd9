"""The entry point's pre-parser (batchinfer/entry.py): it reads a command line as click does,
from tables generated from the commands' own options (batchinfer/run_words.py), to launch
the fork server before click is imported, for a run on this machine only."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import click
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from batchinfer import run_words
from batchinfer.cli import main as cli
from batchinfer.entry import local_run, read_words

# Each run launches a fork server of its own, not the module's (tests/conftest.py):
OWN_FORK_SERVER = "it checks when a run launches its fork server"

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_run_words", ROOT / "tools" / "gen_run_words.py"
    )
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def test_the_tables_are_what_their_generator_writes_from_the_commands():
    assert (ROOT / "batchinfer" / "run_words.py").read_text() == _generator().render(), (
        "batchinfer/run_words.py is out of date: run python tools/gen_run_words.py"
    )


def test_the_generator_refuses_an_option_the_pre_parser_could_not_follow():
    gen = _generator()
    for option in (
        click.Option(["--x"], envvar="X"),  # set from the environment: argv does not tell
        click.Option(["--x"], is_flag=False, flag_value="y"),  # its value is optional
        click.Option(["-xy"]),  # one dash, two letters: click reads it as a long option
    ):
        command = click.Command("c", params=[option])
        with pytest.raises(gen.UnreadableOption):
            gen._table(command, click.Context(command))


# ------------------------------------------------------------- read as click reads them
@functools.cache
def _contexts() -> tuple[click.Context, click.Context]:
    top = click.Context(cli, info_name="batchinfer", **cli.context_settings)
    run = cli.get_command(top, "run")
    assert run is not None
    return top, click.Context(run, info_name="run", parent=top)


def _clicks_reading(ctx: click.Context, args: list[str]) -> tuple[set[str], list[str]] | None:
    """What click's own parser makes of ``args``: the parameters set and the positional
    words (None: it refuses them)."""
    try:
        opts, rest, order = ctx.command.make_parser(ctx).parse_args(list(args))
    except click.UsageError:
        return None
    given = {p.name for p in order if isinstance(p, click.Option) and p.name}
    dataset = opts.get("dataset")  # run's positional words (click 8.2+: a sentinel if none)
    return given, [*(dataset if isinstance(dataset, tuple) else ()), *rest]


def _option_words() -> list[str]:
    top, run = _contexts()
    found = {o for c in (top, run) for p in c.command.get_params(c) for o in p.opts}
    return sorted(
        found | {o for c in (top, run) for p in c.command.get_params(c) for o in p.secondary_opts}
    )


_WORDS = st.one_of(
    st.sampled_from(_option_words()),
    st.sampled_from(["--", "-", "run", "d", "3", "--nope", "-x", "-k3", "-hm", "-mk", "--ray=a"]),
    st.builds(
        lambda o, v: f"{o}={v}", st.sampled_from(_option_words()), st.sampled_from(["", "a"])
    ),
    st.text("-=akmoh", max_size=4),
)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(_WORDS, max_size=8))
@example(["d", "--out", "--ray"])  # --ray is OUT's name here, as click reads it
@example(["d", "--", "--ray"])  # after --, a positional word
@example(["d", "-mm.onnx", "-k3"])  # short options with their values in the word
@example(["d", "--no-progress=1"])  # a flag given a value: refused
def test_the_run_commands_words_are_read_as_click_reads_them(args):
    _, run = _contexts()
    assert read_words(args, run_words.RUN_OPTIONS, interspersed=True) == _clicks_reading(run, args)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.lists(_WORDS, max_size=5))
@example(["--version", "run"])
@example(["-h", "--", "run"])
def test_the_groups_words_are_read_as_click_reads_them(args):
    top, _ = _contexts()
    assert read_words(args, run_words.GROUP_OPTIONS, interspersed=False) == _clicks_reading(
        top, args
    )


# ------------------------------------------------------------------------- the decision
@pytest.mark.parametrize(
    ("args", "local"),
    [
        (["run", "d", "--model", "m.onnx"], True),
        (["run", "d", "-m", "m.onnx", "--out", "--ray"], True),  # an OUT named --ray
        (["run", "-k3", "d", "--", "--help"], True),  # a dataset named --help
        (["run", "d", "-m", "m.onnx", "--ray", "local:2"], False),  # Ray's workers: no server
        (["run", "--ray=auto", "d"], False),
        (["run", "d", "--help"], False),  # click prints the help and exits
        (["run", "-hm", "m.onnx"], False),
        (["--help", "run"], False),
        (["--version"], False),
        (["eval", "job.toml"], False),
        ([], False),
        (["run", "d", "--rayy", "x"], False),  # click refuses an unknown option
        (["run", "d", "--model"], False),  # ... and a missing value
    ],
)
def test_a_fork_server_is_launched_early_only_for_a_run_on_this_machine(args, local):
    assert local_run(args) is local
