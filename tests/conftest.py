"""Shared fixtures: the leak guard every test runs under, and a demo kit made once per session."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from batchinfer.demo import write_demo
from batchinfer.engine.slots import SEGMENT_PREFIX, SHM_DIR


def _our_segments() -> set[str]:
    """Segments made by this test process, or by a coordinator that is dead (a subprocess).

    Segments of other live processes (another test session running at the same time) are
    theirs to clean up, not ours.
    """
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(SEGMENT_PREFIX + "-")]
    except OSError:
        return set()
    ours = set()
    for name in names:
        pid = name.split("-")[1]
        if pid.isdigit() and (int(pid) == os.getpid() or not psutil.pid_exists(int(pid))):
            ours.add(name)
    return ours


def _children() -> dict[int, str]:
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        # multiprocessing's resource tracker lives as long as the test session, by design.
        if "resource_tracker" not in cmd:
            out[p.pid] = cmd
    return out


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail a test that leaves a child process or one of our /dev/shm segments behind."""
    segments_before = _our_segments()
    children_before = set(_children())
    yield
    leaked_children = {pid: cmd for pid, cmd in _children().items() if pid not in children_before}
    for pid in list(leaked_children):
        try:  # give a child that is exiting right now a moment to be reaped
            psutil.Process(pid).wait(timeout=2)
            del leaked_children[pid]
        except psutil.TimeoutExpired:
            psutil.Process(pid).kill()
        except psutil.Error:
            del leaked_children[pid]
    leaked_segments = _our_segments() - segments_before
    for name in leaked_segments:
        os.unlink(os.path.join(SHM_DIR, name))
    assert not leaked_children, f"test left processes behind: {leaked_children}"
    assert not leaked_segments, f"test left shared-memory segments behind: {leaked_segments}"


@pytest.fixture(scope="session")
def demo_kit(tmp_path_factory):
    """The demo kit (1,797 digit PNGs and the three models), written once per session."""
    return write_demo(Path(tmp_path_factory.mktemp("demo")) / "kit")
