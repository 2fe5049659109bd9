"""A run writes only into the folders it opened when it began (issue 40, item 4).

OUT/predictions swapped for a symbolic link to another folder while a run writes, or
while ``--overwrite`` deletes the run it replaces: the run must create, change or delete
nothing in that folder, and stop with exit 3 saying what changed. Every swap happens at
a point the test chooses (right after a part is written, at the first delete, between
the delete and the first write), never after a sleep.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from batchinfer.cli import main
from batchinfer.results import read_predictions
from batchinfer.sink import output_folder
from batchinfer.sink.predictions import PredictionWriter

FAST = ["--backend", "sim", "--sim-npu-ms", "0.2", "--sim-host-ms", "0", "--no-progress"]


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


def run_args(dataset: Path, model: Path, out: Path, *extra: str) -> list:
    return ["run", dataset, "--model", model, "--out", out, *FAST, "--part-rows", "10", *extra]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every entry under ``folder`` (hidden ones too) -> its bytes (None for a folder)."""
    return {
        str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes())
        for p in sorted(folder.rglob("*"))
    }


@pytest.fixture
def data(demo_kit, tmp_path) -> Path:
    """30 demo digits (three classes of ten): three parts of 10 rows."""
    root = tmp_path / "data"
    for label in ("0", "1", "2"):
        (root / label).mkdir(parents=True)
        for png in sorted((demo_kit.dataset / label).iterdir())[:10]:
            shutil.copy(png, root / label / png.name)
    return root


@pytest.fixture
def digits(demo_kit) -> Path:
    return demo_kit.models["digits"]


@pytest.fixture
def victim(tmp_path) -> Path:
    """Someone else's folder whose files have the names a run writes."""
    folder = tmp_path / "victim"
    folder.mkdir()
    for n in range(4):
        (folder / f"part-{n:05d}.parquet").write_bytes(f"the victim's part {n}".encode())
    (folder / "notes.txt").write_text("the victim's notes")
    return folder


def swap_for_link(out: Path, victim: Path) -> None:
    """What an attacker (or a careless script) does: OUT/predictions becomes a link."""
    if (out / "predictions").exists():
        os.rename(out / "predictions", out / "predictions.moved")
    os.symlink(victim, out / "predictions")


def error_line(result: Result) -> str:
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_predictions_swapped_for_a_link_mid_run_gets_nothing_and_the_run_stops_with_exit_3(
    data, digits, tmp_path, victim, monkeypatch
):
    out = tmp_path / "o"
    real_flush = PredictionWriter.flush

    def flush_then_swap(self):
        path = real_flush(self)
        if path is not None and path.name == "part-00000.parquet":
            swap_for_link(out, victim)  # the first part is in place; two are to come
        return path

    monkeypatch.setattr(PredictionWriter, "flush", flush_then_swap)
    before = snapshot(victim)
    result = invoke(*run_args(data, digits, out, "--cores", "0"))
    assert snapshot(victim) == before, "the run wrote through the link"
    assert result.exit_code == 3, result.output
    line = error_line(result)
    assert f"{out / 'predictions'} was replaced by a symbolic link to {victim}" in line
    assert f"its parts are in {out / 'predictions.moved'}" in line
    assert "--resume" in line
    # The run's own folder, wherever it went, holds only what the run wrote before the swap.
    assert sorted(os.listdir(out / "predictions.moved")) == ["part-00000.parquet"]
    assert json.loads((out / "manifest.json").read_text())["status"] == "running"

    # Put the folder back, as the message says, and the run continues where it stopped.
    monkeypatch.setattr(PredictionWriter, "flush", real_flush)
    os.unlink(out / "predictions")
    os.rename(out / "predictions.moved", out / "predictions")
    again = invoke(*run_args(data, digits, out, "--resume"))
    assert again.exit_code == 0, again.output
    assert "10 already done (resumed)" in again.stdout
    assert sorted(read_predictions(out)["index"].to_pylist()) == list(range(30))
    assert snapshot(victim) == before


@pytest.mark.parametrize("when", ["at the first delete", "between delete and write"])
def test_overwrite_deletes_and_writes_nothing_through_a_link_swapped_in_meanwhile(
    data, digits, tmp_path, victim, monkeypatch, when
):
    out = tmp_path / "o"
    assert invoke(*run_args(data, digits, out)).exit_code == 0  # the run to be replaced
    swapped = []
    if when == "at the first delete":
        real_unlink = os.unlink

        def unlink(path, *args, **kwargs):
            if not swapped and os.path.basename(path) == "part-00000.parquet":
                swapped.append(path)
                swap_for_link(out, victim)
            return real_unlink(path, *args, **kwargs)

        monkeypatch.setattr(os, "unlink", unlink)
    else:
        real_clear = output_folder.clear_run

        def clear_then_swap(*args, **kwargs):
            real_clear(*args, **kwargs)
            swapped.append(True)
            swap_for_link(out, victim)

        monkeypatch.setattr(output_folder, "clear_run", clear_then_swap)
    before = snapshot(victim)
    result = invoke(*run_args(data, digits, out, "--overwrite"))
    assert swapped, "the swap never happened: the test did not test anything"
    assert snapshot(victim) == before, "the run deleted or wrote through the link"
    assert result.exit_code == 3, result.output
    line = error_line(result)
    assert f"{out / 'predictions'} was replaced by a symbolic link to {victim}" in line
