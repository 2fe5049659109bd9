"""``batchinfer doctor``'s checks, in the order shown, for a board or a machine without NPU."""

from __future__ import annotations

import os
from pathlib import Path

from batchinfer.doctor import npu, resources, runtime
from batchinfer.doctor.machine import Machine
from batchinfer.doctor.report import Check, Report, fail, ok
from batchinfer.runtime.backends import detect_chip, rknn_chip
from batchinfer.runtime.constants import CHIP_CORES
from batchinfer.runtime.rknn_file import MAGIC

#: The architectures rknn-toolkit-lite2 exists for (the contract: manylinux aarch64 only).
BOARD_ARCHES = ("aarch64", "arm64")
#: Cores the onnx and sim backends lay their workers out as without a board (an RK3588).
DEFAULT_CORES = CHIP_CORES["rk3588"]
#: Chips that run each other's models (Rockchip's docs: RK3566 and RK3568 share models).
_SAME_MODELS = {"rk3566": "rk3568", "rk3568": "rk3566"}


def run_doctor(machine: Machine | None = None, model: Path | None = None) -> Report:
    """Every check for ``machine`` (default: this one), sized for ``model`` when given.

    Never raises for what it finds: each finding is a line of the report.
    """
    m = machine or Machine()
    # An arm64 machine that is not a Rockchip board (a server, a laptop) is checked as x86
    # is: its backends, not an NPU it does not have.
    if not m.emulated and (m.arch.lower() not in BOARD_ARCHES or detect_chip(m.root) is None):
        checks = [
            *runtime.backends(),
            *resources.memory(m, DEFAULT_CORES, model),
            resources.open_files(m, DEFAULT_CORES),
        ]
        return Report(
            f"{m.arch}, no Rockchip NPU: batchinfer runs its onnx, sim and toolkit backends here",
            tuple(checks),
        )
    soc, chip = npu.soc(m)
    cores = CHIP_CORES.get(chip or "", 1)
    version, where = npu.driver_version(m)
    checks = [
        soc,
        npu.driver(m, version, where),
        npu.kernel(m, chip, version),
        runtime.librknnrt(m, model),
        runtime.toolkit_lite(m),
        npu.permissions(m),
    ]
    if model is not None and chip is not None:
        checks.append(model_platform(model, chip))
    checks += [
        *resources.memory(m, cores, model),
        npu.governors(m, chip),
        resources.open_files(m, cores),
    ]
    where_text = (
        "emulated: the files it shows, written in a temporary folder"
        if m.emulated
        else "this board"
    )
    return Report(f"{(chip or m.arch).upper()} board ({where_text})", tuple(checks))


def model_platform(model: Path, chip: str) -> Check:
    """Whether ``model`` (a .rknn) was converted for this chip (else init_runtime fails with
    RKNN_ERR_TARGET_PLATFORM_UNMATCH)."""
    not_rknn = _not_rknn(model)
    if not_rknn is not None:
        return fail("model", "Model", not_rknn, "copy or convert the model again.")
    made_for = rknn_chip(model)
    if made_for is None:
        return ok(
            "model",
            "Model",
            f"{model.name}: no target platform to check (not a .rknn with metadata)",
        )
    if made_for in (chip, _SAME_MODELS.get(chip)):
        return ok("model", "Model", f"{model.name} was converted for {made_for.upper()}")
    return fail(
        "model",
        "Model",
        f"{model.name} was converted for {made_for.upper()}, and this is {chip.upper()}",
        f"convert the model again with rknn.config(target_platform='{chip}').",
    )


def _not_rknn(model: Path) -> str | None:
    """Why a .rknn file is no RKNN model at all (load_rknn would refuse it), else None.

    An empty or truncated download, or an HTML error page saved under the model's name,
    has no metadata either: without this it passed as a model too old to say its platform.
    """
    if model.suffix.lower() != ".rknn":
        return None
    try:
        with open(model, "rb") as fh:
            head = fh.read(len(MAGIC))
            size = os.fstat(fh.fileno()).st_size
    except OSError as exc:
        return f"{model.name} cannot be read ({exc.strerror or exc})"
    if head == MAGIC:
        return None
    return (
        f"{model.name} is not an RKNN model ({size:,} bytes, not starting with 'RKNN'): "
        "an empty or cut-short copy, or another file under its name"
    )
