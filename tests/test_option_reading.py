"""A job file's TOML values against an option's type hint (batchinfer/option_reading.py):
what each hint takes, what it converts, and what it refuses (a bool is never a number)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from batchinfer.option_reading import _conforms

_REFUSED = object()


@pytest.mark.parametrize(
    ("value", "hint", "expected"),
    [
        (True, bool, True),
        (1, bool, _REFUSED),
        (3, int, 3),
        (True, int, _REFUSED),
        (2.5, int, _REFUSED),
        (3, float, 3.0),
        (False, float, _REFUSED),
        ("x", str, "x"),
        (1, str, _REFUSED),
        ("a/b", Path, Path("a/b")),
        (None, int | None, None),
        ("x", float | str, "x"),
        (2, float | str, 2.0),
        (None, float | str, _REFUSED),
        ([1, 2], tuple[float, ...], (1.0, 2.0)),
        ([1, 2, 3], tuple[int, int], _REFUSED),
        ([1, "a"], tuple[int, ...], _REFUSED),
        ("0,1", tuple[int, ...], _REFUSED),
        (b"x", bytes, _REFUSED),  # a hint no option declares takes nothing
    ],
)
def test_a_value_is_taken_converted_or_refused_by_its_hint(value: Any, hint: Any, expected):
    if expected is _REFUSED:
        with pytest.raises(ValueError):
            _conforms(value, hint)
    else:
        got = _conforms(value, hint)
        assert got == expected and type(got) is type(expected)
