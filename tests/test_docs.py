"""The docs' commands and the CLI reference agree with the program.

Every `sh` code block of README.md and docs/ is read, and every ``batchinfer COMMAND ...``
in it must name a command that exists and only options that command's ``--help`` lists
(checked against the click command itself, in-process: fast, and the same source as
``--help``). docs/reference/cli.md must be what tools/gen_cli_reference.py writes.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import shlex
from pathlib import Path

import click
import pytest

from batchinfer.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


def sh_lines(text: str) -> list[str]:
    """The shell commands of a page's ```sh blocks, continuation lines joined."""
    lines: list[str] = []
    for block in _FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def invocations(line: str) -> list[list[str]]:
    """The argument lists after each ``batchinfer`` word of one shell line."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote: let the test say which line
        return [["<unparsable>", line]]
    found: list[list[str]] = []
    current: list[str] | None = None
    for word in words:
        ends = word.endswith(";") and word != ";"  # "demo;": a word, then the end
        if ends:
            word = word[:-1]
        if word in ("&&", "||", ";", "|"):
            if current is not None:
                found.append(current)
            current = None
            continue
        if current is not None:
            current.append(word)
        elif word == "batchinfer" or word.endswith("/batchinfer"):
            current = []
        if ends and current is not None:
            found.append(current)
            current = None
    if current is not None:
        found.append(current)
    return found


def _options(command: click.Command) -> set[str]:
    names = {"-h", "--help"}
    for param in command.params:
        if isinstance(param, click.Option):
            names.update(param.opts)
            names.update(param.secondary_opts)
    return names


def check(args: list[str]) -> list[str]:
    """What is wrong with ``batchinfer ARGS`` (empty when nothing)."""
    if args[:1] == ["<unparsable>"]:
        return [f"cannot parse: {args[1]}"]
    command: click.Command = cli
    ctx = click.Context(cli, info_name="batchinfer")
    words = list(args)
    path = ["batchinfer"]
    while isinstance(command, click.Group) and words and not words[0].startswith("-"):
        name = words.pop(0)
        sub = command.get_command(ctx, name)
        if sub is None:
            return [f"{' '.join(path)} has no command {name!r}"]
        path.append(name)
        command, ctx = sub, click.Context(sub, info_name=name, parent=ctx)
    known = _options(command)
    if command is cli:
        known.add("--version")
    takes_value = {
        opt
        for p in command.params
        if isinstance(p, click.Option) and not p.is_flag and not p.count
        for opt in p.opts
    }
    problems = []
    value_next = False
    for word in words:
        if value_next:  # an option's value, which may itself start with "-" ('-hwaccel rkmpp')
            value_next = False
            continue
        if not word.startswith("-") or word == "-" or re.fullmatch(r"-\d.*", word):
            continue  # an argument or a negative number
        flag = word.split("=", 1)[0]
        if flag not in known:
            problems.append(f"{' '.join(path)}: {flag} is not in its --help")
        value_next = flag in takes_value and "=" not in word
    return problems


def test_every_batchinfer_command_in_the_docs_uses_options_its_help_lists():
    checked = 0
    problems = []
    for page in DOCS:
        for line in sh_lines(page.read_text()):
            for args in invocations(line):
                checked += 1
                problems += [f"{page.relative_to(ROOT)}: {p}" for p in check(args)]
    assert checked > 20, checked  # the extraction found the docs' commands
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_wrong_option_and_a_wrong_command():
    (line,) = sh_lines("```sh\nbatchinfer run demo/dataset \\\n  --cors 0,1 --model m.onnx\n```\n")
    assert check(invocations(line)[0]) == ["batchinfer run: --cors is not in its --help"]
    assert check(["export", "cocoa"]) == ["batchinfer export has no command 'cocoa'"]
    assert check(["export", "coco", "RUN", "--out", "r.json"]) == []
    assert invocations("cd x && batchinfer demo demo; ls") == [["demo", "demo"]]


def test_the_cli_reference_is_what_its_generator_writes():
    spec = importlib.util.spec_from_file_location(
        "gen_cli", ROOT / "tools" / "gen_cli_reference.py"
    )
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    page = ROOT / "docs" / "reference" / "cli.md"
    assert page.read_text() == gen.render(), (
        "docs/reference/cli.md is out of date: run python tools/gen_cli_reference.py"
    )
    assert [p[0] for p in gen.command_paths() if len(p) == 1] == sorted(
        ["run", "bench", "eval", "info", "demo", "export", "doctor"]
    )


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_points_outside_the_repository(page):
    # The team's folder beside the repository, spelled in pieces so that this file does
    # not itself name it (the check for links out of the repository reads tests too).
    team_folder = "/".join(("..", "sha" + "red"))
    text = page.read_text()
    assert team_folder not in text and "/work/" not in text


def test_the_design_page_quotes_the_modules_as_they_are():
    """docs/design.md quotes each protocol's comment block; a changed block fails here."""
    import ast

    text = (ROOT / "docs" / "design.md").read_text()
    quotes = re.findall(
        r"^From the docstring of `([^`]+)`:\n\n```text\n(.*?)\n```$", text, re.S | re.M
    )
    assert len(quotes) >= 6
    for where, quoted in quotes:
        path, _, name = where.partition("::")
        tree = ast.parse((ROOT / path).read_text())
        if name:
            tree = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
        assert ast.get_docstring(tree, clean=True) == quoted, f"docs/design.md: {where} has changed"


def test_the_design_page_quotes_the_pool_protocol_as_it_is_in_the_code():
    """docs/design.md shows engine/pools.py's protocol table; a change to one is a change
    to both (the code's comment is the one written down; the page quotes it)."""
    import batchinfer.engine.pools as pools

    doc = pools.__doc__ or ""
    table = doc[doc.index("PROTOCOL (loop") :].rstrip("\n")
    page = (ROOT / "docs" / "design.md").read_text()
    assert f"```text\n{table}\n```" in page


def test_the_design_page_quotes_the_task_protocol_as_it_is_in_the_code():
    """docs/design.md shows the Task protocol (batchinfer/tasks/base.py); a change to one is
    a change to both (the code's docstring is the one written down; the page quotes it)."""
    from batchinfer.tasks.base import Task

    doc = inspect.cleandoc(Task.__doc__ or "")
    table = doc[doc.index("PROTOCOL (tasks)") :].rstrip("\n")
    page = (ROOT / "docs" / "design.md").read_text()
    assert "From the docstring of `batchinfer/tasks/base.py::Task`" in page
    assert table in page


def test_the_contributors_map_names_modules_and_tests_that_exist():
    # docs/contributing.md's "Where to change what": every file it names is there (a module
    # moved or a test renamed would send a newcomer to nothing).
    text = (ROOT / "docs" / "contributing.md").read_text()
    table = text.split("## Where to change what", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`((?:batchinfer|tests|tools|docs)/[\w/.*-]+|[\w/]+\.py)`", table))
    assert len(named) > 15, named
    missing = []
    for name in sorted(named):
        top = name.split("/", 1)[0]
        path = name if top in ("batchinfer", "tests", "tools", "docs") else f"batchinfer/{name}"
        found = list(ROOT.glob(path))
        if not found:
            missing.append(name)
    assert not missing, missing
