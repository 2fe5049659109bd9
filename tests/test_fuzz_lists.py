"""Fuzz tier: list files (.txt, .csv, .jsonl, .parquet; batchinfer/data/manifest.py and
listed.py). Every generated list is a one-line usage error or items, each row exactly once,
under a memory bound (tests/fuzz_support.py)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fuzz_support import (
    assert_clean,
    fuzz,
    ints,
    json_values,
    nasty_paths,
    nasty_text,
    nested,
    run_bounded,
)
from hypothesis import example, given
from hypothesis import strategies as st

from batchinfer.data.sources import open_source
from batchinfer.errors import DatasetError

INT64_MAX = 2**63 - 1

# Paths a .txt list can hold one a line: no whitespace (a last word that is an integer is
# a label), not a comment.
txt_paths = st.text(
    st.characters(blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc")), min_size=1, max_size=20
).filter(lambda s: not s.startswith("#") and s.strip() == s and s.isprintable())
labels = st.one_of(st.none(), ints)


def _read(path: Path) -> dict[str, object]:
    """What a run sees of the list: its length, its items (id, label), and whether the
    found-files check passes."""
    ds = open_source(path)
    items = [(item.id, item.label, item.path) for item in ds.iter_from()]
    found = None
    try:
        ds.check_found()
    except DatasetError as exc:
        found = str(exc)
    return {"count": len(ds), "items": items, "found": found}


def check_once(outcome, entries: int | None) -> None:
    """A clean outcome; when the list was read, every entry is one item with a unique id."""
    assert_clean(outcome)
    if outcome.kind != "ok":
        return
    got = outcome.value
    ids = [i[0] for i in got["items"]]
    assert len(ids) == len(set(ids)), f"repeated ids: {ids}"
    assert got["count"] == len(ids)
    if entries is not None:
        assert len(ids) == entries


def _write_txt(folder: Path, rows: list[tuple[str, int | None]]) -> Path:
    lines = [p if label is None else f"{p} {label}" for p, label in rows]
    path = folder / "list.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@fuzz
@given(rows=st.lists(st.tuples(txt_paths, st.one_of(st.none(), st.integers(0, 2**62))), max_size=8))
def test_txt_lists(tmp_path_factory, rows):
    folder = tmp_path_factory.mktemp("txt")
    path = _write_txt(folder, rows)
    check_once(run_bounded(lambda: _read(path)), len(rows))


csv_rows = st.lists(
    st.fixed_dictionaries(
        {"path": nasty_paths},
        optional={"id": nasty_text, "label": st.one_of(nasty_text, ints.map(str)), "x": nasty_text},
    ),
    max_size=8,
)


@fuzz
@given(rows=csv_rows, header=st.sampled_from(["path", "path,id", "path,id,label,x", "id,path,x"]))
def test_csv_lists(tmp_path_factory, rows, header):
    folder = tmp_path_factory.mktemp("csv")
    columns = header.split(",")
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(columns)
    for row in rows:
        writer.writerow([row.get(c, "") for c in columns])
    path = folder / "list.csv"
    path.write_text(text.getvalue(), encoding="utf-8")
    check_once(run_bounded(lambda: _read(path)), len(rows))


jsonl_rows = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"path": st.one_of(nasty_paths, json_values)},
            optional={"id": json_values, "label": st.one_of(labels, json_values), "x": json_values},
        ),
        json_values,  # a line that is not an object: its own error row
    ),
    max_size=8,
)


@fuzz
@given(rows=jsonl_rows)
def test_jsonl_lists(tmp_path_factory, rows):
    folder = tmp_path_factory.mktemp("jsonl")
    path = folder / "list.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    check_once(run_bounded(lambda: _read(path)), len(rows))


@fuzz
@example(data=b'{"path": "b.png", "x": ' + b"9" * 5000 + b"}\n", form="jsonl")  # int() refuses
@given(data=st.binary(max_size=300), form=st.sampled_from(["txt", "csv", "jsonl", "parquet"]))
def test_lists_of_any_bytes(tmp_path_factory, data, form):
    """Bytes that are no list at all (or a valid list with bytes spliced in)."""
    folder = tmp_path_factory.mktemp("bytes")
    path = folder / f"list.{form}"
    path.write_bytes(
        {"csv": b"path,label\n", "jsonl": b'{"path": "a.png"}\n'}.get(form, b"") + data
    )
    check_once(run_bounded(lambda: _read(path)), None)


parquet_columns = st.fixed_dictionaries(
    {"path": st.sampled_from([pa.string(), pa.large_string(), pa.int64(), pa.binary()])},
    optional={
        "id": st.sampled_from([pa.string(), pa.int64(), pa.uint64(), pa.float64()]),
        "label": st.sampled_from([pa.int64(), pa.uint64(), pa.string(), pa.float32(), pa.int8()]),
        "x": st.sampled_from([pa.string(), pa.int64(), pa.list_(pa.int32())]),
    },
)


@st.composite
def parquet_tables(draw):
    types = draw(parquet_columns)
    n = draw(st.integers(0, 6))
    data = {}
    for name, t in types.items():
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            values = draw(st.lists(st.one_of(st.none(), nasty_paths), min_size=n, max_size=n))
        elif pa.types.is_binary(t):
            values = draw(st.lists(st.binary(max_size=8), min_size=n, max_size=n))
        elif pa.types.is_list(t):
            values = draw(
                st.lists(st.lists(st.integers(-5, 5), max_size=3), min_size=n, max_size=n)
            )
        elif pa.types.is_floating(t):
            values = draw(st.lists(st.floats(width=32), min_size=n, max_size=n))
        else:
            lo, hi = (0, 2**64 - 1) if t == pa.uint64() else (-(2**63), INT64_MAX)
            if t == pa.int8():
                lo, hi = -128, 127
            values = draw(
                st.lists(
                    st.one_of(st.none(), st.integers(max(lo, -3), 20), st.sampled_from([lo, hi])),
                    min_size=n,
                    max_size=n,
                )
            )
        data[name] = pa.array(values, type=t)
    return pa.table(data), n


@fuzz
@given(table=parquet_tables())
def test_parquet_lists(tmp_path_factory, table):
    folder = tmp_path_factory.mktemp("parquet")
    path = folder / "list.parquet"
    pq.write_table(table[0], path)
    check_once(run_bounded(lambda: _read(path)), table[1])


# --------------------------------------------------------------------------- issue 40 defects


@pytest.mark.parametrize("form", ["txt", "csv", "jsonl"])
@pytest.mark.parametrize("label", [2**63, 2**64, 10**30])
def test_a_label_arrow_cannot_hold_is_refused_or_an_error_row(tmp_path, form, label):
    """A label the predictions' int64 column cannot hold must never reach the sink."""
    (tmp_path / "a.png").write_bytes(b"")
    path = tmp_path / f"list.{form}"
    path.write_text(
        {
            "txt": f"a.png {label}\n",
            "csv": f"path,label\na.png,{label}\n",
            "jsonl": json.dumps({"path": "a.png", "label": label}) + "\n",
        }[form]
    )
    outcome = run_bounded(lambda: _read(path))
    assert_clean(outcome)
    if outcome.kind == "ok":
        for _, got, where in outcome.value["items"]:
            assert got is None or got <= INT64_MAX, f"label {got} reaches the sink ({where})"


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_a_deeply_nested_jsonl_line_is_its_error_row(tmp_path, kind):
    path = tmp_path / "list.jsonl"
    path.write_text('{"path": "a.png"}\n' + nested(100_000, kind) + "\n")
    outcome = run_bounded(lambda: _read(path))
    check_once(outcome, 2)
    assert outcome.kind == "ok"


@pytest.mark.parametrize("form", ["txt", "csv", "jsonl", "parquet"])
def test_a_fifo_named_as_a_list_is_refused_in_one_line(tmp_path, form):
    import os

    path = tmp_path / f"list.{form}"
    os.mkfifo(path)
    outcome = run_bounded(lambda: _read(path), timeout=1)
    assert outcome.kind == "usage", str(outcome)
    assert "not a regular file" in outcome.error or "FIFO" in outcome.error, outcome.error
