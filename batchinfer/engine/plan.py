"""RunPlan: a RunConfig checked against the machine, the model, the dataset and OUT.

Everything that can be wrong with an invocation is found here, before any process or
shared-memory segment exists, so a usage error leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from batchinfer.data.dataset import Dataset, open_dataset
from batchinfer.data.preprocess import Preprocess, preprocess_for
from batchinfer.engine.affinity import resolve_affinity
from batchinfer.engine.config import RunConfig
from batchinfer.engine.slots import sweep_dead_segments
from batchinfer.errors import ModelError, OutputExistsError, OutputWriteError, UsageError
from batchinfer.runtime import describe_model, resolve_backend
from batchinfer.runtime.constants import CHIP_CORES
from batchinfer.sink.manifest import model_sha256, read_manifest
from batchinfer.sink.resume import ResumeState, prepare_resume


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
    out: Path
    resume: ResumeState | None
    todo: int
    skipped: int

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


def _prepare_out(config: RunConfig) -> Path:
    if config.out is None:
        out = Path("runs") / time.strftime("%Y%m%d-%H%M%S")
        n = 1
        while out.exists():
            n += 1
            out = Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{n}"
    else:
        out = Path(config.out)
    out = out.resolve()
    if out.exists() and not out.is_dir():
        raise OutputExistsError(
            f"--out {out} is a file, not a folder; pass the path of a folder to write results to."
        )
    if out.exists() and any(out.iterdir()) and not config.resume:
        if not config.overwrite:
            raise OutputExistsError(
                f"output folder {out} already exists; pass --resume to continue that run, "
                "--overwrite to replace it, or another --out."
            )
        if not (out / "manifest.json").exists() and not (out / "predictions").exists():
            raise OutputExistsError(
                f"output folder {out} exists and does not look like a batchinfer run, so "
                "--overwrite will not delete it; pass another --out."
            )
        shutil.rmtree(out)
    try:
        (out / "predictions").mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise OutputWriteError(
            f"output folder {out} is not writable ({e.strerror}); pass an --out you can write to."
        ) from e
    return out


def _check_resume_model(out: Path, model: Path) -> None:
    if not (out / "manifest.json").exists():
        return
    try:
        before = read_manifest(out).get("model_sha256")
    except Exception:
        return
    if before and before != model_sha256(model):
        raise UsageError(
            f"--resume: the run in {out} was made with a different model file; resume it with "
            "the same model, or start a new run with another --out."
        )


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
    """Check ``config`` and prepare OUT; raise a UsageError (exit 2) or a RunFailedError."""
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
    out = _prepare_out(config)
    resume = None
    if config.resume:
        _check_resume_model(out, model)
        resume = prepare_resume(out)
    sweep_dead_segments()
    n = len(dataset) if config.limit is None else min(len(dataset), config.limit)
    skipped = 0 if resume is None else int((resume.done < n).sum())
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
        out=out,
        resume=resume,
        todo=n - skipped,
        skipped=skipped,
    )
