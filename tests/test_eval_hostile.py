"""``batchinfer eval`` against hostile datasets and paths: names that are markup or math,
an item that blocks whoever opens it, someone's file at the report's path, and a second
signal to a process stuck in a read.

The datasets are a few of the demo's digits copied under the names being tried; the
emulator runs with a short NPU time.
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
from cdp import Browser, chromium_path
from click.testing import CliRunner, Result

from batchinfer.cli import main
from batchinfer.data.whole_file import HANGING_FILE_ENV
from batchinfer.engine.plumbing.child import send_or_exit, setup_child
from batchinfer.evaluate.files import REPORT_MARK
from batchinfer.evaluate.markdown import code, text
from batchinfer.evaluate.thumbnails import MAX_HUNG, ThumbnailSpec, make_thumbnails, picture
from batchinfer.sink.outdir import OutLock

REPO = Path(__file__).resolve().parents[1]

#: Class folder and file names that are markup somewhere: LaTeX math for matplotlib, a
#: code span's end, raw HTML, a table cell's end, a table row's end.
HOSTILE = ["$\\notacommand{$", "a`b", "<img src=x onerror=alert(1)>", "p|q", "new\nline"]
#: An item whose name is all of them at once (and whose file is empty: an error row).
HOSTILE_FILE = "x``<img src=x onerror=alert(1)>|$\\frac{$.png"


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


@pytest.fixture
def fast_sim(monkeypatch):
    monkeypatch.setenv("BATCHINFER_SIM_NPU_MS", "0.2")
    monkeypatch.setenv("BATCHINFER_SIM_HOST_MS", "0")


def digits(root: Path, classes: list[str], kit, per_class: int = 3) -> Path:
    """``per_class`` of the demo's images of digit i in folder ``classes[i]``."""
    for i, name in enumerate(classes):
        folder = root / name
        folder.mkdir(parents=True)
        for png in sorted((kit.dataset / str(i)).glob("*.png"))[:per_class]:
            shutil.copy(png, folder / png.name)
    return root


def write_job(path: Path, kit, dataset: Path, extra: str = "") -> Path:
    path.write_text(
        textwrap.dedent(
            f"""
            name = "hostile"
            [device]
            model = "{kit.models["digits"]}"
            [device.runtime]
            backend = "sim"
            cores = [0]
            [dataset]
            path = {tomlstr(dataset)}
            [gates.top1]
            min = 0.0
            [gates.errors]
            max = 1
            """
        )
        + textwrap.dedent(extra)
    )
    return path


def tomlstr(value: object) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def rendered(markdown: str) -> str:
    """``markdown`` as GitHub would render it: CommonMark, tables, raw HTML passed on."""
    # Imported here: the toolkit environment (its own pins) has no markdown-it; the dev extra does.
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown)


def table_widths(page: str) -> list[set[int]]:
    """For each table of an HTML page, the set of its rows' cell counts."""
    widths = []
    for table in page.split("<table>")[1:]:
        rows = table.split("</table>")[0].split("<tr>")[1:]
        widths.append({row.count("<td") + row.count("<th") for row in rows})
    return widths


# --------------------------------------------------------------------------- names
def test_markdown_keeps_every_hostile_name_as_text_on_one_line_and_in_one_cell():
    for name in [*HOSTILE, HOSTILE_FILE, "`", " ` ", "``x``"]:
        shown = html.escape(name.replace("\n", "\\n"), quote=False)
        page = rendered(f"| a | b |\n|---|---|\n| {code(name, cell=True)} | {text(name)} |\n")
        assert table_widths(page) == [{2}], page
        cells = re.findall(r"<td>(.*?)</td>", page, re.S)
        assert cells == [f"<code>{shown}</code>", shown.strip()], name  # cells are trimmed
        assert rendered(f"Lost: {code(name)}.") == f"<p>Lost: <code>{shown}</code>.</p>\n"


@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_hostile_class_and_file_names_are_data_in_the_report_and_summary(
    tmp_path, demo_kit, fast_sim
):
    classes = [*HOSTILE, "5", "6", "7", "8", "9"]
    dataset = digits(tmp_path / "ds", classes, demo_kit)
    (dataset / "a`b" / HOSTILE_FILE).write_bytes(b"")  # an error row, named in the summary
    job = write_job(tmp_path / "job.toml", demo_kit, dataset)

    result = invoke("eval", job, "--no-progress")

    # Before: matplotlib parsed the first class name as math, and failed (exit 1).
    assert result.exit_code == 0, result.output + result.stderr
    assert "Traceback" not in result.output + result.stderr
    out = tmp_path / "eval" / "hostile"
    summary = rendered((out / "summary.md").read_text())
    assert "<img" not in summary
    assert all(len(widths) == 1 for widths in table_widths(summary)), summary
    item = f"a`b/{HOSTILE_FILE}"
    assert f"<code>{html.escape(item, quote=False)}</code>" in summary  # the first error

    report = (out / "report.html").read_text()
    assert "<img src=x" not in report
    assert "&lt;img src=x onerror=alert(1)&gt;" in report
    if chromium_path() is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: .ci/run must install it")
        # The files were checked above; what a browser shows was not: say so, not pass.
        pytest.skip(
            "chromium is not installed here (apt-get install chromium): the report was not "
            "opened in a browser; CI runs this"
        )
    with Browser(window=(1200, 900)) as browser:
        browser.open((out / "report.html").as_uri())
        assert browser.problems() == []
        # Only the items' pictures are images; every class shows under its own name.
        images = browser.evaluate("[...document.images].map(i => i.src.slice(0, 5))")
        assert images and set(images) == {"data:"}
        names = browser.evaluate(
            "[...document.querySelectorAll('#class-table td:first-child')]"
            ".map(td => td.textContent)"
        )
        assert sorted(names) == sorted(classes)


# --------------------------------------------------------------------------- blocking items
@pytest.mark.slow  # default tier: a FIFO item in a run (test_reliability.py)
def test_a_fifo_item_is_an_error_row_and_the_report_does_not_wait_for_it(
    tmp_path, demo_kit, fast_sim
):
    dataset = digits(tmp_path / "ds", [str(i) for i in range(10)], demo_kit)
    job = write_job(
        tmp_path / "job.toml",
        demo_kit,
        dataset,
        """
        [device.reliability]
        decode_timeout_s = 1
        """,
    )
    first = invoke("eval", job, "--no-progress", "--update-baseline")
    assert first.exit_code == 0, first.output + first.stderr
    out = tmp_path / "eval" / "hostile"
    (items,) = [pq.read_table(p) for p in (out / "evals").glob("*/items.parquet")]
    right = items.filter(items["correct"])["id"].to_pylist()
    # A symlink to a FIFO is an item (a bare FIFO is skipped when the dataset is listed);
    # it was right last night, so tonight the report shows it among the items lost.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (dataset / right[0]).unlink()
    (dataset / right[0]).symlink_to(fifo)

    # A subprocess, so that a hang fails this test instead of holding the session for ever.
    # Its readers open the FIFO as a plain file (HANGING_FILE_ENV): it blocks them, as a
    # file on a dead mount would (unasked, a reader refuses a FIFO at once).
    night2 = subprocess.run(
        [sys.executable, "-m", "batchinfer", "eval", str(job), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(sys.path),
            HANGING_FILE_ENV: os.path.realpath(fifo),
        },
    )

    assert night2.returncode == 0, night2.stderr
    assert f"Lost: `{right[0]}`" in night2.stdout
    latest = max((out / "evals").glob("*/items.parquet"))
    rows = {r["id"]: r for r in pq.read_table(latest).to_pylist()}
    assert "decode timeout" in rows[right[0]]["error"]
    report = (out / "report.html").read_text()
    card = report.split(f"<code>{html.escape(right[0])}</code>", 1)[1].split("</div>", 1)[0]
    assert "no picture: not a regular file" in card


def hanging_maker(spec: ThumbnailSpec, tasks, results) -> None:
    """A picture maker that, unlike the real one, opens whatever it is given: a FIFO named
    ``*.hang`` blocks it, as a file on a dead mount would."""
    setup_child(spec.parent_pid, None)
    send_or_exit(results, ("ready",))
    msg = tasks.recv()
    for path in msg[1]:
        if path.endswith(".hang"):
            open(path, "rb")  # noqa: SIM115 - never returns
        send_or_exit(results, ("made", *picture(path, spec.size, spec.max_pixels)))


@pytest.mark.slow  # waits out a timeout (2-5 s); moved for the default tier's 90 s
def test_pictures_that_hang_cost_their_timeout_and_the_rest_go_on_or_are_skipped(
    tmp_path, demo_kit
):
    png = sorted((demo_kit.dataset / "3").glob("*.png"))[:4]
    hangs = []
    for k in range(MAX_HUNG):
        hangs.append(str(tmp_path / f"{k}.hang"))
        os.mkfifo(hangs[-1])
    paths = [str(png[0]), hangs[0], str(png[1]), hangs[1], str(png[2])]

    pictures = make_thumbnails(
        paths, decode_timeout_s=0.5, startup_timeout_s=60, max_pixels=None, maker=hanging_maker
    )

    assert pictures[str(png[0])].uri.startswith("data:image/png;base64,")
    assert pictures[str(png[1])].uri.startswith("data:image/png;base64,")  # a new maker
    for hang in hangs:
        assert pictures[hang].uri is None
        assert pictures[hang].note == "reading it took longer than 0.5 s (the decode timeout)"
    assert pictures[str(png[2])].uri is None  # after MAX_HUNG hangs, the rest are skipped
    assert pictures[str(png[2])].note.startswith(f"not read: {MAX_HUNG} items before it")
    # no_leaks: the hung makers were killed and reaped


def test_the_real_picture_maker_does_not_open_what_is_not_a_regular_file(tmp_path, demo_kit):
    fifo = tmp_path / "item.png"
    os.mkfifo(fifo)
    png = next((demo_kit.dataset / "3").glob("*.png"))
    pictures = make_thumbnails(
        [str(fifo), str(png)], decode_timeout_s=60, startup_timeout_s=60, max_pixels=None
    )
    assert pictures[str(fifo)].note == "not a regular file"
    assert pictures[str(png)].uri.startswith("data:image/png;base64,")


STUCK = """
import subprocess, sys, types
from batchinfer.engine.plumbing.signals import SignalRouter, StopSignals
SignalRouter.install()
from batchinfer.engine.slots import create_segment, segment_name
from batchinfer.sink.outdir import OutLock

out, fifo = sys.argv[1], sys.argv[2]
with StopSignals() as signals:
    # An engine whose loop never gets to look at its stop flags: its coordinator is stuck.
    # It says when it is asked to stop (a second signal sent before the first is taken
    # would merge with it: the kernel keeps one pending signal of a kind).
    signals.engine = types.SimpleNamespace(request_stop=lambda why: print(why, flush=True))
    OutLock(out, command="stuck").acquire()
    segment = create_segment(segment_name("0123abcd", "stuck"), 4096)
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(3600)"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    print(child.pid, flush=True)
    open(fifo, "rb")  # blocks for ever: no writer will come
"""


@pytest.mark.slow  # default tier: a second SIGINT stops at once (test_reliability.py)
def test_a_second_sigterm_ends_a_process_stuck_in_a_read_and_releases_everything(tmp_path):
    out, fifo = tmp_path / "out", tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK, str(out), str(fifo)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    child = None
    try:
        # Its lock, segment and child exist; it is blocked opening the FIFO, or about to be
        # (the signals only set flags it never looks at: either way it is stuck).
        child = int(proc.stdout.readline())
        assert any(n.startswith(f"batchinfer-{proc.pid}-") for n in os.listdir("/dev/shm"))
        proc.send_signal(signal.SIGTERM)  # graceful: a flag
        assert proc.stdout.readline() == "interrupted by SIGTERM\n"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)  # a guard only: before, it never ended
    finally:
        if proc.poll() is None:  # it never ended: what the test fails for, but leave nothing
            proc.kill()
            proc.communicate()
            if child is not None:
                os.kill(child, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert "interrupted by SIGTERM again" in stderr and "stopped at once" in stderr
    assert "Traceback" not in stderr
    with OutLock(out, command="next night"):  # its lock went with it
        pass
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"batchinfer-{proc.pid}-")]
    with contextlib.suppress(psutil.NoSuchProcess):  # killed: gone, or a zombie for init
        assert psutil.Process(child).status() == psutil.STATUS_ZOMBIE


# --------------------------------------------------------------------------- output paths
@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
@pytest.mark.parametrize("key", ["report", pytest.param("summary", marks=pytest.mark.slow)])
def test_a_file_eval_did_not_write_at_the_report_or_summary_path_is_refused_first(
    tmp_path, demo_kit, key
):
    dataset = digits(tmp_path / "ds", [str(i) for i in range(10)], demo_kit, per_class=1)
    theirs = tmp_path / "notes" / ("index.html" if key == "report" else "README.md")
    theirs.parent.mkdir()
    theirs.write_text("# someone's notes\n")
    output = f"""
    [output]
    dir = {tomlstr(tmp_path / "eval")}
    {key} = {tomlstr(theirs)}
    """
    job = write_job(tmp_path / "job.toml", demo_kit, dataset, output)

    result = invoke("eval", job, "--no-progress")

    assert result.exit_code == 2, result.output + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line == (
        f"error: {job}: output.{key} {theirs} exists and was not written by batchinfer "
        f"eval; eval replaces only the files it wrote there: move that file away or set "
        f"output.{key} to another path."
    )
    assert theirs.read_text() == "# someone's notes\n"
    assert not (tmp_path / "eval").exists()  # refused before anything ran or was locked

    theirs.unlink()
    theirs.mkdir()  # a folder is not a file eval wrote either
    result = invoke("eval", job, "--no-progress")
    assert result.exit_code == 2 and "is not a regular file" in result.stderr

    theirs.rmdir()  # free: eval writes it, and replaces it the next night
    assert invoke("eval", job, "--no-progress").exit_code == 0
    assert invoke("eval", job, "--no-progress").exit_code == 0
    first_line = theirs.read_text().split("\n", 1)[0]
    assert (REPORT_MARK in first_line) if key == "report" else first_line.startswith("<!--")


def test_the_detection_summary_keeps_hostile_names_as_text_too():
    # The detection summary was written apart from the classification one and interpolated
    # names raw: a backtick in a file name closed its code span, a '<img>' in a message was
    # HTML, a '|' in a class-free message split the gate table.
    from batchinfer.evaluate.scorers.instances import InstancesScorer
    from batchinfer.evaluate.summary import markdown_summary

    hostile = "a`b|<img src=x onerror=alert(1)>\nc"
    device = {
        "model": f"/m/{hostile}.onnx",
        "model_sha256": "0" * 64,
        "backend": "sim",
        "cores": [0, 1],
        "warnings": [f"core 1: {hostile}"],
    }
    record = {
        "job": hostile,
        "verdict": "fail",
        "device": device,
        "reference": None,
        "metrics": {"map50_95": 0.5},
        "ground_truth": {"images": 3, "annotations": 4, "unmatched_items": 0, "unknown_images": 0},
        "dataset": {"evaluated": 3},
        "eval_id": "e1",
        "gates": [
            {"metric": "map50_95", "check": "min", "value": 0.5, "limit": 0.9, "passed": False,
             "note": hostile}
        ],
        "per_core": [],
        "vs_reference": None,
        "vs_baseline": None,
        "errors": [{"id": f"{hostile}.png", "error": f"cannot read {hostile}"}],
    }  # fmt: skip
    page = rendered(markdown_summary(record, Path(f"/out/{hostile}/report.html"), InstancesScorer))
    assert "<img" not in page  # every '<img' is shown as text (&lt;img)
    assert all(w == {4} for w in table_widths(page)[:1]), page  # the gate table keeps 4 cells
    shown = html.escape(hostile.replace("\n", "\\n"), quote=False)
    assert f"<code>{shown}.png</code>" in page and f"<code>{shown}</code>" in page
