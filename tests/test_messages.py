"""Messages name settings as data (batchinfer.messages), rendered by each front end."""

from __future__ import annotations

import ast
import json
import pickle
import re
from pathlib import Path

import pytest

import batchinfer
from batchinfer.errors import ConfigError, UsageError
from batchinfer.messages import Message, Setting, as_message, join, render, setting


def _flag(field: str) -> str:
    return "--" + field.rsplit(".", 1)[-1].replace("_", "-")


def test_a_message_keeps_its_settings_as_references_through_concatenation() -> None:
    said = (
        f"{3} slots do not fit; lower " + setting("runtime.slots") + " or " + "{runtime.readers}."
    )
    assert isinstance(said, Message)
    assert said.parts == (
        "3 slots do not fit; lower ",
        Setting("runtime.slots"),
        " or ",
        Setting("runtime.readers"),  # the older template, read on the way in
        ".",
    )
    assert str(said) == "3 slots do not fit; lower runtime.slots or runtime.readers."
    assert said.render(_flag) == "3 slots do not fit; lower --slots or --readers."
    assert said.settings == ("runtime.slots", "runtime.readers")


def test_a_message_written_without_a_front_end_names_fields_never_templates() -> None:
    said = "raise " + setting("bench.duration_s") + "."
    assert json.dumps({"warnings": [said]}) == '{"warnings": ["raise bench.duration_s."]}'
    assert "{" not in f"{said}" and "{" not in said.upper()


def test_a_message_crosses_processes_whole() -> None:
    said = join("; ", ["core 1: lower " + setting("runtime.cores"), "plain"])
    again = pickle.loads(pickle.dumps(said))
    assert again == said and again.parts == said.parts
    error = pickle.loads(pickle.dumps(ConfigError(setting("runtime.slots") + " is too small.")))
    assert error.render(_flag) == "--slots is too small." and error.fields == ("runtime.slots",)


def test_errors_take_messages_and_older_templates_alike() -> None:
    new = ConfigError(setting("preprocess.size") + " is not a size.")
    old = ConfigError("{preprocess.size} is not a size.")
    for error in (new, old):
        assert str(error) == "preprocess.size is not a size."
        assert error.render(_flag) == "--size is not a size."
        assert error.fields == ("preprocess.size",)
    assert render("plain {x.y}", str.upper) == "plain X.Y"
    assert as_message(new.message) is new.message


@pytest.mark.parametrize("make", [lambda: UsageError("no settings here"), lambda: UsageError()])
def test_a_message_without_settings_is_its_text(make) -> None:
    error = make()
    assert error.render(_flag) == str(error)


# A setting's field (group.name) or one of the few settings outside any group.
_TEMPLATE = re.compile(
    r"\{((?:[a-z_]+\.)+[a-z_][a-z0-9_]*|model|dataset|limit|labels|ray|ray_data|image_root)\}"
)


def _templates(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        match.group(0)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
        for match in _TEMPLATE.finditer(node.value)
    ]


def test_settings_are_named_with_setting_not_templates() -> None:
    root = Path(batchinfer.__file__).resolve().parent.parent
    found = {
        str(path.relative_to(root)): hits
        for path in sorted((root / "batchinfer").rglob("*.py"))
        if (hits := _templates(path))
    }
    assert not found, f"name settings with batchinfer.messages.setting(), not templates: {found}"


def test_a_preprocess_error_names_the_setting_as_each_front_end_sets_it() -> None:
    # It said "--mean" to eval jobs too, whose users set device.preprocess.mean.
    from batchinfer.cli.options import flag_of
    from batchinfer.data.input_spec import Preprocess
    from batchinfer.evaluate.job import job_key

    with pytest.raises(UsageError) as caught:
        Preprocess(shape=(1, 8, 8, 3), dtype="float32", mean=(1.0, 2.0))
    assert caught.value.render(flag_of).startswith("--mean has 2 values")
    said = caught.value.render(lambda field: job_key("device", field))
    assert said.startswith("device.preprocess.mean has 2 values")
