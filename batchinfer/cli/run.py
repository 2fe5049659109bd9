"""``batchinfer run``: the main job."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from batchinfer.cli.options import (
    build_group,
    flag_of,
    group_options,
    image_root_option,
    no_progress_option,
    ray_options,
)
from batchinfer.errors import render_fields

if TYPE_CHECKING:
    from batchinfer.engine.planning.config import RunConfig
    from batchinfer.engine.runner import RunResult

EXIT_OK, EXIT_ITEM_ERRORS, EXIT_INTERRUPTED = 0, 1, 130


def resume_command(argv: list[str], out: Path) -> str:
    """The command that continues an interrupted run: the same one, with --resume and --out."""
    args = [a for a in argv if a not in ("--overwrite", "--resume")]
    if not any(a in ("--out", "-o") or a.startswith("--out=") for a in args):
        args += ["--out", str(out)]
    return shlex.join(["batchinfer", *args, "--resume"])


@click.command("run")
# nargs=-1 only to say what went wrong when a shell expanded an unquoted glob into many
# paths (click's own message lists every one of them); one DATASET is taken.
@click.argument(
    "dataset", nargs=-1, required=True, metavar="DATASET", type=click.Path(path_type=Path)
)
@click.option(
    "--model", "-m", required=True, type=click.Path(path_type=Path), help=".rknn or .onnx model."
)
@group_options("runtime", "runtime.sim", "preprocess", "output", "reliability", "detect")
@click.option("--limit", type=int, help="Only the first N items of the dataset.")
@click.option(
    "--labels",
    type=click.Path(path_type=Path),
    help="Class map: one class folder name per line (line 1 is label 0), or JSON (a list of "
    "names, {name: label}, a Keras class index). Default: the top-level folders, sorted. "
    "Detection runs: the head's class names, one per line (default: COCO's for 80 classes).",
)
@image_root_option("a list file or a COCO JSON")
@no_progress_option
# -- scale-out on Ray (batchinfer.cluster) ------------------------------------------------
@ray_options("Run on")
def command(
    dataset: tuple[Path, ...],
    model: Path,
    limit: int | None,
    labels: Path | None,
    image_root: Path | None,
    no_progress: bool,
    ray_address: str | None,
    ray_data: str,
    **params,
) -> None:
    """Run MODEL over every item of DATASET on the NPU cores; results go to Parquet.

    DATASET is a folder of images (class subfolders become labels) or of .npy tensors; a
    list file (.txt, or .csv / .jsonl / .parquet with a path column, optional id and label);
    a COCO .json; an Ultralytics data.yaml (its val split); a quoted glob
    ('images/**/*.jpg'); or WebDataset tar shards, read without unpacking
    ('shards/train-{000..099}.tar'). The docs' Datasets page has one example of each.

    \b
    Examples:
      batchinfer run images/ --model resnet18.rknn --cores 0,1,2 -k 3
      batchinfer run demo/dataset --model demo/models/digits.onnx --backend sim --sim-npu-ms 2
      batchinfer run images/ --model m.rknn --out runs/night --resume
      batchinfer run demo/dataset --model demo/models/digits.onnx --backend sim --ray local:3
      batchinfer run photos/ --model yolov8n.rknn --conf 0.3      (a detector: boxes)

    Exit codes: 0 all items succeeded, 1 some items are error rows, 2 usage error,
    3 the run could not proceed, 130 interrupted (continue with --resume).
    """
    if len(dataset) > 1:
        first = dataset[0]
        raise click.UsageError(
            f"run takes one DATASET, not {len(dataset)} paths: the shell expanded a glob? "
            f"Quote it (for example '{first.parent / ('*' + first.suffix)}') or pass a list "
            "file (a .txt with one path a line)."
        )
    args = (
        dataset[0],
        model,
        limit,
        labels,
        no_progress,
        params,
        ray_address,
        ray_data,
        image_root,
    )
    _run(*args)


def _run(
    dataset: Path,
    model: Path,
    limit: int | None,
    labels: Path | None,
    no_progress: bool,
    params: dict,
    ray_address: str | None = None,
    ray_data: str = "head",
    image_root: Path | None = None,
) -> None:
    from batchinfer.engine.planning.config import RunConfig  # options only: cheap to import

    output = build_group("output", params)
    if output.out is not None and ray_address is None:
        # The run's one early refusal of a held OUT (the lock is asked again when taken):
        # before the engine and pyarrow are imported (a few tenths of a second), let alone
        # the model opened or the dataset listed. It ends the command, and so stops the
        # fork server the program's entry point launched before click read these options
        # (entry.py). On a cluster, run_on_cluster makes it (Ray's start dwarfs those
        # imports).
        from batchinfer.sink.out_lock import refuse_if_held

        refuse_if_held(output.out)
    config = RunConfig(
        dataset=dataset,
        model=model,
        runtime=build_group("runtime", params, sim=build_group("runtime.sim", params)),
        preprocess=build_group("preprocess", params),
        output=output,
        reliability=build_group("reliability", params),
        detect=build_group("detect", params),
        limit=limit,
        labels=labels,
        image_root=image_root,
        command=shlex.join(["batchinfer", *sys.argv[1:]]),
    )
    if ray_address is not None:
        result = _on_cluster(config, no_progress, ray_address, ray_data)
    else:
        from batchinfer.engine.plumbing import fork_server

        # The children's fork server imports numpy and the child modules while this
        # process imports the engine and pyarrow and plans (on two CPUs they overlap). The
        # program launched it before importing click (entry.py): this holds that one; a
        # command called in-process (click's CliRunner) launches it here.
        with fork_server.running():
            result = _here(config, no_progress)
    from batchinfer.cli.console import format_summary

    try:
        _say_result(result, format_summary(result.stats, npu_load=result.npu_load is not None))
    except BrokenPipeError:
        # Whoever read stdout left (`batchinfer run ... | head -1`): the run is done, so
        # its exit code still says how it went (click would exit 1, "items failed").
        # stdout goes to /dev/null so that the exit's flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if result.status == "interrupted":
        click.echo(f"resume with: {resume_command(sys.argv[1:], result.out)}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(EXIT_ITEM_ERRORS if result.errors else EXIT_OK)


def _here(config: RunConfig, no_progress: bool) -> RunResult:
    """Run ``config`` on this board (its held-OUT refusal made already)."""
    from batchinfer.cli.console import ConsoleObserver
    from batchinfer.engine.runner import plan_and_run

    console = ConsoleObserver(flag_of, progress=not no_progress)
    try:
        return plan_and_run(config, [console], console.listing)
    finally:
        console.close()


def _on_cluster(config: RunConfig, no_progress: bool, address: str, data: str) -> RunResult:
    """Run ``config`` on a Ray cluster: the cluster's engine, the same outputs."""
    from batchinfer.cli.console import ConsoleObserver
    from batchinfer.cluster import ClusterLostError, run_on_cluster

    console = ConsoleObserver(flag_of, progress=not no_progress)
    try:
        return run_on_cluster(config, address, [console], data=data, listing=console.listing)
    except ClusterLostError as e:  # its message ends with the command that resumes
        if e.out is not None:
            e.resume_command = resume_command(sys.argv[1:], e.out)
        raise
    finally:
        console.close()


def _say_result(result: Any, summary: str) -> None:
    """The per-core table, what was skipped, the failed items and the status, on stdout."""
    click.echo(summary)
    skipped = result.skipped_files
    if skipped.get("count"):
        kinds = ", ".join(f"{ext or '(none)'} {n}" for ext, n in skipped["by_extension"].items())
        first = ", ".join(skipped["first"][:3])
        more = ", ..." if skipped["count"] > 3 else ""
        click.echo(
            f"skipped {skipped['count']} file(s) that are not items ({kinds}): {first}{more}; "
            "all are listed in the manifest"
        )
    if result.failed_items:
        click.echo(f"failed items (first {len(result.failed_items)} of {result.errors}):")
        for item_id, error in result.failed_items:
            click.echo(f"  {item_id}: {render_fields(error, flag_of)}")
        click.echo(f"  every error row is in {result.out / 'predictions'} (column error)")
    done = f"{result.succeeded} succeeded, {result.errors} error{'' if result.errors == 1 else 's'}"
    if result.skipped:
        done += f", {result.skipped} already done (resumed)"
    click.echo(f"{result.status}: {done}; results in {result.out}")
