"""Helpers for dataset tests: folders of named files (tests/ is on sys.path under pytest)."""

from __future__ import annotations

from pathlib import Path


def touch(root: Path, *names: str) -> None:
    """Create empty files (a listing looks only at names), with their folders."""
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
