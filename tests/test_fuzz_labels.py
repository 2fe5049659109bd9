"""Fuzz tier: labels files (``--labels``, ``dataset.labels``; batchinfer/data/classes.py).
Text and JSON of every shape (repeated, empty, hidden and unicode names, NULs, labels
negative or past what the predictions' int64 column holds, nested values) is a class map
or a one-line usage error, under a memory bound (tests/fuzz_support.py)."""

from __future__ import annotations

import json
import os

import pytest
from fuzz_support import (
    assert_clean,
    fuzz,
    ints,
    json_values,
    nasty_text,
    nested,
    run_bounded,
)
from hypothesis import example, given
from hypothesis import strategies as st

from batchinfer.data.classes import read_labels_file

INT64_MAX = 2**63 - 1


def _read(path: str) -> dict[str, int]:
    return read_labels_file(path).labels


def check_map(outcome) -> None:
    assert_clean(outcome)
    if outcome.kind == "ok":
        for name, label in outcome.value.items():
            assert type(label) is int and 0 <= label <= INT64_MAX, (name, label)
            assert name and "/" not in name and not name.startswith("."), name


@fuzz
@given(lines=st.lists(nasty_text, max_size=8), ending=st.sampled_from(["\n", "\r\n", "\r", ""]))
def test_text_labels_files(tmp_path_factory, lines, ending):
    path = tmp_path_factory.mktemp("txt") / "labels.txt"
    path.write_bytes(ending.join(lines).encode("utf-8", "surrogatepass") + ending.encode())
    check_map(run_bounded(lambda: _read(str(path))))


json_labels = st.one_of(
    st.lists(st.one_of(nasty_text, json_values), max_size=6),
    st.dictionaries(nasty_text, st.one_of(ints, json_values), max_size=6),
    st.dictionaries(
        st.one_of(ints.map(str), nasty_text),
        st.lists(st.one_of(nasty_text, json_values), min_size=1, max_size=2),
        max_size=6,
    ),
    json_values,
)


@fuzz
@example(data={"cat": 2**63})  # was taken as label 2**63, which no int64 column holds
@example(data={"0": ["cat"], "99999999999999999999": ["dog"]})
@given(data=json_labels)
def test_json_labels_files(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("json") / "labels.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    check_map(run_bounded(lambda: _read(str(path))))


@fuzz
@example(data=b"[" + b"9" * 5000 + b"]", suffix=".json")  # more digits than int() converts
@given(data=st.binary(max_size=200), suffix=st.sampled_from([".txt", ".json", ""]))
def test_labels_files_of_any_bytes(tmp_path_factory, data, suffix):
    path = tmp_path_factory.mktemp("bytes") / f"labels{suffix}"
    path.write_bytes(data)
    check_map(run_bounded(lambda: _read(str(path))))


# --------------------------------------------------------------------------- issue 40 defects


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_labels_file_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    path = tmp_path / "labels.txt"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(kind)
    outcome = run_bounded(lambda: _read(str(path)), memory=128 << 20, timeout=1)
    assert outcome.kind == "usage" and "not a regular file" in outcome.error, str(outcome)


def test_a_deeply_nested_json_labels_file_is_a_usage_error(tmp_path):
    path = tmp_path / "labels.json"
    path.write_text(nested(100_000))
    outcome = run_bounded(lambda: _read(str(path)))
    assert outcome.kind == "usage", str(outcome)
