"""The NPU's own load, as the rknpu driver writes it, sampled while a run lasts.

The rknpu driver counts each core's busy time and, once a second (RKNPU_LOAD_INTERVAL),
keeps the last second's share; ``/sys/kernel/debug/rknpu/load`` prints it (rknpu_debugger.c,
``rknpu_load_show``): ``"NPU load: "``, then per core ``" Core%d: "`` and ``"%2d%%,"`` on a
multi-core NPU, or one ``"%2d%%"`` on a one-core NPU, then a newline::

    NPU load:  Core0: 45%, Core1: 40%, Core2:  0%,     (RK3588; RK3576 has Core0-1)
    NPU load: 45%                                      (RK3566/RK3568: one core)

Kernels built with CONFIG_ROCKCHIP_RKNPU_PROC_FS print the same text in
``/proc/rknpu/load``. debugfs is readable by root only on most images. The driver has been
seen printing figures far above 100 % (``Core2: 429496%``, rockchip-linux/rknpu2#102;
20000 %, rockchip-linux/rknn-toolkit2#293): such a figure is not a load and is left out.

The NPU emulator writes the same text in its board folder (batchinfer.runtime.sim_load),
so everything here runs, and is tested, without a board.

:class:`NpuLoadSampler` reads the file on a thread of the coordinator every ``interval_s``
(a read of a few dozen bytes) and keeps each sample compactly (its time, a byte per core:
a night's run at 2 samples/s is well under a megabyte); :meth:`NpuLoadSampler.summary` is
the mean per core over the samples of an interval (bench: its measurement). When the file
cannot be read at the start, the sampler says why once (:attr:`NpuLoad.unreadable`) and
takes no samples. Which file a run reads: batchinfer.engine.npu_watch.
"""

from __future__ import annotations

import bisect
import re
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Where a board's driver prints the load: debugfs first, then procfs (relative to a root).
BOARD_FILES = ("sys/kernel/debug/rknpu/load", "proc/rknpu/load")
#: How often the coordinator reads it: the driver's figure changes once a second.
INTERVAL_S = 0.5
#: The text that says "not known" in tables.
NA = "n/a"
_NONE = 255  # a sample without this core's figure

_HEAD_RE = re.compile(r"^\s*NPU\s+load\s*:(?P<rest>.*)$", re.IGNORECASE | re.DOTALL)
_CORE_RE = re.compile(r"Core\s*(\d+)\s*:\s*(\d+)\s*%")
_ONE_RE = re.compile(r"^\s*(\d+)\s*%\s*,?\s*$")


def parse_load(text: str | None) -> dict[int, float] | None:
    """Per-core load in percent from the driver's text (a one-core NPU: core 0).

    None when the text is not the driver's (empty, cut short, garbage). A core whose
    figure is above 100 % (a driver fault, see the module docstring) is left out; when
    every core's is, the result is None.
    """
    if not text:
        return None
    head = _HEAD_RE.match(text.strip())
    if head is None:
        return None
    rest = head["rest"]
    cores = _CORE_RE.findall(rest)
    if cores:
        # Every "CoreN:" must carry a figure: "Core0: 45%, Core1: ," is a torn read.
        if len(cores) != len(re.findall(r"Core\s*\d+", rest)):
            return None
        loads = {int(c): float(p) for c, p in cores if int(p) <= 100}
        return loads or None
    one = _ONE_RE.match(rest)
    if one is None or int(one[1]) > 100:
        return None
    return {0: float(one[1])}


def format_load(percents: Sequence[int]) -> str:
    """The driver's text for these per-core figures (one figure: a one-core NPU)."""
    if len(percents) == 1:
        return f"NPU load: {percents[0]:2d}%\n"
    return "NPU load: " + "".join(f" Core{i}: {p:2d}%," for i, p in enumerate(percents)) + "\n"


@dataclass(frozen=True)
class NpuLoad:
    """The NPU load over a run: mean per core (0..1), or why it is not known."""

    source: str  # the file read, for people: "/sys/kernel/debug/rknpu/load"
    per_core: dict[int, float] | None = None
    samples: int = 0
    unreadable: str | None = None  # one sentence: why there is no figure
    max_per_core: dict[int, float] = field(default_factory=dict)

    def of(self, cores: Sequence[int]) -> dict[int, float] | None:
        """The mean load of ``cores`` only (None when none of them has a figure)."""
        if not self.per_core:
            return None
        mine = {c: v for c, v in self.per_core.items() if c in cores}
        return mine or None

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "samples": self.samples,
            "per_core": (
                None
                if self.per_core is None
                else {str(c): round(v, 4) for c, v in sorted(self.per_core.items())}
            ),
            "max_per_core": {str(c): round(v, 4) for c, v in sorted(self.max_per_core.items())},
            "unreadable": self.unreadable,
        }


#: What to do when a board's file cannot be read.
BOARD_HINT = (
    "debugfs is root's on most images: run as root (or mount debugfs) to see the board's "
    "own per-core figure beside batchinfer's busy time"
)


def unreadable_sentence(path: Path, why: str, hint: str = BOARD_HINT) -> str:
    """What the run says, once, when the driver's load cannot be read."""
    return f"NPU load: {path} is not readable ({why}); the NPU load columns say {NA}. {hint}."


def _read(path: Path) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read(4096)


class NpuLoadSampler:
    """Reads the driver's load file every ``interval_s`` on a thread while a run lasts.

    ``start()`` reads once on the caller's thread: when that fails the sampler keeps the
    reason (:meth:`summary`'s ``unreadable``) and starts no thread. ``stop()`` ends the
    thread and takes one last sample. Text that is not the driver's is counted, not used.
    """

    def __init__(
        self,
        path: Path,
        interval_s: float = INTERVAL_S,
        read: Callable[[Path], str] = _read,
        label: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        hint: str = BOARD_HINT,
    ) -> None:
        self.path = Path(path)
        self.label = label or str(path)
        self.hint = hint
        self.interval_s = interval_s
        self._read = read
        self._clock = clock
        self._lock = threading.Lock()
        self._times = array("d")
        self._cores: dict[int, array] = {}  # per core, per sample: percent, 255 = none
        self.samples = 0
        self.garbled = 0
        self.unreadable: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> bool:
        """Read the file once and add its figures; False when it could not be read."""
        try:
            text = self._read(self.path)
        except OSError as e:
            if self.samples == 0 and self.garbled == 0:
                why = e.strerror or type(e).__name__
                self.unreadable = unreadable_sentence(self.path, why, self.hint)
            return False
        loads = parse_load(text)
        now = self._clock()
        with self._lock:
            if loads is None:
                self.garbled += 1
                return True
            for core in loads.keys() - self._cores.keys():
                self._cores[core] = array("B", bytes([_NONE]) * self.samples)
            for core, column in self._cores.items():
                column.append(int(loads[core]) if core in loads else _NONE)
            self._times.append(now)
            self.samples += 1
        return True

    def start(self) -> NpuLoadSampler:
        if self._thread is not None:
            return self
        if not self.sample():
            return self
        self.unreadable = None
        self._thread = threading.Thread(target=self._loop, name="npu-load", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.sample()

    def summary(self, t0: float | None = None, t1: float | None = None) -> NpuLoad:
        """The mean and highest load per core of the samples taken in ``[t0, t1]``."""
        with self._lock:
            lo = 0 if t0 is None else bisect.bisect_left(self._times, t0)
            hi = len(self._times) if t1 is None else bisect.bisect_right(self._times, t1)
            per_core, highest = {}, {}
            for core, column in sorted(self._cores.items()):
                values = [v for v in column[lo:hi] if v != _NONE]
                if values:
                    per_core[core] = sum(values) / len(values) / 100
                    highest[core] = max(values) / 100
            unreadable = self.unreadable
            if not per_core and unreadable is None and self.garbled:
                unreadable = unreadable_sentence(
                    self.path, f"{self.garbled} read(s), none in the driver's format", self.hint
                )
            return NpuLoad(
                source=self.label,
                per_core=per_core or None,
                samples=max(0, hi - lo),
                unreadable=unreadable,
                max_per_core=highest,
            )


def board_load_file(root: Path = Path("/")) -> Path:
    """The file a board's driver prints the load in: the first of BOARD_FILES that exists
    (debugfs even when only root may read it), else debugfs's."""
    for name in BOARD_FILES:
        path = root / name
        try:
            if path.exists():
                return path
        except OSError:  # /sys/kernel/debug itself not searchable (root's): try procfs
            continue
    return root / BOARD_FILES[0]
