"""The fingerprint of a run: everything that decides what a prediction row says.

A ``--resume`` appends rows to the ones already on disk, so it is refused unless it would
write the same rows the first invocation would have: the same model bytes, backend,
preprocessing, output options and dataset (folder, listing, and each file's size and
modification time, or with ``--resume-check content`` its bytes: an image replaced under
its own name is a changed dataset too). Settings that change how
fast or where a row is made (cores, instances, slots, timeouts, --limit) are not part of
it: a resume may use other cores, for instance to leave out one that failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchinfer.errors import UsageError
from batchinfer.messages import Message, as_message, join, setting

#: Human names of the fingerprint's entries, in the order differences are reported.
_LABELS = {
    "model_sha256": "model file (sha256)",
    "runtime_files": "files the runtime reads beside the model (sha256)",
    "backend": "backend",
    "preprocess": "preprocessing",
    "topk": setting("output.topk"),
    "save_outputs": setting("output.save_outputs"),
    "dataset_root": "dataset folder",
    "dataset_items": "number of dataset items",
    "dataset_listing_sha256": "dataset listing (the items' names, sha256)",
    "class_map": "class map (labels)",
    "resume_check": setting("output.resume_check"),
    "dataset_stat_sha256": "state of the dataset's files (each one's size and modification "
    "time, sha256)",
    "dataset_content_sha256": "content of the dataset's files (sha256)",
    "task": "task and detection settings",
    "video": "video settings (every, fps, keyframes, start, end, max frames, decoder, autorotate)",
}

#: Entries older manifests do not have: a resume of such a run cannot check them.
_ADDED_LATER = ("resume_check", "dataset_stat_sha256", "dataset_content_sha256")


def run_fingerprint(
    *,
    model_sha256: str,
    runtime_files: dict[str, str],
    backend: str,
    preprocess: dict[str, Any],
    topk: int,
    save_outputs: bool,
    dataset_root: str,
    dataset_items: int,
    dataset_listing_sha256: str,
    class_map: dict[str, Any] | None = None,
    resume_check: str | None = None,
    dataset_files_sha256: str | None = None,
    task: dict[str, Any] | None = None,
    video: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The fingerprint as a JSON-able dict (stored in the manifest).

    ``dataset_files_sha256`` (data/fingerprint.py) covers what ``resume_check`` says of
    every item's file: ``stat`` its size and mtime, ``content`` its bytes. Without it
    (evaluations) the fingerprint has no such entries. ``task``: None for a classification
    run (the task's Task.fingerprint), so those keep the fingerprint they had before tasks
    existed.
    """
    files: dict[str, Any] = {}
    if dataset_files_sha256 is not None:
        files = {
            "resume_check": resume_check,
            f"dataset_{resume_check}_sha256": dataset_files_sha256,
        }
    out = files | {
        "model_sha256": model_sha256,
        "runtime_files": dict(sorted(runtime_files.items())),
        "backend": backend,
        "preprocess": preprocess,
        "topk": topk,
        "save_outputs": save_outputs,
        "dataset_root": dataset_root,
        "dataset_items": dataset_items,
        "dataset_listing_sha256": dataset_listing_sha256,
        "class_map": class_map,
    }
    if task is not None:
        out["task"] = task
    if video is not None:  # a video dataset's (batchinfer.data.video); others keep theirs
        out["video"] = video
    return out


def _short(value: Any) -> str:
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12] + "…"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_short(v)}" for k, v in value.items()) + "}"
    return str(value)


def _dict_diff(old: dict, new: dict) -> str:
    keys = [k for k in dict.fromkeys([*old, *new]) if old.get(k) != new.get(k)]
    return ", ".join(f"{k} {_short(old.get(k))} → {_short(new.get(k))}" for k in keys)


def fingerprint_differences(old: dict[str, Any], new: dict[str, Any]) -> list[Message]:
    """One phrase per entry that differs, e.g. ``--topk 5 → 3``; [] when they agree."""
    out: list[Message] = []
    for key, label in _LABELS.items():
        a, b = old.get(key), new.get(key)
        if a == b or (key in _ADDED_LATER and key not in old):
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out.append(as_message(label) + f": {_dict_diff(a, b)}")
        else:
            out.append(as_message(label) + f" {_short(a)} → {_short(b)}")
    return out


def check_resume_fingerprint(
    out: Path, recorded: dict[str, Any] | None, fingerprint: dict[str, Any]
) -> None:
    """UsageError naming every difference between the run in ``out`` (its manifest's
    ``recorded`` fingerprint) and this one."""
    differences = fingerprint_differences(recorded or {}, fingerprint)
    if differences:
        raise UsageError(
            setting("output.resume")
            + f": the run in {out} was made with a different "
            + join("; ", differences)
            + ". Resume it with the settings it was started with, or start a new run "
            "(another " + setting("output.out") + ", or " + setting("output.overwrite") + ")."
        )
