"""Fuzz tier: eval job files (batchinfer/evaluate/job.py). A valid job is written with keys
changed to values of every type (huge integers, inf and nan, unicode, NULs, nested arrays
and tables, unknown keys); loading it is a job or a one-line usage error naming the file,
under a memory bound (tests/fuzz_support.py)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from fuzz_support import assert_clean, fuzz, ints, nasty_paths, nasty_text, run_bounded
from hypothesis import example, given
from hypothesis import strategies as st

from batchinfer.evaluate.job import load_job

BASE: dict[str, dict[str, object]] = {
    "": {"name": "fuzz"},
    "device": {"model": "m.onnx"},
    "device.runtime": {"backend": "sim", "cores": [0, 1, 2], "instances_per_core": 2},
    "reference": {"model": "m.onnx"},
    "reference.runtime": {"backend": "onnx"},
    "dataset": {"path": "ds"},
    "metrics": {"topk": 5, "worst": 12},
    "gates.top1": {"min": 0.95, "max_drop": 0.005, "alpha": 0.05},
    "gates.errors": {"max": 0},
    "output": {"dir": "out"},
}
KEYS = [(t, k) for t, keys in BASE.items() for k in keys] + [
    ("", "task"),
    ("dataset", "limit"),
    ("dataset", "labels"),
    ("dataset", "ground_truth"),
    ("dataset", "image_root"),
    ("device.runtime", "slots"),
    ("device.preprocess", "mean"),
    ("device.preprocess", "size"),
    ("metrics", "custom"),
    ("metrics", "bootstrap"),
    ("gates.top1", "min_ratio_to_reference"),
    ("gates.nope", "min"),
    ("output", "history"),
    ("", "unknown"),
]


def toml_value(value: object) -> str:
    """``value`` as TOML (inline tables for dicts; TOML has no null: an empty string)."""
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else ("inf" if value > 0 else "-inf")
            if math.isinf(value)
            else repr(value)
        )
    if isinstance(value, str):
        return json.dumps(value)  # JSON's escapes are TOML's basic string escapes
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def render(tables: dict[str, dict[str, object]]) -> str:
    lines = []
    for table, keys in tables.items():
        if table:
            lines.append(f"[{table}]")
        lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


toml_values = st.recursive(
    st.one_of(
        st.booleans(),
        ints,
        st.floats(),
        nasty_text.filter(lambda s: "\x7f" not in s),
        nasty_paths.filter(lambda s: "\x7f" not in s),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text("abc_", min_size=1, max_size=3), inner, max_size=3),
    ),
    max_leaves=6,
)


def _folder(folder: Path) -> Path:
    (folder / "m.onnx").write_bytes(b"")
    (folder / "ds" / "0").mkdir(parents=True)
    return folder


def _load(path: Path) -> str:
    return repr(load_job(path).name)


@fuzz
@given(changes=st.lists(st.tuples(st.sampled_from(KEYS), toml_values), max_size=4))
def test_jobs_with_keys_of_any_value(tmp_path_factory, changes):
    folder = _folder(tmp_path_factory.mktemp("job"))
    tables = {t: dict(keys) for t, keys in BASE.items()}
    for (table, key), value in changes:
        tables.setdefault(table, {})[key] = value
    path = folder / "job.toml"
    path.write_text(render(tables), encoding="utf-8")
    assert_clean(run_bounded(lambda: _load(path)))


@fuzz
@example(data=b"a = " + b"9" * 5000)  # more digits than int() converts: a ValueError
@example(data=b"a = " + b"[" * 5000 + b"]" * 5000)  # was a RecursionError traceback
@example(data=b"a = " + b"{b=" * 5000 + b"1" + b"}" * 5000)
@given(data=st.binary(max_size=300))
def test_jobs_of_any_bytes(tmp_path_factory, data):
    folder = _folder(tmp_path_factory.mktemp("bytes"))
    path = folder / "job.toml"
    path.write_bytes(render(BASE).encode() + data)
    outcome = run_bounded(lambda: _load(path))
    assert_clean(outcome)
    if outcome.kind == "usage":
        assert str(path) in outcome.error


# --------------------------------------------------------------------------- issue 40 defects


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_job_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    path = tmp_path / "job.toml"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    outcome = run_bounded(lambda: _load(path), timeout=1)
    assert outcome.kind == "usage" and "not a regular file" in outcome.error, str(outcome)
