"""The output folder's owner (batchinfer.sink.output_folder): its stages, and the second
look under the lock, which sees an OUT changed between planning and running.

No engine runs here: a run is begun and finished with no rows, as a run that was
interrupted before its first row would be.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from batchinfer.errors import OutputExistsError, OutputLockedError, UsageError
from batchinfer.options import OutputOptions
from batchinfer.sink.out_lock import lock_holder
from batchinfer.sink.outdir import OutLock
from batchinfer.sink.output_folder import OutputFolder, Stage
from batchinfer.sink.run_folder import RunEnd
from batchinfer.sink.stats import CoreStatsRecorder

FINGERPRINT = {"model_sha256": "a" * 64, "topk": 5}


def _options(out: Path, **kw) -> OutputOptions:
    return OutputOptions(out=out, **kw)


def _looked(out: Path, fingerprint: dict = FINGERPRINT, **kw) -> OutputFolder:
    folder = OutputFolder.look(out, _options(out, **kw), command="test")
    folder.accept(fingerprint)
    return folder


def _finish(folder: OutputFolder, status: str = "complete") -> str:
    recorder = CoreStatsRecorder([0], 1, folder.invocation)
    status, error, _ = folder.finish(RunEnd(status, None, recorder, {}, {}))
    assert error is None
    return status


def _a_run(out: Path, fingerprint: dict = FINGERPRINT, **kw) -> None:
    """A finished run (no rows) in ``out``, as another invocation would leave it."""
    folder = _looked(out, fingerprint, **kw).begin({"command": "earlier"}, save_outputs=False)
    _finish(folder)


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def test_a_folder_goes_planned_running_finished_and_holds_the_lock_only_while_running(
    tmp_path,
):
    out = tmp_path / "o"
    folder = _looked(out)
    assert folder.stage is Stage.PLANNED and not out.exists()  # planning changes nothing
    with folder.begin({"command": "test"}, save_outputs=False) as running:
        assert running.stage is Stage.RUNNING
        assert lock_holder(out)["command"] == "test"
        assert _manifest(out)["status"] == "running"
        assert _manifest(out)["fingerprint"] == FINGERPRINT
        assert running.invocation == 0 and running.done_below(10) == 0
        assert running.skip() is None
        with pytest.raises(RuntimeError, match="already running"):
            running.begin({}, save_outputs=False)
        assert _finish(running) == "complete"
        assert running.stage is Stage.FINISHED and lock_holder(out) is None
    assert _manifest(out)["status"] == "complete"


def test_an_engine_that_raises_leaves_the_folder_released_through_with(tmp_path):
    out = tmp_path / "o"
    folder = _looked(out)
    with pytest.raises(KeyError), folder.begin({}, save_outputs=False):
        assert lock_holder(out) is not None
        raise KeyError("the engine failed")
    assert folder.stage is Stage.FINISHED and lock_holder(out) is None


def test_a_run_made_in_out_after_planning_is_seen_under_the_lock_and_left_alone(tmp_path):
    out = tmp_path / "o"
    folder = _looked(out)  # planned while OUT was absent
    _a_run(out)  # another run took OUT and finished there meanwhile
    before = _manifest(out)
    with pytest.raises(OutputExistsError, match="already holds a run"):
        folder.begin({}, save_outputs=False)
    assert _manifest(out) == before  # nothing of it changed
    assert folder.stage is Stage.PLANNED and lock_holder(out) is None


def test_a_foreign_file_put_in_out_after_planning_is_seen_under_the_lock(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    folder = _looked(out)  # planned while OUT was empty
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="not empty"):
        folder.begin({}, save_outputs=False)
    assert sorted(p.name for p in out.iterdir()) == [".batchinfer.lock", "notes.txt"]


def test_a_run_resumed_with_other_settings_after_planning_is_refused_under_the_lock(tmp_path):
    out = tmp_path / "o"
    _a_run(out)
    folder = _looked(out, resume=True)  # planning: the same run, so far
    # Meanwhile the folder was overwritten by a run with another fingerprint.
    _a_run(out, {**FINGERPRINT, "topk": 3}, overwrite=True)
    with pytest.raises(UsageError, match=r"topk.* 3 → 5"):
        folder.begin({}, save_outputs=False)
    assert _manifest(out)["fingerprint"]["topk"] == 3 and lock_holder(out) is None


def test_a_resume_planned_against_another_fingerprint_is_refused_at_planning(tmp_path):
    out = tmp_path / "o"
    _a_run(out)
    with pytest.raises(UsageError, match="made with a different"):
        _looked(out, {**FINGERPRINT, "topk": 3}, resume=True)


def test_out_taken_by_another_run_after_planning_is_refused_naming_it(tmp_path):
    out = tmp_path / "o"
    folder = _looked(out)
    with (
        OutLock(out, command="the other run"),
        pytest.raises(OutputLockedError, match="the other run"),
    ):
        folder.begin({}, save_outputs=False)
    assert folder.stage is Stage.PLANNED


def test_a_resume_continues_the_manifest_as_the_next_invocation(tmp_path):
    out = tmp_path / "o"
    _a_run(out)
    run_id = _manifest(out)["run_id"]
    with _looked(out, resume=True).begin({"command": "again"}, save_outputs=False) as folder:
        assert folder.invocation == 1
        _finish(folder)
    manifest = _manifest(out)
    assert manifest["run_id"] == run_id and len(manifest["invocations"]) == 2


def test_overwrite_planned_on_a_run_clears_only_what_the_run_wrote(tmp_path):
    out = tmp_path / "o"
    _a_run(out)
    (out / "notes.txt").write_text("mine")
    folder = _looked(out, overwrite=True)
    with folder.begin({"command": "new"}, save_outputs=False):
        _finish(folder)
    assert (out / "notes.txt").read_text() == "mine"
    assert _manifest(out)["invocations"][0]["command"] == "new"


def test_planning_refuses_resume_without_out_and_a_held_out_when_it_takes_the_lock(tmp_path):
    out = tmp_path / "o"
    with pytest.raises(UsageError, match="needs"):
        OutputFolder.look(out, dataclasses.replace(OutputOptions(), resume=True))
    folder = _looked(out, overwrite=True)  # planning does not ask
    with (
        OutLock(out, command="holder"),
        pytest.raises(OutputLockedError, match="holder"),
        folder.begin({}, save_outputs=False),
    ):
        pass
    assert folder.stage is Stage.PLANNED


def test_a_planned_run_whose_out_was_taken_meanwhile_starts_no_engine(tmp_path):
    import models as M
    from PIL import Image
    from runs import config

    from batchinfer.engine.planning.plan import plan_run
    from batchinfer.engine.plumbing.signals import StopSignals
    from batchinfer.engine.runner import run_plan

    data = tmp_path / "d"
    data.mkdir()
    Image.new("L", (8, 8)).save(data / "x.png")
    out = tmp_path / "o"
    plan = plan_run(config(data, M.nhwc_uint8_model(tmp_path), backend="onnx", out=out))
    _a_run(out)  # another run, between planning and running

    def no_engine(*args):
        raise AssertionError("an engine was made for an OUT this run may not use")

    with StopSignals() as signals, pytest.raises(OutputExistsError, match="already holds"):
        run_plan(plan, signals, make_engine=no_engine)
    assert _manifest(out)["invocations"][0]["command"] == "earlier"
    assert lock_holder(out) is None


def test_out_moved_before_the_first_row_gets_no_predictions_folder_in_the_new_one(tmp_path):
    """The row sink opens when the first core is ready, after the run has started: an OUT
    moved away before then must not get predictions/ made in the folder now at its path."""
    from batchinfer.errors import OutputLostError

    out, moved = tmp_path / "o", tmp_path / "o-moved"
    with _looked(out).begin({}, save_outputs=False) as folder:
        out.rename(moved)
        out.mkdir()  # another run's folder now, say
        with pytest.raises(OutputLostError, match="deleted, moved or replaced"):
            folder.rows.open([((1, 10), "float32")])
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    ("swap", "said"),
    [
        ("link", "was replaced by a symbolic link to"),
        ("folder", "was replaced by another folder"),
        ("gone", "was deleted or moved away"),
    ],
)
def test_a_predictions_folder_swapped_under_a_run_stops_its_next_write_saying_what_changed(
    tmp_path, swap, said
):
    from batchinfer.errors import OutputLostError

    out, victim = tmp_path / "o", tmp_path / "victim"
    victim.mkdir()
    folder = _looked(out).begin({"command": "this"}, save_outputs=False)
    folder.check_held()  # nothing changed yet
    (out / "predictions").rename(out / "moved")
    if swap == "link":
        (out / "predictions").symlink_to(victim)
    elif swap == "folder":
        (out / "predictions").mkdir()
    with pytest.raises(OutputLostError, match=said) as info:
        folder.check_held()
    assert f"its parts are in {out / 'moved'}" in str(info.value)
    recorder = CoreStatsRecorder([0], 1, folder.invocation)
    status, error, _ = folder.finish(RunEnd("complete", None, recorder, {}, {}))
    assert status == "failed" and isinstance(error, OutputLostError)
    assert list(victim.iterdir()) == []
    assert _manifest(out)["status"] == "running"  # written no more once the swap was seen


# ------------------------------------------------ a run planned while another makes OUT
# Two runs started together: the loser's planning may look at OUT while the winner, holding
# the lock, has made predictions/ but not yet its manifest (the folder looks foreign), or has
# written its "running" manifest (the folder looks like a run). Either way the loser must be
# told OUT is in use, not that it "already exists and is not empty". The winner is stopped
# between its steps by a hook on RunFolder.begin (its next step, the manifest).


def _stopped_between_steps(monkeypatch, step) -> None:
    """Call ``step()`` when a run has made predictions/ under the lock, before its manifest."""
    from batchinfer.sink import output_folder

    real = output_folder.RunFolder.begin

    def hooked(*args, **kwargs):
        step()
        return real(*args, **kwargs)

    monkeypatch.setattr(output_folder.RunFolder, "begin", hooked)


@pytest.mark.parametrize("flags", [{}, {"resume": True}, {"overwrite": True}])
def test_a_run_planned_while_another_makes_out_is_told_it_is_in_use(tmp_path, monkeypatch, flags):
    out = tmp_path / "o"
    said: list[str] = []

    def loser_plans() -> None:
        assert sorted(p.name for p in out.iterdir()) == [".batchinfer.lock", "predictions"]
        with pytest.raises(OutputLockedError) as info:
            OutputFolder.look(out, _options(out, **flags))
        said.append(str(info.value))

    _stopped_between_steps(monkeypatch, loser_plans)
    with OutputFolder.look(out, _options(out), command="the winner") as winner:
        winner.accept(FINGERPRINT)
        winner.begin({}, save_outputs=False)
        (line,) = said
        assert "in use by another batchinfer run" in line and "the winner" in line
        with pytest.raises(OutputLockedError, match="in use by another batchinfer run"):
            OutputFolder.look(out, _options(out))  # its manifest written: still in use
        _finish(winner)


def test_a_run_that_finished_while_the_loser_looked_is_judged_as_it_is_now(tmp_path, monkeypatch):
    """The loser saw the half-made folder, but by the time it asked who holds OUT the winner
    had finished: it is told what OUT holds now (a run), not what it saw."""
    import threading

    from batchinfer.sink import outdir

    out = tmp_path / "o"
    made, go = threading.Event(), threading.Event()

    def winner_waits() -> None:
        made.set()
        go.wait()

    _stopped_between_steps(monkeypatch, winner_waits)

    def winner() -> None:
        _a_run(out)

    thread = threading.Thread(target=winner)
    thread.start()
    made.wait()
    real = outdir.lock_holder

    def winner_finishes_first(path: Path) -> dict | None:
        go.set()
        thread.join()
        return real(path)

    monkeypatch.setattr(outdir, "lock_holder", winner_finishes_first)
    try:
        with pytest.raises(OutputExistsError, match="already holds a run"):
            OutputFolder.look(out, _options(out))
    finally:
        go.set()
        thread.join()
    assert _manifest(out)["status"] == "complete"


def test_a_resume_planned_on_a_run_another_has_begun_is_told_it_is_in_use(tmp_path):
    # The other run overwrote OUT with other settings and runs there now: this resume's
    # look passes (a run), its fingerprint does not match, and OUT is in use.
    out = tmp_path / "o"
    _a_run(out)
    with _looked(out, overwrite=True, fingerprint={**FINGERPRINT, "topk": 3}).begin(
        {"command": "the other run"}, save_outputs=False
    ) as other:
        folder = OutputFolder.look(out, _options(out, resume=True))
        with pytest.raises(OutputLockedError, match="in use by another batchinfer run"):
            folder.accept(FINGERPRINT)
        _finish(other)
    with pytest.raises(UsageError, match="made with a different"):
        folder.accept(FINGERPRINT)  # once it has finished: the run it is
