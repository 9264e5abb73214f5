"""Command line of the local stack: ``python -m devstack run | load | up | resources | template``.

``run`` is the main job (the demo in ``devstack/demo.py``), ``load`` the load run (``devstack/load.py``), ``up``
keeps the stack running, ``resources`` lists how each template resource is realised locally, ``template`` renders
the agents' parts of template.yaml from agents.yaml (``devstack/agents.py``).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from devstack.agents import AgentsFileError, write_template
from devstack.client import SignedHttp
from devstack.identities import IDENTITIES, identity
from devstack.provision import HOW_CREATED, HOW_EMULATED, HOW_SKIPPED, describe
from devstack.stack import DEFAULT_LOG_DIR, DEFAULT_TEMPLATE, LocalStack
from devstack.template import HttpApiEventSpec, Stack, TemplateError

__all__ = ["app", "cli_examples", "example_requests", "main", "parse_parameters", "resources_table"]

app = typer.Typer(
    name="devstack",
    help="The sasflow stack on loopback: moto for tables and queues, in-process Lambda, SQS, schedules and HTTP API.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()

TemplateOption = Annotated[Path, typer.Option("--template", "-t", help="SAM template.", dir_okay=False)]
ParamOption = Annotated[
    list[str] | None,
    typer.Option("--param", "-p", help="Parameter override Key=Value (repeatable), as in sam deploy."),
]
StackNameOption = Annotated[str, typer.Option("--stack-name", help="Stack name, the prefix of physical names.")]


def parse_parameters(items: list[str] | None) -> dict[str, str]:
    """Turn ``["Key=Value", ...]`` into a dict.

    Raises
    ------
    typer.BadParameter
        An item has no ``=``.
    """
    parameters: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected Key=Value, got {item!r}", param_hint="--param")
        parameters[key.strip()] = value
    return parameters


def resources_table(stack: Stack) -> Table:
    """A rich table of the template's resources and how each is realised locally (`devstack.provision.describe`)."""
    table = Table(title=f"stack {stack.stack_name}: {len(stack.template_resources())} resources", title_justify="left")
    table.add_column("logical id", style="bold")
    table.add_column("type")
    table.add_column("local realisation")
    styles = {HOW_CREATED: "green", HOW_EMULATED: "cyan", HOW_SKIPPED: "dim"}
    for logical_id, rtype, how in describe(stack):
        style = next((value for prefix, value in styles.items() if how.startswith(prefix)), "bold red")
        table.add_row(logical_id, rtype, how, style=style)
    return table


def example_requests(stack: Stack, api_url: str, *, caller: str = "client-a") -> list[str]:
    """One curl command per HTTP route (path variables filled with ``example``), for the console.

    An ``AWS_IAM`` route is signed by curl's own SigV4 (``--aws-sigv4``) with a local identity's keys
    (`devstack.identities`): the local stack refuses unsigned requests, as API Gateway does. ``/ops`` routes are
    signed by the operator, the only identity whose policy grants them.
    """
    commands: list[str] = []

    def signing(name: str) -> str:
        who = identity(name)
        return f"--aws-sigv4 'aws:amz:{stack.region}:execute-api' --user '{who.access_key}:{who.secret_key}' "

    for spec in stack.functions():
        for event in spec.events:
            if not isinstance(event, HttpApiEventSpec) or event.path == "$default":
                continue
            path = "/".join("example" if part.startswith("{") else part for part in event.path.split("/"))
            method = "GET" if event.method == "ANY" else event.method
            # The operators' routes are granted to the operator only (a client would get 403).
            signer = "operator" if event.path.startswith("/ops") else caller
            sign = signing(signer) if event.authorization == "AWS_IAM" else ""
            if method in {"POST", "PUT", "PATCH"}:
                commands.append(
                    f"curl -sS {sign}-X {method} {api_url}{path} -H 'content-type: application/json' -d '{{}}'"
                )
            else:
                commands.append(f"curl -sS {sign}-X {method} {api_url}{path}")
    return commands


def cli_examples(api_url: str) -> list[str]:
    """The operator CLI's commands against the local stack at ``api_url`` (``sasflow``, installed by make venv)."""
    cli = f".venv/bin/sasflow --url {api_url}"
    return [
        f"{cli} start events/trip_booking_request.json --watch",
        f"{cli} list --status COMPENSATION_FAILED",
        f"{cli} get <workflow_id>",
        f"{cli} history <workflow_id>",
        f"{cli} timeline <workflow_id> --out timeline.png",
        f"{cli} retry-compensation <workflow_id> --reason 'flights is back'",
        f"{cli} overdue",
        f"{cli} dlq list",
    ]


def _load_stack(template: Path, param: list[str] | None, stack_name: str) -> Stack:
    try:
        return Stack.from_file(template, stack_name=stack_name, parameters=parse_parameters(param))
    except (TemplateError, OSError) as error:
        console.print(f"[bold red]error:[/] {error}")
        raise typer.Exit(code=2) from None


@app.command()
def template() -> None:
    """Render the agents' parts of template.yaml from agents.yaml (one entry per agent)."""
    try:
        changed = write_template()
    except AgentsFileError as error:
        console.print(f"[bold red]error:[/] {error}")
        raise typer.Exit(code=2) from None
    console.print("template.yaml updated from agents.yaml" if changed else "template.yaml is up to date")


@app.command()
def resources(
    template: TemplateOption = DEFAULT_TEMPLATE,
    param: ParamOption = None,
    stack_name: StackNameOption = "sasflow",
) -> None:
    """Print the template's resources and how the local stack realises each one."""
    console.print(resources_table(_load_stack(template, param, stack_name)))


@app.command()
def up(
    port: Annotated[int, typer.Option("--port", help="Port of the HTTP API emulator (0 = any free port).")] = 3000,
    template: TemplateOption = DEFAULT_TEMPLATE,
    param: ParamOption = None,
    stack_name: StackNameOption = "sasflow",
    schedule_interval: Annotated[
        float | None, typer.Option("--schedule-interval", help="Run every schedule this often (seconds).")
    ] = None,
    sqs_concurrency: Annotated[int, typer.Option("--sqs-concurrency", help="Poll threads per SQS mapping.")] = 2,
    visibility_timeout: Annotated[
        int | None, typer.Option("--visibility-timeout", help="Visibility timeout when polling (seconds).")
    ] = None,
    log_dir: Annotated[Path, typer.Option("--log-dir", help="Folder of the per-function logs.")] = DEFAULT_LOG_DIR,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log the emulators' activity.")] = False,
    swagger: Annotated[
        bool, typer.Option("--swagger/--no-swagger", help="Serve Swagger UI at /swagger (local only, unauthenticated).")
    ] = True,
) -> None:
    """Start the local stack and keep it running until Ctrl-C."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    _load_stack(template, param, stack_name)  # fail fast, before starting anything
    local = LocalStack(
        template,
        parse_parameters(param),
        schedule_interval_seconds=schedule_interval,
        sqs_concurrency=sqs_concurrency,
        log_dir=log_dir,
        api_port=port,
        stack_name=stack_name,
        sqs_visibility_timeout_seconds=visibility_timeout,
        swagger=swagger,
    )
    with console.status("starting the local stack (moto, tables, queues, function workers)..."):
        try:
            local.start()
        except OSError as error:
            console.print(f"[bold red]error:[/] {error} (is port {port} free? try --port 0)")
            raise typer.Exit(code=1) from None
    stopping = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        console.print(resources_table(local.stack))
        console.print(f"\n[bold]HTTP API[/]      {local.api_url}")
        if swagger:
            console.print(
                f"[bold]Swagger UI[/]    {local.api_url}/swagger  (local only and [bold]unauthenticated[/]: the page, "
                "and its Try it out, which is taken as signed by the identity picked under Servers)",
                soft_wrap=True,
            )
        console.print(f"[bold]moto endpoint[/] {local.endpoint_url}  (AWS_ENDPOINT_URL for the aws cli / boto3)")
        console.print(f"[bold]function logs[/] {log_dir.resolve()}/<LogicalId>.log")
        for name, value in local.outputs.items():
            console.print(f"  [dim]{name}[/] {value}")
        console.print("\n[bold]identities[/] (the API verifies SigV4 against these, as API Gateway against IAM)")
        for who in IDENTITIES.values():
            console.print(f"  {who.name:9} {who.access_key}:{who.secret_key}  {who.arn}", highlight=False)
        published = push_definitions(local.api_url)
        if published:
            console.print("\n[bold]definitions[/] (definitions/*.json, published as client-a: start them by name)")
            for line in published:
                console.print(f"  {line}", highlight=False)
        commands = example_requests(local.stack, local.api_url)
        if commands:
            console.print("\n[bold]try[/]")
            for command in commands:
                console.print(f"  {command}", soft_wrap=True, highlight=False)
        console.print("\n[bold]sasflow CLI[/] (operator by default; --as client-a|client-b)")
        for command in cli_examples(local.api_url):
            console.print(f"  {command}", soft_wrap=True, highlight=False)
        console.print("\n[green]ready[/] - Ctrl-C to stop")
        while not stopping.wait(1.0):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        with console.status("stopping..."):
            local.stop()
    console.print("stopped")


DEFINITIONS_DIR = Path(__file__).resolve().parent.parent / "definitions"


def push_definitions(api_url: str, directory: Path = DEFINITIONS_DIR, caller: str = "client-a") -> list[str]:
    """Publish every ``directory/*.json`` to the local stack (``PUT /definitions/{name}/versions/{version}``).

    Returns one line per file: its name, version and answer (201 published, 200 unchanged, else the error).
    """
    http = SignedHttp(api_url, caller=caller)
    lines = []
    for file in sorted(directory.glob("*.json")):
        document = json.loads(file.read_text(encoding="utf-8"))
        name, version = document.get("name"), document.get("version", 1)
        response = http.request(
            "PUT",
            f"/definitions/{name}/versions/{version}",
            body=json.dumps(document).encode(),
            headers={"Content-Type": "application/json"},
        )
        answer = json.loads(response.data or b"null") or {}
        outcome = {201: "published", 200: "unchanged"}.get(
            response.status, f"{response.status} {answer.get('message')}"
        )
        lines.append(f"{name} v{version}: {outcome}  ({file.name})")
    return lines


@app.command()
def run(
    workflows: Annotated[int, typer.Option(help="How many trip bookings to start.", min=1, max=1000)] = 50,
    seed: Annotated[int, typer.Option(help="Seed of the fault injection (services and agents).")] = 7,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for every workflow to end.", min=10)] = 240.0,
) -> None:
    """Start the local stack and run trip bookings with faults switched on; print a summary read from DynamoDB."""
    from devstack.demo import run_demo

    raise typer.Exit(run_demo(workflows=workflows, seed=seed, timeout_seconds=timeout, console=console))


@app.command()
def load(
    workflows: Annotated[int, typer.Option(help="How many trip bookings to start.", min=1, max=5000)] = 1000,
    transient_error_rate: Annotated[
        float, typer.Option(help="Share of calls to every service that fail with 503.", min=0.0, max=1.0)
    ] = 0.2,
    outage_seconds: Annotated[float, typer.Option(help="Length of the hotels outage (seconds).", min=0.0)] = 30.0,
    max_in_flight: Annotated[
        int | None, typer.Option(help="At most this many workflows running at once [default: 25].", min=1)
    ] = None,
    time_limit: Annotated[
        float, typer.Option(help="Wall-clock limit of the whole run, start-up included (seconds).", min=30.0)
    ] = 1200.0,
    seed: Annotated[int, typer.Option(help="Seed of the services' fault draws.")] = 7,
    report: Annotated[Path | None, typer.Option(help="Also write the markdown table here.", dir_okay=False)] = Path(
        ".devstack/load/report.md"
    ),
) -> None:
    """Run many trip bookings under faults on the local stack; check and print what it took (exit 1 on a failure)."""
    from devstack.load import LoadProfile, render, run_load, write_report

    profile = LoadProfile(
        workflows=workflows,
        transient_error_rate=transient_error_rate,
        outage_seconds=outage_seconds,
        time_limit_seconds=time_limit,
        seed=seed,
    )
    if max_in_flight is not None:
        profile = dataclasses.replace(profile, max_in_flight=max_in_flight)
    result = run_load(profile, console=console)
    render(result, console)
    if report is not None:
        write_report(result, report)
        console.print(f"\nmarkdown table written to {report}")
    # moto leaves much cyclic garbage (every TransactWriteItems deep-copies the table); collecting it at interpreter
    # exit takes minutes after a large run, and the process ends here, so that last collection is skipped.
    gc.freeze()
    raise typer.Exit(result.exit_code)


@app.command("map")
def map_run(
    items: Annotated[
        int, typer.Option(help="Items of the map step: one child workflow each.", min=1, max=10_000)
    ] = 10_000,
    concurrency: Annotated[int, typer.Option(help="The map step's max_concurrency.", min=1, max=1_000)] = 500,
    time_limit: Annotated[float, typer.Option(help="Wall-clock limit of the run (seconds).", min=30.0)] = 3600.0,
) -> None:
    """Run one workflow with a map step of ITEMS children on the local stack; check it (exit 1 on a failure)."""
    from devstack.fanout import render, run_map

    result = run_map(items, concurrency, time_limit, console)
    render(result, console)
    gc.freeze()
    raise typer.Exit(1 if result.problems else 0)


def main() -> None:
    """Entry point of ``python -m devstack``."""
    app()
