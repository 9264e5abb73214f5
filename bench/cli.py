"""``python -m bench`` (``make bench``): run every measurement, print one markdown table, write the results files.

The table has one row per metric: our figure, the anchor it is compared with, the ratio and whether the target is
met. ``bench/results.md`` gets the table with the date, the machine and the definitions; ``bench/results.json`` gets
every raw count, so any figure can be recomputed by hand. The exit status is 1 when a row misses its target (the
missed rows are listed), so a script or CI job sees it; 0 when every target is met.
"""

from __future__ import annotations

import json
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from bench import cost
from bench.report import Row, markdown
from sasflow import prices

ROOT = Path(__file__).resolve().parents[1]
RESULTS_MD = ROOT / "bench" / "results.md"
RESULTS_JSON = ROOT / "bench" / "results.json"

RECOMPUTE = """\
How to recompute a figure by hand from `bench/results.json` (`scenarios.<S>`; per 1M steps: divide by `steps_run`
and multiply by 10^6):

- Step Functions Standard: `step_functions_transitions * 0.025 / 1000`.
- Step Functions Express: `express.requests * 1.00 / 1e6 + express.gb_seconds * 0.00001667`; with logging, plus
  `express.log_bytes * 0.50 / 2**30`. `express.remote_latency_seconds` is the latency each Task attempt is billed
  for; `express.cannot_run` says why a scenario has no Express figure.
- Lambda durable functions: `durable.operations * 8.00 / 1e6 + durable.bytes_written * 0.25 / 2**30 +
  durable.invocations * 0.20 / 1e6` (`durable.by_plan`: each distinct plan the SDK's runner ran, its counts and how
  many workflows had it).
- Ours: `ours_dollars.total` (its lines are in `ours_dollars`).
- The whole bill (`whole_bill`, at `whole_bill.remote_latency_seconds` per call): ours = `whole_bill.ours` =
  `ours_dollars.total + whole_bill.agents.dollars` (the agents' `lambda_requests`, `lambda_compute` with
  `waiting_gb_seconds`, `cloudwatch_logs`); Step Functions Standard with HTTP Tasks = `whole_bill.standard_http_tasks`
  (its transitions); durable functions = `durable.dollars + whole_bill.durable.waiting_gb_seconds * 0.0000166667`.
- S4 (a map step): per item, divide by `items`. Distributed Map with Standard children:
  `distributed_map.standard_children.transitions * 0.025 / 1000` (one transition per child started, plus each
  child's own, `child_transitions`, plus the parent's Map state); with Express children (reference):
  `distributed_map.express_children.transitions * 0.025 / 1000 + items * 1.00 / 1e6 +
  distributed_map.express_children.gb_seconds * 0.00001667`.
- Per-step overhead (`throughput.latency`, seconds): `p50`, `p95` and `calls_p50`, `calls_p95` (the same calls back
  to back) of each path; `throughput.batching_windows` are the template's windows by function.
- Batching windows (`windows.configurations`, one per profile and window pair): `latency.p50`, `latency.p95` (the
  per-step overhead, seconds: the start of a step's call to its service minus the end of the previous step's),
  `latency.poller_windows` (the windows the local stack's pollers ran with), and `cost.vs_durable`,
  `cost.vs_standard` (S1's `ours_per_step` over `durable_per_step` and `standard_per_step`)."""

app = typer.Typer(add_completion=False, help="Cost and scale of sasflow, measured side by side with Step Functions.")
console = Console(soft_wrap=True)


def machine() -> str:
    """A one-line description of this machine."""
    cpus = os.cpu_count() or 0
    memory = ""
    try:
        with open("/proc/meminfo") as meminfo:
            kb = int(meminfo.readline().split()[1])
        memory = f", {kb / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return f"{platform.machine()}, {cpus} cores{memory}, {platform.system()}, Python {platform.python_version()}"


def _load() -> str:
    """``, load average 1.52 at the end`` (the 1-minute figure, the bench's own load included), or "" where the
    system has none."""
    try:
        return f", load average {os.getloadavg()[0]:.2f} at the end"
    except OSError:
        return ""


def parse_overrides(text: str) -> dict[str, str]:
    """``"A=1 B=2"`` (as ``sam deploy --parameter-overrides`` takes them) as ``{"A": "1", "B": "2"}``.

    Raises
    ------
    typer.BadParameter
        When an item is not ``Name=Value``.
    """
    overrides: dict[str, str] = {}
    for item in text.split():
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{item!r}: expected Name=Value")
        overrides[name] = value
    return overrides


def run_cost(
    scale: float, only: list[str] | None, parameters: dict[str, str] | None = None
) -> tuple[list[Row], dict[str, Any]]:
    from bench.scenarios import run_scenario, scenarios

    all_rows: list[Row] = []
    raw: dict[str, Any] = {}
    for scenario in scenarios(scale, parameters):
        if only and scenario.name not in only:
            continue
        console.print(f"[bold]{scenario.name}[/]: {scenario.title} ({scenario.workflows} workflows) ...")
        result = run_scenario(scenario)
        data = cost.figures(result)
        raw[scenario.name] = data
        if scenario.name != "S7-alone":  # S7's baseline: its times only, in S7's fairness row
            all_rows += cost.rows(result, data)
        if scenario.name == "S7" and "S7-alone" in raw:
            all_rows.append(cost.fairness_row(data, raw["S7-alone"]))
        transitions = data.get("step_functions_transitions", data.get("child_transitions"))
        console.print(
            f"  {dict(result.statuses)}, {result.steps_run} steps, {transitions} Step Functions "
            f"transitions, {result.wall_seconds:.0f} s"
        )
    return all_rows, raw


@app.command()
def bench(
    scale: Annotated[
        float, typer.Option(help="Multiplies the scenarios' workflow counts (1.0 = the full bench).")
    ] = 1.0,
    sweep_sizes: Annotated[
        str, typer.Option(help="Finished steps in the table, comma-separated.")
    ] = "1000,10000,100000",
    throughput_workflows: Annotated[int, typer.Option(help="Workflows of the local-stack throughput run.")] = 60,
    cold_start_pairs: Annotated[
        int, typer.Option(help="Baseline-handler pairs per handler; the median of their ratios counts.")
    ] = 40,
    windows: Annotated[
        str,
        typer.Option(
            help="Batching-window pairs (scheduler/agent, seconds) the windows part measures besides the"
            " template's profiles, comma-separated; a fraction of a second on the local stack only."
        ),
    ] = "0/0,0.5/0.5,1/1,2/2",
    only: Annotated[
        str, typer.Option(help="Run only these parts: cost,sweep,throughput,windows,cold (comma-separated).")
    ] = "",
    scenarios: Annotated[
        str, typer.Option(help="Only these scenarios (S1,S2,S3,S4,S5,S6,S1-tenancy,S7-alone,S7).")
    ] = "",
    parameter_overrides: Annotated[
        str,
        typer.Option(
            help="Template parameters the scenarios deploy with, e.g. 'Profile=latency' or"
            " 'SchedulerBatchingWindowSeconds=0 AgentBatchingWindowSeconds=0' (Profile=cost otherwise)."
        ),
    ] = "",
    write: Annotated[bool, typer.Option(help="Write bench/results.md and bench/results.json.")] = True,
) -> None:
    """Run the bench and print the table; exit 1 when a target is missed."""
    parts = {p.strip() for p in only.split(",") if p.strip()} or {"cost", "sweep", "throughput", "windows", "cold"}
    started = time.perf_counter()
    rows: list[Row] = []
    raw: dict[str, Any] = {"prices": {"read_on": prices.PRICES_READ_ON, "region": prices.REGION}}
    if "cost" in parts:
        chosen = [s.strip() for s in scenarios.split(",") if s.strip()] or None
        overrides = parse_overrides(parameter_overrides)
        if overrides:
            raw["parameter_overrides"] = overrides
        from bench.scenarios import COST_PARAMETERS

        raw["scenarios_deployed_with"] = {**COST_PARAMETERS, **overrides}
        cost_rows, raw["scenarios"] = run_cost(scale, chosen, overrides)
        rows += cost_rows
    if "sweep" in parts:
        from bench.sweep import measure_sweep

        console.print("[bold]sweep scaling[/] ...")
        sweep_rows, raw["sweep"] = measure_sweep(tuple(int(s) for s in sweep_sizes.split(",")))
        rows += sweep_rows
    if "throughput" in parts:
        from bench.throughput import measure_throughput

        console.print("[bold]throughput on the local stack[/] ...")
        tp_rows, raw["throughput"] = measure_throughput(throughput_workflows)
        rows += tp_rows
    if "windows" in parts:
        from bench.windows import deployed_parameters, measure_windows, parse_pairs

        console.print("[bold]batching windows[/] (the local stack and S1, by profile and window pair) ...")
        known = {}
        if "S1" in raw.get("scenarios", {}):  # the cost part's S1, at this scale: not run again
            known[deployed_parameters(raw["scenarios_deployed_with"])] = raw["scenarios"]["S1"]
        window_rows, raw["windows"] = measure_windows(
            parse_pairs(windows),
            scale=scale,
            progress=lambda line: console.print(f"  {line}", highlight=False),
            known_s1=known,
        )
        rows += window_rows
    if "cold" in parts:
        from bench.cold_start import measure_cold_start

        console.print("[bold]cold start[/] ...")
        cold_rows, raw["cold_start"] = measure_cold_start(cold_start_pairs)
        rows += cold_rows
    table = markdown(rows)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = f"Measured {when} on {machine()}{_load()}; prices of {prices.PRICES_READ_ON} ({prices.REGION})."
    if "cost" in parts:
        deployed = " ".join(f"{k}={v}" for k, v in sorted(raw["scenarios_deployed_with"].items()))
        header += f" The S1-S7 rows deploy the template with {deployed}."
    console.print()
    if "cost" in parts:
        console.print((cost.__doc__ or "").strip(), markup=False, highlight=False)
        console.print()
    console.print(header)
    print()
    print(table)
    raw["rows"] = [row.as_dict() for row in rows]
    raw["measured_at"] = when
    raw["machine"] = machine()
    raw["wall_seconds"] = round(time.perf_counter() - started, 1)
    if write:
        RESULTS_MD.write_text(_results_markdown(header, table))
        RESULTS_JSON.write_text(json.dumps(raw, indent=1, sort_keys=True, default=str) + "\n")
        console.print(f"\nwrote {RESULTS_MD} and {RESULTS_JSON}")
    missed = [row for row in rows if row.met is False]
    if missed:
        console.print(f"[red]targets missed: {len(missed)}[/]", highlight=False)
        for row in missed:
            console.print(f"  {row.metric}: {row.cells()[3]}, target {row.target}", markup=False, highlight=False)
        raise typer.Exit(1)


def _results_markdown(header: str, table: str) -> str:
    return "\n".join(
        [
            "# Bench results (`make bench`)",
            "",
            header,
            "",
            table,
            "",
            "## What the rows mean",
            "",
            (cost.__doc__ or "").strip(),
            "",
            "Raw counts (requests by service and operation, WRU/RRU, SQS chunks, Lambda milliseconds, Step Functions "
            "transitions, the Express and durable-functions counts) are in `bench/results.json`.",
            "",
            RECOMPUTE,
            "",
        ]
    )


def main() -> None:
    """Run the CLI."""
    app()
