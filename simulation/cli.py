"""``python -m simulation``: run seeded simulations, print workflows, faults and invariant violations."""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from simulation.run import WORLDS, RunReport, run_many

app = typer.Typer(add_completion=False, help="Deterministic fault-injection simulation of sasflow.")
console = Console()


@app.command()
def simulate(
    seed: Annotated[int, typer.Option(help="Seed of the first run; run i uses seed + i.")] = 1,
    workflows: Annotated[int, typer.Option(help="Workflows per run.", min=1)] = 200,
    runs: Annotated[int, typer.Option(help="Independent runs (each its own moto backend).", min=1)] = 1,
    jobs: Annotated[int, typer.Option(help="Runs in parallel (processes).", min=1)] = 1,
    world: Annotated[
        str,
        typer.Option(
            help="fast: DynamoDB calls answered by moto's backend directly; moto: through boto3 and moto's HTTP "
            "stubs (about 5x slower; the same report for a seed)."
        ),
    ] = "fast",
) -> None:
    """Run the simulation and exit non-zero when any invariant is violated."""
    logging.disable(logging.CRITICAL)  # the handlers log every injected crash; the tables say what matters
    total = workflows * runs
    if world not in WORLDS:
        raise typer.BadParameter(f"one of {', '.join(WORLDS)}", param_hint="--world")
    console.print(
        f"simulating {total} workflows: {runs} run(s) x {workflows}, seeds {seed}..{seed + runs - 1}, "
        f"{jobs} process(es), the {world} world"
    )
    started = time.perf_counter()

    def progress(report: RunReport) -> None:
        mark = "[green]ok[/]" if not report.violations else f"[red]{len(report.violations)} violation(s)[/]"
        console.print(
            f"seed {report.seed}: {report.workflows} workflows, {sum(report.faults.values())} faults, "
            f"{report.invocations} invocations, {report.ticks} ticks, {report.wall_seconds:.1f} s  {mark}"
        )
        for violation in report.violations[:10]:
            console.print(f"  [red]{violation.kind}[/] {violation.workflow_id} {violation.detail}")
        if report.violations:
            console.print(f"  replay: {report.replay_command()}")

    reports = run_many(seed, workflows, runs, jobs=jobs, progress=progress, world=world)
    _print_tables(reports)
    elapsed = time.perf_counter() - started
    console.print(f"{total} workflows in {elapsed:.0f} s: {total / elapsed:.1f} workflows/s on {jobs} process(es)")
    if any(r.violations for r in reports):
        raise typer.Exit(1)


def _print_tables(reports: list[RunReport]) -> None:
    statuses: Counter[str] = Counter()
    children: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    for report in reports:
        statuses.update(report.statuses)
        children.update(report.children)
        faults.update(report.faults)
    outcome = Table(title="Workflows by final state")
    outcome.add_column("state")
    outcome.add_column("workflows", justify="right")
    for state, count in sorted(statuses.items()):
        outcome.add_row(state, str(count))
    outcome.add_row("total", str(sum(statuses.values())))
    console.print(outcome)
    console.print(_counts("Map steps' children by final state (workflows of their own)", "state", children))
    triggered: Counter[str] = Counter()
    for report in reports:
        triggered.update(report.triggered)
    console.print(_counts("Workflows the triggers started (triggers.yaml), by final state", "state", triggered))
    console.print(
        f"triggers: {sum(r.trigger_deliveries for r in reports)} messages to their queues (ticks, events, messages, "
        f"their duplicates, and messages that are none of them); {sum(r.trigger_skipped for r in reports)} skipped "
        f"(paused, or a run held the slot), {sum(r.trigger_missed for r in reports)} missed (later than the catch-up "
        "window), "
        f"{sum(r.trigger_buffered for r in reports)} kept waiting (buffer_one), "
        f"{sum(r.trigger_held for r in reports)} messages and uploads held while paused (sqs, s3), "
        f"{sum(r.trigger_run_nows for r in reports)} run-nows; one workflow per occurrence"
    )
    overlaps: Counter[str] = Counter()
    for report in reports:
        kind = (
            report.trigger_kind
            if report.trigger_kind in ("event", "sqs", "s3")
            else f"schedule, overlap {report.trigger_overlap}"
        )
        overlaps[kind] += sum(report.triggered.values())
    console.print(_counts("Workflows the triggers started, by the seed's trigger and policy", "trigger", overlaps))
    console.print(_counts("Faults injected, by kind", "fault", faults))
    console.print(
        f"call limits (the hotels agent): {sum(r.limited_calls for r in reports)} calls, "
        f"{sum(r.limit_deferrals for r in reports)} dispatches deferred for the limits; tenants: "
        f"{sum(r.tenant_workflows for r in reports)} workflows of definitions with tenancy, "
        f"{sum(r.tenant_refused for r in reports)} starts refused over max_running (429), "
        f"{sum(r.tenant_queued for r in reports)} queued (started in ticket order)"
    )
    actions: Counter[str] = Counter()
    answers: Counter[str] = Counter()
    for report in reports:
        actions.update(report.operator_actions)
        answers.update(report.callback_answers)
    console.print(
        _counts("Operator actions, by action and answer (interleaved at supervisor ticks)", "action answer", actions)
    )
    console.print(
        _counts("Callback answers, by status and answer (the approver, at supervisor ticks)", "status answer", answers)
    )
    violations = Table(title="Invariant violations")
    violations.add_column("invariant")
    violations.add_column("count", justify="right")
    counted = Counter(v.kind for r in reports for v in r.violations)
    for kind, count in sorted(counted.items()):
        violations.add_row(kind, str(count))
    violations.add_row("total", str(sum(counted.values())))
    console.print(violations)
    dead = sum(r.dead_letters for r in reports)
    poison = sum(r.faults.get("poison message", 0) for r in reports)
    refused = sum(r.trigger_dead_letters for r in reports)
    console.print(
        f"dead-letter entries: {dead} ({poison} poison messages, {refused} the trigger refused or could not deliver; "
        "each other one explained by a terminal workflow)"
    )


def _counts(title: str, column: str, counts: Counter[str]) -> Table:
    table = Table(title=title)
    table.add_column(column)
    table.add_column("count", justify="right")
    for kind, count in sorted(counts.items()):
        table.add_row(kind, str(count))
    return table


def main() -> None:
    """Run the CLI."""
    app()
