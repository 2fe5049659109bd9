"""The one exception tree of batchinfer.

Every error a user can cause or meet is a :class:`BatchinferError`; the CLI catches
that one class, prints its message (one sentence: what is wrong, what to do) and exits
with its ``exit_code``. Exit codes are a contract with schedulers:

    0  every item succeeded
    1  the run finished but some items are error rows (or an evaluation regressed)
    2  usage or configuration error: nothing ran
    3  the run could not proceed (no core could start, output unwritable, ...)
  130  interrupted (SIGINT/SIGTERM); the output is resumable
"""

from __future__ import annotations

from collections.abc import Callable

from batchinfer.messages import Message, as_message
from batchinfer.messages import render as render_fields

__all__ = [
    "BatchinferError",
    "ConfigError",
    "DatasetError",
    "InferenceError",
    "InputError",
    "ModelError",
    "NoCoreError",
    "OutputExistsError",
    "OutputLockedError",
    "OutputLostError",
    "OutputTamperedError",
    "OutputWriteError",
    "RunFailedError",
    "RunInterrupted",
    "RuntimeUnavailableError",
    "SharedMemoryError",
    "UsageError",
    "render_fields",
]


class BatchinferError(Exception):
    """Base of every error batchinfer raises on purpose.

    Its message names settings as data (batchinfer.messages: ``"lower " +
    setting("runtime.slots")``): ``str()`` shows the field name (``runtime.slots``), and each
    front end renders its own with :meth:`render` (the CLI shows ``--slots``). A plain string
    with ``{group.setting}`` templates (the older convention) is read into one on the way in.
    """

    exit_code = 3

    def __init__(self, *args: object) -> None:
        if args and isinstance(args[0], str):
            args = (as_message(args[0]), *args[1:])
        super().__init__(*args)

    @property
    def message(self) -> Message:
        """The message, its settings as references."""
        first = self.args[0] if self.args else ""
        return first if isinstance(first, Message) else as_message(str(first))

    def render(self, name: Callable[[str], str]) -> str:
        """The message with every setting named by ``name(field)``."""
        return self.message.render(name)

    def __str__(self) -> str:
        return self.render(lambda field: field)


class UsageError(BatchinferError):
    """A bad invocation or configuration: nothing ran."""

    exit_code = 2


class ConfigError(UsageError):
    """A setting is wrong; ``fields`` lists the settings at fault, the main one first."""

    def __init__(self, message: str, *fields: str) -> None:
        super().__init__(message)
        self.fields = fields or self.message.settings


class DatasetError(UsageError):
    """The dataset is missing, empty or of an unknown kind."""


class ModelError(UsageError):
    """The model file is missing or cannot be loaded."""


class RuntimeUnavailableError(UsageError):
    """The requested runtime cannot be used on this machine."""


class OutputExistsError(UsageError):
    """The output folder exists and neither --resume nor --overwrite was given."""


class OutputLockedError(UsageError):
    """Another run holds the output folder."""


class OutputTamperedError(UsageError):
    """A run folder holds what batchinfer never writes (a manifest naming a file outside
    predictions/, a symlink or folder where a part should be): nothing in it is used."""


class RunInterrupted(BatchinferError):
    """SIGINT, SIGTERM or SIGHUP arrived before the run started: nothing was written."""

    exit_code = 130

    def __init__(self, message: str = "interrupted before the run started") -> None:
        super().__init__(message)


class RunFailedError(BatchinferError):
    """The run started but could not proceed."""

    exit_code = 3


class NoCoreError(RunFailedError):
    """No NPU core could be started."""


class OutputWriteError(RunFailedError):
    """Results could not be written (permissions, disk full)."""


class OutputLostError(OutputWriteError):
    """The output folder was deleted, moved or replaced while the run wrote to it."""


class SharedMemoryError(RunFailedError):
    """Shared memory could not be allocated (/dev/shm too small)."""


class InputError(BatchinferError):
    """One dataset item could not be read or preprocessed.

    Raised inside reader processes; the engine turns it into an error row for that item
    and goes on. It never reaches the CLI.
    """


class InferenceError(BatchinferError):
    """A runtime call failed (returned -1 or None); raised by the runtime adapter."""
