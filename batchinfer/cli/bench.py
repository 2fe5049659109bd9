"""``batchinfer bench``: a throughput figure with a verdict, a diagnosis, sweeps and comparisons."""

from __future__ import annotations

import dataclasses
import shlex
import sys
import typing
from pathlib import Path

import click

from batchinfer.bench.options import BenchOptions, bench_flag
from batchinfer.cli.failures import name_settings
from batchinfer.cli.options import build_group, flag_of, group_options, image_root_option
from batchinfer.engine import events as ev
from batchinfer.errors import UsageError, render_fields

EXIT_VALID, EXIT_INVALID, EXIT_INTERRUPTED = 0, 1, 130
EXIT_REGRESSION = 1


def name_of(field_name: str) -> str:
    """The flag of any setting a bench message names."""
    return bench_flag(field_name) or flag_of(field_name)


def _bench_options(fn):
    """Click options generated from BenchOptions (defaults and help stay there)."""
    hints = typing.get_type_hints(BenchOptions)
    for f in reversed(dataclasses.fields(BenchOptions)):
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        kind = int if hints[f.name] is int else float
        default = "" if f.default is None else f"  [default: {f.default:g}]"
        fn = click.option(flag, f"bench__{f.name}", type=kind, help=f.metadata["help"] + default)(
            fn
        )
    return fn


class _Progress:
    """What the terminal shows while a benchmark runs: its phases and the engine's warnings."""

    def __init__(self, opts: BenchOptions, prefix: str = "") -> None:
        self.opts = opts
        self.prefix = prefix

    def notify(self, event: object) -> None:
        if isinstance(event, ev.Started):
            cores = ",".join(str(c) for c in event.cores)
            click.echo(
                f"{self.prefix}cores {cores} ready ({event.backend}, {event.instances_per_core} "
                f"instance(s) per core): warming up {self.opts.warmup_s:g} s, then measuring "
                f"{self.opts.duration_s:g} s (up to {self.opts.limit_s:g} s until stable)",
                err=True,
            )
        elif isinstance(event, ev.Warned):
            click.echo(f"warning: {render_fields(event.message, name_of)}", err=True)


@click.command("bench")
@click.option("--model", "-m", type=click.Path(path_type=Path), help=".rknn or .onnx model.")
@click.option(
    "--dataset",
    type=click.Path(path_type=Path),
    help="Measure end to end on this dataset (a folder, a list file, a COCO .json, a data.yaml "
    "or a glob, as run takes; readers decode it; it is read again "
    "from the start when shorter than the run). Without it: synthetic inputs of the "
    "model's input shape, prepared once in the slots, so only the inference path counts.",
)
@image_root_option("a --dataset list file or COCO JSON")
# --input: bench feeds one input (model_input refuses a model with several).
@group_options(
    "runtime", "runtime.sim", "preprocess", "reliability", "detect", skip=("preprocess.inputs",)
)
@_bench_options
@click.option(
    "--sweep",
    type=click.Choice(["cores", "instances"]),
    help="Run once per setting: cores (1, 2, 3 of --cores) or instances (1..4 per core); "
    "ends with a recommendation.",
)
@click.option(
    "--max-p99-ms",
    type=float,
    help="With --sweep: recommend only settings whose p99 latency stays at or under this.",
)
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the result here.")
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    help="Write per-sample latencies and per-window throughput (Parquet) and plots here "
    "(a new or empty folder, or an earlier bench's).",
)
@click.option(
    "--compare",
    nargs=2,
    type=click.Path(path_type=Path),
    metavar="A.json B.json",
    help="Compare two saved results side by side; exit 1 if B regresses A.",
)
def command(**params) -> None:
    """Measure MODEL's throughput on the NPU cores: a figure you can trust, or why not.

    The run warms up (excluded), then measures in windows until it has lasted --duration,
    holds --min-samples and its last three windows agree within 10 % (extending up to
    --max-duration). It is VALID only then, without errors, other load on the CPUs,
    throttling or a frequency change; otherwise INVALID with every reason. It prints
    samples/s in total and per core, latency percentiles, utilisation, CPU use by role,
    board conditions, and a diagnosis of what limits the run.

    \b
    Examples:
      batchinfer bench --model resnet18.rknn --cores 0,1,2 -k 2 --json r.json
      batchinfer bench --model m.rknn --sweep instances --max-p99-ms 40 --out bench/
      batchinfer bench --model m.rknn --dataset images/ --duration 30
      batchinfer bench --model demo/models/pool224.onnx --backend sim --sim-npu-ms 2
      batchinfer bench --compare baseline.json today.json

    Exit codes: 0 VALID (no regression with --compare), 1 INVALID (for a sweep: any
    setting), or B regresses A, 2 usage error or unreadable/mismatched files, 3 the run
    could not proceed, 130 interrupted.
    """
    name_settings(name_of)  # bench's own settings have flags of their own
    _bench(params)


def _bench(params: dict) -> None:
    model, dataset, sweep = params.pop("model"), params.pop("dataset"), params.pop("sweep")
    image_root = params.pop("image_root")
    max_p99_ms, json_path = params.pop("max_p99_ms"), params.pop("json_path")
    out, compare = params.pop("out"), params.pop("compare")
    if compare:
        given = [f for f, v in (("--model", model), ("--dataset", dataset), ("--sweep", sweep),
                                ("--out", out), ("--image-root", image_root)) if v]  # fmt: skip
        if given:
            raise UsageError(
                f"--compare reads two saved results; drop {', '.join(given)} (or run the "
                "benchmark first with --json)."
            )
        _compare(*compare)
        return
    if model is None:
        raise UsageError("bench needs --model MODEL (or --compare A.json B.json).")
    if max_p99_ms is not None and sweep is None:
        raise UsageError("--max-p99-ms chooses among the settings of a sweep; add --sweep.")
    from batchinfer.bench import outputs, plots
    from batchinfer.bench.runner import BenchConfig

    values = {
        f.name: params.pop(f"bench__{f.name}")
        for f in dataclasses.fields(BenchOptions)
        if params.get(f"bench__{f.name}") is not None
    }
    opts = BenchOptions(**values)
    for key in [k for k in params if k.startswith("bench__")]:
        params.pop(key)
    config = BenchConfig(
        model=model,
        runtime=build_group("runtime", params, sim=build_group("runtime.sim", params)),
        bench=opts,
        dataset=dataset,
        image_root=image_root,
        preprocess=build_group("preprocess", params),
        reliability=build_group("reliability", params),
        detect=build_group("detect", params),
        command=shlex.join(["batchinfer", *sys.argv[1:]]),
    )
    if out is not None:
        out = outputs.check_out(out)
    with_plots = out is not None and plots.available()
    if out is not None and not with_plots:
        click.echo(f"warning: no plots: matplotlib is missing; {plots.INSTALL_HINT}", err=True)
    if sweep is None:
        _single(config, opts, json_path, out, with_plots)
    else:
        _sweep(config, opts, sweep, max_p99_ms, json_path, out, with_plots)


def _single(config, opts, json_path, out, with_plots) -> None:
    from batchinfer.bench import outputs
    from batchinfer.bench.report import format_result
    from batchinfer.bench.runner import bench

    result = bench(config, observers=[_Progress(opts)])
    data = result.to_json(name_of)
    _deliver(result, data, format_result(data), json_path, out, outputs.write_run, with_plots)


def _sweep(config, opts, kind, max_p99_ms, json_path, out, with_plots) -> None:
    from batchinfer.bench import outputs
    from batchinfer.bench.report import format_sweep
    from batchinfer.bench.sweep import run_sweep

    def one_done(setting, result) -> None:
        f = result.figures
        click.echo(
            f"{setting.name}: {f.samples_per_s:.1f} samples/s, p99 "
            f"{f.latency_ms['p99'] or float('nan'):.2f} ms, {result.diagnosis.bound}-bound, "
            f"{'VALID' if result.valid else 'INVALID'}",
            err=True,
        )

    result = run_sweep(
        config, kind, max_p99_ms, observers=[_Progress(opts, "  ")], on_result=one_done
    )
    data = result.to_json(name_of)
    _deliver(result, data, format_sweep(data), json_path, out, outputs.write_sweep, with_plots)


def _deliver(result, data, text, json_path, out, write_out, with_plots) -> None:
    """Print, write --json and --out, and exit with the verdict's code."""
    from batchinfer.bench.result import write_json

    # Files first: a reader that stops early (``| head``) must not cost them.
    if json_path is not None:
        write_json(data, json_path)
    if out is not None:
        write_out(out, result, data, with_plots)
    click.echo(text)
    if json_path is not None:
        click.echo(f"result written to {json_path}")
    if out is not None:
        click.echo(f"samples, windows{' and plots' if with_plots else ''} written to {out}")
    if result.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(EXIT_VALID if result.valid else EXIT_INVALID)


def _compare(a_path: Path, b_path: Path) -> None:
    from batchinfer.bench.compare import compare, format_comparison
    from batchinfer.bench.result import read_json

    a, b = read_json(a_path), read_json(b_path)
    names = (f"A ({a_path.name})", f"B ({b_path.name})")
    if names[0] == names[1]:
        names = (f"A ({a_path})", f"B ({b_path})")
    c = compare(a, b, *names)
    click.echo(format_comparison(c, *names))
    sys.exit(EXIT_REGRESSION if c.regression else 0)
