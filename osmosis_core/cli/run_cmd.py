"""``osmosis run``: run a rollout over a dataset and summarise the rewards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from osmosis_core.cli.common import config_options, resolve_config

__all__ = ["run"]


@click.command()
@click.argument("config_file", metavar="CONFIG", required=False, type=click.Path(dir_okay=False, path_type=Path))
@config_options
@click.option("--resume", is_flag=True, help="Finish an interrupted run: run only the missing (row, sample) pairs.")
@click.option(
    "--stub-policy",
    is_flag=True,
    help="Use the scripted calculator server of osmosis_core.testing instead of a model (a stand-in).",
)
@click.option("--stub-latency", type=click.FloatRange(min=0), default=0.0, hidden=True)
def run(config_file: Path | None, resume: bool, stub_policy: bool, stub_latency: float, **flags: Any) -> None:
    """Run a rollout over a dataset: every row, n samples each, results written as they finish.

    CONFIG is a TOML run config (see configs/eval/); flags override it. Results go to
    runs/<config>-<timestamp>/results.jsonl, one line per rollout, with summary.json and the
    resolved config (never an API key). Ctrl-C stops cleanly and keeps every finished result;
    --resume then runs exactly what is missing. Exit status: 0 when the run completed, 1 on an
    error, 130 when interrupted.

    \b
    Examples:
      osmosis run configs/eval/multiply-plain.toml --stub-policy
      osmosis run configs/eval/multiply-plain.toml --policy-url http://127.0.0.1:8000/v1 --model Qwen/Qwen3-8B
      OPENAI_API_KEY=... osmosis run configs/eval/multiply-plain.toml \\
          --policy-url https://api.openai.com/v1 --model gpt-4o-mini --api-key-env OPENAI_API_KEY
      osmosis run configs/eval/multiply-plain.toml --output runs/try1 --resume
    """
    from rich.console import Console

    from osmosis_core.cli.display import make_reporter, print_summary
    from osmosis_core.records import PolicyEndpoint
    from osmosis_core.runner import execute_run, prepare_run

    config = resolve_config(config_file, flags)
    console = Console(highlight=False)
    err = Console(stderr=True, highlight=False)
    stub = None
    try:
        override = None
        if stub_policy:
            from osmosis_core.testing.stub_process import StubPolicyProcess

            stub = StubPolicyProcess(latency=stub_latency).start()
            model = flags.get("model") or "osmosis-stub"
            override = PolicyEndpoint(stub.url, model)
            err.print(
                f"[yellow]--stub-policy: rollouts call a scripted calculator server at {stub.url}. "
                "It is a stand-in for testing the wiring, not a model: rewards say nothing about any model.[/yellow]"
            )
        plan = prepare_run(config, resume=resume, policy_override=override)
        done = plan.stats.finished
        console.print(
            f"run [bold]{plan.run_dir}[/bold]: {len(plan.rows)} rows x {config.run.n_samples} samples "
            f"({len(plan.pending)} to run{f', {done} already done' if done else ''}) on backend "
            f"{config.run.backend!r}, up to {plan.backend.max_concurrency or plan.in_flight} at once, "
            f"policy {plan.policy.base_url} ({plan.policy.model})"
        )
        import anyio

        outcome = anyio.run(execute_run, plan, make_reporter(console))
    finally:
        if stub is not None:
            stub.stop()
    print_summary(console, outcome.summary, outcome.run_dir)
    if outcome.interrupted:
        err.print(
            f"interrupted: {outcome.summary.finished} finished results are kept in {outcome.run_dir}; "
            f"finish with: {_resume_command(outcome.run_dir)}",
            soft_wrap=True,
        )
        raise click.exceptions.Exit(130)


def _resume_command(run_dir: Path) -> str:
    """The command line that was run, with ``--output RUN_DIR --resume``: the same flags finish it."""
    import shlex
    import sys

    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--output":
            skip = True
        elif not (arg == "--resume" or arg.startswith("--output=")):
            args.append(arg)
    return shlex.join(["osmosis", *args, "--output", str(run_dir), "--resume"])
