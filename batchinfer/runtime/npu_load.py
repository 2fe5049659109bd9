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
(a read of a few dozen bytes) and keeps per-core sums; :meth:`NpuLoadSampler.summary` is
the mean per core over the samples. When the file cannot be read at the start, the sampler
says why once (:attr:`NpuLoad.unreadable`) and takes no samples.
"""

from __future__ import annotations

import re
import threading
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


def unreadable_sentence(path: Path, why: str) -> str:
    """What the run says, once, when the driver's load cannot be read."""
    return (
        f"NPU load: {path} is not readable ({why}); the NPU load columns say {NA}. debugfs is "
        "root's on most images: run as root (or mount debugfs) to see the board's own "
        "per-core figure beside batchinfer's busy time."
    )


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
    ) -> None:
        self.path = Path(path)
        self.label = label or str(path)
        self.interval_s = interval_s
        self._read = read
        self._lock = threading.Lock()
        self._sums: dict[int, float] = {}
        self._counts: dict[int, int] = {}
        self._max: dict[int, float] = {}
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
                self.unreadable = unreadable_sentence(self.path, e.strerror or type(e).__name__)
            return False
        loads = parse_load(text)
        with self._lock:
            if loads is None:
                self.garbled += 1
                return True
            self.samples += 1
            for core, pct in loads.items():
                self._sums[core] = self._sums.get(core, 0.0) + pct / 100
                self._counts[core] = self._counts.get(core, 0) + 1
                self._max[core] = max(self._max.get(core, 0.0), pct / 100)
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

    def summary(self) -> NpuLoad:
        with self._lock:
            per_core = {c: self._sums[c] / self._counts[c] for c in self._sums}
            unreadable = self.unreadable
            if not per_core and unreadable is None and self.garbled:
                unreadable = unreadable_sentence(
                    self.path, f"{self.garbled} read(s), none in the driver's format"
                )
            return NpuLoad(
                source=self.label,
                per_core=per_core or None,
                samples=self.samples,
                unreadable=unreadable,
                max_per_core=dict(self._max),
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
