"""Run the shell and Python blocks of the docs and check the output they show.

    python tools/docs_runner.py                       # README.md and every page under docs/
    python tools/docs_runner.py docs/guide/run.md     # one page (or several)

Each page runs in a temporary folder of its own that holds what the repository root holds
for a user who has just run ``batchinfer demo demo`` there: the kit in ``demo/`` (made once
per invocation with this checkout's ``batchinfer demo``, then copied fresh for every page)
and a copy of ``jobs/``. Its blocks run in page order in that folder, so a block sees what
the blocks before it wrote. ``batchinfer`` and ``python`` on the PATH are this checkout's
(``python -m batchinfer`` through small scripts in the folder's ``bin/``).

- A ```sh block runs in ``bash -e -o pipefail`` and must exit 0.
- A ```python block runs in one namespace per page (its ``__name__`` is ``"__main__"``)
  through Sybil's Python evaluator, so a traceback names the page's line.
- Markers, HTML comments (hidden on GitHub and in the site) on their own line right before a
  fence, with only blank lines between:
  - ``<!-- docs-runner: skip (REASON) -->``: the block is not run (a board, a real model,
    the network, the install commands themselves); the reason is required;
  - ``<!-- docs-runner: exit N -->``: the sh block must exit with N instead of 0
    (``exit 0,1``: with either, for a verdict the machine decides, as bench's);
  - ``<!-- docs-runner: file PATH -->``: the block's text (a job file, say) is written to
    PATH, relative to the page's folder, when the blocks before it have run;
  - ``<!-- docs-runner: output -->`` before a ```text block: that block is the output of
    the runnable block before it (stdout and stderr together, as on a terminal), checked
    after trailing spaces and blank lines at either end are dropped. ``...`` inside a line
    matches any text within that line (a timing, a path); a line that is only ``...``
    matches any number of lines, none included.
- Every fence names its language (```sh, ```python, ```text, ```toml, ...): a bare fence is
  reported, so that no command escapes the runner. Only sh and python blocks run.

A page stops at its first failing block (the ones after it depend on it), which is named
with its line, the command, the exit code and the output (or a diff against the shown
output); the other pages still run. Exit status 1 when any block failed.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from sybil import Document, Example, Region
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = ("sh", "python")
BLOCK_TIMEOUT_S = 900
_MARKER = re.compile(r"<!--\s*docs-runner:\s*(?P<body>.*?)\s*-->")
_INFO = re.compile(r"(?P<language>[^\n]*)$\n", re.M)


def shown_path(page: Path) -> Path:
    """A page's path as messages name it: from the repository root when it is inside."""
    return page.relative_to(ROOT) if page.is_relative_to(ROOT) else page


def default_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclass
class Block:
    """One fenced block of a page and the markers before it."""

    line: int
    language: str
    source: str
    skip: str | None = None  # the reason, when not run
    exit_codes: tuple[int, ...] = (0,)
    is_output: bool = False
    write_to: str | None = None  # a file the block's text is written to, in page order
    expected: Block | None = None  # the ```text block that shows this block's output
    region: Region | None = field(default=None, repr=False)


@dataclass
class PageResult:
    page: Path
    ran: int = 0
    skipped: int = 0
    failure: str | None = None
    seconds: float = 0.0


class PageError(Exception):
    """A page whose markers or fences the runner cannot take as written."""


def _markers_before(text: str, start: int) -> list[tuple[int, str]]:
    """The docs-runner comments on the lines right before position START (blank lines
    between allowed), nearest last, each with its line number."""
    found: list[tuple[int, str]] = []
    lines = text[:start].split("\n")[:-1]  # the fence's own line is not included
    for number in range(len(lines), 0, -1):
        line = lines[number - 1].strip()
        if not line:
            continue
        match = _MARKER.fullmatch(line)
        if match is None:
            break
        found.append((number, match.group("body")))
    return found[::-1]


def parse_page(path: Path) -> tuple[Document, list[Block]]:
    """The page's fenced blocks, in order, with their markers applied."""
    document = Document(path.read_text(encoding="utf-8"), str(path))
    name = shown_path(path)
    lexer = RawFencedCodeBlockLexer(info_pattern=_INFO)
    blocks: list[Block] = []
    problems: list[str] = []
    attached: set[int] = set()  # the lines of the markers that belong to a block
    for region in lexer(document):
        line = document.text.count("\n", 0, region.start) + 1
        language = region.lexemes["language"].strip().split(" ")[0]
        block = Block(line, language, region.lexemes["source"], region=region)
        if not language:
            problems.append(
                f"{name}:{line}: a fence without a language: say ```sh, ```python, ```text, ..."
            )
        for marker_line, body in _markers_before(document.text, region.start):
            attached.add(marker_line)
            where = f"{name}:{marker_line}"
            skip = re.fullmatch(r"skip(?:\s*\((?P<reason>.*)\))?", body)
            exit_ = re.fullmatch(r"exit (?P<codes>\d+(?:,\d+)*)", body)
            file_ = re.fullmatch(r"file (?P<path>\S+)", body)
            if skip:
                if not (skip.group("reason") or "").strip():
                    problems.append(f"{where}: a skip says why: <!-- docs-runner: skip (why) -->")
                block.skip = skip.group("reason")
            elif exit_ and language == "sh":
                block.exit_codes = tuple(int(c) for c in exit_.group("codes").split(","))
            elif body == "output" and language == "text":
                block.is_output = True
            elif file_ and not file_.group("path").startswith("/") and ".." not in body:
                block.write_to = file_.group("path")
            else:
                problems.append(f"{where}: unknown marker for a ```{language} block: {body!r}")
        if block.is_output:
            runnable = [b for b in blocks if b.language in RUNNABLE]
            if not runnable or runnable[-1].expected is not None or runnable[-1] is not blocks[-1]:
                problems.append(
                    f"{name}:{line}: an output block must follow the sh or python block it shows"
                )
            else:
                runnable[-1].expected = block
        blocks.append(block)
    for number, line in enumerate(document.text.split("\n"), 1):
        if _MARKER.fullmatch(line.strip()) and number not in attached:
            problems.append(f"{name}:{number}: a marker must be right before a fence: {line}")
    if problems:
        raise PageError("\n".join(problems))
    return document, blocks


def _pattern(expected: str) -> re.Pattern[str]:
    """The regular expression a shown output stands for (``...`` wildcards)."""
    parts: list[str] = []
    for line in expected.rstrip("\n").split("\n"):
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append("[^\n]*?".join(re.escape(piece) for piece in line.split("...")) + r"\n")
    return re.compile("".join(parts))


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").split("\n")).strip("\n") + "\n"


def output_matches(expected: str, actual: str) -> bool:
    """Whether ACTUAL is what the shown output EXPECTED says (module docstring)."""
    return _pattern(_normalise(expected)).fullmatch(_normalise(actual)) is not None


def _shims(folder: Path) -> dict[str, str]:
    """The environment of a page's blocks: this checkout's batchinfer and python first."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    scripts = {
        "batchinfer": f'exec "{sys.executable}" -m batchinfer "$@"\n',
        "python": f'exec "{sys.executable}" "$@"\n',
        "python3": f'exec "{sys.executable}" "$@"\n',
    }
    for name, body in scripts.items():
        script = bin_dir / name
        script.write_text("#!/bin/sh\n" + body)
        script.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def make_kit(dest: Path) -> Path:
    """A demo kit written by this checkout's ``batchinfer demo``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    subprocess.run(
        [sys.executable, "-m", "batchinfer", "demo", str(dest)],
        check=True,
        stdout=subprocess.DEVNULL,
        env=env,
    )
    return dest


def _shown(block: Block, code: str) -> str:
    return f"```{block.language} block at line {block.line}:\n{code.rstrip()}\n"


def _check_output(block: Block, output: str) -> str | None:
    """None, or what differs between the block's output and the output the page shows."""
    if block.expected is None or output_matches(block.expected.source, output):
        return None
    diff = difflib.unified_diff(
        _normalise(block.expected.source).splitlines(),
        _normalise(output).splitlines(),
        f"shown (line {block.expected.line})",
        "printed",
        lineterm="",
    )
    return "its output is not the one the page shows (... matches any text):\n" + "\n".join(diff)


def _run_sh(block: Block, folder: Path, env: dict[str, str]) -> str | None:
    try:
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block.source],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=BLOCK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as stopped:
        late = f"did not end within {BLOCK_TIMEOUT_S} s:\n{stopped.output}"
        return _shown(block, block.source) + late
    if done.returncode not in block.exit_codes:
        expected = " or ".join(map(str, block.exit_codes))
        return (
            f"{_shown(block, block.source)}exited {done.returncode} (expected {expected}); "
            f"its output:\n{done.stdout}"
        )
    wrong = _check_output(block, done.stdout)
    return None if wrong is None else f"{_shown(block, block.source)}{wrong}"


class BlockTimeout(Exception):
    """A Python block that ran longer than BLOCK_TIMEOUT_S."""


def _timeout(signum: int, frame: object) -> None:
    raise BlockTimeout(f"the block did not end within {BLOCK_TIMEOUT_S} s")


def _run_python(block: Block, example: Example) -> str | None:
    captured = io.StringIO()
    timed = threading.current_thread() is threading.main_thread()  # signals: main thread only
    previous = signal.signal(signal.SIGALRM, _timeout) if timed else None
    if timed:
        signal.alarm(BLOCK_TIMEOUT_S)
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            PythonEvaluator()(example)
    except Exception:
        return (
            f"{_shown(block, block.source)}raised:\n{traceback.format_exc()}"
            f"its output before:\n{captured.getvalue()}"
        )
    finally:
        if timed:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    wrong = _check_output(block, captured.getvalue())
    return None if wrong is None else f"{_shown(block, block.source)}{wrong}"


def run_page(page: Path, kit: Path | None, keep: bool = False) -> PageResult:
    """Run one page's blocks in a fresh folder holding a copy of KIT (as ``demo/``)."""
    result = PageResult(page)
    started = time.monotonic()
    try:
        document, blocks = parse_page(page)
    except PageError as wrong:
        result.failure = str(wrong)
        return result
    by_start = {b.region.start: b for b in blocks if b.region is not None}
    for block in blocks:
        if block.language in RUNNABLE and block.region is not None and block.skip is None:
            block.region.parsed = block.region.lexemes["source"]
            document.add(block.region)
    if not any(b.language in RUNNABLE and b.skip is None for b in blocks):  # nothing to run
        result.skipped = sum(b.language in RUNNABLE for b in blocks)
        return result
    folder = Path(tempfile.mkdtemp(prefix="docs-runner-"))
    cwd = os.getcwd()
    try:
        if kit is not None:
            shutil.copytree(kit, folder / "demo", symlinks=True)
        shutil.copytree(ROOT / "jobs", folder / "jobs", symlinks=True)
        env = _shims(folder)
        saved_env = dict(os.environ)
        os.environ.update({k: env[k] for k in ("PATH", "PYTHONPATH")})
        os.chdir(folder)
        document.namespace["__name__"] = "__main__"
        examples = {e.region.start: e for e in document}
        for block in blocks:
            if block.write_to is not None:
                (folder / block.write_to).parent.mkdir(parents=True, exist_ok=True)
                (folder / block.write_to).write_text(block.source)
            if block.language not in RUNNABLE:
                continue
            if block.skip is not None:
                result.skipped += 1
                continue
            assert block.region is not None
            example = examples[block.region.start]
            assert by_start[block.region.start] is block
            if block.language == "sh":
                failure = _run_sh(block, folder, env)
            else:
                failure = _run_python(block, example)
            result.ran += 1
            if failure is not None:
                result.failure = f"{shown_path(page)}:{block.line}: {failure}"
                break
    finally:
        os.chdir(cwd)
        if "saved_env" in locals():
            os.environ.clear()
            os.environ.update(saved_env)
        if keep:
            print(f"  (kept {folder})", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)
        result.seconds = time.monotonic() - started
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", type=Path, help="default: README.md and docs/")
    parser.add_argument("--kit", type=Path, help="an existing demo kit to copy (default: make one)")
    parser.add_argument("--keep", action="store_true", help="keep each page's folder")
    args = parser.parse_args(argv)
    pages = [p.resolve() for p in args.pages] or default_pages()
    with tempfile.TemporaryDirectory(prefix="docs-runner-kit-") as scratch:
        kit = args.kit.resolve() if args.kit else None
        if kit is None:
            print("making the demo kit ...", file=sys.stderr, flush=True)
            kit = make_kit(Path(scratch) / "demo")
        failed = 0
        for page in pages:
            result = run_page(page, kit, keep=args.keep)
            name = shown_path(page)
            verdict = "FAILED" if result.failure else "ok"
            print(
                f"{name}: {verdict}: {result.ran} block(s) run, {result.skipped} skipped"
                f" ({result.seconds:.1f} s)",
                flush=True,
            )
            if result.failure:
                failed += 1
                print(result.failure, flush=True)
    print(f"{len(pages) - failed} of {len(pages)} page(s) ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
