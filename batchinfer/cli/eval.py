"""``batchinfer eval``: a nightly accuracy job, with an exit code a scheduler can act on."""

from __future__ import annotations

import functools
import shlex
import sys
from pathlib import Path

import click

from batchinfer.cli.console import ConsoleObserver


@click.command("eval")
@click.argument("job", type=click.Path(path_type=Path))
@click.option(
    "--update-baseline",
    is_flag=True,
    help="Accept this evaluation as the job's baseline (recorded with who, when, the model's "
    "sha256 and the job's git commit). The verdict is still judged against the old one.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar (there is none off a terminal).")
def command(job: Path, update_baseline: bool, no_progress: bool) -> None:
    """Evaluate JOB (a TOML job file): run the device model and the float reference through
    the engine, score them, check the gates, append to the history, write the report.

    Prints a short Markdown summary (also written to the job's summary.md).

    \b
    Examples:
      batchinfer eval jobs/digits.toml
      batchinfer eval jobs/digits.toml --update-baseline

    Exit codes: 0 every gate passed, 1 a gate failed, 2 the job file is wrong,
    3 the evaluation could not run (runtime failure, outputs locked or unwritable),
    130 interrupted (nothing recorded).
    """
    from batchinfer.cli import fail_cleanly

    fail_cleanly(_eval)(job, update_baseline, no_progress)


def _eval(job_path: Path, update_baseline: bool, no_progress: bool) -> None:
    from batchinfer.errors import BatchinferError
    from batchinfer.evaluate import evaluate, load_job
    from batchinfer.evaluate.job import job_key

    def observers(side: str) -> list[ConsoleObserver]:
        return [ConsoleObserver(functools.partial(job_key, side), progress=not no_progress)]

    try:
        job = load_job(job_path)
        result = evaluate(
            job,
            update_baseline=update_baseline,
            observers=observers,
            command=shlex.join(["batchinfer", *sys.argv[1:]]),
        )
    except BatchinferError as e:
        # Job errors name job keys already; anything else names engine fields, shown as
        # the device's keys (a job file has no flags).
        click.echo(f"error: {e.render(functools.partial(job_key, 'device'))}", err=True)
        sys.exit(e.exit_code)
    click.echo(result.summary, nl=False)
    failed = result.verdict.failed
    if failed:
        click.echo(f"\nverdict: FAIL ({len(failed)} of {len(result.verdict.gates)} checks failed)")
        for gate in failed:
            click.echo(f"  {gate.line()}")
    else:
        click.echo(f"\nverdict: pass ({len(result.verdict.gates)} checks)")
    sys.exit(result.exit_code)
