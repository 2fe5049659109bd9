"""Plug-in tasks (issue 41 item 5): the docs' worked example run end to end through the core
workers, and every way a plug-in can be wrong: refused at start-up with one line, or that
item's error row (never a worker's death, never a lost row)."""

from __future__ import annotations

import pickle
import re
import sys
from pathlib import Path

import models as M
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from test_cli import FAST_SIM, assert_error, invoke

from batchinfer.results import read_predictions, read_run

ROOT = Path(__file__).resolve().parents[1]
DIM = 16


def _docs_example(folder: Path) -> Path:
    """The plug-in of docs/guide/tasks.md, as the page shows it, written to ``folder``."""
    page = (ROOT / "docs" / "guide" / "tasks.md").read_text()
    code = re.search(r"<!-- docs-runner: file embeddings.py -->\n```python\n(.*?)```", page, re.S)
    assert code is not None
    path = folder / "embeddings.py"
    path.write_text(code.group(1))
    return path


def _dataset(folder: Path, n: int = 5) -> tuple[Path, dict[str, np.ndarray]]:
    """``n`` 8x8 grey images, and each one's pixels (NHWC uint8) by file name."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(3)
    pixels = {}
    for i in range(n):
        a = rng.integers(0, 256, (8, 8), dtype=np.uint8)
        Image.fromarray(a, "L").save(folder / f"{i}.png")
        pixels[f"{i}.png"] = a.reshape(1, 8, 8, 1)
    return folder, pixels


def _run(tmp_path: Path, task: str, *extra: str):
    model = M.nhwc_uint8_model(tmp_path, classes=DIM)
    data, pixels = _dataset(tmp_path / "data")
    out = tmp_path / "out"
    args = ["run", data, "--model", model, "--out", out, "--task", task, *FAST_SIM, *extra]
    return invoke(*args), out, pixels


def test_the_docs_example_stores_embeddings_decoded_in_the_core_workers(tmp_path):
    plugin = _docs_example(tmp_path)
    result, out, pixels = _run(tmp_path, f"{plugin}:Embeddings")
    assert result.exit_code == 0, result.output
    table = read_predictions(out)
    assert table.num_rows == len(pixels) and table.column("error").null_count == len(pixels)
    for row in table.to_pylist():
        want = M.nhwc_uint8_reference(pixels[Path(row["id"]).name], classes=DIM)[0]
        np.testing.assert_allclose(row["norm"], np.linalg.norm(want), rtol=1e-4)
        np.testing.assert_allclose(row["embedding"], want / np.linalg.norm(want), atol=1e-5)
    record = read_run(out).manifest.raw["task"]
    assert record["task"] == "embeddings" and record["reference"] == f"{plugin}:Embeddings"
    decoded = read_run(out).manifest.raw["detect"]  # decoded in the workers, and timed
    assert decoded["items_decoded"] == len(pixels)
    [part] = (out / "predictions").glob("part-*.parquet")
    assert pq.read_schema(part).field("embedding").type.value_type == pa.float32()


def test_a_plugin_task_travels_to_the_workers_by_reference(tmp_path):
    """The class is imported again from its file on the other side, never pickled code."""
    from batchinfer.options import DetectOptions
    from batchinfer.tasks import plan_task, plugin

    file = _docs_example(tmp_path)
    model = M.nhwc_uint8_model(tmp_path, classes=DIM)
    task = plan_task(DetectOptions(task=f"{file}:Embeddings"), model, (8, 8))
    data = pickle.dumps(task)
    assert b"linalg" not in data and str(file).encode() in data
    plugin._loaded.clear()  # as in a process that never loaded it
    for name in [m for m in sys.modules if m.startswith("batchinfer_task_")]:
        del sys.modules[name]
    again = pickle.loads(data)
    assert type(again) is not type(task) and type(again).__name__ == "Embeddings"
    assert again.reason == task.reason and again.fields() == task.fields()


BAD = """
import pyarrow as pa
from batchinfer.tasks import Task

class Fine(Task):
    name = "fine"
    @classmethod
    def recognise(cls, facts, options, asked):
        return cls()
    def fields(self):
        return [pa.field("v", pa.float32())]
    def decode(self, outputs, placed):
        return {"v": float(outputs[0].sum())}

class NoTask:
    pass

class Raises(Fine):
    @classmethod
    def recognise(cls, facts, options, asked):
        raise RuntimeError("no model for me")

class Declines(Fine):
    @classmethod
    def recognise(cls, facts, options, asked):
        return None

class Clash(Fine):
    def fields(self):
        return [pa.field("error", pa.string())]

class DecodeRaises(Fine):
    def decode(self, outputs, placed):
        raise ValueError("bad luck")

class Unpicklable(Fine):
    def decode(self, outputs, placed):
        return {"v": lambda: 1}

class Unstorable(Fine):
    def decode(self, outputs, placed):
        return {"v": "not a number"}
"""


@pytest.fixture
def bad_file(tmp_path) -> Path:
    path = tmp_path / "bad.py"
    path.write_text(BAD)
    return path


@pytest.mark.parametrize(
    ("what", "needle"),
    [
        ("nowhere.py:Fine", "no such file"),
        ("no_such_package_xyz.mod:Fine", "no module 'no_such_package_xyz'"),
        ("{bad}:Missing", "has no Missing"),
        ("{bad}:NoTask", "not a batchinfer.tasks.Task subclass"),
        ("{bad}:Raises", "its recognise() raised RuntimeError: no model for me"),
        ("{bad}:Declines", "its recognise() said no"),
        ("{bad}:Clash", "its field 'error' is a column batchinfer writes"),
        ("{boom}:Fine", "importing it failed: ZeroDivisionError"),
        ("segment", "--task segment: The model's outputs ((1, 16), for a 8x8 input) are not"),
        ("bogus", "'bogus' is no task"),
    ],
)
def test_a_plugin_that_cannot_run_is_refused_at_start_up_in_one_line(
    tmp_path, bad_file, what, needle
):
    boom = tmp_path / "boom.py"
    boom.write_text("1 / 0\n")
    task = what.format(bad=bad_file, boom=boom)
    result, out, _ = _run(tmp_path, task)
    assert_error(result, 2, needle)
    assert not (out / "predictions").exists() or not list((out / "predictions").iterdir())


@pytest.mark.parametrize(
    ("cls", "needle"),
    [
        ("DecodeRaises", "decoding the outputs failed: ValueError: bad luck"),
        ("Unpicklable", "cannot be sent back from the core worker"),
        ("Unstorable", "its v 'not a number' cannot be stored"),
    ],
)
def test_a_plugin_whose_decode_fails_gives_that_items_error_row(tmp_path, bad_file, cls, needle):
    result, out, pixels = _run(tmp_path, f"{bad_file}:{cls}")
    assert result.exit_code == 1, result.output  # the run ends, with error rows
    table = read_predictions(out)
    assert sorted(Path(i).name for i in table.column("id").to_pylist()) == sorted(pixels)
    errors = table.column("error").to_pylist()
    assert len(errors) == len(pixels) and all(e and needle in e for e in errors), errors
    assert table.column("v").null_count == len(pixels)


def test_an_installed_plugin_is_found_by_its_entry_point_name(tmp_path, bad_file, monkeypatch):
    from batchinfer.tasks import plugin

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugin, "entry_point", lambda name: "bad:Fine" if name == "fine" else None)
    result, out, pixels = _run(tmp_path, "fine")
    assert result.exit_code == 0, result.output
    values = read_predictions(out).column("v").to_pylist()
    assert len(values) == len(pixels) and None not in values
