"""Option groups: one set of names, types, defaults and help shared by every front end.

The library speaks in field names (``runtime.slots``, ``reliability.inference_timeout_s``);
each front end renders them its own way: the CLI as flags (``--slots``), a job file as
TOML keys (``[runtime] slots = 8``). Defaults live here and nowhere else: click options
are generated from these fields (see ``batchinfer.cli.options``) and job files are read
into the same dataclasses (:func:`from_mapping`).

A field's metadata says how a front end shows it:
- ``help``: one line for ``--help`` and the docs;
- ``flag``: the CLI flag when it is not ``--`` + the name with dashes;
- ``short``: a one-letter alias;
- ``parse``: how the CLI turns its text into the value (e.g. ``0,1,2`` -> (0, 1, 2));
- ``choices``: the allowed values, when there is a fixed set;
- ``words``: the only strings a number-or-word setting takes (``-k auto``);
- ``bounds``: the range of a numeric setting (:class:`batchinfer.bounds.Bounds`), e.g.
  ``option(0.25, "...", bounds=Bounds(0, 1))`` (0 <= x <= 1), ``Bounds(0, 1, above=True,
  below=True)`` (0 < x < 1), ``Bounds(1, 10_000, why="...")``; a ceiling may be a function
  of the machine (``Bounds(1, readers_ceiling)``). Job files are checked on load
  (:func:`from_mapping`); runs, benches and evaluations when planned (``check_settings`` in
  batchinfer.engine.planning.plan checks every group of a RunConfig with :func:`check_group`). A
  value out of range is one ConfigError (exit 2) naming the setting and its limit. Floats
  must be finite, bounded or not. Every numeric field of a group in GROUPS must declare its
  ``bounds`` (tests/test_bounds.py checks); None and words (``"estimate"``) always pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from batchinfer.bounds import (
    DAY_S,
    Bounds,
    item_bytes_ceiling,
    pixels_ceiling,
    readers_ceiling,
)
from batchinfer.option_reading import (  # noqa: F401  (the options' public API, kept here)
    check_group,
    from_mapping,
    options_fields,
    similar_name,
)
from batchinfer.options_video import VideoOptionFields

#: Every backend a run can name (batchinfer.runtime.backends has their classes).
BACKEND_NAMES = ("auto", "rknnlite", "onnx", "sim", "toolkit")


def option(default: Any, help: str, **meta: Any) -> Any:
    """A dataclass field with front-end metadata (see the module docstring)."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("use tuples or None for defaults, so the options stay frozen")
    return field(default=default, metadata={"help": help, **meta})


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip() != "")
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of integers") from None


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of numbers") from None


def _size(text: str) -> tuple[int, int]:
    try:
        parts = [int(v) for v in text.lower().replace("x", ",").split(",")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or min(parts) < 1:
        raise ValueError(f"{text!r} is not a size; give 224 or 224x224 (HxW)")
    return parts[0], parts[1]


def _pixels(text: str) -> int | str:
    if text.strip().lower() == "none":
        return "none"
    try:
        value = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise ValueError(f"{text!r} is not a number of pixels (or 'none')") from None
    return value


_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def _bytes(text: str) -> int | str:
    """A number of bytes (``268435456``, ``256MiB``, ``256M``, ``1.5GiB``), or a word."""
    word = text.strip().lower()
    if word in ("auto", "none"):
        return word
    number = word.replace(",", "").replace("_", "").removesuffix("b").removesuffix("i")
    unit = number[-1:] if number[-1:] in _UNITS else ""
    try:
        value = float(number[: len(number) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise ValueError(
            f"{text!r} is not a number of bytes; give e.g. 268435456, 256MiB or 1GiB "
            "(or 'auto', or 'none')"
        ) from None
    if not value.is_integer():
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)


N = TypeVar("N", int, float)


def _number_or(word: str, number: Callable[[str], N], what: str) -> Callable[[str], N | str]:
    """The parser of a setting that is a number (``number(text)``, ``what`` in its error)
    or the ``word`` (any case): the word as it is spelt here."""

    def parse(text: str) -> N | str:
        if text.strip().lower() == word:
            return word
        try:
            return number(text)
        except ValueError:
            raise ValueError(f"{text!r} is not {what} (or {word!r})") from None

    return parse


_ms_or_estimate = _number_or("estimate", float, "milliseconds")
_instances = _number_or("auto", int, "a number of instances")


# ------------------------------------------------------------------------ shared ranges
#: Timeouts: positive, and a day at most (longer would switch hang detection off).
TIMEOUT = Bounds(0, DAY_S, above=True, why="one day")
#: The emulator's per-call times.
SIM_MS = Bounds(0, 60_000, why="a minute; hangs are injected as faults")
#: Classes kept per row (top-k) at most, in runs and in evaluations.
TOPK_MAX = 1000
#: Item counts (``--limit``, ``dataset.limit``): an int64, like the rows' item index.
ITEMS = Bounds(1, 2**63 - 1)


# --------------------------------------------------------------------------- the groups
@dataclass(frozen=True)
class SimOptions:
    """The NPU emulator's settings (``--backend sim``); None: the emulator's default."""

    npu_ms: float | str | None = option(
        None,
        "NPU time per inference in ms (default 2), or 'estimate' (from the model's size).",
        parse=_ms_or_estimate,
        bounds=SIM_MS,
    )
    host_ms: float | None = option(
        None, "Host time per inference in ms, outside the NPU (default 4).", bounds=SIM_MS
    )
    chip: str | None = option(
        None, "Chip to emulate (default rk3588).", choices=("rk3588", "rk3576", "rk3566")
    )
    faults: tuple[str, ...] = option(
        (),
        "Inject a fault: KIND:core=C:call=N or KIND:item=I (KIND crash, hang, none, init), "
        "init:core=C, skew:core=C, leak:mb=M or leak:core=C:mb=M (every call keeps M MB) "
        "(repeatable).",
        flag="--sim-fault",
        multiple=True,
    )

    def is_default(self) -> bool:
        return self == SimOptions()


@dataclass(frozen=True)
class RuntimeOptions:
    """Which runtime runs the model, on which NPU cores, with how many processes."""

    backend: str = option(
        "auto",
        "auto: .rknn -> rknnlite (the NPU), .onnx -> onnx (ONNX Runtime on the CPU); "
        "sim: an emulated NPU; toolkit: rknn-toolkit2's simulator (quantised numerics, no "
        "timing; in its own environment).",
        choices=BACKEND_NAMES,
    )
    cores: tuple[int, ...] | None = option(
        None, "NPU cores to use, e.g. 0,1,2 (default: every core of the chip).", parse=_ints
    )
    instances_per_core: int | str = option(
        1,
        "Runtime instances per core (threads of the core's worker); 2-3 keep a core busy; "
        "auto: chosen from a short measurement on one core at start.",
        short="-k",
        parse=_instances,
        words=("auto",),
        bounds=Bounds(1, 16, why="a core runs one inference at a time; more only queue"),
    )
    slots: int | None = option(
        None,
        "Shared-memory slots (default: 7 per instance + 2 per reader).",
        # Planning also checks that the slots' inputs fit /dev/shm (plan_engine).
        bounds=Bounds(2, 65_536, why="the coordinator tracks every slot"),
    )
    readers: int | None = option(
        None,
        "Reader processes that decode inputs (default: from the CPU count).",
        bounds=Bounds(1, readers_ceiling),
    )
    cpu_affinity: str = option(
        "auto",
        "CPUs for our processes: auto (the big cores on big.LITTLE), none, or a list like 4-7.",
    )
    sim: SimOptions = field(default_factory=SimOptions)


@dataclass(frozen=True)
class PreprocessOptions(VideoOptionFields):
    """How a dataset item becomes the model's input tensor; None: from the model's input.
    The video fields (which frames, which decoder) come first: batchinfer.options_video."""

    size: tuple[int, int] | None = option(
        None,
        "Resize inputs to HxW (default: the model's input size).",
        parse=_size,
        bounds=Bounds(1, 16_384),
    )
    color: str | None = option(
        None, "Channel order (default: from the model).", choices=("rgb", "bgr", "gray")
    )
    layout: str | None = option(
        None,
        "Input layout (default: the model's input layout).",
        choices=("nhwc", "nchw"),
    )
    dtype: str | None = option(None, "Input dtype, e.g. uint8 or float32 (default: the model's).")
    mean: tuple[float, ...] | None = option(
        None,
        "Per-channel mean subtracted from float inputs, e.g. 123.7,116.3,103.5.",
        parse=_floats,
        bounds=Bounds(-65_536, 65_536),
    )
    std: tuple[float, ...] | None = option(
        None,
        "Per-channel std dividing float inputs, e.g. 58.4,57.1,57.4.",
        parse=_floats,
        bounds=Bounds(0, 65_536, above=True),
    )
    exif_orientation: bool = option(
        True,
        "Rotate and flip images by their EXIF Orientation tag, as image viewers do.",
        flag="--exif-orientation/--no-exif-orientation",
    )
    background: str = option(
        "white",
        "Colour transparent images are composited over: a name, #rrggbb, r,g,b, or none to "
        "drop alpha.",
    )
    max_pixels: int | str = option(
        89_478_485,
        "Images with more pixels (width x height, from the header) become error rows; "
        "none for no limit (default: Pillow's decompression-bomb limit).",
        parse=_pixels,
        bounds=Bounds(1, pixels_ceiling),
    )
    jpeg_draft: bool = option(
        True,
        "Decode large JPEGs at 1/2-1/8 scale when the model's input is that much smaller.",
        flag="--jpeg-draft/--no-jpeg-draft",
    )
    max_item_bytes: int | str = option(
        "auto",
        "Items larger than this (an image file's size, a tar member's as its header says) "
        "become error rows, unread: bytes, or e.g. 512MiB; auto: 3 per pixel of "
        "--max-pixels (256 MiB by default); none for no limit.",
        parse=_bytes,
        words=("auto", "none"),
        bounds=Bounds(1, item_bytes_ceiling),
    )
    inputs: tuple[str, ...] = option(
        (),
        "Feed the model input NAME from the manifest column COLUMN: NAME=COLUMN (repeatable; "
        "the column holds image or .npy paths, or lists of numbers).",
        flag="--input",
        multiple=True,
    )


@dataclass(frozen=True)
class OutputOptions:
    """Where rows go and what they hold."""

    out: Path | None = option(
        None, "Output folder (default: runs/<timestamp>).", short="-o", path=True
    )
    overwrite: bool = option(False, "Replace the run in an existing output folder.")
    resume: bool = option(
        False, "Continue the run in --out: skip items already written without error."
    )
    topk: int = option(5, "Classes kept per row.", bounds=Bounds(0, TOPK_MAX))
    save_outputs: bool = option(False, "Also store the raw outputs in the prediction rows.")
    part_rows: int = option(
        8192,
        "Rows per Parquet part; a crash loses at most the part being filled.",
        bounds=Bounds(1, 1_000_000, why="a part is held in memory until it is written"),
    )
    resume_check: str = option(
        "stat",
        "What --resume finds unchanged in every dataset file: stat (size and modification "
        "time) or content (its bytes' sha256; reads the whole dataset once more).",
        choices=("stat", "content"),
    )


@dataclass(frozen=True)
class ReliabilityOptions:
    """What counts as a failure, and how long anything may take."""

    max_attempts: int = option(
        2,
        "Attempts per item (on different cores where possible) before it becomes an error row.",
        bounds=Bounds(1, 10),
    )
    inference_timeout_s: float = option(
        60.0,
        "An inference running longer is hung: its worker is killed and restarted.",
        bounds=TIMEOUT,
    )
    decode_timeout_s: float = option(
        60.0,
        "Decoding one file longer is hung: the reader is replaced, the file retried.",
        bounds=TIMEOUT,
    )
    startup_timeout_s: float = option(
        120.0,
        "A worker or reader not ready after this long (model loading included) is killed.",
        bounds=TIMEOUT,
    )
    drain_timeout_s: float = option(
        10.0,
        "On Ctrl-C, how long items already in flight may take to finish.",
        bounds=Bounds(0, DAY_S, why="one day"),
    )
    max_worker_rss_mb: float | None = option(
        None,
        "A core worker whose own memory (RSS less shared pages) passes this many MB is "
        "replaced between items (default: half the machine's memory over the core workers, "
        "at least 256).",
        bounds=Bounds(16, 2**24, why="16 TiB"),
    )
    recycle_after: int = option(
        2000,
        "A core worker whose memory grew steadily over its last N items is replaced "
        "between items; 0: only --max-worker-rss-mb replaces one.",
        bounds=Bounds(0, 2**40, why="no run is that long"),
    )
    canary: bool = option(
        True,
        "Check before the run that every core gives the same outputs.",
        flag="--canary/--no-canary",
    )


# ------------------------------------------------------------------ detection (issue 25)
#: The built-in tasks' names (batchinfer/tasks: auto decides; segment/pose/obb once there).
#: ``detect.task`` also takes a plug-in: path/to/file.py:Class or package.module:Class.
TASKS = ("auto", "classify", "detect", "raw")
#: The head layouts ``detect.head`` may name (batchinfer.detect.heads.HEAD_FAMILIES).
DETECT_HEADS = ("auto", "yolov5-zoo", "yolov8-zoo", "yolov8-ultralytics", "yolov5-ultralytics")


def _anchors(text: str) -> tuple[tuple[float, ...], ...]:
    """Anchors as w,h pixel pairs: strides separated by '/' or ';' (10,13,16,30,33,23/30,61,
    62,45,59,119/116,90,156,198,373,326), or one flat list split evenly over the strides."""
    groups = [g for g in text.replace(";", "/").split("/") if g.strip()]
    try:
        parsed = tuple(tuple(float(v) for v in g.replace(",", " ").split()) for g in groups)
    except ValueError:
        raise ValueError(
            f"{text!r} is not anchors; give w,h pixel pairs per stride, strides separated by "
            "'/', e.g. 10,13,16,30,33,23/30,61,62,45,59,119/116,90,156,198,373,326"
        ) from None
    if not parsed or any(len(g) == 0 or len(g) % 2 for g in parsed):
        raise ValueError(f"{text!r} is not anchors: each stride needs whole w,h pairs")
    return parsed


def _colour(text: str) -> int | tuple[int, int, int]:
    try:
        parts = tuple(int(v) for v in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 3:
        return parts
    raise ValueError(f"{text!r} is not a colour; give one grey level (114) or r,g,b")


@dataclass(frozen=True)
class DetectOptions:
    """What the run does with the outputs, and how a detection head's boxes are decoded."""

    task: str = option(
        "auto",
        "auto, detect, segment, pose, obb, classify, raw, or a plug-in task "
        "(path/to/file.py:Class, package.module:Class, or an installed one's name). auto: "
        "the task the model's metadata names, else the first whose head the outputs are "
        "(detect, segment, pose, obb), classify for one (1, N) output, else raw (the "
        "outputs are stored).",
    )
    conf: float = option(
        0.25, "Detection: the score a box needs to be kept (0-1).", bounds=Bounds(0, 1)
    )
    iou: float = option(
        0.45,
        "Detection: boxes of a class overlapping more than this are merged by NMS (0-1).",
        bounds=Bounds(0, 1, above=True),
    )
    max_det: int = option(
        300,
        "Detection: the most boxes kept per image (1-100000).",
        bounds=Bounds(1, 100_000, why="every box of an image is one row's list"),
    )
    anchors: tuple[tuple[float, ...], ...] | None = option(
        None,
        "Detection: anchors (w,h pixel pairs, strides separated by '/') of an anchor-based "
        "head (default: the model's .config.json 'anchors', else COCO's).",
        parse=_anchors,
        bounds=Bounds(0, 16_384, above=True, why="an anchor is at most an input's side"),
    )
    pad_colour: int | tuple[int, int, int] = option(
        114,
        "Detection: the colour letterboxing pads with, a grey level or r,g,b (0-255).",
        parse=_colour,
        bounds=Bounds(0, 255, why="8-bit pixels"),
    )
    # -- issue 40: Ultralytics' NMS options, and the head layout when the shapes fit two
    agnostic_nms: bool = option(
        False,
        "Detection: NMS across classes: a box suppresses overlapping boxes of every class, "
        "not only of its own (Ultralytics' agnostic_nms).",
        flag="--agnostic-nms/--no-agnostic-nms",
    )
    classes: tuple[int, ...] | None = option(
        None,
        "Detection: keep only boxes of these class ids, e.g. 0,2 (a box's class is its best "
        "class, as in Ultralytics' classes filter).",
        parse=_ints,
        bounds=Bounds(0, 99_999, why="the most classes a head may have"),
    )
    head: str = option(
        "auto",
        "Detection: the head layout, when the output shapes fit two (one (1, N, 4+C) "
        "output: transposed yolov8-ultralytics, or yolov5-ultralytics rows with an object "
        "score); auto: by the class count the labels or the model's metadata give.",
        choices=DETECT_HEADS,
    )


GROUPS: dict[str, type] = {
    "runtime": RuntimeOptions,
    "runtime.sim": SimOptions,
    "preprocess": PreprocessOptions,
    "output": OutputOptions,
    "reliability": ReliabilityOptions,
    "detect": DetectOptions,
}


#: Flags that are not ``--`` + the field's name with dashes (beyond metadata "flag").
_FLAG_PREFIX = {"runtime.sim": "--sim-"}


def flag_name(group: str, f: dataclasses.Field) -> str:
    """The CLI flag of field ``f`` of ``group``, as click spells it: ``--slots``,
    ``--sim-npu-ms``, ``--canary/--no-canary``. The library's keyword for it
    (``batchinfer.run(..., sim_npu_ms=5)``) is the first flag without its dashes, ``_`` for
    ``-``: one set of names for every front end."""
    if "flag" in f.metadata:
        return str(f.metadata["flag"])
    return _FLAG_PREFIX.get(group, "--") + f.name.replace("_", "-")


def keyword_name(group: str, f: dataclasses.Field) -> str:
    """The library's keyword for a setting: its flag as a Python name (``sim_npu_ms``)."""
    return flag_name(group, f).split("/")[0].lstrip("-").replace("-", "_")
