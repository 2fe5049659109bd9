"""The values a numeric setting may take, and the ceilings this machine sets.

Each numeric field of an option group declares its range once, as ``bounds=`` in its
:func:`batchinfer.options.option` (``Bounds(1, 16)``, ``Bounds(0, DAY_S, above=True)``,
``Bounds(1, readers_ceiling)``). :func:`check_value` applies it wherever values enter:
job files (:func:`batchinfer.options.from_mapping`) and planning (every run, bench and
evaluation), so a setting that would hang or exhaust the machine is one usage error
(exit 2) that names the setting and its limit before anything starts.

Besides its range, every float must be finite, declared or not: ``nan`` compares false
with everything, so ``timeout > 0`` lets it through and a watchdog never fires; ``inf``
turns a limit off. ``None`` (auto, off, the default) and words (``estimate``, ``none``)
are not numbers and pass; a tuple's elements are checked one by one.

A ceiling is a number, or a function of this machine (CPUs, memory, /dev/shm) that
returns the number and why it is that, e.g. ``(8, "4 per CPU; this machine has 2")``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from batchinfer.errors import ConfigError
from batchinfer.messages import setting

#: Timeouts and durations longer than a day are refused (they would switch hang
#: detection off in all but name).
DAY_S = 86_400.0

#: Reader processes per CPU at most (decoding is CPU-bound; more only wait their turn).
READERS_PER_CPU = 4
#: Memory per reader process at the least (a decoder and its image buffers).
READER_BYTES = 128 * 2**20

Ceiling = Callable[[], tuple[float, str]]


@dataclass(frozen=True)
class Bounds:
    """``low <= value <= high`` (``low < value`` with ``above``; ``< high`` with ``below``).

    Either end may be None (open). ``high`` may be a :data:`Ceiling`, a function of the
    machine; ``why`` says why a fixed ``high`` is what it is (shown in the message).
    """

    low: float | None = None
    high: float | Ceiling | None = None
    above: bool = False
    below: bool = False
    why: str = ""

    def ceiling(self) -> tuple[float | None, str]:
        """The upper limit now, and why."""
        if callable(self.high):
            return self.high()
        return self.high, self.why


def _num(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:,}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _low_words(b: Bounds) -> str:
    if b.low is None:
        return ""
    if b.above:
        return "positive" if b.low == 0 else f"more than {_num(b.low)}"
    return f"at least {_num(b.low)}"


def _high_words(high: float | None, why: str, below: bool) -> str:
    if high is None:
        return ""
    words = f"{'less than' if below else 'at most'} {_num(high)}"
    return f"{words} ({why})" if why else words


def _range_words(b: Bounds, high: float | None, why: str) -> str:
    if b.low is not None and high is not None and b.above == b.below:
        words = f"{'between' if b.above else 'from'} {_num(b.low)} "
        words += f"{'and' if b.above else 'to'} {_num(high)}"
        return f"{words} ({why})" if why else words
    parts = [p for p in (_low_words(b), _high_words(high, why, b.below)) if p]
    return " and ".join(parts)


def check_value(bounds: Bounds | None, value: Any, name: str) -> None:
    """ConfigError naming ``{name}`` when ``value`` is not finite or not within ``bounds``.

    None, words and booleans pass; tuples are checked element by element.
    """
    if isinstance(value, (tuple, list)):
        for v in value:
            check_value(bounds, v, name)
        return
    if value is None or isinstance(value, (str, bool)) or not isinstance(value, (int, float)):
        return
    b = bounds or Bounds()
    if isinstance(value, float) and not math.isfinite(value):
        whole = _range_words(b, *b.ceiling())
        raise ConfigError(
            setting(name)
            + f" must be a finite number{', ' + whole if whole else ''}, not {value}.",
            name,
        )
    high, why = b.ceiling()
    too_low = b.low is not None and (value <= b.low if b.above else value < b.low)
    too_high = high is not None and (value >= high if b.below else value > high)
    if too_low or too_high:
        if b.above and b.below:  # an open interval: "between 0 and 1" says it all
            words = _range_words(b, high, why)
        else:
            words = _low_words(b) if too_low else _high_words(high, why, b.below)
        raise ConfigError(setting(name) + f" must be {words}, not {_num(value)}.", name)


# ------------------------------------------------------------------- this machine
def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def memory_bytes() -> int | None:
    """This machine's physical memory, None where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def readers_ceiling() -> tuple[int, str]:
    """Reader processes this machine can hold: 4 per CPU, and 128 MiB of memory each."""
    cpus = usable_cpus()
    by_cpu = READERS_PER_CPU * cpus
    memory = memory_bytes()
    if memory is not None and memory // READER_BYTES < by_cpu:
        by_memory = max(1, memory // READER_BYTES)
        return by_memory, f"one per 128 MiB of memory; this machine has {memory / 2**30:.1f} GiB"
    return by_cpu, f"{READERS_PER_CPU} per CPU; this process may use {cpus}"


def pixels_ceiling() -> tuple[int, str]:
    """Pixels an image may have for its decoded RGBA buffer to fit in this machine's memory."""
    memory = memory_bytes()
    if memory is None:
        return 2**31, "Pillow's largest image"
    return (
        memory // 4,
        f"decoded, they must fit in this machine's {memory / 2**30:.1f} GiB of memory",
    )


def item_bytes_ceiling() -> tuple[int, str]:
    """Bytes one item may hold at most: it is read into memory whole, so this machine's."""
    memory = memory_bytes()
    if memory is None:
        return 2**40, "1 TiB"
    return memory, f"an item is read into memory whole; this machine has {memory / 2**30:.1f} GiB"


#: Memory a simulated Ray node (``--ray local:N``) takes at the least: a raylet, its
#: object store's share and the actors of its cores.
LOCAL_NODE_BYTES = 1 * 2**30


def local_nodes_ceiling() -> tuple[int, str]:
    """Simulated Ray nodes this machine can hold: 4 per CPU, and 1 GiB of memory each."""
    cpus = usable_cpus()
    memory = memory_bytes()
    if memory is not None and memory // LOCAL_NODE_BYTES < 4 * cpus:
        return max(1, memory // LOCAL_NODE_BYTES), (
            f"one per GiB of memory; this machine has {memory / 2**30:.1f} GiB"
        )
    return 4 * cpus, f"4 per CPU; this process may use {cpus}"
