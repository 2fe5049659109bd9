"""Tasks users plug in: ``--task path/to/file.py:Class``, ``--task package.module:Class``,
or the name an installed package registers in the entry-point group ``batchinfer.tasks``
(``[project.entry-points."batchinfer.tasks"] faces = "mypkg.faces:RetinaFace"``).

A plug-in is a subclass of :class:`batchinfer.tasks.Task` and runs through the same protocol
as the built-in tasks (base.py): its ``recognise`` plans it at start-up, its ``decode`` runs
in the core workers, its ``fields`` are its columns. Refused at start-up with one line
(ConfigError, exit 2): a reference that does not load (no such file, module or class, an
import that raises), a class that is no Task, a ``recognise`` that raises or returns no
task. Once running, a ``decode`` that raises, returns something that cannot travel back
from the worker (not picklable), or values its fields cannot store gives that item's error
row: never a worker's death, never a lost row.

How the class reaches the core workers: the planned task object travels in the worker's
spec, pickled, but a plug-in's class is pickled *by its reference*: the class loaded here
remembers the ``file.py:Class`` (an absolute path) or ``module:Class`` it came from, and a
worker imports it again from there (:func:`rebuild`), then restores the instance's fields.
Code is never pickled, and the file is read again in each worker process (workers are
forked from a server started before the plug-in was loaded).
"""

from __future__ import annotations

import copyreg
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchinfer.errors import ConfigError
from batchinfer.messages import setting
from batchinfer.tasks.base import ModelFacts, Task

if TYPE_CHECKING:
    from batchinfer.options import DetectOptions

#: The entry-point group installed packages register tasks in (name -> "module:Class").
ENTRY_POINT_GROUP = "batchinfer.tasks"

_loaded: dict[str, type[Task]] = {}


def _refuse(reference: str, why: str) -> ConfigError:
    return ConfigError(setting("detect.task") + f" {reference}: {why}", "detect.task")


def entry_point(name: str) -> str | None:
    """The ``module:Class`` an installed package registers as task ``name``, or None."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return str(ep.value)
    return None


def reference_of(name: str) -> str:
    """A plug-in's loadable reference: ``/abs/file.py:Class`` or ``module:Class``."""
    if ":" not in name:
        found = entry_point(name)
        if found is None:
            raise _refuse(name, f"no installed package registers it ({ENTRY_POINT_GROUP}).")
        name = found
    where, _, cls = name.rpartition(":")
    if where.endswith(".py"):
        where = str(Path(where).expanduser().resolve())
    return f"{where}:{cls}"


def load(reference: str) -> type[Task]:
    """The Task class ``reference`` names (ConfigError, one line, when it cannot be had)."""
    reference = reference_of(reference)
    if reference in _loaded:
        return _loaded[reference]
    where, _, cls_name = reference.rpartition(":")
    if not where or not cls_name:
        raise _refuse(reference, "give path/to/file.py:ClassName or package.module:ClassName.")
    try:
        module = _import_file(Path(where)) if where.endswith(".py") else _import(where)
    except ConfigError:
        raise
    except BaseException as e:  # the plug-in's own code raised while importing
        if isinstance(e, (KeyboardInterrupt, SystemExit)) and not isinstance(e, SystemExit):
            raise
        raise _refuse(reference, f"importing it failed: {type(e).__name__}: {e}") from None
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise _refuse(reference, f"{where} has no {cls_name}.")
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise _refuse(
            reference, f"{cls_name} is not a batchinfer.tasks.Task subclass; make it one."
        )
    if not cls.name:
        raise _refuse(reference, f"{cls_name} has no name (a class attribute: name = '...').")
    cls._batchinfer_reference = reference  # type: ignore[attr-defined]
    # Its instances pickle as (reference, fields): the worker imports the class again.
    copyreg.pickle(cls, _by_reference)
    _loaded[reference] = cls
    return cls


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and module.startswith(e.name):
            raise _refuse(f"{module}", f"no module {e.name!r} can be imported.") from None
        raise


def _import_file(path: Path) -> Any:
    if not path.is_file():
        raise _refuse(str(path), "no such file.")
    name = "batchinfer_task_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise _refuse(str(path), "it cannot be imported as a Python file.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def plan_plugin(name: str, facts: ModelFacts, options: DetectOptions) -> Task:
    """Plug-in ``name`` planned for the model (ConfigError, one line, when refused)."""
    cls = load(name)
    try:
        task = cls.recognise(facts, options, asked=True)
    except ConfigError:
        raise
    except Exception as e:
        raise _refuse(name, f"its recognise() raised {type(e).__name__}: {e}") from None
    if task is None:
        raise _refuse(name, f"it does not take {facts.model.name} (its recognise() said no).")
    if not isinstance(task, Task):
        raise _refuse(name, f"its recognise() returned {type(task).__name__}, not a Task.")
    try:
        fields = task.fields()
        task.decoder()
    except Exception as e:
        raise _refuse(name, f"planning it failed: {type(e).__name__}: {e}") from None
    _check_fields(name, fields)
    return task


def _check_fields(name: str, fields: object) -> None:
    import pyarrow as pa

    from batchinfer.sink.columns import base_field_names

    if not isinstance(fields, list) or not all(isinstance(f, pa.Field) for f in fields):
        raise _refuse(name, "its fields() must return a list of pyarrow.Field.")
    taken = base_field_names()
    clash = [f.name for f in fields if f.name in taken or f.name.startswith("out_")]
    if clash:
        raise _refuse(name, f"its field {clash[0]!r} is a column batchinfer writes; rename it.")


def _by_reference(task: Task) -> tuple[Any, tuple[str, dict[str, Any]]]:
    return rebuild, (type(task)._batchinfer_reference, dict(task.__dict__))  # type: ignore[attr-defined]


def rebuild(reference: str, state: dict[str, Any]) -> Task:
    """A plug-in task again in another process: its class imported by reference (module
    docstring), its fields restored."""
    cls = load(reference)
    task = cls.__new__(cls)
    task.__dict__.update(state)
    return task
