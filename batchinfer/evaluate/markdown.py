"""Names and messages as Markdown data: nothing in them can open a span, a tag or a cell.

Class folders, file names, job and metric names are whatever a filesystem or a user allows:
a backtick would close a code span early, ``<img src=x onerror=...>`` would be raw HTML to
a Markdown renderer, a ``|`` would split a table cell and a newline would end a table row.

- :func:`code` puts a name in a code span fenced by more backticks than the longest run
  in it (CommonMark's rule), padded with a space each side (which renderers strip) when it
  starts or ends with a backtick or space, so a backtick inside stays text and ``<``,
  ``&`` show as typed;
- :func:`text` backslash-escapes the punctuation that starts Markdown or HTML in free text
  (messages that quote a name);
- in a table cell (``code(..., cell=True)``) a ``|`` is escaped too, which GFM honours
  even inside a code span; in both, line breaks and other control characters are written as escapes
  (``\\n``), so one name stays on one line.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")
_RUNS = re.compile(r"`+")
# Backslash escapes are valid before any ASCII punctuation (CommonMark 2.4): these are the
# ones that can start emphasis, a link, code, raw HTML or an entity, or split a cell.
_PUNCTUATION = re.compile(r"([\\`*_\[\]<>&|~!])")
# Words joined by '.', '_' or '-' mean nothing to Markdown (an underscore inside a word
# never starts emphasis): such a name may stay bare.
_PLAIN = re.compile(r"[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*")


def _visible(name: str) -> str:
    """``name`` on one line: control characters as escapes (``\\n``, ``\\x1b``)."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), name)


def code(name: object, *, cell: bool = False) -> str:
    """``name`` as an inline code span that nothing in it can end early."""
    body = _visible(str(name))
    fence = "`" * (max((len(r) for r in _RUNS.findall(body)), default=0) + 1)
    if cell:
        body = body.replace("|", "\\|")
    if body[:1] in ("`", " ") or body[-1:] in ("`", " "):
        body = f" {body} "  # renderers strip one space each side: the name keeps its own
    return f"{fence}{body}{fence}"


def name(value: object, *, cell: bool = False) -> str:
    """A metric's or a setting's name: bare when it is plain words (``top1_agreement``),
    else a :func:`code` span."""
    value = str(value)
    return value if _PLAIN.fullmatch(value) else code(value, cell=cell)


def text(message: object) -> str:
    """Free ``message`` as Markdown text: shown as written, never markup (in a table cell
    too: its ``|`` is escaped everywhere)."""
    return _PUNCTUATION.sub(r"\\\1", _visible(str(message)))
