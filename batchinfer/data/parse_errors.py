"""What a parser's ValueError says, for a user, in one line.

json, tomllib and PyYAML turn digits into ints with ``int()``, which refuses an integer of
more than ``sys.get_int_max_str_digits()`` digits (4300: a guard against quadratic-time
conversion) with a plain ValueError that none of them wraps in its own error type, and
whose message advises a call the user cannot make.
"""

from __future__ import annotations

import sys


def parse_problem(exc: ValueError) -> str:
    """``exc`` (a parser's error) in one line, an over-long integer said as such."""
    text = " ".join(str(exc).split())
    if "integer string conversion" in text:
        limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 4300
        return f"it holds an integer of more than {limit} digits"
    return text
