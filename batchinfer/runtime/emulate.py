"""Run an unchanged RKNNLite script on the emulator: ``python -m batchinfer.runtime.emulate``.

    python -m batchinfer.runtime.emulate [--board rk3588] script.py [script args...]

The script's ``from rknnlite.api import RKNNLite`` (or ``import rknnlite.api``) gets the
emulator's class, :class:`batchinfer.runtime.sim.RKNNLite`; nothing else in it changes.
Settings come from the BATCHINFER_SIM_* environment variables (see the README).

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
import io
import os
import platform
import runpy
import sys
import types
from collections.abc import Sequence

from batchinfer.runtime.constants import CHIP_CORES

DEVICE_TREE_COMPATIBLE = "/proc/device-tree/compatible"


def install_rknnlite_alias() -> None:
    """Make ``rknnlite`` and ``rknnlite.api`` importable, with the emulator's RKNNLite."""
    from batchinfer.runtime.sim import RKNNLite

    package = types.ModuleType("rknnlite")
    package.__path__ = []  # a package, so "import rknnlite.api" works
    api = types.ModuleType("rknnlite.api")
    api.RKNNLite = RKNNLite  # type: ignore[attr-defined]
    package.api = api  # type: ignore[attr-defined]
    sys.modules["rknnlite"] = package
    sys.modules["rknnlite.api"] = api


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
    parser.add_argument("script", help="the script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    ns = parser.parse_args(argv)
    if not os.path.isfile(ns.script):
        parser.error(f"script {ns.script} does not exist")
    if ns.board:
        pretend_board(ns.board)
    install_rknnlite_alias()
    sys.argv = [ns.script, *ns.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(ns.script)))
    runpy.run_path(ns.script, run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
