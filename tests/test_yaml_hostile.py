"""A data.yaml is read as hostile input (issue 40, items 2, 7 and 8): every key used is
type-checked before use, without walking its value, and a file that cannot be read is one
usage error (exit 2) naming the key or saying why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hostile_child import run_child
from PIL import Image
from test_cli import assert_error, invoke, run_args

from batchinfer.data.sources import open_source
from batchinfer.errors import DatasetError


def _laughs(last: str) -> str:
    """The "billion laughs": nine levels of nine aliases (9^9 strings when walked)."""
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join([*lines, last]) + "\n"


@pytest.mark.parametrize(
    ("last", "words"),
    [
        ("val: [*i]", "The val[0] key of {f} holds a list of 9 values"),
        ("val: *i", "The val[0] key of {f} holds a list of 9 values"),
        ("path: *i\nval: images", "The path key of {f} holds a list of 9 values"),
        ("val: images\nnames: *i", "The names[0] key of {f} holds a list of 9 values"),
        ("val: images\nnames: {0: *i}", "The names[0] key of {f} holds a list of 9 values"),
    ],
)
def test_an_alias_bomb_is_refused_naming_its_key_in_bounded_memory(tmp_path, last, words):
    # Before: str() of the value grew past the child's 2 GiB (MemoryError, a traceback;
    # 3 GB in 57 s without a limit).
    yml = tmp_path / "data.yaml"
    yml.write_text(_laughs(last))
    assert yml.stat().st_size < 700
    (line,) = run_child(
        f"""
        from batchinfer.data.sources import open_source
        said(lambda: open_source({str(yml)!r}))
        """,
        timeout=60,
    )
    assert line.startswith("DatasetError 2: " + words.format(f=yml)), line


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("- val\n", "holds a list of 1 values, not keys"),
        ("val: 5\n", "The val key of {f} holds the int 5; it must be a folder"),
        ("val: [images, 7]\n", "The val[1] key of {f} holds the int 7"),
        ("val: {a: b}\n", "The val key of {f} holds a mapping of 1 keys"),
        ("path: 5\nval: images\n", "The path key of {f} holds the int 5"),
        ("path: [a]\nval: images\n", "The path key of {f} holds a list of 1 values"),
        ("val: images\nnames: cat\n", "The names key of {f} holds 'cat'; it must be a list"),
        ("val: images\nnames: [cat, 3]\n", "The names[1] key of {f} holds the int 3"),
        ("val: images\nnames: {0: cat, 2: dog}\n", "gives 2 classes but not class 1"),
        ("val: images\nnames: {a: cat}\n", "has the key 'a'; its keys are the class indexes"),
        ("val: " + "x" * 5000 + "\n", "The val key of {f} holds text of 5000 characters"),
        ("val: images\nnames: " + "[" * 5000 + "]" * 5000 + "\n",
         "maximum nesting depth" if yaml.__with_libyaml__ else "nests YAML deeper than"),
        ("val: [unclosed\n", "is not valid YAML"),
        ("path: /proc/self\nval: fd\n", "The path key of {f} is '/proc/self', which is /proc/"),
    ],
)  # fmt: skip
def test_a_key_of_the_wrong_type_is_a_usage_error_naming_it(tmp_path, text, words):
    # Before: `str()` made folders of them ("5", "['a']"), a names: nested 5,000 deep was
    # a RecursionError traceback, and path: /proc/self listed /proc/self/fd/4 and said
    # "fix its permissions".
    yml = tmp_path / "data.yaml"
    yml.write_text(text)
    (tmp_path / "images").mkdir()
    Image.new("L", (8, 8)).save(tmp_path / "images" / "a.png")
    with pytest.raises(DatasetError) as info:
        open_source(yml)
    message = str(info.value)
    assert words.format(f=yml) in message
    assert "\n" not in message and len(message) < 400


def test_names_are_read_as_a_list_or_a_mapping_of_indexes(tmp_path):
    from batchinfer.data.yolo_yaml import read_data_yaml

    yml = tmp_path / "data.yaml"
    yml.write_text("val: images\nnames: {1: dog, 0: cat}\n")
    assert read_data_yaml(yml).names == ("cat", "dog")
    yml.write_text("val: images\nnames: [cat, dog]\n")
    assert read_data_yaml(yml).names == ("cat", "dog")
    yml.write_text("val: images\n")
    config = read_data_yaml(yml)
    assert (config.names, config.val, config.root) == (None, ("images",), tmp_path)


def test_a_bad_data_yaml_is_one_line_and_exit_2_for_run(tmp_path, demo_kit):
    yml = tmp_path / "data.yaml"
    yml.write_text(_laughs("val: [*i]"))
    result = invoke(*run_args(yml, demo_kit.models["digits"], tmp_path / "o"))
    assert_error(result, 2, f"The val[0] key of {yml} holds a list of 9 values")
    assert not (tmp_path / "o").exists()


def test_a_val_list_that_is_a_device_is_not_a_regular_file(tmp_path):
    yml = tmp_path / "data.yaml"
    yml.write_text("path: /dev\nval: zero\n")
    with pytest.raises(DatasetError, match="is /dev: the system's own view"):
        open_source(yml)
    (tmp_path / "split.txt").symlink_to("/dev/zero")
    yml.write_text("val: split.txt\n")
    with pytest.raises(DatasetError, match=r"the val split .*split\.txt is a character device"):
        open_source(yml)


def test_a_split_list_is_read_against_its_folder(tmp_path: Path):
    (tmp_path / "images").mkdir()
    Image.new("L", (8, 8)).save(tmp_path / "images" / "a.png")
    (tmp_path / "val.txt").write_text("\ufeff# first\n./images/a.png\n\n")
    yml = tmp_path / "data.yaml"
    yml.write_text("val: val.txt\n")
    assert [i.id for i in open_source(yml)] == ["images/a.png"]
