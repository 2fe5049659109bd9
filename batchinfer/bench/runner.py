"""One benchmark run: the engine with a synthetic (or repeated dataset) source, a null
sink and the measuring observer; then the figures, the verdict and the diagnosis.

    plan (reads only) ─► conditions before ─► Engine(source, NullSink, BenchObserver).run()
      ─► conditions after ─► figures ─► verdict ─► diagnosis ─► BenchResult

Without a dataset, tensors of the model's input shape are written once into the slots
(:class:`SyntheticSource`): no readers run and only the inference path is measured. With
one, readers decode its files as in ``run`` (end to end), and the dataset is read again
from its first item whenever it ends before the measurement does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import batchinfer
from batchinfer.bench.conditions import Probe, condition_reasons, npu_load, probe
from batchinfer.bench.cpu import CpuSampler, cpu_use, reset_peak_rss, usable_cpus
from batchinfer.bench.diagnosis import Evidence, diagnose, with_emulator_share
from batchinfer.bench.figures import figures
from batchinfer.bench.limits import Limits
from batchinfer.bench.limits import measure as measure_limits
from batchinfer.bench.measure import BenchObserver
from batchinfer.bench.options import BenchOptions, check_bench
from batchinfer.bench.result import BenchResult
from batchinfer.bench.verdict import Measured, judge
from batchinfer.data.dataset import Dataset, Item, say_notes
from batchinfer.data.sources import open_source
from batchinfer.data.video.dataset import VideoDataset
from batchinfer.engine.board.instance_probe import settle_instances
from batchinfer.engine.events import Observer
from batchinfer.engine.loop import Engine
from batchinfer.engine.npu_watch import NpuLoadWatch, board_backend
from batchinfer.engine.planning.config import RunConfig
from batchinfer.engine.planning.interface import EnginePlan
from batchinfer.engine.planning.plan import plan_inference
from batchinfer.engine.plumbing.signals import StopSignals
from batchinfer.engine.sources import DatasetSource, SyntheticSource
from batchinfer.hostinfo import host_facts
from batchinfer.options import (
    DetectOptions,
    PreprocessOptions,
    ReliabilityOptions,
    RuntimeOptions,
)
from batchinfer.options_video import video_settings
from batchinfer.runtime.npu_load import NpuLoad
from batchinfer.sink.manifest import model_sha256
from batchinfer.sink.rows import NullSink


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark: the model, the runtime settings, the measurement, the inputs."""

    model: Path
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    bench: BenchOptions = field(default_factory=BenchOptions)
    dataset: Path | None = None  # None: synthetic inputs, inference path only
    image_root: Path | None = None  # where a list's or COCO file's relative paths start
    preprocess: PreprocessOptions = field(default_factory=PreprocessOptions)
    reliability: ReliabilityOptions = field(default_factory=ReliabilityOptions)
    detect: DetectOptions = field(default_factory=DetectOptions)  # the task (batchinfer/tasks)
    command: str | None = None


class RepeatedDataset(DatasetSource):
    """A dataset folder's items, read again from the first whenever it ends, until
    :meth:`finish`. Indexes keep counting up, so each pass's items are new items."""

    def __init__(self, dataset: Dataset) -> None:
        super().__init__(dataset)
        self._finished = False
        self.passes = 0

    @property
    def total(self) -> int | None:
        return None

    def finish(self) -> None:
        self._finished = True

    def __iter__(self) -> Iterator[Item]:
        index = 0
        while not self._finished:
            for item in self.dataset.iter_from():
                if self._finished:
                    return
                yield dataclasses.replace(item, index=index)
                index += 1
            self.passes += 1


@dataclass(frozen=True)
class Prepared:
    """A checked benchmark, ready to run (planning only reads)."""

    config: BenchConfig
    model: Path
    plan: EnginePlan
    dataset: Dataset | None
    shape: tuple[int, ...]
    dtype: str


def prepare(config: BenchConfig) -> Prepared:
    """Check ``config`` against the model, the backend and the dataset; changes nothing."""
    check_bench(config.bench)
    run_config = RunConfig(
        dataset=config.dataset or Path("."),
        model=config.model,
        runtime=config.runtime,
        preprocess=config.preprocess,
        reliability=config.reliability,
        detect=config.detect,
    )
    # One input, fed whole (no feeds); a benchmark does not score labels, so none are read.
    dataset = config.dataset
    planned = plan_inference(
        run_config,
        (
            lambda _labels: open_source(
                dataset,
                image_root=config.image_root,
                video=video_settings(config.preprocess),
            )
        )
        if dataset
        else None,
        several_inputs=False,
    )
    if planned.dataset is not None:
        say_notes(planned.dataset, labels=False)  # a benchmark does not score labels
    return Prepared(
        config, planned.model, planned.engine, planned.dataset, planned.shape, planned.dtype
    )


def label(backend: dict[str, Any]) -> str:
    """What the figures are: a board's, the emulator's, or the CPU's."""
    name = backend.get("name")
    if name == "sim":
        return (
            f"emulated NPU (batchinfer sim, {backend.get('chip')}: npu {backend.get('npu_ms'):g} "
            f"ms, host {backend.get('host_ms'):g} ms per call): emulator figures, not a board's"
        )
    if name == "onnx":
        return "ONNX Runtime on the CPU: no NPU involved"
    return f"real NPU (rknnlite on {backend.get('chip')})"


def _versions(sdk: dict[int, str | None]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "batchinfer": batchinfer.__version__,
        "python": platform.python_version(),
    }
    for package in ("numpy", "onnxruntime", "rknn-toolkit-lite2"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[package] = importlib.metadata.version(package)
    texts = sorted({(v or "").strip() for v in sdk.values() if v})
    if texts:
        out["runtime_sdk"] = texts
    driver = host_facts().get("npu", {}).get("driver")
    if driver:
        out["npu_driver"] = driver
    return out


def _config_json(p: Prepared) -> dict[str, Any]:
    c, plan = p.config, p.plan
    b = c.bench
    return {
        "command": c.command,
        "model": str(p.model),
        "model_sha256": model_sha256(p.model),
        "input": {"shape": list(p.shape), "dtype": p.dtype},
        "backend": plan.backend.name,
        "cores": list(plan.cores),
        "instances_per_core": plan.instances_per_core,
        **({"instances_auto": plan.instances_choice} if plan.instances_choice else {}),
        "slots": plan.slots,
        "readers": plan.readers if p.dataset is not None else 0,
        "cpu_affinity": list(plan.cpus) if plan.cpus else None,
        "source": (
            {"kind": "dataset", "root": str(p.dataset.root), "items": len(p.dataset)}
            | _video_source(p.dataset)
            if p.dataset is not None
            else {"kind": "synthetic"}
        ),
        "duration_s": b.duration_s,
        "warmup_s": b.warmup_s,
        "min_samples": b.min_samples,
        "max_duration_s": b.limit_s,
        "window_s": b.window_s,
        "cpus": usable_cpus(),
        "task": plan.task.describe() if plan.task is not None else "classify",
    }


def postprocess_share(detect: dict[str, float], cpu_s: dict[str, float]) -> dict[str, Any] | None:
    """A detection benchmark's post-processing: the core workers' CPU per item spent decoding
    boxes (timed around the decoder, on each instance's thread clock), and its share of the
    workers' CPU and of all CPU per item (run, warm-up included; start-up left out)."""
    items = int(detect.get("items", 0))
    if not items:
        return None
    decode_s = float(detect.get("cpu_s", 0.0))
    workers = float(cpu_s.get("workers", 0.0))
    total = sum(v for k, v in cpu_s.items() if k != "startup")
    return {
        "items": items,
        "cpu_ms_per_item": round(1e3 * decode_s / items, 4),
        "worker_cpu_ms_per_item": round(1e3 * workers / items, 4) if workers else None,
        "share_of_worker_cpu": round(decode_s / workers, 4) if workers else None,
        "share_of_cpu": round(decode_s / total, 4) if total else None,
        "nonfinite_dropped": int(detect.get("nonfinite", 0)),
        "nonfinite_items": int(detect.get("nonfinite_items", 0)),
    }


def run_bench(
    prepared: Prepared,
    observers: Sequence[Observer] = (),
    read_conditions: Probe | None = None,
    signals: StopSignals | None = None,
) -> BenchResult:
    """Run one benchmark and judge it; a run that could not proceed raises its error.

    ``signals``: the caller's :class:`StopSignals` (a sweep shares one); without it, one is
    installed for this run, so Ctrl-C stops the measurement and keeps what it measured.
    """
    if signals is None:
        with StopSignals() as own:
            return run_bench(prepared, observers, read_conditions, own)
    read_conditions = read_conditions or probe()
    prepared = dataclasses.replace(prepared, plan=settle_instances(prepared.plan))
    plan = prepared.plan
    source = RepeatedDataset(prepared.dataset) if prepared.dataset else SyntheticSource()
    before = read_conditions()
    reset_peak_rss()
    sampler = CpuSampler(clock=time.monotonic)
    observer = BenchObserver(prepared.config.bench, sampler, read_conditions, source.finish)
    # The board's own NPU load (its driver's file; the emulator's under sim), sampled on a
    # thread while the run lasts and averaged over the measurement.
    watch = NpuLoadWatch(lambda: board_backend(engine))
    engine = Engine(plan, source, NullSink(), [observer, watch, *observers])
    signals.engine = engine
    try:
        outcome = engine.run()
    finally:
        signals.engine = None
        watch.stop()
    after = read_conditions()
    if outcome.status == "failed" and outcome.error is not None:
        raise outcome.error
    if observer.phase != "done":
        observer.end_early(
            "interrupted" if outcome.status == "interrupted" else "the run ended early"
        )
    board = watch.summary(observer.t_start, observer.t_end) if observer.t_start else None
    result = _judge(prepared, observer, outcome.backend, outcome.sdk_versions, before, after, board)
    result.interrupted = outcome.status == "interrupted"
    result.postprocess = postprocess_share(outcome.detect, outcome.cpu_s)
    if not result.interrupted:
        result.limits = _limits(prepared, outcome.backend)
        result.diagnosis = with_emulator_share(
            result.diagnosis, result.limits.call_cpu_ms, result.figures.samples_per_s
        )
    return result


def _limits(prepared: Prepared, backend: dict[str, Any]) -> Limits:
    """The NPU and decode limits of this run (after it: they never compete with it)."""
    plan = prepared.plan
    sim = backend.get("name") == "sim"
    npu_ms = backend.get("npu_ms") if sim else None
    data = prepared.dataset
    return measure_limits(
        usable_cpus(),
        len(plan.cores),
        npu_ms if isinstance(npu_ms, (int, float)) else None,
        plan.preprocess,
        [item.path for item in data] if data is not None else (),
        data.kind if data is not None else "",
        plan.backend if sim else None,
        plan.cores[0],
    )


def _judge(
    prepared: Prepared,
    obs: BenchObserver,
    backend: dict[str, Any],
    sdk: dict[int, str | None],
    before: dict,
    after: dict,
    board: NpuLoad | None = None,
) -> BenchResult:
    opts = prepared.config.bench
    plan = prepared.plan
    samples = obs.log.freeze()
    t_start = obs.t_start if obs.t_start is not None else 0.0
    t_end = obs.t_end if obs.t_end is not None else t_start
    npu_ms = backend.get("npu_ms") if backend.get("name") == "sim" else None
    fig = figures(
        samples,
        t_start,
        t_end,
        opts.window_s,
        plan.cores,
        plan.instances_per_core,
        npu_ms if isinstance(npu_ms, (int, float)) else None,
    )
    cpus = usable_cpus()
    use = None
    if obs.cpu_start is not None and obs.cpu_end is not None:
        use = cpu_use(obs.cpu, obs.cpu_start, obs.cpu_end, cpus, obs.runnable)
    other_start = None
    if obs.cpu_started is not None and obs.cpu_start is not None and opts.warmup_s >= 0.5:
        other_start = cpu_use(obs.cpu, obs.cpu_started, obs.cpu_start, cpus).others
    errors = [t for t in obs.error_times if t_start <= t < t_end]
    first = next((e for t, e in obs.first_errors if t_start <= t < t_end), None)
    verdict = judge(
        opts,
        Measured(
            measured_s=fig.measured_s,
            samples=fig.samples,
            errors=len(errors),
            rates=fig.rates,
            stopped=obs.stopped,
            other_cpus_start=other_start,
            other_cpus=None if use is None else use.others,
            first_error=first,
            failures=obs.failures,
            condition_reasons=condition_reasons(obs.readings),
        ),
    )
    loads, source = _npu_loads(fig, obs.readings, board, plan.cores)
    if loads and board is not None and source is not None and source.startswith(board.source):
        fig = dataclasses.replace(
            fig, cores=[dataclasses.replace(c, npu_load=loads.get(c.core)) for c in fig.cores]
        )
    diagnosis = diagnose(
        Evidence(
            cpus=cpus,
            instances_per_core=plan.instances_per_core,
            utilization={c.core: c.utilization for c in fig.cores},
            instances_busy={c.core: c.instances_busy for c in fig.cores},
            npu_load=loads,
            npu_load_source=source,
            coordinator_cpu=sum(p.cpu for p in use.role("coordinator")) if use else 0.0,
            reader_cpu=[p.cpu for p in use.role("reader")] if use else [],
            worker_cpu=[p.cpu for p in use.role("worker")] if use else [],
            other_cpus=use.others if use else 0.0,
            machine_cpus=use.machine if use else 0.0,
            runnable=use.runnable if use else None,
            wait_p50_ms=fig.wait_p50_ms,
            latency_p50_ms=fig.latency_ms["p50"],
            read_p50_ms=fig.read_p50_ms,
            samples_per_s=fig.samples_per_s,
            backend=backend.get("name", ""),
            npu_load_unreadable=board.unreadable if board is not None else None,
        )
    )
    return BenchResult(
        label=label(backend),
        backend=backend,
        verdict=verdict,
        diagnosis=diagnosis,
        figures=fig,
        cpu=use,
        other_cpus_start=other_start,
        errors=len(errors),
        config=_config_json(prepared),
        versions=_versions(sdk),
        conditions={"before": before, "after": after, "during": obs.readings},
        samples=samples,
        t_started=obs.t_started,
        t_start=obs.t_start,
        t_end=obs.t_end,
        stopped=obs.stopped,
    )


#: Readings of the driver's file a measurement needs before its figure is used: the driver
#: keeps one figure a second, so a shorter measurement would show the second before it.
BOARD_SAMPLES = 3


def _npu_loads(
    fig: Any, readings: list[dict], board: NpuLoad | None, cores: tuple[int, ...]
) -> tuple[dict[int, float] | None, str | None]:
    """The NPU load per core over the measurement, and where it came from: the board's own
    driver file (the emulator's under sim) first, from BOARD_SAMPLES readings on; else the
    emulator's time model (calls x npu_ms); else what the conditions' readings hold (a
    devfreq node's whole-NPU load)."""
    mine = board.of(cores) if board is not None else None
    if board is not None and mine and board.samples >= BOARD_SAMPLES:
        return mine, f"{board.source}, {board.samples} samples"
    if fig.cores and fig.cores[0].npu_load is not None:
        return {c.core: c.npu_load for c in fig.cores}, "emulator time model (calls x npu_ms)"
    loads, source = npu_load(readings)
    if loads is not None:
        loads = {c: v for c, v in loads.items() if c < 0 or c in cores}
    return loads, source


def bench(
    config: BenchConfig,
    observers: Sequence[Observer] = (),
    read_conditions: Callable[[], dict] | None = None,
) -> BenchResult:
    """Plan and run one benchmark (see :func:`prepare` and :func:`run_bench`)."""
    return run_bench(prepare(config), observers, read_conditions)


def _video_source(dataset: Any) -> dict[str, Any]:
    """A video dataset's decoder (the report says it, with frames/s per reader)."""
    if not isinstance(dataset, VideoDataset):
        return {}
    s = dataset.settings
    return {"videos": len(dataset.videos), "decoder": s.decoder, "ffmpeg_args": s.ffmpeg_args}
