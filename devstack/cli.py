"""Command line of the local stack: ``python -m devstack run | load | up | faults | resources | template``.

``run`` is the main job (the demo in ``devstack/demo.py``), ``load`` the load run (``devstack/load.py``), ``up``
keeps the stack running (one per checkout, `devstack.uplock`), ``faults`` shows and sets the fault knobs of its sample
services from another terminal (`devstack.faults`), ``resources`` lists how each template resource is realised
locally, ``template`` renders the agents' parts of template.yaml from agents.yaml (``devstack/agents.py``).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from devstack.agents import AgentsFileError, write_template
from devstack.client import SignedHttp
from devstack.events import LocalRule
from devstack.faults import FaultsError, KnobChanges, knobs_table, parse_duration, read_knobs, send_poison_message
from devstack.faults import apply as apply_faults
from devstack.identities import IDENTITIES, identity
from devstack.provision import HOW_CREATED, HOW_EMULATED, HOW_SKIPPED, describe
from devstack.stack import DEFAULT_LOG_DIR, DEFAULT_TEMPLATE, LocalStack
from devstack.template import HttpApiEventSpec, Stack, TemplateError, remote_service_parameters
from devstack.triggers import SAMPLE_TRIGGERS_PARAMETER
from devstack.uplock import DEFAULT_LOCK_PATH, StackAlreadyRunningError, UpLock, read_running

if TYPE_CHECKING:
    from sasflow_cli.console import ConsoleServer

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
    """Render the generated parts of template.yaml from agents.yaml and triggers.yaml (one entry per agent or
    trigger)."""
    try:
        changed = write_template()
    except AgentsFileError as error:
        console.print(f"[bold red]error:[/] {error}")
        raise typer.Exit(code=2) from None
    console.print(
        "template.yaml updated from agents.yaml and triggers.yaml" if changed else "template.yaml is up to date"
    )


@app.command()
def resources(
    template: TemplateOption = DEFAULT_TEMPLATE,
    param: ParamOption = None,
    stack_name: StackNameOption = "sasflow",
) -> None:
    """Print the template's resources and how the local stack realises each one."""
    console.print(resources_table(_load_stack(template, param, stack_name)))


#: The template parameters that say where the agents' services are: given any, ``up`` serves no sample services.
REMOTE_SERVICE_PARAMETERS = ("DeploySampleServices", "FlightsBaseUrl", "HotelsBaseUrl", "PaymentsBaseUrl")


def _serves_sample_services(stack: Stack, parameters: dict[str, str]) -> bool:
    """Whether ``up`` serves the sample services on loopback: the template can point its agents at them, and the
    caller gave no service of their own."""
    declared = stack.template.get("Parameters") or {}
    return all(name in declared for name in REMOTE_SERVICE_PARAMETERS) and not any(
        name in parameters for name in REMOTE_SERVICE_PARAMETERS
    )


def faults_examples() -> list[str]:
    """The fault-knob commands of the sample services (``python -m devstack faults``), for the console."""
    faults_cli = ".venv/bin/python -m devstack faults"
    return [
        f"{faults_cli}                                   # the knobs in force",
        f"{faults_cli} flights --outage 60s --error-rate 0.2",
        f"{faults_cli} --reset                           # no faults anywhere",
        f"{faults_cli} flights --poison-message          # one for its dead-letter queue",
    ]


@app.command()
def up(
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Port of the HTTP API emulator (0 = any free port).")
    ] = 3000,
    template: TemplateOption = DEFAULT_TEMPLATE,
    param: ParamOption = None,
    stack_name: StackNameOption = "sasflow",
    schedule_interval: Annotated[
        float | None,
        typer.Option(
            "--schedule-interval", min=0.1, help="Run every schedule this often (seconds; default: its own rate)."
        ),
    ] = None,
    sqs_concurrency: Annotated[
        int, typer.Option("--sqs-concurrency", min=1, max=64, help="Poll threads per SQS mapping.")
    ] = 2,
    visibility_timeout: Annotated[
        int | None,
        typer.Option("--visibility-timeout", min=0, max=43_200, help="Visibility timeout when polling (seconds)."),
    ] = None,
    log_dir: Annotated[Path, typer.Option("--log-dir", help="Folder of the per-function logs.")] = DEFAULT_LOG_DIR,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", "-v", help="Also print the resources, outputs and a curl per route; log the emulators."
        ),
    ] = False,
    swagger: Annotated[
        bool, typer.Option("--swagger/--no-swagger", help="Serve Swagger UI at /swagger (local only, unauthenticated).")
    ] = True,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sample services' fault draws.")] = 0,
    console_port: Annotated[
        int,
        typer.Option(
            "--console-port", min=0, max=65535, help="Port of the operators' web console on 127.0.0.1 (0 = any free)."
        ),
    ] = 0,
) -> None:
    """Start the local stack and keep it running until Ctrl-C (one per checkout: .devstack/up.lock)."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    lock = UpLock(DEFAULT_LOCK_PATH)
    try:
        lock.acquire()
    except StackAlreadyRunningError as error:
        console.print(f"[bold red]error:[/] {error}", highlight=False)
        raise typer.Exit(code=1) from None
    try:
        if lock.stale_pid is not None:
            console.print(f"[dim]took over {lock.path}: its pid {lock.stale_pid} is not running[/]", highlight=False)
        _up(lock, port, template, param, stack_name, schedule_interval, sqs_concurrency, visibility_timeout, log_dir,
            verbose, swagger, seed, console_port)  # fmt: skip
    finally:
        lock.release()


def _up(
    lock: UpLock,
    port: int,
    template: Path,
    param: list[str] | None,
    stack_name: str,
    schedule_interval: float | None,
    sqs_concurrency: int,
    visibility_timeout: int | None,
    log_dir: Path,
    verbose: bool,
    swagger: bool,
    seed: int,
    console_port: int = 0,
) -> None:
    parameters = parse_parameters(param)
    stack = _load_stack(template, param, stack_name)  # fail fast, before starting anything
    servers: dict[str, Any] = {}
    if _serves_sample_services(stack, parameters):
        from devstack.demo import sample_services_importable

        sample_services_importable()
        from http_server import serve_all

        # In this process, one instance per service, so a knob set from another terminal is in force at once for
        # every agent (as Lambda workers, each would hold its own knobs).
        servers = serve_all(rng_seed=seed)
        parameters = {**parameters, **remote_service_parameters({n: s.base_url for n, s in servers.items()})}
    if SAMPLE_TRIGGERS_PARAMETER in (stack.template.get("Parameters") or {}):
        # The sample triggers of triggers.yaml tick locally unless told otherwise (off in a deployment).
        parameters.setdefault(SAMPLE_TRIGGERS_PARAMETER, "ENABLED")
    local = LocalStack(
        template,
        parameters,
        schedule_interval_seconds=schedule_interval,
        sqs_concurrency=sqs_concurrency,
        log_dir=log_dir,
        api_port=port,
        stack_name=stack_name,
        sqs_visibility_timeout_seconds=visibility_timeout,
        swagger=swagger,
    )
    try:
        with console.status("starting the local stack (moto, tables, queues, function workers)..."):
            try:
                local.start()
            except OSError as error:
                console.print(f"[bold red]error:[/] {error} (is port {port} free? try --port 0)")
                raise typer.Exit(code=1) from None
        lock.publish(
            api_url=local.api_url,
            services={name: server.base_url for name, server in servers.items()},
            request_queues=_request_queues(local),
            **trigger_sources(local),
        )
        operators = _console_server(local.api_url, console_port)
        try:
            _serve_until_stopped(local, servers, log_dir, verbose, swagger, operators.url)
        finally:
            operators.stop()
    finally:
        for server in servers.values():
            server.stop()


def _console_server(api_url: str, port: int) -> ConsoleServer:
    """The operators' web console (``sasflow console``) of the local stack, signed as the local operator, in a
    thread of this process."""
    from sasflow_cli.console import Console as OperatorsConsole
    from sasflow_cli.console import ConsoleServer
    from sasflow_cli.targets import build_client

    client = build_client(url=api_url, stack=None, caller="operator")
    try:
        return ConsoleServer(lambda bound: OperatorsConsole(client, "operator", bound), port).start()
    except OSError as error:
        console.print(f"[bold red]error:[/] console: {error} (is port {port} free? try --console-port 0)")
        raise typer.Exit(code=1) from None


@app.command()
def emit(
    source: Annotated[str, typer.Option(help="The event's source (e.g. sasflow.demo).")],
    detail_type: Annotated[str, typer.Option("--detail-type", help="The event's detail-type (e.g. TripRequested).")],
    detail: Annotated[
        str, typer.Option(help="The event's detail: a JSON object, or @FILE to read it from a file.")
    ] = "{}",
    bus: Annotated[str, typer.Option(help="The bus: default, or a bus name of triggers.yaml.")] = "default",
    event_id: Annotated[
        str | None, typer.Option("--id", help="The event's id (default: a new one); the same id twice is one event.")
    ] = None,
) -> None:
    """Put an event on a bus of this checkout's running `make up`: every enabled rule on that bus whose pattern
    matches it sends it to its target queue (an event trigger starts one workflow per event id)."""
    from devstack.events import LocalRule, envelope, put_event

    running = _running_stack()
    if not running.get("endpoint_url"):
        console.print(
            f"[bold red]error:[/] the `make up` of pid {running.get('pid')} is still starting; try again in a few "
            "seconds",
            highlight=False,
        )
        raise typer.Exit(code=1)
    if event_id is not None and not event_id.strip():
        raise typer.BadParameter("an event's id is not blank; leave --id out for a new one", param_hint="--id")
    try:
        document = json.loads(Path(detail[1:]).read_text(encoding="utf-8") if detail.startswith("@") else detail)
    except OSError as error:
        raise typer.BadParameter(f"cannot read {detail[1:]}: {error.strerror}", param_hint="--detail") from None
    except ValueError as error:
        raise typer.BadParameter(f"not JSON: {error}", param_hint="--detail") from None
    if not isinstance(document, dict):
        raise typer.BadParameter("an event's detail is a JSON object", param_hint="--detail")
    rules = [LocalRule.from_document(rule) for rule in running.get("event_rules") or []]
    buses = sorted({rule.bus for rule in rules} | {"default"})
    stack_name = running.get("stack_name") or "sasflow"
    physical = bus if bus in buses else f"{stack_name}-{bus}"
    if physical not in buses:
        raise typer.BadParameter(f"no bus {bus!r} in this stack; its buses: {', '.join(buses)}", param_hint="--bus")
    region = running.get("region", "us-east-1")
    event = envelope(source, detail_type, document, region=region, event_id=event_id)
    from botocore.exceptions import BotoCoreError, ClientError

    from devstack import _aws

    try:
        matched = put_event(
            _aws.client("sqs", region=region, endpoint_url=running["endpoint_url"]), rules, physical, event
        )
    except (BotoCoreError, ClientError) as error:
        console.print(
            f"[bold red]error:[/] the local stack did not take the event ({error}); is `make up` still running?",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(code=1) from None
    targets = ", ".join(rule.name for rule in matched) or "no rule (nothing matched its pattern)"
    console.print(f"event {event['id']} put on bus {physical}: {targets}", highlight=False, soft_wrap=True)


@app.command()
def send(
    trigger: Annotated[str, typer.Option(help="An sqs trigger of triggers.yaml (e.g. trip-queue).")],
    body: Annotated[
        str,
        typer.Option(help="The message body (a JSON object when the trigger's input is the body), or @FILE."),
    ],
    attribute: Annotated[
        list[str] | None,
        typer.Option("--attribute", help="A message attribute NAME=VALUE (a string); repeat it for more."),
    ] = None,
) -> None:
    """Send a message to an sqs trigger's queue of this checkout's running `make up`: it starts one workflow,
    however often SQS delivers it (its message id is the occurrence)."""
    running, queue = _local_trigger(trigger, "sqs", "trigger_queues")
    try:
        text = Path(body[1:]).read_text(encoding="utf-8") if body.startswith("@") else body
    except OSError as error:
        raise typer.BadParameter(f"cannot read {body[1:]}: {error.strerror}", param_hint="--body") from None
    attributes: dict[str, Any] = {}
    for pair in attribute or []:
        name, equals, value = pair.partition("=")
        if not equals or not name.strip():
            raise typer.BadParameter(f"{pair!r}: an attribute is NAME=VALUE", param_hint="--attribute")
        attributes[name.strip()] = {"DataType": "String", "StringValue": value}
    sent = _on_local_stack(
        running,
        "sqs",
        "message",
        lambda sqs: sqs.send_message(
            QueueUrl=queue, MessageBody=text, **({"MessageAttributes": attributes} if attributes else {})
        ),
    )
    console.print(
        f"message {sent['MessageId']} sent to {queue.rsplit('/', 1)[-1]}: trigger {trigger} starts one workflow for "
        f"it (sasflow list --trigger {trigger}), holds it while paused, or refuses it into its dead-letter queue "
        "with the reason (sasflow dlq list)",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def upload(
    trigger: Annotated[str, typer.Option(help="An s3 trigger of triggers.yaml (e.g. trip-uploads).")],
    key: Annotated[str, typer.Option(help="The object's key: it must have the trigger's prefix and suffix.")],
    body: Annotated[str, typer.Option(help="The object's content: text, or @FILE to upload a file.")] = "{}",
) -> None:
    """Upload an object to an s3 trigger's bucket of this checkout's running `make up`: S3 (moto) notifies the
    trigger, which starts one workflow for the upload (its key and version id are the occurrence)."""
    running, watched = _local_trigger(trigger, "s3", "trigger_buckets")
    if not (key.startswith(watched["prefix"]) and key.endswith(watched["suffix"])):
        raise typer.BadParameter(
            f"{key!r}: trigger {trigger} watches {watched['prefix']}*{watched['suffix']}: S3 would not notify it",
            param_hint="--key",
        )
    try:
        content = Path(body[1:]).read_bytes() if body.startswith("@") else body.encode()
    except OSError as error:
        raise typer.BadParameter(f"cannot read {body[1:]}: {error.strerror}", param_hint="--body") from None
    put = _on_local_stack(
        running, "s3", "upload", lambda s3: s3.put_object(Bucket=watched["bucket"], Key=key, Body=content)
    )
    console.print(
        f"uploaded {watched['bucket']}/{key} (version {put.get('VersionId')}): trigger {trigger} starts one workflow "
        f"for it (sasflow list --trigger {trigger}), holds it while paused, or refuses it into its dead-letter queue "
        "with the reason (sasflow dlq list)",
        highlight=False,
        soft_wrap=True,
    )


def _local_trigger(trigger: str, kind: str, published: str) -> tuple[dict[str, Any], Any]:
    """The running `make up` and what its lock ``published`` of its ``kind`` trigger ``trigger`` (a queue's URL, a
    bucket and its keys); exit saying so when it is still starting or has no such trigger."""
    running = _running_stack()
    if not running.get("endpoint_url"):
        console.print(f"[bold red]error:[/] the `make up` of pid {running.get('pid')} is still starting; try again")
        raise typer.Exit(code=1)
    found: dict[str, Any] = running.get(published) or {}
    if trigger not in found:
        known = ", ".join(sorted(found)) or f"none (kind: {kind} in triggers.yaml, then restart make up)"
        raise typer.BadParameter(
            f"no {kind} trigger {trigger!r} in this stack; its {kind} triggers: {known}", param_hint="--trigger"
        )
    return running, found[trigger]


def _on_local_stack(running: dict[str, Any], service: str, what: str, call: Callable[[Any], Any]) -> Any:
    """``call`` with a client of ``service`` on the running `make up`; exit 1 saying it did not take ``what``."""
    from botocore.exceptions import BotoCoreError, ClientError

    from devstack import _aws

    client = _aws.client(service, region=running.get("region", "us-east-1"), endpoint_url=running["endpoint_url"])
    try:
        return call(client)
    except (BotoCoreError, ClientError) as error:
        console.print(f"[bold red]error:[/] the local stack did not take the {what} ({error})", highlight=False)
        raise typer.Exit(code=1) from None


def trigger_lines(local: LocalStack) -> list[str]:
    """One line per schedule, event rule and queue of the template's triggers: what it ticks at, matches or reads,
    and whether it ticks (or takes events) here."""
    lines = []
    for spec in local.stack.scheduler_schedules():
        emulator = local.scheduler_schedules.get(spec.logical_id)
        ticking = "ticks here" if emulator is not None else "DISABLED (its State)"
        lines.append(f"{spec.logical_id}: {spec.expression} {spec.timezone}, {ticking}")
    for rule in local.stack.event_rules():
        if not rule.enabled:
            lines.append(f"{rule.logical_id}: events on bus {rule.bus}, DISABLED (its State)")
            continue
        pattern = json.dumps(rule.pattern, separators=(",", ":"))
        lines.append(
            f"{rule.logical_id}: events on bus {rule.bus} matching {pattern}: "
            "python -m devstack emit --source ... --detail-type ... --detail JSON"
        )
    queues, buckets = _trigger_destinations(local)
    for name, url in queues.items():
        lines.append(
            f"{url.rsplit('/', 1)[-1]}: each message starts a workflow of {name}: "
            f"python -m devstack send --trigger {name} --body JSON"
        )
    for name, watched in buckets.items():
        keys = f"{watched['prefix']}*{watched['suffix']}"
        lines.append(
            f"{watched['bucket']}: each upload of {keys} starts a workflow of {name}: "
            f"python -m devstack upload --trigger {name} --key {watched['prefix']}NAME{watched['suffix']}"
        )
    return lines


def batching_windows_line(local: LocalStack) -> str:
    """The batching windows the local stack's SQS pollers run with, and the ``Profile`` that chose them:
    ``Profile=latency: scheduler 0 s, agents 0 s`` (docs/deploy.md, "Latency and cost")."""
    by_function = {poller.name.split(".", 1)[0]: poller.spec.batching_window_seconds for poller in local.pollers}
    scheduler = by_function.pop("SchedulerFunction", None)
    agents = sorted(set(by_function.values()))
    profile = local.stack.parameters.get("Profile")
    windows = ", ".join(
        part
        for part in (
            f"scheduler {scheduler:g} s" if scheduler is not None else "",
            f"agents {'/'.join(f'{w:g}' for w in agents)} s" if agents else "",
        )
        if part
    )
    return f"Profile={profile}: {windows}" if profile else windows


def trigger_sources(local: LocalStack) -> dict[str, Any]:
    """What `make up` publishes in its lock for ``emit``, ``send`` and ``upload``: where moto answers, the stack's
    event rules, and each sqs trigger's queue and s3 trigger's bucket."""
    queues, buckets = _trigger_destinations(local)
    return {
        "endpoint_url": local.endpoint_url,
        "region": local.region,
        "stack_name": local.stack.stack_name,
        "event_rules": [LocalRule.of(rule).document() for rule in local.stack.event_rules()],
        "trigger_queues": queues,
        "trigger_buckets": buckets,
    }


def _trigger_destinations(local: LocalStack) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Where the local stack's triggers take occurrences from a person (its ``triggers.yaml``, beside its template,
    read once): each sqs trigger's queue URL (an existing queue's stand-in), for ``python -m devstack send``, and
    each s3 trigger's bucket name, prefix and suffix, for ``python -m devstack upload``."""
    from devstack.triggers import load_triggers, triggers_file

    queues: dict[str, str] = {}
    buckets: dict[str, dict[str, str]] = {}
    stand_ins = {existing.arn: existing.url for existing in local.stack.existing_queues()}
    for trigger in load_triggers(triggers_file(local.template_path)):
        queue = f"{trigger.pascal}TriggerQueue"
        if trigger.kind == "sqs" and trigger.queue is not None:
            queues[trigger.name] = stand_ins[local.stack.resolve({"Fn::Sub": trigger.queue})]
        elif trigger.kind == "sqs" and queue in local.physical_ids:
            queues[trigger.name] = local.physical_ids[queue]
        elif trigger.kind == "s3" and (trigger.bucket_parameter or trigger.created_bucket in local.physical_ids):
            bucket = str(
                local.stack.ref(trigger.bucket_parameter)  # an existing bucket's stand-in
                if trigger.bucket_parameter
                else local.physical_ids[trigger.bucket_id]
            )
            buckets[trigger.name] = {"bucket": bucket, "prefix": trigger.prefix, "suffix": trigger.suffix}
    return queues, buckets


def _request_queues(local: LocalStack) -> dict[str, dict[str, str]]:
    """Each agent's request queue (``agents.yaml``'s name -> the queue's URL and the logical name of its dead-letter
    queue, as ``sasflow dlq list`` shows it), for ``faults --poison-message``."""
    from devstack.agents import load_agents

    return {
        agent.name: {
            "url": local.physical_ids[f"{agent.pascal}RequestQueue"],
            "dead_letter_queue": f"{agent.pascal}DeadLetterQueue",
        }
        for agent in load_agents()
        if f"{agent.pascal}RequestQueue" in local.physical_ids
    }


def _serve_until_stopped(
    local: LocalStack, servers: dict[str, Any], log_dir: Path, verbose: bool, swagger: bool, console_url: str
) -> None:
    stopping = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        # What a person needs next comes first; the long lists follow, the resources only on --verbose.
        console.print(f"[bold]HTTP API[/]      {local.api_url}")
        console.print(
            f"[bold]console[/]       {console_url}\n"
            "              (the operators' web page, signed here as the operator; open it on this machine; "
            "docs/console.md)",
            soft_wrap=True,
            highlight=False,
        )
        console.print("\n[bold]next[/], in another terminal (sasflow signs as the operator; --as client-a)")
        for command in cli_examples(local.api_url):
            console.print(f"  {command}", soft_wrap=True, highlight=False)
        if servers:
            console.print(
                "\n[bold]fault knobs[/] of the sample services (docs/operate.md: Fault knobs and an on-call drill)"
            )
            for command in faults_examples():
                console.print(f"  {command}", soft_wrap=True, highlight=False)
        console.print()
        for name, server in servers.items():
            console.print(f"[bold]{name:13}[/] {server.base_url}  (sample service, no faults)", highlight=False)
        if swagger:
            console.print(
                f"[bold]Swagger UI[/]    {local.api_url}/swagger  (local only and [bold]unauthenticated[/]: the page, "
                "and its Try it out, which is taken as signed by the identity picked under Servers)",
                soft_wrap=True,
            )
        console.print(f"[bold]windows[/]       {batching_windows_line(local)}", highlight=False)
        console.print(f"[bold]moto endpoint[/] {local.endpoint_url}  (AWS_ENDPOINT_URL for the aws cli / boto3)")
        console.print(f"[bold]function logs[/] {log_dir.resolve()}/<LogicalId>.log")
        if local.check_roles:
            console.print(
                "[bold]role check[/]    on: each function's AWS calls are checked against its role in template.yaml; "
                f"a refused one fails as on AWS and is listed in {local.refusals_path} (docs/security.md)",
                soft_wrap=True,
                highlight=False,
            )
        console.print(
            "[bold]state[/]         in this process's memory: tables, queues and the services' ledgers are gone "
            "when it stops",
            soft_wrap=True,
        )
        console.print("\n[bold]identities[/] (the API verifies SigV4 against these, as API Gateway against IAM)")
        for who in IDENTITIES.values():
            console.print(f"  {who.name:9} {who.access_key}:{who.secret_key}  {who.arn}", highlight=False)
        published = push_definitions(local.api_url)
        if published:
            console.print(
                "\n[bold]definitions[/] (definitions/*.json, published as client-a: start them by name; push a new "
                "version with sasflow --as client-a)"
            )
            for line in published:
                console.print(f"  {line}", highlight=False)
        ticking = trigger_lines(local)
        if ticking:
            console.print("\n[bold]triggers[/] (triggers.yaml; sasflow triggers list, sasflow list --trigger NAME)")
            for line in ticking:
                console.print(f"  {line}", highlight=False)
        if verbose:
            console.print()
            console.print(resources_table(local.stack))
            console.print("\n[bold]outputs[/]")
            for name, value in local.outputs.items():
                console.print(f"  [dim]{name}[/] {value}")
            commands = example_requests(local.stack, local.api_url)
            if commands:
                console.print("\n[bold]try[/] (signed curl, one per route)")
                for command in commands:
                    console.print(f"  {command}", soft_wrap=True, highlight=False)
        else:
            console.print(
                f"\n[dim]--verbose also prints the {len(local.stack.template_resources())} resources and how each is "
                "realised, the outputs and a signed curl per route[/]",
                highlight=False,
            )
        console.print("\n[green]ready[/] - Ctrl-C to stop")
        while not stopping.wait(1.0):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        with console.status("stopping..."):
            local.stop()
    refused = local.role_refusals()
    for refusal in refused:
        console.print(f"[bold red]refused by its role[/] {refusal}", soft_wrap=True, highlight=False)
    console.print("stopped")
    if refused:
        raise typer.Exit(code=1)


def _duration(text: str | None, option: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint=option) from None


Rate = Annotated[float | None, typer.Option(min=0.0, max=1.0)]


@app.command()
def faults(
    service: Annotated[str, typer.Argument(help="flights, hotels, payments, or all.", show_default="all")] = "all",
    outage: Annotated[
        str | None, typer.Option("--outage", help="Answer every call 503 from now for this long (60s, 2m); 0 ends it.")
    ] = None,
    error_rate: Annotated[
        float | None, typer.Option("--error-rate", min=0.0, max=1.0, help="Share of calls answered 503 (0..1).")
    ] = None,
    latency: Annotated[str | None, typer.Option("--latency", help="Added to every call (250ms, 2s).")] = None,
    hang_rate: Annotated[
        float | None,
        typer.Option("--hang-rate", min=0.0, max=1.0, help="Share of calls that apply their effect only after --hang."),
    ] = None,
    hang: Annotated[str | None, typer.Option("--hang", help="How long a hang lasts (30s; past complete-by).")] = None,
    rejection_rate: Annotated[
        float | None,
        typer.Option("--rejection-rate", min=0.0, max=1.0, help="Share of forward actions refused (the step fails)."),
    ] = None,
    compensation_error_rate: Annotated[
        float | None,
        typer.Option(
            "--compensation-error-rate",
            min=0.0,
            max=1.0,
            help="Share of compensations answered 503, forward actions untouched (a workflow's unwind fails).",
        ),
    ] = None,
    quota_in_flight: Annotated[
        int | None,
        typer.Option("--quota-in-flight", min=1, help="Calls served at once; one more is answered 429 THROTTLED."),
    ] = None,
    quota_rate: Annotated[
        float | None,
        typer.Option("--quota-rate", min=0.01, help="Calls a second (a token bucket); beyond, 429 THROTTLED."),
    ] = None,
    quota_burst: Annotated[
        int | None,
        typer.Option("--quota-burst", min=1, help="Calls --quota-rate lets through at once (default: a second's)."),
    ] = None,
    reset: Annotated[bool, typer.Option("--reset", help="No faults (outage included), before the other options.")] = (
        False
    ),
    poison_message: Annotated[
        bool,
        typer.Option(
            "--poison-message",
            help="Put a poison message on the service's agent queue: it reaches the dead-letter queue in seconds.",
        ),
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show or set the fault knobs of the sample services of this checkout's running `make up`."""
    running = _running_stack()
    services: dict[str, str] = running.get("services") or {}
    if not services:
        starting = "api_url" not in running
        console.print(
            "[bold red]error:[/] "
            + (
                f"the `make up` of pid {running.get('pid')} is still starting; try again in a few seconds"
                if starting
                else "this `make up` serves no sample services (its agents call the services given by --param)"
            ),
            highlight=False,
        )
        raise typer.Exit(code=1)
    if service != "all" and service not in services:
        raise typer.BadParameter(f"expected one of {', '.join([*services, 'all'])}", param_hint="SERVICE")
    latency_seconds = _duration(latency, "--latency")
    knobs: dict[str, float] = {}
    for name, value in (
        ("transient_error_rate", error_rate),
        ("latency_ms", None if latency_seconds is None else latency_seconds * 1000),
        ("hang_rate", hang_rate),
        ("hang_seconds", _duration(hang, "--hang")),
        ("rejection_rate", rejection_rate),
        ("compensation_error_rate", compensation_error_rate),
        ("quota_in_flight", quota_in_flight),
        ("quota_rate", quota_rate),
        ("quota_burst", quota_burst),
    ):
        if value is not None:
            knobs[name] = value
    changes = KnobChanges(outage_seconds=_duration(outage, "--outage"), knobs=knobs, reset=reset)
    chosen = services if service == "all" else {service: services[service]}
    try:
        if poison_message:
            _send_poison(running, chosen)
        changed = {} if changes.empty else {row.service: row for row in apply_faults(chosen, changes)}
        # Every service is shown, so the table is the whole picture of what the agents meet.
        rows = [changed.get(name) or read_knobs({name: url})[0] for name, url in services.items()]
    except FaultsError as error:
        console.print(f"[bold red]error:[/] {error}", highlight=False)
        raise typer.Exit(code=1) from None
    if json_output:
        console.print_json(json.dumps({row.service: {"base_url": row.base_url, **row.knobs} for row in rows}))
    else:
        console.print(knobs_table(rows))


def _running_stack() -> dict[str, Any]:
    """What this checkout's running `make up` published (its lock); exit 1 saying so when none runs."""
    running = read_running(DEFAULT_LOCK_PATH)
    if running is None:
        console.print(
            f"[bold red]error:[/] no `make up` is running in this checkout (no live lock at {DEFAULT_LOCK_PATH}); "
            "start one with `make up`, and run this from the same folder",
            highlight=False,
        )
        raise typer.Exit(code=1)
    return running


def _send_poison(running: dict[str, Any], services: dict[str, str]) -> None:
    """``faults --poison-message``: one poison message on the request queue of each service's agent."""
    queues: dict[str, dict[str, str]] = running.get("request_queues") or {}
    for name in services:
        if name not in queues or not running.get("endpoint_url"):
            raise FaultsError(f"this `make up` did not publish the request queue of {name}; restart it to drill this")
        queue_url, dead_letter_queue = queues[name]["url"], queues[name]["dead_letter_queue"]
        message_id = send_poison_message(running["endpoint_url"], running.get("region", "us-east-1"), queue_url)
        queue = queue_url.rsplit("/", 1)[-1]
        console.print(
            f"poison message {message_id} sent to {queue}: the {name} agent fails it on every receive (its log's "
            f"`batch item failed`, permanent true) and it is in {dead_letter_queue} within seconds; "
            f"sasflow dlq list {dead_letter_queue}",
            soft_wrap=True,
            highlight=False,
        )


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


@app.command()
def burst(
    workflows: Annotated[int, typer.Option(help="How many trip bookings to start at once.", min=1, max=5000)] = 500,
    call_wait_seconds: Annotated[
        float | None,
        typer.Option(help="The agents' CALL_WAIT_SECONDS: how long a record waits for its limits before deferral."),
    ] = None,
    time_limit: Annotated[
        float, typer.Option(help="Wall-clock limit of the whole run, start-up included (seconds).", min=30.0)
    ] = 1200.0,
    report: Annotated[Path | None, typer.Option(help="Also write the markdown table here.", dir_okay=False)] = Path(
        ".devstack/burst/report.md"
    ),
) -> None:
    """Start WORKFLOWS trip bookings at once against services limited as agents.yaml declares (the hotels: 5 at once,
    10 a second, answering 429 beyond): check none was called over its quota and the deferrals used no attempt."""
    from devstack.load import burst_profile, render, run_load, write_report

    profile = burst_profile(workflows, call_wait_seconds=call_wait_seconds, time_limit_seconds=time_limit)
    result = run_load(profile, console=console)
    render(result, console, title="Burst run")
    if report is not None:
        write_report(result, report)
        console.print(f"\nmarkdown table written to {report}")
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
