"""RunPlan: a RunConfig checked against the machine, the model, the dataset and OUT.

Everything that can be wrong with an invocation is found here, before any process or
shared-memory segment exists, so a usage error leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from batchinfer.data.dataset import Dataset, open_dataset
from batchinfer.data.preprocess import Preprocess, preprocess_for
from batchinfer.engine.affinity import resolve_affinity
from batchinfer.engine.config import RunConfig
from batchinfer.engine.slots import sweep_dead_segments
from batchinfer.errors import ModelError, OutputWriteError, UsageError
from batchinfer.runtime import describe_model, resolve_backend
from batchinfer.runtime.constants import CHIP_CORES
from batchinfer.sink.fingerprint import fingerprint_differences, run_fingerprint
from batchinfer.sink.manifest import RunManifest, model_sha256
from batchinfer.sink.outdir import (
    OutFolder,
    OutLock,
    check_out,
    check_separate,
    clear_run,
    inspect_out,
)
from batchinfer.sink.resume import ResumeState, prepare_resume, verify_parts


@dataclass(frozen=True)
class RunPlan:
    """A validated run: resolved paths, backend, cores, preprocessing, sizes, OUT state."""

    config: RunConfig
    backend: str
    chip: str
    model: Path
    dataset: Dataset
    preprocess: Preprocess
    cores: tuple[int, ...]
    slots: int
    readers: int
    cpus: tuple[int, ...] | None
    out: OutFolder
    fingerprint: dict
    model_sha256: str
    resume: ResumeState | None = None
    todo: int = 0
    skipped: int = 0

    def preprocess_json(self) -> dict:
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.preprocess).items()
        }


def detect_chip() -> str | None:
    """The Rockchip SoC this machine is, from the device tree (None when not a Rockchip)."""
    with contextlib.suppress(OSError):
        compatible = Path("/proc/device-tree/compatible").read_bytes().decode(errors="replace")
        for chip in CHIP_CORES:
            if f"rockchip,{chip}" in compatible:
                return chip
    return None


def _chip_for(backend: str, config: RunConfig) -> str:
    if backend == "sim":
        return (config.sim.chip or os.environ.get("BATCHINFER_SIM_CHIP") or "rk3588").lower()
    if backend == "rknnlite":
        return detect_chip() or "rk3588"
    return "rk3588"  # onnx: no NPU; cores are worker processes laid out as on an RK3588


def _cores(config: RunConfig, chip: str) -> tuple[int, ...]:
    n = CHIP_CORES.get(chip, 1)
    valid = tuple(range(n))
    if config.cores is None:
        return valid
    cores = tuple(config.cores)
    bad = [c for c in cores if c not in valid]
    if bad or not cores or len(set(cores)) != len(cores):
        listed = ",".join(str(c) for c in valid)
        raise UsageError(
            f"--cores {','.join(str(c) for c in cores) or '(empty)'} is not a list of distinct "
            f"NPU cores of {chip.upper()}, which has cores {listed}; pass e.g. --cores {listed}."
        )
    return cores


def _model_input(model: Path, config: RunConfig) -> tuple[tuple[int, ...], str]:
    try:
        info = describe_model(model)
    except ModelError:
        if model.suffix.lower() != ".rknn" or config.size is None:
            raise
        # A bare .rknn on a board: shapes cannot be read off it, so the flags say them.
        channels = 1 if config.color == "gray" else 3
        return (1, *config.size, channels), config.dtype or "uint8"
    if len(info.inputs) != 1:
        raise UsageError(
            f"model {model} has {len(info.inputs)} inputs; batchinfer run feeds one tensor per "
            "dataset item, so use a model with one input."
        )
    return info.inputs[0].shape, info.inputs[0].dtype


def _out_path(config: RunConfig) -> Path:
    if config.out is not None:
        return Path(os.path.abspath(Path(config.out).expanduser()))
    out = Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    n = 1
    while out.exists():
        n += 1
        out = Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{n}"
    return Path(os.path.abspath(out))


def _runtime_files(model: Path) -> dict[str, str]:
    """sha256 of the files a runtime reads beside a .rknn (its .onnx, conversion settings)."""
    if model.suffix.lower() != ".rknn":
        return {}
    beside = [model.with_suffix(".onnx"), model.with_name(model.stem + ".config.json")]
    return {p.name: model_sha256(p) for p in beside if p.is_file()}


def _check_resume_fingerprint(folder: OutFolder, fingerprint: dict) -> None:
    if folder.state != "run" or folder.manifest is None:
        return
    before = folder.manifest.data.get("fingerprint") or {}
    differences = fingerprint_differences(before, fingerprint)
    if differences:
        raise UsageError(
            f"--resume: the run in {folder.path} was made with a different "
            + "; ".join(differences)
            + ". Resume it with the settings it was started with, or start a new run "
            "(another --out, or --overwrite)."
        )


def prepare_out(plan: RunPlan, lock: OutLock) -> tuple[RunPlan, RunManifest | None]:
    """Take OUT's lock, then clear it (--overwrite) or verify it (--resume); nothing else.

    Returns the plan with what is already done, and the manifest being continued (None
    for a new run). OUT is inspected again under the lock: another run may have changed
    it since planning.
    """
    cfg = plan.config
    lock.acquire()
    folder = inspect_out(plan.out.path)
    check_out(folder, overwrite=cfg.overwrite, resume=cfg.resume, probe_lock=False)
    manifest = None
    resume = None
    if folder.state == "run" and cfg.overwrite:
        clear_run(folder)
    elif folder.state == "run" and cfg.resume:
        _check_resume_fingerprint(folder, plan.fingerprint)
        manifest = folder.manifest
        resume = prepare_resume(manifest)
    try:
        (folder.path / "predictions").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputWriteError(
            f"output folder {folder.path} is not writable ({e.strerror}); pass an --out you "
            "can write to."
        ) from e
    n = len(plan.dataset) if cfg.limit is None else min(len(plan.dataset), cfg.limit)
    skipped = 0 if resume is None else resume.done_below(n)
    plan = dataclasses.replace(plan, out=folder, resume=resume, todo=n - skipped, skipped=skipped)
    return plan, manifest


def _check_faults(specs: tuple[str, ...], chip: str) -> None:
    from batchinfer.runtime.sim import parse_fault

    for spec in specs:
        fault = parse_fault(spec)
        if fault.core is not None and fault.core >= CHIP_CORES[chip]:
            raise UsageError(
                f"--sim-fault {spec}: core {fault.core} does not exist on {chip} "
                f"(cores 0-{CHIP_CORES[chip] - 1}); name one of those cores."
            )


def plan_run(config: RunConfig) -> RunPlan:
    """Check ``config`` against the machine, model, dataset and OUT; changes nothing.

    Raises a UsageError (exit 2) for anything wrong with the invocation, including an OUT
    this run may not use and a --resume whose settings differ from the run's.
    """
    # OUT first: a folder held by another run is refused before any slow check.
    folder = inspect_out(_out_path(config))
    check_separate(folder.path, Path(config.dataset).expanduser())
    check_out(folder, overwrite=config.overwrite, resume=config.resume)
    model = Path(config.model).expanduser().resolve()
    if not model.is_file():
        raise ModelError(
            f"model file {model} does not exist; pass the path of a .rknn or .onnx file."
        )
    backend = resolve_backend(config.backend, model)
    if backend == "rknnlite":
        from batchinfer.errors import RuntimeUnavailableError
        from batchinfer.runtime.rknnlite import unavailable_reason

        reason = unavailable_reason()
        if reason:
            raise RuntimeUnavailableError(reason)
    chip = _chip_for(backend, config)
    if chip not in CHIP_CORES:
        raise UsageError(f"chip {chip!r} is unknown; use one of {', '.join(CHIP_CORES)}.")
    if backend == "sim":
        _check_faults(config.sim.faults, chip)
    cores = _cores(config, chip)
    for name, value, low in (
        ("--instances-per-core", config.instances_per_core, 1),
        ("--topk", config.topk, 1),
        ("--max-attempts", config.max_attempts, 1),
        ("--part-rows", config.part_rows, 1),
    ):
        if value < low:
            raise UsageError(f"{name} must be at least {low}, not {value}.")
    if config.timeout_s <= 0:
        raise UsageError(f"--timeout-s must be positive, not {config.timeout_s:g}.")
    shape, dtype = _model_input(model, config)
    preprocess = preprocess_for(
        shape,
        dtype,
        size=config.size,
        color=config.color,
        layout=config.layout,
        dtype_override=config.dtype,
        mean=config.mean,
        std=config.std,
    )
    dataset = open_dataset(Path(config.dataset).expanduser())
    cpus = resolve_affinity(config.cpu_affinity)
    readers = config.readers
    if readers is None:
        readers = max(1, min(4, (os.cpu_count() or 2) // 2))
    if readers < 1:
        raise UsageError(f"--readers must be at least 1, not {readers}.")
    if config.limit is not None and config.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {config.limit}.")
    # Each instance holds up to three slots in its worker (see _QUEUED_PER_INSTANCE in
    # coordinator.py); one more per instance waits READY, so a finished item is replaced
    # at once; two per reader are being decoded.
    slots = config.slots
    if slots is None:
        slots = len(cores) * config.instances_per_core * 4 + readers * 2
    if slots < 2:
        raise UsageError(f"--slots must be at least 2, not {slots}.")
    sha = model_sha256(model)
    pre_json = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(preprocess).items()}
    fingerprint = run_fingerprint(
        model_sha256=sha,
        runtime_files=_runtime_files(model),
        backend=backend,
        preprocess=pre_json,
        topk=config.topk,
        save_outputs=config.save_outputs,
        dataset_root=str(dataset.root),
        dataset_items=len(dataset),
        dataset_listing_sha256=dataset.listing_sha256,
    )
    if config.resume and folder.manifest is not None:
        _check_resume_fingerprint(folder, fingerprint)
        verify_parts(folder.manifest)
    sweep_dead_segments()
    return RunPlan(
        config=config,
        backend=backend,
        chip=chip,
        model=model,
        dataset=dataset,
        preprocess=preprocess,
        cores=cores,
        slots=slots,
        readers=readers,
        cpus=cpus,
        out=folder,
        fingerprint=fingerprint,
        model_sha256=sha,
    )
