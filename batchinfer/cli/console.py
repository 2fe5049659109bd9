"""What the CLI shows while and after a run: progress, warnings, the per-core table.

These are engine observers (see batchinfer.engine.events) that the commands attach; the
engine knows nothing about terminals.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import click
import pyarrow as pa

from batchinfer.engine import events as ev
from batchinfer.errors import render_fields
from batchinfer.runtime.npu_load import NA
from batchinfer.sink.stats import place_name

if TYPE_CHECKING:
    from tqdm import tqdm

# A listing shorter than this says nothing; a longer one a line every LISTING_LINE_EVERY
# entries in a log (on a terminal: one line, updated).
LISTING_SHOWN_FROM = 50_000
LISTING_LINE_EVERY = 200_000


class ConsoleObserver:
    """Warnings as ``warning: ...`` lines; a progress bar only when stderr is a terminal.

    A progress bar redrawn into a log file fills it with carriage returns, so a run under
    cron, systemd or ``> log 2>&1`` gets the warnings and the final summary only.
    """

    def __init__(self, flag_of: Callable[[str], str], progress: bool = True) -> None:
        self.flag_of = flag_of
        self.progress = progress and sys.stderr.isatty()
        # The progress bar once the run has started (over no iterable: updated by hand).
        self.bar: tqdm[NoReturn] | None = None
        self._listed: int | None = None

    def notify(self, event: object) -> None:
        if isinstance(event, ev.RowsDone):
            if self.bar is not None:
                self.bar.update(len(event.rows))
        elif isinstance(event, ev.Warned):
            self.echo(f"warning: {render_fields(event.message, self.flag_of)}")
        elif isinstance(event, ev.Started):
            if self._listed is not None and sys.stderr.isatty():
                click.echo("", err=True)  # end the listing's line
            cores = ",".join(str(c) for c in event.cores)
            todo = "?" if event.todo is None else str(event.todo)
            where = f"cores {cores}"
            if event.nodes:
                where += f" of {len(event.nodes)} nodes ({', '.join(event.nodes)})"
            self.echo(
                f"started: {todo} items on {where} ({event.backend}, "
                f"{event.instances_per_core} instance(s) per core)"
            )
            if self.progress:  # after start-up, so its rate counts only the run itself
                from tqdm import tqdm

                self.bar = tqdm(
                    total=event.todo,
                    unit="item",
                    dynamic_ncols=True,
                    file=sys.stderr,
                    smoothing=0.1,
                )

    def listing(self, count: int) -> None:
        """Progress of a long dataset listing (called by the library every N entries)."""
        if self._listed is None and count < LISTING_SHOWN_FROM:
            return
        if sys.stderr.isatty():
            click.echo(f"\rlisting the dataset: {count:,} entries", err=True, nl=False)
        elif self._listed is None or count - self._listed >= LISTING_LINE_EVERY:
            click.echo(f"listing the dataset: {count:,} entries", err=True)
        else:
            return
        self._listed = count

    def echo(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            click.echo(text, err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _fmt(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_summary(table: pa.Table, npu_load: bool = False) -> str:
    """A fixed-width per-core summary for the terminal, the total row last (core "all").

    On a cluster a core is shown as ``node/core``. ``npu_load``: the run had an NPU to
    read, so a "NPU load %" column (the board's own figure, its ``npu_load`` column) goes
    beside "util %" (batchinfer's busy time), "n/a" where it was not readable.
    """
    header: tuple[str, ...] = (
        "core", "items", "errors", "restarts", "recycles", "items/s", "util %", "p50 ms", "p99 ms"
    )  # fmt: skip
    if npu_load:
        header = (*header[:7], "NPU load %", *header[7:])
    lines = []
    rows = table.to_pylist()
    rows.sort(key=lambda r: (r["core"] is None, r.get("node") or "", r["core"] or 0))
    for r in rows:
        util = None if r["utilization"] is None else 100 * r["utilization"]
        name = "all" if r["core"] is None else place_name(r.get("node"), r["core"])
        cells = [
            name,
            str(r["items"]),
            str(r["errors"]),
            str(r["restarts"]),
            str(r["recycles"]),
            _fmt(r["items_per_s"], ".1f"),
            _fmt(util, ".0f"),
            _fmt(r["p50_ms"], ".2f"),
            _fmt(r["p99_ms"], ".2f"),
        ]
        if npu_load:
            load = r.get("npu_load")
            cells.insert(7, NA if load is None else f"{100 * load:.0f}")
        lines.append(tuple(cells))
    widths = [max([len(h), *(len(line[i]) for line in lines)]) for i, h in enumerate(header)]
    out = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        )
        for cells in [header, *lines]
    ]
    return "\n".join(out)
