"""Fuzz tier: Ultralytics data.yaml (batchinfer/data/yolo_yaml.py). Every generated
data.yaml (keys of every type, paths that climb out, YAML's own tags and aliases) and every
split list it names is a one-line usage error or its images, each one item with a unique
id, under a memory bound (tests/fuzz_support.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from fuzz_support import assert_clean, fuzz, json_values, nasty_text, run_bounded
from hypothesis import example, given
from hypothesis import strategies as st

from batchinfer.data.sources import open_source

PNG = b"\x89PNG\r\n\x1a\n"


def _kit(folder: Path) -> Path:
    """images/a.png, images/sub/b.png and a split list val.txt naming both."""
    (folder / "images" / "sub").mkdir(parents=True)
    (folder / "images" / "a.png").write_bytes(PNG)
    (folder / "images" / "sub" / "b.png").write_bytes(PNG)
    (folder / "val.txt").write_text("./images/a.png\nimages/sub/b.png\n")
    return folder


def _read(path: str) -> dict[str, object]:
    ds = open_source(path)
    return {"count": len(ds), "ids": [item.id for item in ds.iter_from()]}


def check_once(outcome) -> None:
    assert_clean(outcome)
    if outcome.kind == "ok":
        ids = outcome.value["ids"]
        assert len(ids) == len(set(ids)) == outcome.value["count"]


# Split names: the kit's, ones that do not exist, climb out, are not UTF-8-safe, or name
# a file that is not a list. Never the file system's root: walking all of / is what was
# asked for, not a bomb.
splits = st.one_of(
    st.sampled_from(
        [
            "images",
            "images/sub",
            "val.txt",
            ".",
            "missing",
            "../x",
            "/etc/hostname",
            "/dev/null",
            "a\x00b",
            "é/ü",
            "data.yaml",
            "images/a.png",
        ]
    ),
    nasty_text.filter(lambda s: s.strip("/. ") != "" or s in ("", ".")),
)
values = st.one_of(splits, st.lists(splits, max_size=3), json_values)
documents = st.fixed_dictionaries(
    {},
    optional={
        "path": st.one_of(st.sampled_from([".", "", "images/..", "missing"]), values),
        "val": values,
        "train": values,
        "names": st.one_of(st.lists(nasty_text, max_size=4), json_values),
        "nc": st.one_of(st.integers(-2, 90), json_values),
    },
)


@fuzz
@example(data={"val": "x" * 300})  # a name too long: an OSError traceback from is_dir()
@given(data=documents)
def test_data_yaml_of_any_keys(tmp_path_factory, data):
    folder = _kit(tmp_path_factory.mktemp("yaml"))
    path = folder / "data.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    check_once(run_bounded(lambda: _read(str(path))))


# Hand-written YAML that safe_dump never writes: tags, anchors, merges, odd scalars.
snippets = st.sampled_from(
    [
        "val: !!python/object/apply:os.system ['true']",
        "val: !!binary aW1hZ2Vz",
        "val: !!set {images: null}",
        "val: 2026-12-07",
        "val: &v images\npath: *v",
        "base: &b {val: images}\n<<: *b",
        "val: [images, *missing]",
        "val: 0x10",
        "val: .inf",
        "val: ~",
        "val: images\nval: val.txt",
        "? [images]\n: x",
        "val: images\n---\nval: val.txt",
        "%YAML 1.1\n---\nval: images",
        "val: 'images'\x00",
        'val: "\\x00"',
        "val:\n  - images\n  - {a: b}",
        "names: {0: a, 1: [b]}\nval: images",
        "val: " + "9" * 5000,
    ]
)


@fuzz
@example(text="val: !!python/object/apply:os.system ['true']", junk="")  # PyYAML's 3-line message
@example(text="val: " + "9" * 5000, junk="")  # more digits than int() converts: a ValueError
@given(text=snippets, junk=st.one_of(st.just(""), st.text(max_size=20)))
def test_data_yaml_of_odd_yaml(tmp_path_factory, text, junk):
    folder = _kit(tmp_path_factory.mktemp("odd"))
    path = folder / "data.yaml"
    path.write_text(text + junk, encoding="utf-8")
    check_once(run_bounded(lambda: _read(str(path))))


@fuzz
@given(data=st.binary(max_size=200))
def test_data_yaml_of_any_bytes(tmp_path_factory, data):
    folder = _kit(tmp_path_factory.mktemp("bytes"))
    path = folder / "data.yaml"
    path.write_bytes(b"val: " + data)
    check_once(run_bounded(lambda: _read(str(path))))


@fuzz
@example(data=b"\x80")  # was a UnicodeDecodeError traceback
@given(data=st.binary(max_size=200))
def test_a_split_list_of_any_bytes(tmp_path_factory, data):
    """The split's .txt list is read too: bytes that are not UTF-8 text are a usage error."""
    folder = _kit(tmp_path_factory.mktemp("split"))
    (folder / "val.txt").write_bytes(data)
    path = folder / "data.yaml"
    path.write_text("val: val.txt\n")
    check_once(run_bounded(lambda: _read(str(path))))


# --------------------------------------------------------------------------- issue 40 defects


def _laughs(key: str) -> str:
    rows = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        rows.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    rows.append("val: images\npath: *i" if key == "path" else "val: [*i]")
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("key", ["val", "path"])
def test_a_billion_laughs_is_a_usage_error_in_bounded_memory(tmp_path, key):
    folder = _kit(tmp_path)
    path = folder / "data.yaml"
    path.write_text(_laughs(key))
    outcome = run_bounded(lambda: _read(str(path)), memory=128 << 20, timeout=1)
    assert outcome.kind == "usage", str(outcome)


def test_deeply_nested_names_are_a_usage_error(tmp_path):
    folder = _kit(tmp_path)
    path = folder / "data.yaml"
    path.write_text("val: images\nnames: " + "[" * 600 + "]" * 600 + "\n")
    outcome = run_bounded(lambda: _read(str(path)))
    assert outcome.kind in ("ok", "usage"), str(outcome)


@pytest.mark.parametrize("which", ["data.yaml", "val.txt"])
def test_a_fifo_is_refused_as_not_a_regular_file(tmp_path, which):
    folder = _kit(tmp_path)
    path = folder / "data.yaml"
    if which == "val.txt":
        (folder / "val.txt").unlink()
        os.mkfifo(folder / "val.txt")
        path.write_text("val: val.txt\n")
    else:
        os.mkfifo(path)
    outcome = run_bounded(lambda: _read(str(path)), timeout=1)
    assert outcome.kind == "usage" and "not a regular file" in outcome.error, str(outcome)
