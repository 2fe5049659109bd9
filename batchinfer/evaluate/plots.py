"""Figures for the evaluation report, shared by every task's sections: matplotlib ``Figure``
objects made without pyplot (no global state, no display), turned into inline SVG.

Names are user data: :func:`plain_text` makes a plot draw every label as written (no
mathtext), and :func:`plain_legend` does so for a legend's texts.
"""

from __future__ import annotations

import functools
import io
import itertools
import re
from collections.abc import Callable
from typing import Any, ParamSpec

import matplotlib
from matplotlib.figure import Figure

_salt = itertools.count()
P = ParamSpec("P")
PASS_COLOR, FAIL_COLOR = "#2e7d32", "#c62828"


def dom_id(text: str) -> str:
    """An id usable in HTML and CSS selectors (``reference.top1`` -> ``reference-top1``)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", text)


def svg(fig: Figure) -> str:
    """The figure as inline SVG (ids salted per figure, so two plots never share one)."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": f"batchinfer-{next(_salt)}"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg") :]


def plain_text(plot: Callable[P, str]) -> Callable[P, str]:
    """Make ``plot`` draw every label as written: no mathtext.

    A class folder or metric named ``$\\notacommand{$`` would otherwise be parsed as
    LaTeX math, and fail the whole report (usetex=False does not turn mathtext off). The
    setting is read when a Text is made and when it is drawn: both happen inside ``plot``.
    """

    @functools.wraps(plot)
    def plain(*args: P.args, **kwargs: P.kwargs) -> str:
        with matplotlib.rc_context({"text.parse_math": False}):
            return plot(*args, **kwargs)

    return plain


def figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100)
    fig.set_layout_engine("constrained")
    return fig


def plain_legend(ax: Any, **kwargs: Any) -> None:
    """``ax.legend(**kwargs)`` with its texts drawn as written (no mathtext)."""
    legend = ax.legend(**kwargs)
    for text in legend.get_texts():
        text.set_parse_math(False)


__all__ = ["dom_id", "figure", "plain_legend", "plain_text", "svg"]
