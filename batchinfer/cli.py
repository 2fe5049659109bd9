"""The ``batchinfer`` command: parse, call the library, turn errors into messages and exit codes.

Nothing here does work of its own; every command is a call into the library. Errors of the
one tree (``batchinfer.errors``) become one line on stderr and their exit code:
0 ok, 1 some items failed, 2 usage/configuration, 3 the run could not proceed, 130 interrupted.
"""

from __future__ import annotations

import functools
import logging
import shlex
import sys
from pathlib import Path

import click

from batchinfer import __version__
from batchinfer.errors import BatchinferError
from batchinfer.runtime import BACKENDS

_CORES_HELP = "NPU cores to use, e.g. 0,1,2 (default: every core of the chip)."


def _fail_cleanly(fn):
    """Turn a BatchinferError into its one-line message and exit code (the one catch point)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BatchinferError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)

    return wrapper


class _CliLogHandler(logging.Handler):
    """Log lines on the stderr of the moment: plain for info, ``warning: ...`` for warnings."""

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.levelno >= logging.WARNING:
            text = f"{record.levelname.lower()}: {text}"
        click.echo(text, err=True)


def _setup_logging() -> None:
    log = logging.getLogger("batchinfer")
    # Replace our own handler (never anyone else's), so that repeated in-process calls
    # (tests, notebooks) each print to their current stderr exactly once.
    log.handlers = [h for h in log.handlers if not isinstance(h, _CliLogHandler)]
    log.addHandler(_CliLogHandler())
    log.setLevel(logging.INFO)
    log.propagate = False


def _int_list(value: str | None, option: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(v) for v in value.split(",") if v.strip() != "")
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a comma-separated list of integers", param_hint=option
        ) from None


def _float_list(value: str | None, option: str) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        return tuple(float(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a comma-separated list of numbers", param_hint=option
        ) from None


def _size(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        parts = [int(v) for v in value.lower().replace("x", ",").split(",")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or min(parts) < 1:
        raise click.BadParameter(
            f"{value!r} is not a size; give 224 or 224x224 (HxW)", param_hint="--size"
        )
    return parts[0], parts[1]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="batchinfer")
def main() -> None:
    """Batch inference over the NPU cores of Rockchip RK3588-class boards.

    \b
    First run (x86 or board):
      batchinfer demo demo
      batchinfer run demo/dataset --model demo/models/digits.onnx --cores 0,1,2
    """
    _setup_logging()


@main.command()
@click.argument("dataset", type=click.Path(path_type=Path))
@click.option(
    "--model", "-m", required=True, type=click.Path(path_type=Path), help=".rknn or .onnx model."
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default="auto",
    show_default=True,
    help="auto: .rknn -> rknnlite (the NPU), .onnx -> onnx (ONNX Runtime on the CPU); "
    "sim: an emulated NPU; toolkit: rknn-toolkit2's simulator (quantised numerics, no timing; "
    "its own environment, see README).",
)
@click.option("--cores", help=_CORES_HELP)
@click.option(
    "--instances-per-core",
    "-k",
    type=int,
    default=1,
    show_default=True,
    help="Runtime instances per core (threads of the core's worker); 2-3 keep a core busy.",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    help="Output folder (default: runs/<timestamp>).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing output folder.")
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the run in --out: skip items already written without error.",
)
@click.option("--limit", type=int, help="Only the first N items of the dataset.")
@click.option("--size", help="Resize inputs to HxW (default: the model's input size).")
@click.option(
    "--color",
    type=click.Choice(["rgb", "bgr", "gray"]),
    help="Channel order (default: from the model).",
)
@click.option("--layout", type=click.Choice(["nhwc", "nchw"]), help="Input layout (default: nhwc).")
@click.option("--dtype", help="Input dtype, e.g. uint8 or float32 (default: the model's).")
@click.option(
    "--mean", help="Per-channel mean subtracted from float inputs, e.g. 123.7,116.3,103.5."
)
@click.option("--std", help="Per-channel std dividing float inputs, e.g. 58.4,57.1,57.4.")
@click.option("--topk", type=int, default=5, show_default=True, help="Classes kept per row.")
@click.option(
    "--save-outputs", is_flag=True, help="Also store the raw outputs in the prediction rows."
)
@click.option(
    "--part-rows",
    type=int,
    default=8192,
    show_default=True,
    help="Rows per Parquet part; a crash loses at most the part being filled (see --resume).",
)
@click.option(
    "--slots", type=int, help="Shared-memory slots (default: 4 per instance + 2 per reader)."
)
@click.option(
    "--readers", type=int, help="Reader processes that decode inputs (default: CPUs/2, 1-4)."
)
@click.option(
    "--cpu-affinity",
    default="auto",
    show_default=True,
    help="CPUs for our processes: auto (the big cores on big.LITTLE), none, or a list like 4-7.",
)
@click.option(
    "--timeout-s",
    type=float,
    default=60.0,
    show_default=True,
    help="A worker stuck in one inference longer than this is killed and restarted.",
)
@click.option(
    "--max-attempts",
    type=int,
    default=2,
    show_default=True,
    help="Attempts per item (on different cores where possible) before it becomes an error row.",
)
@click.option(
    "--no-canary", is_flag=True, help="Skip the check that every core gives the same outputs."
)
@click.option("--sim-npu-ms", type=float, help="sim: NPU time per inference (default 2).")
@click.option(
    "--sim-host-ms", type=float, help="sim: host time per inference, outside the NPU (default 4)."
)
@click.option(
    "--sim-chip", type=click.Choice(["rk3588", "rk3576", "rk3566"]), help="sim: chip to emulate."
)
@click.option(
    "--sim-fault",
    multiple=True,
    help="sim: inject a fault, KIND:core=C:call=N or KIND:item=I, "
    "KIND one of crash, hang, none, init; or init:core=C, skew:core=C (repeatable).",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@_fail_cleanly
def run(dataset: Path, model: Path, **opts) -> None:
    """Run MODEL over every item of DATASET on the NPU cores; results go to Parquet.

    DATASET is a folder of images (class subfolders become labels) or of .npy tensors.

    \b
    Examples:
      batchinfer run images/ --model resnet18.rknn --cores 0,1,2 -k 3
      batchinfer run demo/dataset --model demo/models/digits.onnx --backend sim --sim-npu-ms 2
      batchinfer run images/ --model m.rknn --out runs/night --resume

    Exit codes: 0 all items succeeded, 1 some items are error rows, 2 usage error,
    3 the run could not proceed, 130 interrupted (resume with --resume).
    """
    from batchinfer.engine import RunConfig, SimOptions
    from batchinfer.engine import run as run_engine

    config = RunConfig(
        dataset=dataset,
        model=model,
        backend=opts["backend"],
        cores=_int_list(opts["cores"], "--cores"),
        instances_per_core=opts["instances_per_core"],
        out=opts["out"],
        overwrite=opts["overwrite"],
        resume=opts["resume"],
        limit=opts["limit"],
        size=_size(opts["size"]),
        color=opts["color"],
        layout=opts["layout"],
        dtype=opts["dtype"],
        mean=_float_list(opts["mean"], "--mean"),
        std=_float_list(opts["std"], "--std"),
        topk=opts["topk"],
        save_outputs=opts["save_outputs"],
        part_rows=opts["part_rows"],
        slots=opts["slots"],
        readers=opts["readers"],
        cpu_affinity=opts["cpu_affinity"],
        sim=SimOptions(
            npu_ms=opts["sim_npu_ms"],
            host_ms=opts["sim_host_ms"],
            chip=opts["sim_chip"],
            faults=tuple(opts["sim_fault"]),
        ),
        timeout_s=opts["timeout_s"],
        max_attempts=opts["max_attempts"],
        canary=not opts["no_canary"],
        progress=not opts["no_progress"],
        command=shlex.join(["batchinfer", *sys.argv[1:]]),
    )
    result = run_engine(config)
    click.echo(result.summary)
    done = f"{result.succeeded} succeeded, {result.errors} errors"
    if result.skipped:
        done += f", {result.skipped} already done (resumed)"
    click.echo(f"{result.status}: {done}; results in {result.out}")
    if result.status == "interrupted":
        click.echo(f"resume with: batchinfer run ... --out {result.out} --resume", err=True)
    sys.exit(result.exit_code)


@main.command()
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--overwrite", is_flag=True, help="Replace a demo kit already in TARGET.")
@_fail_cleanly
def demo(target: Path, overwrite: bool) -> None:
    """Write a first-run kit to TARGET: 1,797 digit images and three small models.

    \b
    Then:
      batchinfer run TARGET/dataset --model TARGET/models/digits.onnx --cores 0,1,2
    """
    from batchinfer.demo import write_demo

    kit = write_demo(target, overwrite=overwrite)
    click.echo(f"wrote {kit.count} images to {kit.dataset} and models to {kit.root / 'models'}")
    click.echo(f"next: batchinfer run {kit.dataset} --model {kit.models['digits']} --cores 0,1,2")


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default="auto",
    show_default=True,
)
@_fail_cleanly
def info(model: Path, backend: str) -> None:
    """Show MODEL's inputs and outputs, the runtime that would run it and its version.

    \b
    Example:
      batchinfer info demo/models/digits.onnx --backend sim
    """
    from batchinfer.inspect import model_report

    click.echo(model_report(model, backend))
