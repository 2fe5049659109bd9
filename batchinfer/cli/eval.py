"""``batchinfer eval``: a nightly accuracy job, with an exit code a scheduler can act on."""

from __future__ import annotations

import dataclasses
import functools
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from batchinfer.cli.console import ConsoleObserver
from batchinfer.cli.failures import name_settings
from batchinfer.cli.options import no_progress_option, ray_options

if TYPE_CHECKING:
    from batchinfer.evaluate.job import Job


@click.command("eval")
@click.argument("job", type=click.Path(path_type=Path))
@click.option(
    "--update-baseline",
    is_flag=True,
    help="Accept this evaluation as the job's baseline (recorded with who, when, the model's "
    "sha256 and the job's git commit). The verdict is still judged against the old one.",
)
@no_progress_option
@ray_options(
    "Run the device model on",
    "The reference runs here. Overrides the job's [device.ray] address.",
    data_default=None,
    data_note="Default: the job's [device.ray] data, else head.",
)
def command(
    job: Path,
    update_baseline: bool,
    no_progress: bool,
    ray_address: str | None,
    ray_data: str | None,
) -> None:
    """Evaluate JOB (a TOML job file): run the device model and the float reference through
    the engine, score them, check the gates, append to the history, write the report.

    Prints a short Markdown summary (also written to the job's summary.md).

    \b
    Examples:
      batchinfer eval jobs/digits.toml
      batchinfer eval jobs/digits.toml --update-baseline
      batchinfer eval jobs/digits.toml --ray auto     # the device model on a Ray cluster

    Exit codes: 0 every gate passed, 1 a gate failed, 2 the job file is wrong,
    3 the evaluation could not run (runtime failure, outputs locked or unwritable),
    130 interrupted (nothing recorded).
    """
    _eval(job, update_baseline, no_progress, ray_address, ray_data)


def _eval(
    job_path: Path,
    update_baseline: bool,
    no_progress: bool,
    ray_address: str | None = None,
    ray_data: str | None = None,
) -> None:
    from batchinfer.evaluate import evaluate, load_job
    from batchinfer.evaluate.job import job_key

    flags = {"ray": ray_address, "ray_data": ray_data}

    def key(side: str, name: str) -> str:
        """The job's key for a field, or the flag that set it (--ray overrides the job)."""
        return f"--{name.replace('_', '-')}" if flags.get(name) else job_key(side, name)

    def observers(side: str) -> list[ConsoleObserver]:
        return [ConsoleObserver(functools.partial(key, side), progress=not no_progress)]

    # Job errors name job keys already; anything else names engine fields, shown as the
    # device's keys (a job file has no flags).
    name_settings(functools.partial(key, "device"))
    job = with_cluster(load_job(job_path), ray_address, ray_data)
    result = evaluate(
        job,
        update_baseline=update_baseline,
        observers=observers,
        command=shlex.join(["batchinfer", *sys.argv[1:]]),
    )
    click.echo(result.summary, nl=False)
    failed = result.verdict.failed
    if failed:
        click.echo(f"\nverdict: FAIL ({len(failed)} of {len(result.verdict.gates)} checks failed)")
        for gate in failed:
            click.echo(f"  {gate.line()}")
    else:
        click.echo(f"\nverdict: pass ({len(result.verdict.gates)} checks)")
    sys.exit(result.exit_code)


def with_cluster(job: Job, address: str | None, data: str | None) -> Job:
    """``job`` with ``--ray``/``--ray-data`` over its ``[device.ray]`` settings."""
    ray = job.device.ray
    ray = dataclasses.replace(ray, address=address or ray.address, data=data or ray.data)
    return dataclasses.replace(job, device=dataclasses.replace(job.device, ray=ray))
