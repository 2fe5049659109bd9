"""The names of Python's logging levels, which importing the real ``rknnlite`` rewrites.

Importing ``rknnlite.api`` (rknn-toolkit-lite2) replaces the level names with single
letters, for its own ``W ...`` lines: afterwards ``logging.getLevelNamesMapping()`` is
``{'C': 50, 'E': 40, 'W': 30, 'I': 20, 'D': 10}`` and anything that names a level by its
usual name (``logger.setLevel("INFO")``, ``logging.basicConfig(level="INFO")``,
``logging.config`` files) fails with ``ValueError: Unknown level: 'INFO'``
(airockchip/rknn-toolkit2#414, rockchip-linux/rknn-toolkit2#270, #312;
blakeblackshear/frigate#8434 moved its import for that reason).

The engine undoes it right after importing the real package (runtime/rknnlite.py). The
emulator does it too when a script imports ``rknnlite.api`` under ``python -m
batchinfer.runtime.emulate`` (unless ``--keep-log-levels``), so a script that would break
on a board breaks on this machine too.

No public API removes a level name (``logging.addLevelName`` only adds), so this module
reads and writes logging's two private tables, ``_levelToName`` and ``_nameToLevel``, in
place (logging keeps references to those exact dicts). It is the only module that does;
tests/test_runtime_api.py fails loudly if an interpreter no longer has them.
"""

from __future__ import annotations

import contextlib
import logging

#: The level names after ``import rknnlite.api`` (airockchip/rknn-toolkit2#414).
RKNNLITE_NAME_TO_LEVEL = {"C": 50, "E": 40, "W": 30, "I": 20, "D": 10}

LevelNames = tuple[dict[int, str], dict[str, int]]


def _tables() -> LevelNames:
    level_to_name = getattr(logging, "_levelToName", None)
    name_to_level = getattr(logging, "_nameToLevel", None)
    if not isinstance(level_to_name, dict) or not isinstance(name_to_level, dict):
        raise RuntimeError(
            "this Python's logging module has no _levelToName/_nameToLevel tables; "
            "batchinfer/runtime/_level_names.py must be adapted to it"
        )
    return level_to_name, name_to_level


def snapshot() -> LevelNames:
    """Copies of the current level-name tables, for :func:`restore`."""
    level_to_name, name_to_level = _tables()
    return dict(level_to_name), dict(name_to_level)


def restore(saved: LevelNames) -> None:
    """Put the tables back to ``saved`` (from :func:`snapshot`)."""
    _replace(*saved)


def rename_like_rknnlite() -> None:
    """Rename the levels as importing the real ``rknnlite.api`` does.

    The letters map to the same numbers both ways (``getLevelName(20)`` is ``'I'``) [the
    reverse table is inferred from the letters the wheel's own lines carry].
    """
    letters = {level: name for name, level in RKNNLITE_NAME_TO_LEVEL.items()}
    _replace(letters, dict(RKNNLITE_NAME_TO_LEVEL))


def _replace(level_to_name: dict[int, str], name_to_level: dict[str, int]) -> None:
    tables = _tables()
    lock = getattr(logging, "_lock", None) or contextlib.nullcontext()
    with lock:
        tables[0].clear()
        tables[0].update(level_to_name)
        tables[1].clear()
        tables[1].update(name_to_level)
