"""Naming a shard set: one ``.tar`` path, or a pattern with braces
(``shards/train-{000..099}.tar``) that expands to the shards' paths, in order.
"""

from __future__ import annotations

import itertools
import os
import re

from batchinfer.errors import DatasetError

#: Brace ranges expand to at most this many names (a typo such as {0..9999999} is refused).
MAX_SHARDS = 100_000

_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")
COMPRESSED = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")


def is_shard_spec(spec: str | os.PathLike[str]) -> bool:
    """True when ``spec`` names tar shards (a ``.tar`` path, braces allowed), not a folder."""
    text = os.fspath(spec).lower()
    return (text.endswith(".tar") or text.endswith(COMPRESSED)) and not os.path.isdir(spec)


def expand_braces(pattern: str) -> list[str]:
    """Every name ``pattern`` stands for, in order: ``{000..099}`` is a range (zero-padded
    to the wider bound when one has a leading zero; descending when the first is larger),
    ``{a,b}`` a list; several braces give every combination, leftmost slowest (as bash).
    DatasetError for an unbalanced or empty brace, or more than MAX_SHARDS names."""
    parts: list[list[str]] = []
    pos = 0
    for match in re.finditer(r"\{([^{}]*)\}", pattern):
        parts.append([pattern[pos : match.start()]])
        parts.append(_alternatives(match.group(1), pattern))
        pos = match.end()
    parts.append([pattern[pos:]])
    if any("{" in p[0] or "}" in p[0] for p in parts[::2]):
        raise DatasetError(
            f"The shard pattern {pattern} has an unbalanced or nested brace; write ranges "
            "as {000..099} and lists as {a,b}, one level deep."
        )
    total = 1
    for options in parts:
        total *= len(options)
    if total > MAX_SHARDS:
        raise DatasetError(
            f"The shard pattern {pattern} stands for {total} names, more than {MAX_SHARDS}; "
            "check its ranges."
        )
    return ["".join(combo) for combo in itertools.product(*parts)]


def _alternatives(body: str, pattern: str) -> list[str]:
    match = _RANGE.fullmatch(body)
    if match:
        first, last = match.group(1), match.group(2)
        a, b = int(first), int(last)
        padded = any(len(s.lstrip("-")) > 1 and s.lstrip("-")[0] == "0" for s in (first, last))
        width = max(len(first), len(last)) if padded else 0
        step = 1 if b >= a else -1
        if abs(b - a) + 1 > MAX_SHARDS:
            raise DatasetError(
                f"The shard pattern {pattern} has a range {{{body}}} of more than {MAX_SHARDS} "
                "names; check it."
            )
        return [str(n).zfill(width) for n in range(a, b + step, step)]
    if "," in body:
        return body.split(",")
    raise DatasetError(
        f"The shard pattern {pattern} has a brace {{{body}}} that is neither a range "
        "{000..099} nor a list {a,b}; fix it (or quote the pattern so the shell leaves it)."
    )
