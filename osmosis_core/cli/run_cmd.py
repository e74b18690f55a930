"""``osmosis run``: run a rollout over a dataset and summarise the rewards."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import click

from osmosis_core.cli import common
from osmosis_core.cli.common import config_options, make_console, resolve_config
from osmosis_core.records import RETRYABLE_CATEGORIES

__all__ = ["run"]


@click.command(short_help="Run a rollout over a dataset and summarise the rewards.")
@click.argument("config_file", metavar="CONFIG", required=False, type=click.Path(dir_okay=False, path_type=Path))
@config_options
@click.option("--resume", is_flag=True, help="Finish an interrupted run: run only the missing (row, sample) pairs.")
@click.option(
    "--retry-failed",
    metavar="[CATEGORIES]",
    is_flag=False,
    flag_value=",".join(sorted(RETRYABLE_CATEGORIES)),
    default=None,
    help="With the run folder of --output (or the latest run): run again the pairs whose latest result failed "
    "with one of these comma-separated categories (default: cancelled,infra_error,policy_error,timeout). "
    "Earlier results stay in the file; the summary counts each pair once, by its latest result.",
)
@click.option(
    "--stub-policy",
    is_flag=True,
    help="Use the scripted calculator server of osmosis_core.testing instead of a model (a stand-in).",
)
@click.option("--stub-latency", type=click.FloatRange(min=0), default=0.0, hidden=True)
@click.option(
    "--no-report", is_flag=True, help="Write no report.html into the run folder (osmosis-report; [report] enabled)."
)
@click.option("--stub-flavor", type=click.Choice(["openai", "vllm", "drifting"]), default="vllm", hidden=True)
@click.option(
    "--traces",
    is_flag=True,
    help="Record every model call (prompt and generated token ids, logprobs) through a policy gateway "
    "and write traces.jsonl beside results.jsonl (as a [traces] table does; needs osmosis-gateway).",
)
def run(
    config_file: Path | None,
    resume: bool,
    retry_failed: str | None,
    stub_policy: bool,
    stub_latency: float,
    no_report: bool,
    stub_flavor: str,
    traces: bool,
    **flags: Any,
) -> None:
    """Run a rollout over a dataset: every row, n samples each, results written as they finish.

    CONFIG is a TOML run config (see configs/eval/); flags override it (without CONFIG, --rollout
    DIR and the flags are the whole config). Before the first rollout the policy endpoint is asked
    GET /models once: nothing answering stops the run. Results go to
    runs/<config>-<timestamp>/results.jsonl, one line per rollout, with summary.json and the
    resolved config (never an API key). Ctrl-C or SIGTERM stops cleanly and keeps every finished
    result; --resume then runs exactly what is missing, and --retry-failed what failed for a reason
    a second attempt may not repeat. Only one osmosis process writes a run folder at a time. An
    output closed early (osmosis run ... | head) does not stop the run: it stops printing only.

    Exit status: 0 when the run completed; 1 on an error, when every rollout failed, when more than
    [run] max_failure_rate did, or when the backend gave out before the end (resumable); 130 when
    interrupted.

    \b
    Examples:
      osmosis run configs/eval/multiply-plain.toml --stub-policy
      osmosis run configs/eval/multiply-plain.toml --stub-policy --traces    # + traces.jsonl (osmosis-gateway)
      osmosis run configs/eval/multiply-plain.toml --policy-url http://127.0.0.1:8000/v1 --model Qwen/Qwen3-8B
      OPENAI_API_KEY=... osmosis run configs/eval/multiply-plain.toml \\
          --policy-url https://api.openai.com/v1 --model gpt-4o-mini --api-key-env OPENAI_API_KEY
      osmosis run configs/eval/multiply-plain.toml --output runs/try1 --resume
      osmosis run configs/eval/multiply-plain.toml --output runs/try1 --retry-failed policy_error,timeout
    """
    config = resolve_config(config_file, flags)
    if no_report:
        config.report["enabled"] = False
    if traces:
        config.traces = {**config.traces, "enabled": True}
    categories = _categories(retry_failed)
    console = make_console()
    err = make_console(stderr=True)
    if not stub_policy:
        _check_policy(config, err)
    # from the run's start SIGINT / SIGTERM are the run's (execute_run's exit_on_second_signal): in the
    # console script until the process exits (a handler put back before that would let a signal in its
    # last moments kill a complete run), for a caller in the same process (a test) until this returns
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        stub = None
        if stub_policy:
            from osmosis_core.testing.stub_process import StubPolicyProcess

            stub = StubPolicyProcess(latency=stub_latency, flavor=stub_flavor)
        try:
            outcome = _execute(config, resume, categories, stub, flags.get("model"), console, err)
        finally:
            if stub is not None:
                stub.stop()
        _report(outcome, console, err)
    finally:
        if not common.CONSOLE_SCRIPT:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)


def _execute(config: Any, resume: bool, categories: Any, stub: Any, model: str | None, console: Any, err: Any) -> Any:
    """Start the stand-in (``stub``, when given), check and prepare the run, say what it will do, run it."""
    import functools
    import gc

    import anyio

    from osmosis_core._engine.runner import execute_run, prepare_run
    from osmosis_core.cli.display import make_reporter
    from osmosis_core.records import PolicyEndpoint

    override = None
    if stub is not None:
        stub.start()
        override = PolicyEndpoint(stub.url, model or "osmosis-stub")
        err.print(
            f"[yellow]--stub-policy: rollouts call a scripted calculator server at {stub.url}. It is a stand-in"
            " for testing the wiring, not a model: rewards say nothing about any model.[/yellow]"
        )
    plan = prepare_run(config, resume=resume, retry_failed=categories, policy_override=override)
    done = plan.stats.finished
    again = f", {plan.retried} of them again" if plan.retried else ""
    console.print(
        f"run [bold]{plan.run_dir}[/bold]: {len(plan.rows)} rows x {config.run.n_samples} samples "
        f"({len(plan.pending)} to run{again}{f', {done} already done' if done else ''}) on backend "
        f"{config.run.backend!r}, up to {plan.backend.max_concurrency or plan.in_flight} at once, "
        f"policy {plan.policy.base_url} ({plan.policy.model})"
    )
    if plan.gateway is not None:
        console.print(f"traces: every model call goes through a policy gateway; {plan.run_dir / 'traces.jsonl'}")
    unlabeled = sum(row.label is None for row in plan.rows)
    if unlabeled and plan.rollout.grader_class is not None and not config.run.require_labels:
        err.print(
            f"[yellow]{unlabeled} of {len(plan.rows)} rows have no label (ground_truth): they run and are not "
            "graded (counted as ungraded); set \\[run] require_labels = true to fail them instead[/yellow]"
        )
    # what start-up built (imports, config, dataset, backend) lives as long as the run: the
    # collections the rollouts cause need not scan it again (bench/run_throughput.py: about +3%)
    gc.freeze()
    return anyio.run(functools.partial(execute_run, plan, make_reporter(console), exit_on_second_signal=True))


def _report(outcome: Any, console: Any, err: Any) -> None:
    """The summary table, then how the run ended and what to run next (the exit status).

    :raises click.exceptions.Exit: 130 interrupted, 1 stopped or failing.
    """
    from osmosis_core.cli.display import print_summary

    print_summary(console, outcome.summary, outcome.run_dir, written=outcome.written)
    if outcome.interrupted or outcome.stopped:
        why = f"stopped: {outcome.stopped}" if outcome.stopped else "interrupted"
        err.print(
            f"{why}; {outcome.summary.finished} finished results are kept in {outcome.run_dir}; "
            f"finish with: {_resume_command(outcome.run_dir)}",
            soft_wrap=True,
            markup=False,
        )
        raise click.exceptions.Exit(1 if outcome.stopped else 130)
    if outcome.failing:
        err.print(
            f"run failed: {outcome.failing}; results in {outcome.run_dir / 'results.jsonl'}; "
            f"{_retry_hint(outcome.summary.errors_by_category, outcome.run_dir)}",
            soft_wrap=True,
            markup=False,
        )
        raise click.exceptions.Exit(1)


def _check_policy(config: Any, err: Any) -> None:
    """Stop before the run when nothing answers at the policy endpoint (one line: the URL and why);
    say what an answer that was not a plain yes means (a refused key, a model it does not list).

    :raises click.ClickException: the endpoint is unreachable.
    """
    from osmosis_core._engine.policy_check import check_config_policy

    if not config.policy.base_url:
        return  # (the run's own check says what is missing)
    policy, check = check_config_policy(config)
    if check.unreachable is not None:
        raise click.ClickException(
            f"the policy endpoint {policy.base_url} is unreachable: {check.unreachable}; start its server,"
            " or give --policy-url (or --stub-policy to try the wiring without a model)"
        )
    if check.warning is not None:
        from rich.text import Text

        err.print(Text(f"policy {policy.base_url}: {check.warning}", style="yellow"), soft_wrap=True)


def _categories(value: str | None) -> frozenset[Any] | None:
    """The error categories ``--retry-failed`` names. :raises click.BadParameter: an unknown one."""
    from osmosis_core.records import ErrorCategory

    if value is None:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    known = {c.value: c for c in ErrorCategory}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise click.BadParameter(
            f"{', '.join(unknown) or 'nothing'} is not an error category; choose from {', '.join(sorted(known))}",
            param_hint="--retry-failed",
        )
    return frozenset(known[n] for n in names)


def _retry_hint(errors_by_category: dict[str, int], run_dir: Path) -> str:
    """How to run the failures again: ``--retry-failed`` alone when its default takes every category
    the run failed with; else the categories to name (the default leaves out agent_error and
    validation_error: a second attempt of a bug or a bad row tends to fail the same way)."""
    default = {category.value for category in RETRYABLE_CATEGORIES}
    failed = sorted(errors_by_category)
    retried = [c for c in failed if c in default]
    left = [c for c in failed if c not in default]
    again = f"run the {', '.join(retried)} failures again with: {_resume_command(run_dir, retry=True)}"
    if not left:
        return again
    everything = _resume_command(run_dir, retry=True, categories=failed)
    if not retried:
        return (
            f"--retry-failed does not run {', '.join(left)} again by default (a second attempt tends to fail the"
            f" same way); once the cause is fixed: {everything}"
        )
    return f"{again} ({', '.join(left)} too, once the cause is fixed: {everything})"


def _resume_command(run_dir: Path, *, retry: bool = False, categories: list[str] | None = None) -> str:
    """The command line that was run, with ``--output RUN_DIR --resume`` (or ``--retry-failed``, with
    ``categories`` when given)."""
    import shlex
    import sys

    args: list[str] = []
    argv = sys.argv[1:]
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--output" or (arg == "--retry-failed" and i + 1 < len(argv) and not argv[i + 1].startswith("-")):
            i += 2  # the option and its value
            continue
        if arg not in ("--resume", "--retry-failed") and not arg.startswith(("--output=", "--retry-failed=")):
            args.append(arg)
        i += 1
    last = ["--retry-failed" if retry else "--resume"]
    if retry and categories:
        last.append(",".join(categories))
    return shlex.join(["osmosis", *args, "--output", str(run_dir), *last])
