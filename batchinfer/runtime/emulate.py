"""Run an unchanged RKNNLite script on the emulator: ``python -m batchinfer.runtime.emulate``.

    python -m batchinfer.runtime.emulate [--board rk3588] script.py [script args...]

The script's ``from rknnlite.api import RKNNLite``, ``from rknnlite.api.rknn_lite import
RKNNLite`` (the module the class is defined in) or ``import rknnlite.api`` gets the
emulator's class, :class:`batchinfer.runtime.sim.RKNNLite`; nothing else in it changes.
Settings come from the BATCHINFER_SIM_* environment variables (docs/guide/emulator.md).

Importing the real ``rknnlite.api`` renames Python's logging levels to single letters, so
``logging.basicConfig(level="INFO")`` after it fails on a board
(runtime/_level_names.py). The emulator leaves them alone unless asked:
``--rename-log-levels`` (or ``BATCHINFER_SIM_RENAME_LOG_LEVELS=1``) renames them when the
script imports ``rknnlite.api``, as the real package does, so a script that would break
on a board breaks here too.

Many public scripts check the machine before touching RKNNLite: ``platform.machine()``
is not ``aarch64``, or ``/proc/device-tree/compatible`` does not name a Rockchip chip, so
on x86 they exit at once. ``--board CHIP`` makes exactly these two checks answer like a
CHIP board: ``platform.machine()`` and ``platform.uname().machine`` say ``aarch64``, and
opening or testing ``/proc/device-tree/compatible`` gives ``rockchip,<chip>``; it also
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
import sys
import types
from collections.abc import Sequence

from batchinfer.runtime.constants import CHIP_CORES

DEVICE_TREE_COMPATIBLE = "/proc/device-tree/compatible"


#: Set (to 1) to rename the logging levels when a script imports rknnlite.api.
RENAME_ENV = "BATCHINFER_SIM_RENAME_LOG_LEVELS"
# The modules a script may import; each is a package but the last, as in the wheel.
_MODULES = ("rknnlite", "rknnlite.api", "rknnlite.api.rknn_lite")


class _RknnliteFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``rknnlite``, ``rknnlite.api`` and ``rknnlite.api.rknn_lite`` when a script
    imports them (not before: the real package renames the levels at that moment)."""

    def __init__(self, rename_levels: bool) -> None:
        self.rename_levels = rename_levels

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
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
    the emulator's RKNNLite; ``rename_levels`` (default: $BATCHINFER_SIM_RENAME_LOG_LEVELS)
    renames the logging levels at that import, as the real package does."""
    if rename_levels is None:
        rename_levels = os.environ.get(RENAME_ENV, "").strip().lower() in ("1", "true", "yes")
    for name in _MODULES:
        sys.modules.pop(name, None)
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _RknnliteFinder)]
    sys.meta_path.insert(0, _RknnliteFinder(rename_levels))


def pretend_board(chip: str) -> None:
    """Answer platform.machine() and /proc/device-tree/compatible like a ``chip`` board."""
    compatible = f"rockchip,{chip}-evb\0rockchip,{chip}\0"
    os.environ["BATCHINFER_SIM_CHIP"] = chip
    platform.machine = lambda: "aarch64"  # type: ignore[assignment]
    real_uname = platform.uname
    platform.uname = lambda: real_uname()._replace(machine="aarch64")  # type: ignore[assignment]
    real_open = builtins.open

    def board_open(file, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        if isinstance(file, str | os.PathLike) and os.fspath(file) == DEVICE_TREE_COMPATIBLE:
            return io.BytesIO(compatible.encode()) if "b" in mode else io.StringIO(compatible)
        return real_open(file, mode, *args, **kwargs)

    builtins.open = board_open
    io.open = board_open  # pathlib opens through io.open
    for name in ("exists", "isfile"):
        real = getattr(os.path, name)
        setattr(os.path, name, _also_true_for(real, DEVICE_TREE_COMPATIBLE))


def _also_true_for(check, path: str):  # type: ignore[no-untyped-def]
    def patched(p):  # type: ignore[no-untyped-def]
        return (isinstance(p, str | os.PathLike) and os.fspath(p) == path) or check(p)

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
    parser.add_argument(
        "--rename-log-levels",
        action="store_true",
        help="rename Python's logging levels to C/E/W/I/D when the script imports "
        "rknnlite.api, as the real package does (so logging.basicConfig(level='INFO') after "
        f"it fails here as on a board); also {RENAME_ENV}=1",
    )
    parser.add_argument("script", help="the script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    ns = parser.parse_args(argv)
    if not os.path.isfile(ns.script):
        parser.error(f"script {ns.script} does not exist")
    if ns.board:
        pretend_board(ns.board)
    install_rknnlite_alias(True if ns.rename_log_levels else None)
    sys.argv = [ns.script, *ns.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(ns.script)))
    runpy.run_path(ns.script, run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
