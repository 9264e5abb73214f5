"""The main job (``make run``): the local stack from template.yaml, then 50 trip bookings with faults switched on.

The sample services run as real HTTP servers on loopback with fault knobs (latency, transient 5xx, an outage of the
hotel service, business rejections by payments, hangs past complete-by), and the agents crash after their side
effect on their first reply (and then at a small rate), so the supervisor has work to do. The run ends with a summary
read from DynamoDB and the dead-letter queues, cross-checked against the API and the services' ledgers.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import urllib3
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from devstack.client import SignedHttp
from devstack.template import remote_service_parameters
from sasflow.adapters.dynamodb_store import DynamoDBStateStore

ROOT = Path(__file__).resolve().parents[1]
# The sample services' code dir, as their Lambda would have it on sys.path (its /var/task).
SAMPLE_SERVICES_DIR = ROOT / "functions" / "sample_services"


def sample_services_importable() -> None:
    if str(SAMPLE_SERVICES_DIR) not in sys.path:
        sys.path.append(str(SAMPLE_SERVICES_DIR))


#: Where `make run` writes the timeline of one compensated workflow.
TIMELINE_DIR = ROOT / ".devstack" / "timeline"
TERMINAL = {"COMPLETED", "COMPENSATED", "COMPENSATION_FAILED", "CANCELLED"}


def dead_letter_queues(physical: dict[str, str]) -> list[str]:
    """Every dead-letter queue of the stack (logical ids): the response queue's, each agent's of agents.yaml and
    each trigger's of triggers.yaml."""
    return sorted(name for name in physical if name.endswith("DeadLetterQueue"))


def demo_definition(timeout_seconds: int = 5) -> dict[str, Any]:
    """The sample trip definition from events/, with demo-sized timeouts (seconds) so faults resolve quickly.

    ``timeout_seconds`` is every step's and compensation's complete-by budget (``make load`` gives more, because
    under load a request also waits in its queue).
    """
    request = json.loads((ROOT / "events" / "trip_booking_request.json").read_text())
    definition: dict[str, Any] = request["definition"]
    for step in definition["steps"]:
        step["timeout_seconds"] = timeout_seconds
        step["retry"] = {"max_attempts": 3, "backoff_base_seconds": 0.2, "backoff_cap_seconds": 1.0, "jitter": True}
        step["compensation"]["timeout_seconds"] = timeout_seconds
        step["compensation"]["retry"] = {"max_attempts": 5, "backoff_base_seconds": 0.5, "backoff_cap_seconds": 3.0}
    return definition


def demo_knobs() -> dict[str, Any]:
    """Fault knobs per sample service (see functions/sample_services/travel_services.FaultKnobs)."""
    sample_services_importable()
    from travel_services import FaultKnobs

    return {
        "flights": FaultKnobs(latency_ms=20, transient_error_rate=0.15),
        "hotels": FaultKnobs(latency_ms=30, transient_error_rate=0.1, hang_rate=0.03, hang_seconds=8),
        "payments": FaultKnobs(latency_ms=20, transient_error_rate=0.1, rejection_rate=0.2),
    }


@dataclass
class Summary:
    """What the run produced, read from DynamoDB, the dead-letter queues and the services' ledgers."""

    workflows: Counter[str] = field(default_factory=Counter)
    steps: int = 0
    attempts: int = 0
    resends: int = 0
    deferrals: int = 0
    compensations: int = 0
    compensation_attempts: int = 0
    dead_letters: dict[str, int] = field(default_factory=dict)
    effects: int = 0
    duplicate_effects: int = 0
    remote_compensations: int = 0
    #: Compensations the services answered ``nothing_to_undo``: the step's outcome was unknown (a lost reply, a
    #: timeout) and its action had in fact not happened, so its compensation ran and found nothing.
    nothing_to_undo: int = 0
    api_agrees: int = 0

    @property
    def terminal(self) -> int:
        return sum(n for status, n in self.workflows.items() if status in TERMINAL)


def read_summary(physical: dict[str, str], servers: dict[str, Any], api_url: str, workflow_ids: list[str]) -> Summary:
    """Scan the state table and the DLQs; compare every workflow's status with what the API returns."""
    summary = Summary()
    statuses: dict[str, str] = {}
    for snapshot in DynamoDBStateStore(physical["StateTable"], boto3.client("dynamodb")).workflows():
        if snapshot.workflow.trigger is not None:
            continue  # the triggers' workflows are shown and checked on their own (_triggered)
        statuses[snapshot.workflow.workflow_id] = snapshot.workflow.status.value
        for record in snapshot.steps.values():
            summary.steps += 1 if record.attempt > 0 else 0
            summary.attempts += record.attempt
            summary.resends += record.resends
            summary.deferrals += record.deferrals + record.comp_deferrals
            summary.compensation_attempts += record.comp_attempt
            summary.compensations += 1 if record.comp_attempt > 0 else 0
    summary.workflows = Counter(statuses.values())
    sqs = boto3.client("sqs")
    for logical_id in dead_letter_queues(physical):
        attributes = sqs.get_queue_attributes(
            QueueUrl=physical[logical_id],
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        summary.dead_letters[logical_id] = sum(int(v) for v in attributes.values())
    for server in servers.values():
        effects = server.service.effects()
        summary.effects += sum(effects.values())
        summary.duplicate_effects += sum(1 for n in effects.values() if n > 1)
        summary.remote_compensations += sum(server.service.compensations().values())
        summary.nothing_to_undo += server.service.stats()["by_outcome"].get("nothing_to_undo", 0)
    api = SignedHttp(api_url)
    for workflow_id in workflow_ids:
        status, view = api.get(f"/workflows/{workflow_id}")
        if status == 200 and view["status"] == statuses.get(workflow_id):
            summary.api_agrees += 1
    return summary


def render(summary: Summary, total: int, elapsed: float, console: Console) -> None:
    """Print the summary tables."""
    table = Table(title=f"{total} workflows, {elapsed:.0f} s")
    table.add_column("final state")
    table.add_column("workflows", justify="right")
    for status in ("COMPLETED", "COMPENSATED", "COMPENSATION_FAILED", "CANCELLED", "RUNNING", "COMPENSATING"):
        if summary.workflows.get(status):
            table.add_row(status, str(summary.workflows[status]))
    console.print(table)
    facts = Table(title="What it took (read from DynamoDB, the DLQs and the services' ledgers)")
    facts.add_column("measure")
    facts.add_column("value", justify="right")
    facts.add_row("steps dispatched", str(summary.steps))
    facts.add_row("step attempts (dispatches)", str(summary.attempts))
    facts.add_row("supervisor resends", str(summary.resends))
    facts.add_row("circuit-breaker deferrals", str(summary.deferrals))
    facts.add_row("compensations run (steps)", str(summary.compensations))
    facts.add_row("compensation attempts", str(summary.compensation_attempts))
    for logical_id, count in summary.dead_letters.items():
        facts.add_row(f"messages in {logical_id}", str(count))
    facts.add_row("remote side effects applied", str(summary.effects))
    facts.add_row("duplicate side effects (same token twice)", str(summary.duplicate_effects))
    facts.add_row("compensations applied remotely (an effect undone)", str(summary.remote_compensations))
    facts.add_row("compensations with nothing to undo (action never applied)", str(summary.nothing_to_undo))
    facts.add_row("API status == DynamoDB status", f"{summary.api_agrees}/{total}")
    console.print(facts)


def run_demo(
    *, workflows: int = 50, seed: int = 7, timeout_seconds: float = 240.0, console: Console | None = None
) -> int:
    """Run the demo; return the process exit code (0 when every workflow ended and nothing was doubled or lost)."""
    from devstack.stack import LocalStack, RoleRefusalError

    sample_services_importable()
    from http_server import serve_all

    console = console or Console()
    _log_to_file(ROOT / ".devstack" / "logs" / "devstack.log")
    servers = serve_all(demo_knobs(), rng_seed=seed)
    parameters = {
        **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
        "DeadlineGraceSeconds": "2",
        "MaxClockSkewSeconds": "1",
        "LogLevel": "WARN",
        # the sample triggers of triggers.yaml: one scheduled and one event-started workflow (_triggered)
        "SampleTriggersState": "ENABLED",
    }
    extra_env = {
        "BREAKER_OPEN_SECONDS": "3",
        "BREAKER_PROBE_SECONDS": "3",
        "DEVSTACK_WORKER_INIT": "devstack.chaos:install",
        "DEVSTACK_CHAOS": json.dumps({"lose_reply_rate": 0.05, "crash_first_reply": True, "seed": seed}),
    }
    started = time.monotonic()
    try:
        console.print(
            "[bold]Starting the local stack from template.yaml[/] (moto server, emulated Lambda, schedule, API)"
        )
        with LocalStack(parameters=parameters, schedule_interval_seconds=1.0, extra_env=extra_env) as stack:
            console.print(f"API: {stack.api_url}   logs: .devstack/logs/ (one file per function, devstack.log)")
            console.print("Every AWS call of each function is checked against its role in template.yaml")
            return _drive(stack, servers, workflows, seed, timeout_seconds, started, console)
    except RoleRefusalError as refused:  # the run's outcome stands; a missing permission fails it, named
        console.print(f"[bold red]{refused}[/]", soft_wrap=True, highlight=False)
        return 1
    finally:
        for server in servers.values():
            server.stop()


def _drive(
    stack: Any,
    servers: dict[str, Any],
    workflows: int,
    seed: int,
    timeout_seconds: float,
    started: float,
    console: Console,
) -> int:
    api = SignedHttp(stack.api_url, pool=urllib3.PoolManager(maxsize=8))
    definition = demo_definition()
    workflow_ids: list[str] = []
    store = DynamoDBStateStore(stack.physical_ids["StateTable"], boto3.client("dynamodb"))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        starting = progress.add_task("starting workflows over HTTP", total=workflows)
        for index in range(workflows):
            body = {
                "definition": definition,
                "input": {
                    "traveller": f"traveller-{index:03d}",
                    "route": "LHR-JFK",
                    "nights": 1 + index % 5,
                    "amount": 100 + index,
                },
            }
            status, started_view = api.post("/workflows", body, headers={"Idempotency-Key": f"demo-{seed}-{index}"})
            if status not in (200, 201):
                console.print(f"[red]start {index} failed: {status} {str(started_view)[:200]}")
                return 1
            workflow_ids.append(started_view["workflow_id"])
            progress.advance(starting)
            if index == workflows // 3:
                servers["hotels"].service.start_outage(4)  # a 4-second outage: the breaker opens, steps defer
        finishing = progress.add_task("workflows in a terminal state", total=workflows)
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            done = terminal_count(store)
            progress.update(finishing, completed=done)
            if done >= workflows:
                break
            time.sleep(0.5)
    problems = _triggered(stack, store, console, timeout_seconds)
    elapsed = time.monotonic() - started
    summary = read_summary(stack.physical_ids, servers, stack.api_url, workflow_ids)
    render(summary, workflows, elapsed, console)
    if summary.terminal != workflows:
        problems.append(f"{workflows - summary.terminal} workflow(s) did not reach a terminal state")
    if summary.duplicate_effects:
        problems.append(f"{summary.duplicate_effects} token(s) had their side effect applied twice")
    if summary.api_agrees != workflows:
        problems.append("the API and DynamoDB disagree")
    if sum(summary.dead_letters.values()):
        problems.append("messages are waiting in dead-letter queues")
    try:
        show_timeline(stack.api_url, store, console)
    except Exception as error:  # the run's checks are reported all the same
        problems.append(f"the timeline could not be drawn: {type(error).__name__}: {error}")
    for problem in problems:
        console.print(f"[red]FAILED: {problem}")
    if not problems:
        console.print(f"[green]OK[/]: {workflows} workflows terminal, 0 duplicate side effects, 0 dead letters.")
    return 1 if problems else 0


#: The sample triggers of triggers.yaml the demo starts a workflow with: a schedule's tick, an event (put twice
#: with one id, as EventBridge may deliver it: one workflow), a message sent to the sqs trigger's queue, and an
#: upload to the s3 trigger's bucket (a key with a space, which its notification URL-encodes).
SAMPLE_SCHEDULE = "EveryMinuteTripSchedule"
SAMPLE_EVENT_DETAIL = {"traveller": "Event traveller", "route": "CDG-NRT", "nights": 2, "amount": 240}
SAMPLE_QUEUE_TRIGGER = "trip-queue"
SAMPLE_MESSAGE = {"traveller": "Queued traveller", "route": "LHR-JFK", "nights": 1, "amount": 120}
SAMPLE_UPLOAD_TRIGGER = "trip-uploads"
SAMPLE_UPLOAD_KEY = "requests/Uploaded traveller.json"


def _triggered(stack: Any, store: DynamoDBStateStore, console: Console, timeout_seconds: float) -> list[str]:
    """Start one workflow from a tick of the sample schedule (fired now: a rate of one minute would make the demo
    wait), one from an event put twice on the default bus, one from a message to the sample sqs trigger's queue and
    one from an upload to the sample s3 trigger's bucket, after publishing their definition as its owner would; wait
    for them to end. Returns the problems (none when all ended, one workflow each)."""
    from datetime import UTC, datetime

    from devstack.cli import push_definitions, trigger_sources
    from devstack.events import LocalRule, envelope, put_event

    schedule = stack.scheduler_schedules.get(SAMPLE_SCHEDULE)
    rules = [LocalRule.of(rule) for rule in stack.stack.event_rules()]
    if schedule is None or not rules:
        console.print("triggers.yaml has no sample schedule or event trigger: no triggered workflows in this run")
        return []
    push_definitions(stack.api_url)
    tick = datetime.now(UTC).replace(microsecond=0)
    schedule.fire(tick)
    event = envelope("sasflow.demo", "TripRequested", SAMPLE_EVENT_DETAIL, region=stack.region)
    sqs = boto3.client("sqs")
    matched = [rule.name for _ in range(2) for rule in put_event(sqs, rules, "default", event)]
    expected = {
        ("every-minute-trip", f"tick {tick.strftime('%Y-%m-%dT%H:%M:%SZ')}"),
        ("trip-requested", f"event {event['id']}"),
    }
    sources = trigger_sources(stack)
    queue = sources["trigger_queues"].get(SAMPLE_QUEUE_TRIGGER)
    if queue is not None:
        sent = sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(SAMPLE_MESSAGE))
        expected.add((SAMPLE_QUEUE_TRIGGER, f"message {sent['MessageId']}"))
    watched = sources["trigger_buckets"].get(SAMPLE_UPLOAD_TRIGGER)
    if watched is not None:
        put = boto3.client("s3").put_object(Bucket=watched["bucket"], Key=SAMPLE_UPLOAD_KEY, Body=b"{}")
        upload = f"object {watched['bucket']}/{SAMPLE_UPLOAD_KEY} version {put['VersionId']}"
        expected.add((SAMPLE_UPLOAD_TRIGGER, upload))
    deadline = time.monotonic() + timeout_seconds
    started: list[Any] = []  # the schedule's own ticks may start more while the demo runs: only these count
    while time.monotonic() < deadline:
        started = [
            s.workflow
            for s in store.workflows()
            if s.workflow.trigger is not None and (s.workflow.trigger.name, s.workflow.trigger.occurrence) in expected
        ]
        if len(started) >= len(expected) and all(w.status.value in TERMINAL for w in started):
            break
        time.sleep(0.5)
    for workflow in sorted(started, key=lambda w: w.trigger.name):
        console.print(
            f"started by trigger {workflow.trigger.name} ({workflow.trigger.occurrence}): {workflow.workflow_id} "
            f"{workflow.status.value}",
            highlight=False,
            soft_wrap=True,
        )
    occurrences = {(w.trigger.name, w.trigger.occurrence) for w in started}
    problems = []
    if len(matched) != 2:
        problems.append(f"the event matched {len(matched)} rules over its two puts, not one each: {matched}")
    if occurrences != expected or len(started) != len(expected):
        problems.append(f"the triggers started {sorted(occurrences)}, not one workflow each for {sorted(expected)}")
    elif not all(w.status.value in TERMINAL for w in started):
        problems.append("a triggered workflow did not reach a terminal state")
    return problems


def show_timeline(api_url: str, store: DynamoDBStateStore, console: Console) -> Path | None:
    """Draw the timeline of one compensated workflow of the run (PNG, through the sasflow CLI's functions), print
    where it is and the CLI commands to look further; None when no workflow of the run was compensated."""
    from sasflow_cli.targets import build_client
    from sasflow_cli.timeline import timeline, write_png

    compensated = sorted(
        (s.workflow.created_at, s.workflow.workflow_id)
        for s in store.workflows()
        if s.workflow.status.value == "COMPENSATED"
    )
    if not compensated:
        console.print("no workflow was compensated in this run: no timeline drawn")
        return None
    workflow_id = compensated[0][1]
    client = build_client(url=api_url, stack=None, caller="operator")
    path = write_png(
        timeline(client.history(workflow_id)["events"], client.get(workflow_id)), TIMELINE_DIR / f"{workflow_id}.png"
    )
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    console.print(f"\n[bold]timeline[/] of compensated workflow {workflow_id}: {shown}")
    console.print(
        f"look further with the sasflow CLI, here while the run's stack was up ({api_url}); it stops with the run, "
        "so on the stack of `make up` use the URL it prints:",
        highlight=False,
        soft_wrap=True,
    )
    cli = ".venv/bin/sasflow --url $URL"
    for command in ("get", "history", "timeline"):
        extra = f" --out {TIMELINE_DIR.relative_to(ROOT)}/{workflow_id}.html" if command == "timeline" else ""
        console.print(f"  {cli} {command} {workflow_id}{extra}", highlight=False, soft_wrap=True)
    return path


def _log_to_file(path: Path) -> None:
    """Send the local stack's own logs (pollers, workers) to a file, so the console shows progress and results."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    devstack_logger = logging.getLogger("devstack")
    devstack_logger.addHandler(handler)
    devstack_logger.setLevel(logging.INFO)
    devstack_logger.propagate = False


def terminal_count(store: DynamoDBStateStore) -> int:
    """How many stored workflows are in a terminal state (read through the store, never from raw attributes)."""
    return sum(
        1
        for snapshot in store.workflows()
        if snapshot.workflow.trigger is None and snapshot.workflow.status.value in TERMINAL
    )
