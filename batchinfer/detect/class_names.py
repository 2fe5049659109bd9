"""A detection run's class names: a labels file's, the dataset's own, the model's.

The dataset's own are a COCO JSON's categories or a data.yaml's ``names``.
A detection run over such a dataset names its boxes' classes by them when no labels file
is given (batchinfer/tasks), and keeps a COCO file's category ids, so ``export coco`` writes
the ids the annotations use. The model's class i is the dataset's i-th category by id (as
Ultralytics numbers COCO's categories, and as evaluations match classes by order,
batchinfer.evaluate.groundtruth.category_ids_for). Files whose classes cannot be read this
way (no categories, a malformed entry) give None: the dataset itself was checked when it
was opened, and a run does not need names to run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: More classes than any detector has: a names list past this is not taken.
MAX_CLASSES = 100_000


@dataclass(frozen=True)
class DatasetClasses:
    """A dataset's classes, by model class id."""

    names: tuple[str, ...]
    category_ids: tuple[int, ...] | None  # COCO category id of each class (COCO files)
    source: str  # for messages: "the categories of instances.json"


def dataset_classes(dataset: Path | str | None) -> DatasetClasses | None:
    """The classes a COCO JSON or data.yaml dataset names; None for other datasets and for
    files without usable class names."""
    if dataset is None:
        return None
    path = Path(dataset)
    suffix = path.suffix.lower()
    try:
        if not path.is_file():
            return None
        if suffix == ".json":
            return _coco(path)
        if suffix in (".yaml", ".yml"):
            return _yaml(path)
    except (OSError, ValueError, RecursionError, MemoryError):
        return None
    return None


def _coco(path: Path) -> DatasetClasses | None:
    from batchinfer.data.coco_file import read_coco_json
    from batchinfer.errors import BatchinferError

    try:
        _, data = read_coco_json(path, "the COCO file")
    except BatchinferError:
        return None
    categories = data.get("categories") if isinstance(data, dict) else None
    if not isinstance(categories, list) or not 0 < len(categories) <= MAX_CLASSES:
        return None
    by_id: dict[int, str] = {}
    for c in categories:
        if not isinstance(c, dict):
            return None
        cid, name = c.get("id"), c.get("name")
        if not isinstance(cid, int) or isinstance(cid, bool) or not isinstance(name, str):
            return None
        if cid in by_id:
            return None
        by_id[cid] = name
    ids = sorted(by_id)
    return DatasetClasses(
        tuple(by_id[i] for i in ids), tuple(ids), f"the categories of {path.name}"
    )


def _yaml(path: Path) -> DatasetClasses | None:
    # The data.yaml reader's own checks (a regular file, bounded, keys type-checked without
    # walking them): the dataset was opened through it, so a file it refuses never gets here.
    from batchinfer.data.yolo_yaml import read_data_yaml
    from batchinfer.errors import BatchinferError

    try:
        names = read_data_yaml(path).names
    except BatchinferError:
        return None
    if names is None or not 0 < len(names) <= MAX_CLASSES:
        return None
    return DatasetClasses(names, None, f"the names of {path.name}")


# -- a detection run's class names --------------------------------------------------------

#: Where a detection run's class names came from (the manifest's ``task.names_source``).
NAMES_FROM_FILE, NAMES_COCO80, NAMES_NONE = "labels-file", "coco80", "none"
NAMES_METADATA, NAMES_DATASET = "model-metadata", "dataset"


@dataclass(frozen=True)
class ClassNames:
    """A detection run's class names by class id, where they came from, and the COCO
    category id of each class when the dataset's COCO file gave them."""

    names: tuple[str, ...]
    source: str
    category_ids: tuple[int, ...] = ()
    warning: str | None = None  # a dataset whose class count disagrees with the head's


def labels_file_names(labels: Path) -> tuple[str, ...]:
    """The names of a labels file, line 1 being class 0; ConfigError unless it names each
    class id 0..N-1."""
    from batchinfer.data.classes import read_labels_file
    from batchinfer.errors import ConfigError
    from batchinfer.messages import setting

    class_map = read_labels_file(labels)
    by_label = sorted(class_map.labels.items(), key=lambda kv: (kv[1], kv[0]))
    ids = [label for _, label in by_label]
    if ids != list(range(len(ids))):
        raise ConfigError(
            f"The labels file {class_map.file} ("
            + setting("labels")
            + ") does not name each class id "
            f"0..{len(ids) - 1} (a detection head's classes are numbered from 0); list one "
            "name per line, line 1 being class 0.",
            "labels",
        )
    return tuple(name for name, _ in by_label)


def class_names(
    head_classes: int,
    describe: str,
    labels: Path | None,
    metadata: tuple[str, ...] | None,
    dataset: DatasetClasses | None,
) -> ClassNames:
    """The class names of a head of ``head_classes`` classes (``describe``: the head, for
    messages): the labels file's (a count that differs is a ConfigError), else the
    dataset's own (a COCO file's categories, a data.yaml's names; a count that differs is
    said and they are not used), else the model's metadata's when they fit, else COCO's
    80 names for an 80-class head, else none."""
    from batchinfer.detect.coco import COCO80
    from batchinfer.errors import ConfigError
    from batchinfer.messages import setting

    if labels is not None:
        names = labels_file_names(labels)
        if len(names) != head_classes:
            raise ConfigError(
                f"The labels file {labels} ("
                + setting("labels")
                + f") names {len(names)} classes, but the model's head has {head_classes} "
                f"({describe}); give one name per class, line 1 being class 0.",
                "labels",
            )
        return ClassNames(names, NAMES_FROM_FILE)
    warning = None
    if dataset is not None:
        if len(dataset.names) == head_classes:
            return ClassNames(dataset.names, NAMES_DATASET, dataset.category_ids or ())
        warning = (
            f"The dataset names {len(dataset.names)} classes ({dataset.source}), but the "
            f"model's head has {head_classes} ({describe}); its names are not used. Give "
            "the model's class names with " + setting("labels") + "."
        )
    if metadata is not None and len(metadata) == head_classes:
        return ClassNames(metadata, NAMES_METADATA, warning=warning)
    if head_classes == len(COCO80):
        return ClassNames(tuple(COCO80), NAMES_COCO80, warning=warning)
    return ClassNames((), NAMES_NONE, warning=warning)
