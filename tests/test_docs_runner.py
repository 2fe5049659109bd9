"""tools/docs_runner.py: it runs a page's blocks in order and fails on a broken example.

The full run over README.md and docs/ (minutes: every page gets a demo kit and runs its
commands) is in .ci/run's slow part; these tests run the runner on small pages of their
own, without a demo kit, and check that every real page is one the runner can take.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_runner():
    spec = importlib.util.spec_from_file_location("docs_runner", ROOT / "tools" / "docs_runner.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_runner"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


runner = _load_runner()


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_shown_output_matches_with_ellipsis_wildcards():
    matches = runner.output_matches
    assert matches("all  1797 ...\ndone", "all  1797 464.9 98\ndone\n")
    assert matches("first\n...\nlast", "first\nlast")  # a line of ... may stand for none
    assert matches("first\n...\nlast", "first\na\nb\nlast")
    assert matches("x = 1  \n\n", "\nx = 1")  # blank ends and trailing spaces ignored
    assert not matches("all  1797 ...", "all  1796 464.9")
    assert not matches("a...b", "a\nb")  # inside a line, ... stays within the line
    assert not matches("first\nlast", "first\nextra\nlast")  # nothing unshown is let through
    assert not matches("done", "done\nand more")


def test_a_correct_page_runs_in_order_in_one_folder(tmp_path):
    page = _page(
        tmp_path,
        f"""# A page

```sh
echo 3 > count.txt
python -c "import batchinfer; print(batchinfer.__file__)"
```

<!-- docs-runner: output -->
```text
{ROOT}/batchinfer/__init__.py
```

<!-- docs-runner: skip (needs a board) -->
```sh
exit 1
```

```python
from pathlib import Path

if __name__ == "__main__":
    count = int(Path("count.txt").read_text())
    print("count", count, "took 1.234 s")
```

<!-- docs-runner: output -->
```text
count 3 took ... s
```

<!-- docs-runner: exit 2 -->
```sh
batchinfer run nowhere --model nothing.onnx --cors 0,1
```

```toml
not = "run"
```

<!-- docs-runner: file conf/job.toml -->
```toml
name = "written"
```

```sh
cat conf/job.toml
```

<!-- docs-runner: output -->
```text
name = "written"
```
""",
    )
    result = runner.run_page(page, kit=None)
    assert result.failure is None, result.failure
    assert (result.ran, result.skipped) == (4, 1)


def test_a_renamed_option_fails_the_page_naming_the_block(tmp_path):
    page = _page(
        tmp_path,
        "Intro.\n\n```sh\necho fine\n```\n\n"
        "```sh\nbatchinfer run nowhere --model m.onnx --cors 0,1\n```\n\n"
        "```sh\necho never reached > reached.txt\n```\n",
    )
    result = runner.run_page(page, kit=None)
    assert result.failure is not None
    assert result.failure.startswith(f"{page}:7: ```sh block at line 7:\nbatchinfer run nowhere")
    assert "exited 2 (expected 0)" in result.failure
    assert "--cors" in result.failure.split("its output:")[1]  # click's own complaint
    assert result.ran == 2  # the page stops at its first failure


@pytest.mark.parametrize(
    "language, code", [("sh", "echo 'top1 0.957'"), ("python", "print('top1 0.957')")]
)
def test_a_changed_output_fails_the_page_with_a_diff(tmp_path, language, code):
    page = _page(
        tmp_path,
        f"```{language}\n{code}\n```\n\n"
        "<!-- docs-runner: output -->\n```text\ntop1 0.998...\n```\n",
    )
    result = runner.run_page(page, kit=None)
    assert result.failure is not None
    assert "its output is not the one the page shows" in result.failure
    assert "-top1 0.998...\n+top1 0.957" in result.failure


def test_the_command_line_names_the_failed_page_and_exits_1(tmp_path, capsys):
    good = _page(tmp_path, "```sh\ntest -d demo\n```\n")  # the kit is copied in as demo/
    bad = tmp_path / "bad.md"
    bad.write_text("```sh\necho 1\n```\n\n<!-- docs-runner: output -->\n```text\n2\n```\n")
    (tmp_path / "kit").mkdir()
    assert runner.main([str(good), str(bad), "--kit", str(tmp_path / "kit")]) == 1
    out = capsys.readouterr().out
    assert f"{good}: ok: 1 block(s) run, 0 skipped" in out
    assert f"{bad}: FAILED: 1 block(s) run" in out
    assert f"{bad}:1: ```sh block at line 1:\necho 1\nits output is not" in out
    assert out.endswith("1 of 2 page(s) ok\n")


def test_a_python_block_that_raises_fails_with_the_page_line(tmp_path):
    page = _page(tmp_path, "Text.\n\n```python\nx = 1\nprint(undefined_name)\n```\n")
    result = runner.run_page(page, kit=None)
    assert result.failure is not None
    assert f'File "{page}", line 5' in result.failure
    assert "NameError: name 'undefined_name' is not defined" in result.failure


@pytest.mark.parametrize(
    "text, problem",
    [
        ("```\nbatchinfer run x\n```\n", "page.md:1: a fence without a language"),
        ("<!-- docs-runner: skip -->\n```sh\nls\n```\n", "page.md:1: a skip says why"),
        ("<!-- docs-runner: skip () -->\n```sh\nls\n```\n", "page.md:1: a skip says why"),
        ("<!-- docs-runner: sikp (x) -->\n```sh\nls\n```\n", "page.md:1: unknown marker"),
        (
            "<!-- docs-runner: output -->\n```text\nx\n```\n",
            "page.md:2: an output block must follow",
        ),
        ("<!-- docs-runner: exit 2 -->\n```python\nx\n```\n", "page.md:1: unknown marker"),
        ("<!-- docs-runner: file ../up.toml -->\n```toml\nx\n```\n", "page.md:1: unknown marker"),
        ("<!-- docs-runner: skip (x) -->\nText.\n```sh\nls\n```\n", "page.md:1: a marker must be"),
    ],
)
def test_markers_and_fences_the_runner_cannot_take_are_reported(tmp_path, text, problem):
    with pytest.raises(runner.PageError) as caught:
        runner.parse_page(_page(tmp_path, text))
    assert problem in str(caught.value)


@pytest.mark.parametrize("page", runner.default_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_page_is_one_the_runner_can_take(page):
    _, blocks = runner.parse_page(page)  # raises PageError naming what is wrong
    for block in blocks:
        if block.skip is not None:
            assert block.language in runner.RUNNABLE, (
                f"line {block.line}: skip on a ```{block.language}"
            )


def test_ci_runs_the_docs_and_the_readme_set_up_commands_the_runner_skips():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\n.venv/bin/python tools/docs_runner.py\n" in ci
    readme = (ROOT / "README.md").read_text()
    # .ci/run finds each set-up command with grep -m1 -E: each pattern finds exactly one line
    patterns = re.findall(r'grep -m1 -E "(.+?)" README.md', ci)
    assert len(patterns) == 2, patterns
    commands = [[line for line in readme.splitlines() if re.search(p, line)] for p in patterns]
    assert [len(c) for c in commands] == [1, 1], commands
    _, blocks = runner.parse_page(ROOT / "README.md")
    skipped = {b.source.strip(): b.skip for b in blocks if b.skip}
    for (command,) in commands:
        assert ".ci/run runs this command" in (skipped.get(command) or ""), command
