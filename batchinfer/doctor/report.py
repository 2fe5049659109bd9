"""What ``batchinfer doctor`` found: one :class:`Check` per line, and the :class:`Report`.

A check is ``ok`` (✓), ``warn`` (!: a run can go, but not at its best, or something could
not be known) or ``fail`` (✗: a blocker, a run would fail). Every check that is not ``ok``
carries its fix, one sentence the user can act on. The report is also JSON (``--json``),
and reads back from it (:meth:`Report.from_json`), so scripts and tests see the same checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from batchinfer.messages import render

OK, WARN, FAIL = "ok", "warn", "fail"
MARKS = {OK: "✓", WARN: "!", FAIL: "✗"}


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    id: str  # stable, for scripts: "driver", "librknnrt", ...
    title: str  # what was checked, as shown: "NPU driver"
    status: str  # OK, WARN or FAIL
    summary: str  # what was found
    fix: str | None = None  # what to do (None when status is OK)
    details: dict[str, Any] = field(default_factory=dict)

    def line(self, name: Callable[[str], str] = str) -> str:
        """The check's line; ``name`` renders the settings its text names (CLI: flags)."""
        text = f"{MARKS[self.status]} {self.title}: {render(self.summary, name)}"
        return f"{text}; fix: {render(self.fix, name)}" if self.fix else text

    def rendered(self, name: Callable[[str], str] = str) -> Check:
        """This check with its texts rendered as plain strings."""
        fix = render(self.fix, name) if self.fix else None
        return replace(self, summary=render(self.summary, name), fix=fix)


def ok(id: str, title: str, summary: str, **details: Any) -> Check:
    return Check(id, title, OK, summary, None, details)


def warn(id: str, title: str, summary: str, fix: str, **details: Any) -> Check:
    return Check(id, title, WARN, summary, fix, details)


def fail(id: str, title: str, summary: str, fix: str, **details: Any) -> Check:
    return Check(id, title, FAIL, summary, fix, details)


@dataclass(frozen=True)
class Report:
    """Every check, in the order shown, and where they were made."""

    machine: str  # "rk3588 board", "x86_64 (no NPU)", "rk3588 board (emulated)"
    checks: tuple[Check, ...]

    @property
    def blockers(self) -> int:
        """The number of ✗ lines: ``doctor``'s exit code (0: a run can go)."""
        return sum(c.status == FAIL for c in self.checks)

    def check(self, id: str) -> Check:
        """The check named ``id`` (KeyError when it was not made)."""
        for c in self.checks:
            if c.id == id:
                return c
        raise KeyError(id)

    def text(self, name: Callable[[str], str] = str) -> str:
        lines = [f"batchinfer doctor: {self.machine}"]
        lines += [c.line(name) for c in self.checks]
        n = self.blockers
        if n == 0:
            lines.append("No blockers: a run can go.")
        else:
            lines.append(
                f"{n} blocker{'s' if n > 1 else ''} (✗): fix {'them' if n > 1 else 'it'} first."
            )
        return "\n".join(lines)

    def to_json(self, name: Callable[[str], str] = str) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "blockers": self.blockers,
            "checks": [asdict(c.rendered(name)) for c in self.checks],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        return cls(data["machine"], tuple(Check(**c) for c in data["checks"]))
