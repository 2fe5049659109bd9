"""OUT is never destroyed and never mixed: what --overwrite may delete, the run lock, and a
--resume that proves it continues the same run (fingerprint, verified parts, ids).

Each refusal must be one ``error:`` line, exit 2, and leave every file as it was: the tests
take a snapshot of the folders involved before and compare after.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from models import nchw_float_model

from batchinfer.cli import main
from batchinfer.errors import OutputLockedError, OutputTamperedError
from batchinfer.results import read_predictions
from batchinfer.runtime import constants as C
from batchinfer.sink.manifest import RunManifest

FAST = ["--backend", "sim", "--sim-npu-ms", "0.2", "--sim-host-ms", "0", "--no-progress"]


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


def run_args(dataset: Path, model: Path, out: Path, *extra: str) -> list:
    return ["run", dataset, "--model", model, "--out", out, *FAST, *extra]


def refused(result: Result, *needles: str) -> str:
    """Assert exit 2 with a single ``error:`` line holding ``needles``; return the line."""
    assert "Traceback" not in result.output
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def snapshot(*folders: Path) -> dict[str, bytes]:
    """Every file under ``folders`` (relative name -> bytes): what 'touching nothing' means."""
    files = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.is_symlink():
                files[str(path)] = path.read_bytes()
    return files


@pytest.fixture
def data(demo_kit, tmp_path) -> Path:
    """30 demo digits (three classes of ten): small enough for many runs per test."""
    root = tmp_path / "data"
    for label in ("0", "1", "2"):
        (root / label).mkdir(parents=True)
        for png in sorted((demo_kit.dataset / label).iterdir())[:10]:
            shutil.copy(png, root / label / png.name)
    return root


@pytest.fixture
def digits(demo_kit) -> Path:
    return demo_kit.models["digits"]


def ok_run(*args) -> Result:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result


# ------------------------------------------------------------------ deleting what is not ours
def test_overwrite_keeps_every_file_the_run_did_not_write(data, digits, tmp_path):
    out = tmp_path / "project"
    ok_run(*run_args(data, digits, out))
    (out / "notes.txt").write_text("results of last week")
    (out / "src").mkdir()
    (out / "src" / "main.py").write_text("print('mine')\n")
    (out / ".git").mkdir()
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    theirs = snapshot(out / "src", out / ".git") | {"notes": (out / "notes.txt").read_bytes()}

    ok_run(*run_args(data, digits, out, "--overwrite"))
    assert snapshot(out / "src", out / ".git") | {"notes": (out / "notes.txt").read_bytes()} == (
        theirs
    )
    assert read_predictions(out).num_rows == 30


# Each plant costs a run: three in the default tier (a path out of OUT, a link, a bad
# record), the rest with the slow tier.
@pytest.mark.parametrize(
    ("plant", "needle"),
    [
        ("dotdot", "../../home/.ssh/authorized_keys"),
        pytest.param("absolute", "/home/.ssh/authorized_keys", marks=pytest.mark.slow),
        ("symlink_part", "part-00007.parquet is a symbolic link"),
        pytest.param("folder_part", "part-00007.parquet is a folder", marks=pytest.mark.slow),
        pytest.param(
            "symlink_predictions", "predictions is a symbolic link", marks=pytest.mark.slow
        ),
        ("malformed_record", "has rows or errors that are not counts"),
    ],
)
def test_a_planted_ledger_deletes_and_reads_nothing_outside_or_inside_out(
    data, digits, tmp_path, plant, needle
):
    out = tmp_path / "o"
    ok_run(*run_args(data, digits, out))
    key = tmp_path / "home" / ".ssh" / "authorized_keys"  # the sentinel outside OUT
    key.parent.mkdir(parents=True)
    key.write_text("ssh-ed25519 AAAA me@laptop\n")
    manifest = json.loads((out / "manifest.json").read_text())
    parts, pred = manifest["parts"], out / "predictions"
    record = dict(next(iter(parts.values())))
    if plant == "dotdot":
        parts[os.path.relpath(key, pred)] = record
    elif plant == "absolute":
        parts[str(key)] = record
    elif plant == "symlink_part":  # a name batchinfer writes, a link to the victim
        parts["part-00007.parquet"] = record
        (pred / "part-00007.parquet").symlink_to(key)
    elif plant == "folder_part":
        parts["part-00007.parquet"] = record
        (pred / "part-00007.parquet").mkdir()
        (pred / "part-00007.parquet" / "keep.txt").write_text("mine")
    elif plant == "symlink_predictions":  # every part name would land in another folder
        pred.rename(key.parent / "predictions")
        pred.symlink_to(key.parent / "predictions")
    elif plant == "malformed_record":
        parts["part-00000.parquet"]["rows"] = "all of them"
    (out / "manifest.json").write_text(json.dumps(manifest))
    if plant == "absolute":
        needle = str(key)
    before = snapshot(tmp_path)

    for flag in ("--overwrite", "--resume"):
        refused(invoke(*run_args(data, digits, out, flag)), needle, "nothing in")
    with pytest.raises(OutputTamperedError, match="nothing in"):
        read_predictions(out)
    assert key.read_text() == "ssh-ed25519 AAAA me@laptop\n"
    assert snapshot(tmp_path) == before


def test_a_ledger_name_of_ours_with_a_newline_or_other_digits_is_refused(tmp_path):
    for name in ("part-00001.parquet\n", "part-\u0661\u0662\u0663\u0664\u0665.parquet"):
        manifest = RunManifest.new(tmp_path)
        manifest.parts[name] = {"rows": 1, "errors": 0, "sha256": "0" * 64, "state": "live"}
        manifest.save()
        with pytest.raises(OutputTamperedError, match="not a name batchinfer writes"):
            RunManifest.load(tmp_path)


@pytest.mark.parametrize("flag", ["--overwrite", "--resume"])
@pytest.mark.parametrize("where", ["same", "inside", "around"])
def test_out_may_not_be_the_dataset_inside_it_or_around_it(data, digits, tmp_path, flag, where):
    out = {"same": data, "inside": data / "results", "around": tmp_path}[where]
    before = snapshot(tmp_path)
    line = refused(invoke(*run_args(data, digits, out, flag)), "dataset")
    assert "outside the dataset" in line or "not a batchinfer run" in line
    assert snapshot(tmp_path) == before


def test_out_as_the_dataset_is_refused_even_without_flags_when_empty_of_results(
    data, digits, tmp_path
):
    before = snapshot(data)
    refused(invoke(*run_args(data, digits, data / "new-results")), "inside the dataset")
    assert snapshot(data) == before and not (data / "new-results").exists()


def test_resume_of_a_folder_that_is_not_a_run_is_refused_and_leaves_it_alone(
    data, digits, tmp_path
):
    home = tmp_path / "home"
    (home / "photos").mkdir(parents=True)
    (home / "photos" / "cat.jpg").write_bytes(b"\xff\xd8 not really")
    (home / "todo.md").write_text("- back up photos\n")
    before = snapshot(home)
    refused(invoke(*run_args(data, digits, home, "--resume")), "not a batchinfer run")
    refused(invoke(*run_args(data, digits, home, "--overwrite")), "not a batchinfer run")
    assert snapshot(home) == before
    assert sorted(p.name for p in home.iterdir()) == ["photos", "todo.md"]


def test_overwrite_of_a_folder_with_another_tools_manifest_is_refused(data, digits, tmp_path):
    site = tmp_path / "site"
    (site / "predictions").mkdir(parents=True)
    (site / "manifest.json").write_text(json.dumps({"name": "my web app", "icons": []}))
    (site / "index.html").write_text("<h1>hi</h1>")
    (site / "predictions" / "2027.csv").write_text("year,guess\n")
    before = snapshot(site)
    refused(invoke(*run_args(data, digits, site, "--overwrite")), "not written by batchinfer")
    assert snapshot(site) == before


def test_an_out_that_cannot_be_made_is_a_usage_error_not_a_failed_run(data, digits, tmp_path):
    # Each was "Could not write ... (File exists / Not a directory); check the disk and the
    # folder, then run again with --resume to continue where the run stopped", exit 3:
    # nothing had started, and --resume could not help.
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    line = refused(invoke(*run_args(data, digits, tmp_path / "dangling")), "symbolic link")
    assert str(tmp_path / "nowhere") in line and "--resume" not in line
    assert not (tmp_path / "nowhere").exists()
    (tmp_path / "notes.txt").write_text("a file, not a folder\n")
    line = refused(invoke(*run_args(data, digits, tmp_path / "notes.txt" / "out")), "Not a dir")
    assert "cannot be made" in line and "--resume" not in line
    assert (tmp_path / "notes.txt").read_text() == "a file, not a folder\n"


def test_emulator_state_folder_must_be_private_and_ours(tmp_path, monkeypatch, capfd):
    import tempfile

    from models import nhwc_uint8_model

    from batchinfer.runtime.sim import RKNNLite
    from batchinfer.runtime.sim_settings import default_state_dir

    model = nhwc_uint8_model(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("BATCHINFER_SIM_STATE", raising=False)
    state = default_state_dir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "rk3588.board").write_bytes(b"the victim's data")

    def init() -> int:
        rknn = RKNNLite()
        assert rknn.load_rknn(str(model)) == 0
        try:
            return rknn.init_runtime(core_mask=C.NPU_CORE_0)
        finally:
            rknn.release()

    state.symlink_to(victim)  # planted by another local user before our first run
    assert init() == -1
    assert (victim / "rk3588.board").read_bytes() == b"the victim's data"
    assert "not a private folder" in capfd.readouterr().err
    state.unlink()

    state.mkdir(mode=0o777)
    os.chmod(state, 0o777)  # writable by everyone: anyone could plant a symlink inside
    assert init() == -1
    os.chmod(state, 0o700)
    (state / "rk3588.board").symlink_to(victim / "rk3588.board")
    assert init() == -1
    assert (victim / "rk3588.board").read_bytes() == b"the victim's data"
    (state / "rk3588.board").unlink()
    assert init() == 0  # a private folder of ours is used


# --------------------------------------------------------------------------- the run lock
def _start(dataset: Path, model: Path, out: Path, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "batchinfer", *map(str, run_args(dataset, model, out, *extra))]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(proc: subprocess.Popen, prefix: str) -> None:
    for line in proc.stderr:
        if line.startswith(prefix):
            return
    raise AssertionError(f"never saw {prefix!r} (exit {proc.wait()})")


def test_a_second_run_on_a_held_out_is_refused_naming_the_holder(data, digits, tmp_path):
    out = tmp_path / "o"
    # Core 0 hangs on its fifth call: the first run holds OUT for as long as we like.
    first = _start(data, digits, out, "--cores", "0", "--sim-fault", "hang:core=0:call=5")
    try:
        _wait_for(first, "started:")
        before = snapshot(out)
        for flag in ("--overwrite", "--resume"):
            line = refused(invoke(*run_args(data, digits, out, flag)), "in use by")
            assert f"pid {first.pid}" in line and "hang:core=0:call=5" in line
        assert snapshot(out) == before
    finally:
        first.send_signal(signal.SIGINT)
        first.send_signal(signal.SIGINT)  # the hang keeps an item in flight: stop at once
        first.communicate(timeout=60)
    assert first.returncode == 130


def test_deleting_the_lock_file_of_a_held_out_does_not_let_a_second_run_in(data, digits, tmp_path):
    out = tmp_path / "o"
    first = _start(data, digits, out, "--cores", "0", "--sim-fault", "hang:core=0:call=5")
    try:
        _wait_for(first, "started:")
        (out / ".batchinfer.lock").unlink()  # what a cleanup script, or a user, may do
        before = snapshot(out)
        for flag in ("--overwrite", "--resume"):
            refused(invoke(*run_args(data, digits, out, flag)), "in use by")
        assert snapshot(out) == before
    finally:
        first.send_signal(signal.SIGINT)
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
    assert first.returncode == 130
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"


def test_a_run_whose_out_is_moved_away_writes_nothing_into_a_new_folder_there(
    data, digits, tmp_path
):
    out, moved = tmp_path / "o", tmp_path / "o-moved"
    first = _start(data, digits, out, "--cores", "0", "--sim-fault", "hang:core=0:call=5")
    try:
        _wait_for(first, "started:")
        out.rename(moved)
        out.mkdir()  # another run's folder now, say
        (out / "theirs.txt").write_text("another run's")
    finally:
        first.send_signal(signal.SIGINT)
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=60)
    assert first.returncode == 3, err
    assert "deleted, moved or replaced" in err and "Traceback" not in err
    assert f"it is now {moved}: continue it there with --resume --out {moved}" in err
    assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]
    assert json.loads((moved / "manifest.json").read_text())["status"] == "running"
    ok_run(*run_args(data, digits, moved, "--resume", "--cores", "0"))  # where it is now
    assert sorted(read_predictions(moved)["index"].to_pylist()) == list(range(30))


def test_a_held_out_is_refused_before_the_model_dataset_or_fork_server(
    data, digits, tmp_path, monkeypatch
):
    from runs import config

    from batchinfer import run
    from batchinfer.engine.planning import plan
    from batchinfer.engine.plumbing import fork_server
    from batchinfer.sink.outdir import OutLock

    def must_not(what: str):
        def called(*args, **kwargs):
            raise AssertionError(f"{what} before the held OUT was refused")

        return called

    monkeypatch.setattr(fork_server, "acquire", must_not("the fork server was launched"))
    monkeypatch.setattr(plan, "check_settings", must_not("the settings were checked"))
    monkeypatch.setattr(plan, "make_backend", must_not("the model was opened"))
    monkeypatch.setattr(plan, "open_source", must_not("the dataset was listed"))
    out = tmp_path / "o"
    with (
        OutLock(out, command="the holder"),
        pytest.raises(OutputLockedError, match=r"in use by .*the holder"),
    ):
        run(config(dataset=data, model=digits, out=out))


@pytest.mark.parametrize("front", ["command", "library"])
def test_a_run_asks_once_whether_out_is_held_before_it_takes_the_lock(
    front, data, digits, tmp_path, monkeypatch
):
    """One early refusal (the front door's), then the lock: planning does not ask again."""
    from runs import config

    from batchinfer import run
    from batchinfer.sink import out_lock, outdir

    out = tmp_path / "o"
    ok_run(*run_args(data, digits, out))  # OUT holds a run: every look at it is a real one
    asked: list[Path] = []
    real = out_lock.lock_holder

    def counted(path: Path) -> dict | None:
        asked.append(path)
        return real(path)

    for module in (out_lock, outdir):
        monkeypatch.setattr(module, "lock_holder", counted)
    if front == "command":
        ok_run(*run_args(data, digits, out, "--overwrite"))
    else:
        run(config(dataset=data, model=digits, out=out, overwrite=True))
    assert asked == [out]  # taking the lock asks nobody: it is taken, or the run stops


# The program as `python -m batchinfer` runs it, reporting (as JSON on stdout) the fork
# servers it launched, whether click was imported by then, and the processes it has left
# when the command is done, just before it exits.
_REPORTING_PROGRAM = """\
import json, sys
import psutil
import batchinfer.entry as entry
from batchinfer.engine.plumbing import fork_server
launched = []
class Server(fork_server._Server):
    def __init__(self):
        launched.append("click" in sys.modules)
        super().__init__()
fork_server._Server = Server
real_exit = entry._exit
def report(code):
    left = [p.pid for p in psutil.Process().children(recursive=True)]
    print(json.dumps({"click_before_server": launched, "left": left}), flush=True)
    real_exit(code)
entry._exit = report
entry.main()
"""


def test_the_command_refuses_a_held_out_before_importing_the_engine(data, digits, tmp_path):
    """The one early refusal is the run command's, from its parsed options: click has parsed
    them, so the program's entry point, which launches the fork server before it imports
    click (entry.py), cannot know OUT is held and has launched one. The refusal ends the
    command, and the server with it: nothing is left when the program exits."""
    from batchinfer.sink.outdir import OutLock

    out = tmp_path / "o"
    argv = [sys.executable, "-X", "importtime", "-c", _REPORTING_PROGRAM]
    argv += [str(a) for a in run_args(data, digits, out)]
    with OutLock(out, command="the holder"):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "in use by" in errors[0] and "--out" in errors[0]
    imported = {
        line.split("|")[-1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    # Refused before the engine (and pyarrow, a few tenths of a second) is imported.
    assert "pyarrow" not in imported and "batchinfer.engine.planning.plan" not in imported
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report == {"click_before_server": [False], "left": []}


@pytest.mark.parametrize("probed", ["folder", "lock file"])
def test_a_probe_of_the_lock_is_not_taken_for_a_run_holding_it(tmp_path, monkeypatch, probed):
    # "Is OUT held?" (lock_holder, asked by every run as it starts) takes a shared lock for
    # an instant. A run taking the lock at that instant was refused as "in use by another
    # batchinfer run (holder unknown)"; two runs started together could both be refused.
    from batchinfer import flocks
    from batchinfer.sink import outdir

    out = tmp_path / "o"
    out.mkdir()
    (out / ".batchinfer.lock").touch()
    target = out if probed == "folder" else out / ".batchinfer.lock"
    probe = os.open(target, os.O_RDONLY)
    fcntl.flock(probe, fcntl.LOCK_SH)  # the other run's probe, now
    real, refused = flocks.try_flock, []

    def probe_ends_after_a_refusal(fd: int, operation: int) -> bool:
        taken = real(fd, operation)
        if not taken and not refused:
            refused.append(fd)
            fcntl.flock(probe, fcntl.LOCK_UN)  # the probe is over: it read and let go
        return taken

    monkeypatch.setattr(flocks, "try_flock", probe_ends_after_a_refusal)
    try:
        with outdir.OutLock(out, command="second"):
            assert outdir.lock_holder(out)["command"] == "second"
    finally:
        os.close(probe)
    assert refused, "the probe's lock was never met"


def test_where_a_folder_cannot_be_locked_the_lock_file_is_checked_instead(tmp_path, monkeypatch):
    import stat as stat_module

    from batchinfer import flocks
    from batchinfer.errors import OutputLostError
    from batchinfer.sink import outdir

    real = flocks.try_flock

    def no_folder_locks(fd: int, operation: int) -> bool:  # as on some network filesystems
        if stat_module.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real(fd, operation)

    monkeypatch.setattr(flocks, "try_flock", no_folder_locks)
    out = tmp_path / "o"
    with outdir.OutLock(out, command="first") as held:
        with pytest.raises(OutputLockedError, match="first"):
            outdir.OutLock(out).acquire()  # the file lock still excludes
        assert outdir.lock_holder(out)["command"] == "first"
        (out / ".batchinfer.lock").unlink()
        with pytest.raises(OutputLostError, match="deleted, moved or replaced"):
            held.check()  # the next write of the run stops it: exit 3


def test_two_runs_started_together_on_one_out_exactly_one_runs(demo_kit, data, tmp_path):
    out = tmp_path / "o"
    a = _start(data, demo_kit.models["digits"], out)
    b = _start(data, demo_kit.models["digits-int8"], out)
    results = [(p.wait(timeout=120), p.communicate()[1]) for p in (a, b)]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    # Whichever message: held by the winner now, or already holding its finished run.
    assert "in use by another batchinfer run" in loser or "already holds a run" in loser
    assert "Traceback" not in loser
    table = read_predictions(out)
    assert sorted(table["index"].to_pylist()) == list(range(30))
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["invocations"]) == 1


# ------------------------------------------------------------ resume proves it is the same run
@pytest.fixture
def rgb_data(data, tmp_path) -> Path:
    """The 30 digits as RGB PNGs, for a float NCHW model that takes --mean/--std."""
    from PIL import Image

    root = tmp_path / "rgb"
    for png in data.rglob("*.png"):
        dst = root / png.relative_to(data)
        dst.parent.mkdir(parents=True, exist_ok=True)
        Image.open(png).convert("RGB").save(dst)
    return root


# Each change costs two runs: three in the default tier (a setting, the listing, a file's
# content), the rest with the slow tier.
@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ("topk", "--topk 5 → 3"),
        pytest.param("save_outputs", "--save-outputs False → True", marks=pytest.mark.slow),
        pytest.param("mean_std", "preprocessing: mean", marks=pytest.mark.slow),
        ("added_file", "dataset listing"),
        pytest.param("other_folder", "dataset folder", marks=pytest.mark.slow),
        pytest.param("other_model", "model file", marks=pytest.mark.slow),
        ("replaced_file", "state of the dataset's files"),
    ],
)
def test_resume_with_anything_that_decides_a_row_changed_is_refused(
    rgb_data, tmp_path, change, needle
):
    model = nchw_float_model(tmp_path / "models")
    base = ["--dtype", "float32", "--mean", "0,0,0", "--std", "255,255,255"]
    out = tmp_path / "o"
    ok_run(*run_args(rgb_data, model, out, *base))
    dataset, extra = rgb_data, ["--resume", *base]
    if change == "topk":
        extra += ["--topk", "3"]
    elif change == "save_outputs":
        extra += ["--save-outputs"]
    elif change == "mean_std":
        extra += ["--mean", "1,1,1"]  # the later flag wins
    elif change == "added_file":
        shutil.copy(next(rgb_data.rglob("*.png")), rgb_data / "1" / "0000-new.png")
    elif change == "other_folder":
        dataset = tmp_path / "copy"
        shutil.copytree(rgb_data, dataset)
    elif change == "replaced_file":  # same name, another digit: the listing is the same
        first, other = sorted(rgb_data.rglob("*.png"))[0], sorted(rgb_data.rglob("*.png"))[-1]
        shutil.copy(other, first)
    elif change == "other_model":
        onnx_model = onnx.load(str(model))
        onnx_model.doc_string = "retrained"  # same name, same graph, other bytes
        onnx.save(onnx_model, str(model))
    before = snapshot(out)
    line = refused(invoke(*run_args(dataset, model, out, *extra)), needle, "--resume")
    assert "start a new run" in line
    assert snapshot(out) == before


def _rewrite_keeping_size_and_time(path: Path) -> None:
    """What ``rsync -t`` or ``cp -p`` of an edited file can do: other bytes, same stat."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_resume_check_content_sees_what_size_and_time_cannot(data, digits, tmp_path):
    victim = sorted(data.rglob("*.png"))[3]
    stat_out, content_out = tmp_path / "stat", tmp_path / "content"
    ok_run(*run_args(data, digits, stat_out))
    ok_run(*run_args(data, digits, content_out, "--resume-check", "content"))
    os.utime(victim)  # touched, bytes unchanged: only the stat check minds
    refused(invoke(*run_args(data, digits, stat_out, "--resume")), "state of the dataset")
    again = ok_run(*run_args(data, digits, content_out, "--resume", "--resume-check", "content"))
    assert "30 already done (resumed)" in again.stdout

    _rewrite_keeping_size_and_time(victim)
    before = snapshot(content_out)
    line = refused(
        invoke(*run_args(data, digits, content_out, "--resume", "--resume-check", "content")),
        "content of the dataset's files",
    )
    assert "start a new run" in line
    assert snapshot(content_out) == before
    # Resumed with the other check than the run was made with: named, refused.
    refused(invoke(*run_args(data, digits, content_out, "--resume")), "--resume-check content")


# Two runs; default tier: resume with the same settings (test_reliability.py, above).
@pytest.mark.slow
def test_a_run_recorded_before_files_were_fingerprinted_still_resumes(data, digits, tmp_path):
    out = tmp_path / "o"
    ok_run(*run_args(data, digits, out))
    manifest = json.loads((out / "manifest.json").read_text())
    for key in ("resume_check", "dataset_stat_sha256"):
        del manifest["fingerprint"][key]
    (out / "manifest.json").write_text(json.dumps(manifest))
    again = ok_run(*run_args(data, digits, out, "--resume"))
    assert "30 already done (resumed)" in again.stdout


# Two runs; default tier: resume with the same settings (test_reliability.py).
@pytest.mark.slow
def test_a_resume_with_the_same_settings_may_use_other_cores(data, digits, tmp_path):
    out = tmp_path / "o"
    ok_run(*run_args(data, digits, out, "--cores", "0,1"))
    again = ok_run(*run_args(data, digits, out, "--resume", "--cores", "2"))
    assert "30 already done (resumed)" in again.stdout


def test_resume_refuses_a_stray_or_damaged_part_with_one_line(data, digits, tmp_path):
    out = tmp_path / "o"
    ok_run(*run_args(data, digits, out, "--part-rows", "10"))
    pred = out / "predictions"
    shutil.copy(pred / "part-00001.parquet", pred / "part-final.parquet")
    before = snapshot(out)
    refused(invoke(*run_args(data, digits, out, "--resume")), "part-final.parquet")
    assert snapshot(out) == before
    (pred / "part-final.parquet").unlink()

    # Damage a column the old resume never read: the pred of every row of part 1.
    table = pq.read_table(pred / "part-00001.parquet")
    pred_col = table.schema.get_field_index("pred")
    tampered = table.set_column(pred_col, "pred", pa.array([7] * table.num_rows, pa.int64()))
    pq.write_table(tampered, pred / "part-00001.parquet")
    before = snapshot(out)
    refused(invoke(*run_args(data, digits, out, "--resume")), "part-00001.parquet", "checksum")
    assert snapshot(out) == before


# ------------------------------------------------------------------------- names and counts
def test_a_file_name_that_is_not_utf8_is_kept_losslessly_and_resumes(data, digits, tmp_path):
    raw = os.fsencode(str(data / "2")) + b"/caf\xe9-\xff.png"
    shutil.copy(next((data / "2").iterdir()), raw)
    out = tmp_path / "o"
    first = ok_run(*run_args(data, digits, out))
    assert "31 succeeded" in first.stdout
    table = read_predictions(out)
    odd = [r for r in table.to_pylist() if r["id_bytes"] is not None]
    assert len(odd) == 1
    assert odd[0]["id"] == "2/caf\\xe9-\\xff.png" and odd[0]["id_bytes"] == b"2/caf\xe9-\xff.png"
    assert odd[0]["error"] is None and odd[0]["label"] == 2
    again = ok_run(*run_args(data, digits, out, "--resume"))
    assert "31 already done (resumed)" in again.stdout
    assert read_predictions(out).num_rows == 31


def test_a_write_arrow_refuses_stops_with_exit_3_and_a_manifest_that_says_so(
    data, digits, tmp_path, monkeypatch
):
    out = tmp_path / "o"
    real = pq.write_table
    calls = {"n": 0}

    def refuse_second_part(table, where, **options):
        calls["n"] += 1
        if calls["n"] == 2:
            raise pa.ArrowInvalid("simulated: a value Parquet cannot hold")
        return real(table, where, **options)

    monkeypatch.setattr(pq, "write_table", refuse_second_part)
    result = invoke(*run_args(data, digits, out, "--part-rows", "10", "--cores", "0"))
    assert result.exit_code == 3, result.output
    assert "simulated" in result.stderr and "Traceback" not in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "simulated" in manifest["error"]
    # The refused part's rows stayed buffered and were written as the run stopped.
    assert manifest["counts"]["rows_on_disk"] == read_predictions(out).num_rows == 20
    monkeypatch.setattr(pq, "write_table", real)
    again = ok_run(*run_args(data, digits, out, "--resume"))
    assert "20 already done (resumed)" in again.stdout
    assert sorted(read_predictions(out)["index"].to_pylist()) == list(range(30))


def test_resume_keeps_each_invocations_stats_and_adds_none_when_nothing_is_left(
    data, digits, tmp_path
):
    out = tmp_path / "o"
    first = invoke(
        *run_args(data, digits, out, "--max-attempts", "1", "--sim-fault", "none:item=3")
    )
    assert first.exit_code == 1, first.output
    ok_run(*run_args(data, digits, out, "--resume"))  # redoes item 3 only
    ok_run(*run_args(data, digits, out, "--resume"))  # nothing left
    stats = pq.read_table(out / "core_stats.parquet").to_pylist()
    totals = {r["invocation"]: r for r in stats if r["core"] is None}
    assert sorted(totals) == [0, 1], "the third invocation had nothing to do: no rows"
    assert (totals[0]["items"], totals[0]["errors"], totals[1]["items"]) == (30, 1, 1)
    timeline = pq.read_table(out / "timeline.parquet")
    assert set(timeline["invocation"].to_pylist()) == {0, 1}
    manifest = json.loads((out / "manifest.json").read_text())
    assert [i["status"] for i in manifest["invocations"]] == ["complete"] * 3
    assert [i["counts"]["written"] for i in manifest["invocations"]] == [30, 1, 0]
    assert manifest["counts"]["rows_on_disk"] == 30 and manifest["counts"]["errors_on_disk"] == 0


# --------------------------------------------------------------------------------- signals
@pytest.mark.slow  # over 0.75 s: the default tier's 90 s (docs/contributing.md)
def test_sighup_stops_like_sigterm_and_the_run_resumes(demo_kit, tmp_path):
    out = tmp_path / "o"
    proc = _start(
        demo_kit.dataset, demo_kit.models["digits"], out,
        "--cores", "0", "--sim-npu-ms", "3", "--part-rows", "40",
    )  # fmt: skip
    _wait_for(proc, "started:")
    deadline = time.monotonic() + 60
    while not list((out / "predictions").glob("part-*.parquet")):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)  # no event marks a part landing; see _wait_for_first_part
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "SIGHUP" in err and "Traceback" not in err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert manifest["counts"]["rows_on_disk"] == read_predictions(out).num_rows > 0


def test_ctrl_c_while_the_dataset_is_listed_exits_130(data, digits, tmp_path, monkeypatch):
    import batchinfer.engine.planning.plan as plan

    real = plan.open_source

    def listing_interrupted(root, **options):
        os.kill(os.getpid(), signal.SIGINT)  # delivered before the next bytecode
        return real(root, **options)

    monkeypatch.setattr(plan, "open_source", listing_interrupted)
    result = invoke(*run_args(data, digits, tmp_path / "o"))
    assert result.exit_code == 130, result.output
    assert "interrupted by SIGINT before the run started" in result.stderr
    assert "Aborted" not in result.output and not (tmp_path / "o").exists()


def test_braces_in_a_folder_name_are_said_as_they_are(data, digits, tmp_path):
    """A path with braces is the user's text, not a setting: "{model}" was once said as
    "--model" (messages read braces in plain text as setting templates)."""
    home = tmp_path / "{model}" / "out"
    home.mkdir(parents=True)
    (home / "notes.txt").write_text("mine\n")
    line = refused(invoke(*run_args(data, digits, home, "--resume")), "not a batchinfer run")
    assert str(home) in line
    assert (home / "notes.txt").read_text() == "mine\n"
