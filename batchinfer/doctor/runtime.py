"""Checks of the software a board run needs: librknnrt, rknn-toolkit-lite2, and on a
machine without an NPU, which of batchinfer's other backends can run.

librknnrt carries its version as text (``strings librknnrt.so | grep "librknnrt version"``
gives ``librknnrt version: 2.3.2 (429f97ae6b@2025-04-09T09:09:27)``, the same text it logs
at init). A runtime older than the rknn-toolkit2 that converted the model is the first
trap users meet (``Invalid RKNN model version 6``, airockchip/rknn-toolkit2#254).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

from batchinfer.doctor.machine import Machine, dotted, version_tuple
from batchinfer.doctor.report import Check, fail, ok, warn
from batchinfer.errors import BatchinferError
from batchinfer.runtime.rknnlite import LIBRKNNRT

#: Where rknn-toolkit-lite2 loads the runtime from (ctypes, a fixed path: the contract).
LOADED_FROM = str(LIBRKNNRT)
LIB_DIRS = ("/usr/lib", "/usr/lib64", "/usr/local/lib")
_VERSION_RE = re.compile(rb"librknnrt version: (\d+\.\d+\.\d+[^\x00\n]*)")
_CHUNK = 1 << 20
LITE_PACKAGE = "rknn-toolkit-lite2"
#: The CPython versions rknn-toolkit-lite2 2.5.0 has wheels for (aarch64 only).
LITE_PYTHONS = ((3, 7), (3, 12))
_GET_LIB = (
    "install librknnrt.so from airockchip/rknn-toolkit2 "
    "(rknpu2/runtime/Linux/librknn_api/aarch64/) to /usr/lib"
)


def embedded_version(path: Path) -> str | None:
    """The "librknnrt version: X.Y.Z (...)" text inside the library, read in chunks."""
    tail = b""
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                match = _VERSION_RE.search(tail + chunk)
                if match:
                    return match.group(1).decode("ascii", "replace").strip()
                tail = chunk[-200:]  # a version split across two chunks
    except OSError:
        return None
    return None


def library_dirs(m: Machine) -> list[str]:
    extra = [d for d in m.env.get("LD_LIBRARY_PATH", "").split(":") if d.startswith("/")]
    return list(dict.fromkeys([*extra, *LIB_DIRS]))


def model_toolkit(model: Path | None) -> str | None:
    """The rknn-toolkit2 version that converted ``model`` (a .rknn), from its metadata."""
    if model is None or model.suffix.lower() != ".rknn":
        return None
    from batchinfer.runtime.rknn_file import read_rknn_metadata

    try:
        meta = read_rknn_metadata(model)
    except BatchinferError:
        return None
    return meta.version if meta is not None else None


def librknnrt(m: Machine, model: Path | None) -> Check:
    title = "librknnrt"
    found = {
        f"{d.rstrip('/')}/librknnrt.so": embedded_version(m.path(f"{d}/librknnrt.so"))
        for d in library_dirs(m)
        if m.path(f"{d}/librknnrt.so").is_file()
    }
    details = {"found": found}
    if LOADED_FROM not in found:
        elsewhere = next(iter(found), None)
        return fail(
            "librknnrt",
            title,
            f"{LOADED_FROM} is missing"
            + (
                f" (there is {elsewhere}, but rknn-toolkit-lite2 loads {LOADED_FROM})"
                if elsewhere
                else ""
            ),
            (f"sudo ln -s {elsewhere} {LOADED_FROM}" if elsewhere else _GET_LIB) + ".",
            **details,
        )
    text = found[LOADED_FROM]
    have = version_tuple(text)
    if have is None:
        return warn(
            "librknnrt",
            title,
            f"{LOADED_FROM} has no readable version string",
            f"{_GET_LIB} (a release names its version: strings {LOADED_FROM} | grep version).",
            **details,
        )
    need_text = model_toolkit(model)
    need = version_tuple(need_text)
    if need is not None and have < need:
        return fail(
            "librknnrt",
            title,
            f"{dotted(have)} is older than rknn-toolkit2 {dotted(need)}, which converted "
            f"{model.name if model else 'the model'}",
            f"{_GET_LIB}, version >= {dotted(need)}.",
            version=text,
            model_toolkit=need_text,
            **details,
        )
    against = f", new enough for {model.name} (toolkit {dotted(need)})" if need and model else ""
    more = "" if need or model else " (give --model to check it against a model)"
    return ok(
        "librknnrt", title, f"{text} at {LOADED_FROM}{against}{more}", version=text, **details
    )


def _wheel_tags(dist: importlib.metadata.Distribution) -> list[str]:
    text = dist.read_text("WHEEL") or ""
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]


def toolkit_lite(m: Machine) -> Check:
    title = LITE_PACKAGE
    here = sys.version_info[:2]
    python = f"{here[0]}.{here[1]}"
    low, high = LITE_PYTHONS
    supported = low <= here <= high
    dists = list(
        importlib.metadata.distributions(
            name=LITE_PACKAGE, path=list(m.python_path) if m.python_path is not None else sys.path
        )
    )
    span = f"{low[0]}.{low[1]}-{high[0]}.{high[1]}"
    if not dists:
        if not supported:
            return fail(
                "toolkit_lite2",
                title,
                f"not installed, and it has no wheel for Python {python} (only {span})",
                f"make a virtual environment with Python {span} and pip install "
                "'batchinfer[rk]' in it.",
            )
        return fail(
            "toolkit_lite2",
            title,
            f"not installed for this Python ({python}, {sys.executable})",
            "pip install 'batchinfer[rk]' (with this Python's pip).",
        )
    dist = dists[0]
    version = dist.version
    tags = _wheel_tags(dist)
    tag = f"cp{here[0]}{here[1]}"
    if tags and not any(t.startswith(f"{tag}-") for t in tags):
        return fail(
            "toolkit_lite2",
            title,
            f"{version} is installed for {', '.join(tags)}, not for Python {python}",
            f"pip install --force-reinstall 'batchinfer[rk]' with Python {python}'s pip.",
            version=version,
            tags=tags,
        )
    return ok("toolkit_lite2", title, f"{version} for Python {python}", version=version, tags=tags)


#: What each backend is for, as doctor says it on a machine without an NPU.
BACKEND_USES = {
    "onnx": "ONNX Runtime on the CPU: runs the .onnx (or the .onnx beside a .rknn); "
    "the float reference",
    "sim": "the NPU emulator: an RK3588/RK3576/RK3566 board's timing, cores and faults, "
    "on the .onnx beside a .rknn",
    "toolkit": "rknn-toolkit2's simulator: the NPU's quantised numerics of a real .rknn, no timing",
    "rknnlite": "the real NPU (rknn-toolkit-lite2 + librknnrt), on an aarch64 board",
}


def backend_unavailable(name: str) -> str | None:
    """Why backend ``name`` cannot run on this machine (None: it can), from the backends'
    own checks."""
    if name == "rknnlite":
        from batchinfer.runtime.rknnlite import unavailable_reason

        return unavailable_reason()
    if name == "toolkit":
        from batchinfer.runtime.toolkit import unavailable_reason as toolkit_reason

        return toolkit_reason()
    if importlib.util.find_spec("onnxruntime") is None:  # onnx and sim run ONNX Runtime
        return (
            f"The {name} backend needs onnxruntime, which is not installed; "
            "pip install onnxruntime."
        )
    return None


def backends() -> list[Check]:
    """One line per backend: available (✓) or why not (!). None is a blocker: a machine
    without an NPU is expected to lack some."""
    checks = []
    for name, use in BACKEND_USES.items():
        reason = backend_unavailable(name)
        if reason is None:
            checks.append(ok(f"backend_{name}", f"backend {name}", f"available: {use}"))
        else:
            checks.append(
                warn(f"backend_{name}", f"backend {name}", f"not available here ({use})", reason)
            )
    return checks
