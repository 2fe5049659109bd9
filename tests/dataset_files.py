"""Helpers for dataset tests: folders of named files (tests/ is on sys.path under pytest)."""

from __future__ import annotations

import shutil
from pathlib import Path


def touch(root: Path, *names: str) -> None:
    """Create empty files (a listing looks only at names), with their folders."""
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


def digits_3_and_7(kit_dataset: Path, root: Path, junk: bool) -> Path:
    """Class folders 3 and 7 of the demo's digits (20 each); with ``junk``, what a zip made
    on a Mac and a Windows Explorer leave beside them."""
    for digit in ("3", "7"):
        (root / digit).mkdir(parents=True)
        for png in sorted((kit_dataset / digit).glob("*.png"))[:20]:
            shutil.copy(png, root / digit / png.name)
    if junk:
        (root / "__MACOSX" / "3").mkdir(parents=True)
        (root / "__MACOSX" / "3" / "._x.png").write_bytes(b"\0\5\26\7 AppleDouble")
        (root / "3" / "._0003.png").write_bytes(b"\0\5\26\7 AppleDouble")
        (root / "7" / "Thumbs.db").write_bytes(b"thumbnails")
    return root
