"""``rknn_log``: the log object an RKNNLite keeps; its ``.logger`` gates every line written.

The real constructor sets ``self.rknn_log``, whose ``.logger`` is a ``logging.Logger``;
deployed clients lower it at start-up (``rknn_lite.rknn_log.logger.setLevel(logging.ERROR)``).
Lines look like the real ones: ``<letter> <message>`` for the Python side (``W
rknn-toolkit-lite2 version: 2.5.0``, ``E Catch exception when setting inputs.``) and
``<letter> RKNN: [hh:mm:ss.mmm] <message>`` for what librknnrt itself prints.

Level: DEBUG with ``verbose=True``, else INFO (or ``$BATCHINFER_RKNN_LOG_LEVEL``), so the
librknnrt-style ``I RKNN:`` lines show by default as on a board. On a board those come from
the C library and are not gated by this logger (``RKNN_LOG_LEVEL`` gates them); here every
line is.

Lines go to stderr ([guess]: the real logger may write to stdout; its module names a
``stdout_handler``) and, when ``verbose_file`` is given, are appended to that file too.
The file is opened and closed for each line, so an instance never holds a descriptor.

The real package gets its letters by renaming Python's logging levels when it is imported
(runtime/_level_names.py); this log writes them itself and works under either names
(``python -m batchinfer.runtime.emulate`` renames them as the real import does).
"""

from __future__ import annotations

import datetime
import logging
import os
import sys

_LETTERS = {logging.DEBUG: "D", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E"}
# $BATCHINFER_RKNN_LOG_LEVEL's names, read from a table of our own rather than logging's,
# whose names the real rknnlite import (or the emulator, when asked) replaces with letters.
_START_LEVELS = {
    **{name: level for level, name in _LETTERS.items()},
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
}


def _letter(levelno: int) -> str:
    return _LETTERS.get(levelno, "E" if levelno > logging.ERROR else "D")


class _LineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{_letter(record.levelno)} {record.getMessage()}"


class _StderrHandler(logging.Handler):
    """Writes to ``sys.stderr`` as it is when the line is written (test capture swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


class _AppendFileHandler(logging.Handler):
    """Appends each line to a file, opening it only for that line (no descriptor is kept)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(self.format(record) + "\n")
        except OSError:
            pass  # a log file that cannot be written must not break inference


class _OwnLogger(logging.Logger):
    """A Logger outside logging's registry whose setLevel takes effect at once.

    Logger.setLevel clears the level caches of registered loggers only; this one clears
    its own, or a client lowering the level after the first line would change nothing.
    """

    def setLevel(self, level: int | str) -> None:
        super().setLevel(level)
        # Logger._cache is CPython's private level cache, which typeshed does not declare.
        self._cache.clear()  # type: ignore[attr-defined]


def quiet_instance_logs() -> None:
    """Start this process's non-verbose instances at ERROR, unless the user chose a level.

    Called where the engine makes its runtimes (core workers, cluster actors): deployed
    clients lower rknn_log the same way, so a run's console is not filled with every
    instance's start-up I and W lines; errors still show.
    """
    os.environ.setdefault("BATCHINFER_RKNN_LOG_LEVEL", "ERROR")


class RKNNLog:
    """The ``rknn_log`` attribute: ``.logger`` plus RKNNLite's e/w/i/d/p helpers."""

    def __init__(self, verbose: bool, verbose_file: str | None) -> None:
        # Not registered with logging.getLogger: it lives and dies with its RKNNLite.
        self.logger = _OwnLogger("rknnlite")
        self.logger.propagate = False
        # BATCHINFER_RKNN_LOG_LEVEL (e.g. ERROR) sets where a non-verbose instance starts: the
        # engine's core workers start at ERROR, as deployed clients lower it, so a run's
        # console is not filled with every instance's start-up lines.
        start = os.environ.get("BATCHINFER_RKNN_LOG_LEVEL", "").upper()
        level = _START_LEVELS.get(start, logging.INFO)
        self.logger.setLevel(logging.DEBUG if verbose else level)
        formatter = _LineFormatter()
        handlers: list[logging.Handler] = [_StderrHandler()]
        if verbose_file:
            handlers.append(_AppendFileHandler(verbose_file))
        for handler in handlers:
            handler.setFormatter(formatter)
            self.logger.addHandler(handler)

    def e(self, msg: str, throw: bool = True) -> None:
        """An E line; like the real one, raises ValueError(msg) unless ``throw`` is False."""
        self.logger.error(msg)
        if throw:
            raise ValueError(msg)

    def w(self, msg: str) -> None:
        self.logger.warning(msg)

    def i(self, msg: str) -> None:
        self.logger.info(msg)

    def d(self, msg: str) -> None:
        self.logger.debug(msg)

    def p(self, msg: str) -> None:
        """A plain line on stdout (list_devices and list_support_target_platform print)."""
        print(msg)

    def native(self, level: int, msg: str) -> None:
        """A line as librknnrt prints it: ``I RKNN: [hh:mm:ss.mmm] msg``."""
        if self.logger.isEnabledFor(level):
            stamp = datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]
            self.logger.log(level, f"RKNN: [{stamp}] {msg}")
