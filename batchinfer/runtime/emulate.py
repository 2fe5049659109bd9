"""Run an unchanged RKNNLite script on the emulator: ``python -m batchinfer.runtime.emulate``.

    python -m batchinfer.runtime.emulate [--board rk3588] script.py [script args...]

The script's ``from rknnlite.api import RKNNLite``, ``from rknnlite.api.rknn_lite import
RKNNLite`` (the module the class is defined in) or ``import rknnlite.api`` gets the
emulator's class, :class:`batchinfer.runtime.sim.RKNNLite`; nothing else in it changes.
Settings come from the BATCHINFER_SIM_* environment variables (docs/guide/emulator.md).

Importing the real ``rknnlite.api`` renames Python's logging levels to single letters, so
``logging.basicConfig(level="INFO")`` after it fails on a board
(runtime/_level_names.py). The emulator does the same when the script imports
``rknnlite.api``, so a script that would break on a board breaks here too;
``--keep-log-levels`` (or ``BATCHINFER_SIM_RENAME_LOG_LEVELS=0``) leaves the names alone.

Many public scripts check the machine before touching RKNNLite: ``platform.machine()``
is not ``aarch64``, or ``/proc/device-tree/compatible`` does not name a Rockchip chip, so
on x86 they exit at once. ``--board CHIP`` makes exactly these two checks answer like a
CHIP board: ``platform.machine()`` and ``platform.uname().machine`` say ``aarch64``, and
opening ``/proc/device-tree/compatible`` gives ``rockchip,<chip>`` and ``os.stat``,
``os.path.exists``/``isfile`` and ``Path.exists``/``is_file`` see it as a file; it also
emulates that chip (BATCHINFER_SIM_CHIP). Anything else a script probes (``os.uname()``,
``/sys``, ``/dev``) still answers as this machine does.
"""

from __future__ import annotations

import argparse
import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import io
import os
import platform
import runpy
import stat
import sys
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

from batchinfer.runtime.constants import CHIP_CORES

DEVICE_TREE_COMPATIBLE = "/proc/device-tree/compatible"


#: Set to 0 to keep the logging level names when a script imports rknnlite.api (the
#: default renames them, as the real package does).
RENAME_ENV = "BATCHINFER_SIM_RENAME_LOG_LEVELS"
_OFF = ("0", "false", "no", "off")
# The modules a script may import; each is a package but the last, as in the wheel.
_MODULES = ("rknnlite", "rknnlite.api", "rknnlite.api.rknn_lite")


class _RknnliteFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``rknnlite``, ``rknnlite.api`` and ``rknnlite.api.rknn_lite`` when a script
    imports them (not before: the real package renames the levels at that moment)."""

    def __init__(self, rename_levels: bool) -> None:
        self.rename_levels = rename_levels

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _MODULES:
            return None
        package = fullname != _MODULES[-1]
        return importlib.util.spec_from_loader(fullname, self, is_package=package)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "rknnlite":
            return
        from batchinfer.runtime.sim import RKNNLite

        module.RKNNLite = RKNNLite  # type: ignore[attr-defined]
        if module.__name__ == "rknnlite.api" and self.rename_levels:
            from batchinfer.runtime import _level_names

            _level_names.rename_like_rknnlite()


def install_rknnlite_alias(rename_levels: bool | None = None) -> None:
    """Make ``rknnlite``, ``rknnlite.api`` and ``rknnlite.api.rknn_lite`` importable, with
    the emulator's RKNNLite; ``rename_levels`` renames the logging levels at that import,
    as the real package does (default: yes, unless $BATCHINFER_SIM_RENAME_LOG_LEVELS is 0)."""
    if rename_levels is None:
        rename_levels = os.environ.get(RENAME_ENV, "").strip().lower() not in _OFF
    for name in _MODULES:
        sys.modules.pop(name, None)
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _RknnliteFinder)]
    sys.meta_path.insert(0, _RknnliteFinder(rename_levels))


def pretend_board(chip: str) -> None:
    """Answer platform.machine() and /proc/device-tree/compatible like a ``chip`` board."""
    compatible = f"rockchip,{chip}-evb\0rockchip,{chip}\0"
    os.environ["BATCHINFER_SIM_CHIP"] = chip
    platform.machine = lambda: "aarch64"
    real_uname = platform.uname
    platform.uname = lambda: real_uname()._replace(machine="aarch64")
    real_open = builtins.open

    def board_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, str | os.PathLike) and os.fspath(file) == DEVICE_TREE_COMPATIBLE:
            return io.BytesIO(compatible.encode()) if "b" in mode else io.StringIO(compatible)
        return real_open(file, mode, *args, **kwargs)

    builtins.open = board_open
    io.open = board_open  # pathlib opens through io.open
    # os.path.exists/isfile and pathlib's exists/is_file all ask os.stat: answer it, so
    # every way a script tests the file agrees with open() [the file on a board: a regular
    # read-only file of the device tree, 0444].
    size = len(compatible.encode())
    for name in ("stat", "lstat"):
        setattr(os, name, _stat_also_for(getattr(os, name), DEVICE_TREE_COMPATIBLE, size))


def _stat_also_for(
    real_stat: Callable[..., os.stat_result], path: str, size: int
) -> Callable[..., os.stat_result]:
    """``os.stat`` (or lstat) that answers for ``path`` as for a regular 0444 file."""

    def patched(p: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if isinstance(p, str | os.PathLike) and os.fspath(p) == path:
            now = int(time.time())
            mode = stat.S_IFREG | 0o444
            return os.stat_result((mode, 0, 0, 1, 0, 0, size, now, now, now))
        return real_stat(p, *args, **kwargs)

    return patched


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m batchinfer.runtime.emulate",
        description="Run an RKNNLite script unchanged on the batchinfer NPU emulator.",
    )
    parser.add_argument(
        "--board",
        choices=sorted(CHIP_CORES),
        help="answer platform.machine() and /proc/device-tree/compatible like this chip",
    )
    levels = parser.add_mutually_exclusive_group()
    levels.add_argument(
        "--keep-log-levels",
        dest="rename_log_levels",
        action="store_false",
        default=None,
        help="keep Python's logging level names when the script imports rknnlite.api; by "
        "default they are renamed to C/E/W/I/D as the real package does (so "
        "logging.basicConfig(level='INFO') after it fails here as on a board); also "
        f"{RENAME_ENV}=0",
    )
    levels.add_argument(
        "--rename-log-levels",
        dest="rename_log_levels",
        action="store_true",
        help=f"rename them even if {RENAME_ENV}=0 (the default otherwise)",
    )
    parser.add_argument("script", help="the script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    ns = parser.parse_args(argv)
    if not os.path.isfile(ns.script):
        parser.error(f"script {ns.script} does not exist")
    if ns.board:
        pretend_board(ns.board)
    install_rknnlite_alias(ns.rename_log_levels)
    sys.argv = [ns.script, *ns.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(ns.script)))
    runpy.run_path(ns.script, run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
