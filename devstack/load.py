"""``make load``: many trip bookings on the local stack under faults, then checks read from the stack's own records.

The run: the sample services on loopback with a transient fault rate on every service, the local stack from
template.yaml, and a driver that starts the workflows over HTTP with at most ``max_in_flight`` of them running at
once (a closed loop, so queues stay shorter than the steps' complete-by budget and the run measures what the stack
sustains). Once a third of them have started, one service goes into an outage (``TravelService.start_outage``).
The run stops by itself at ``time_limit_seconds``.

Afterwards it reads the final state (one scan of the state table), every dead-letter message and the services'
ledgers, and checks:

* every workflow is terminal;
* no token had its side effect applied twice (nor undone twice), and the ledger agrees with the services' counters;
* every dead-letter message is explained by the final state of its workflow (a request or reply for an attempt that
  the workflow has settled or superseded); an unexplained one fails the run;
* every saga's outcome matches the ledgers: a COMPLETED workflow holds one live effect per step, a COMPENSATED or
  CANCELLED one holds none.

It prints the figures (final states, steps, attempts, supervisor resends, circuit-breaker deferrals,
compensations, elapsed time, workflows per second) as a table and as markdown, and `LoadResult.problems` lists
what failed.

``make burst`` (`burst_profile`) runs the same driver without admission control: 500 starts at once, no faults, and
each sample service whose agent declares call limits in agents.yaml (the hotels: 5 in flight, 10 a second) made a
rate-limited service with the same quota, answering 429 to a call beyond it. It checks, from the service's own
count, that no call was over the quota, and from the state table that the limits' deferrals used no attempt (every
step took one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import math
import os
import platform
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from random import Random
from typing import Any

import urllib3
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from devstack.agents import load_agents
from devstack.client import SignedHttp
from devstack.demo import (
    ROOT,
    TERMINAL,
    dead_letter_queues,
    demo_definition,
    sample_services_importable,
)
from devstack.faults import describe_quota
from devstack.template import remote_service_parameters
from sasflow.adapters.dynamodb_store import DynamoDBStateStore

__all__ = [
    "DeadLetter",
    "LedgerFacts",
    "LoadProfile",
    "LoadResult",
    "StepState",
    "WorkflowState",
    "burst_profile",
    "check",
    "explain_dead_letter",
    "read_dead_letters",
    "read_final_state",
    "read_ledgers",
    "render",
    "run_load",
    "saga_mismatches",
    "write_report",
]

DEFAULT_LOG_DIR = ROOT / ".devstack" / "load" / "logs"
IN_FLIGHT = {"PROCESSING", "COMPENSATING"}
COMPENSATION_STATUSES = {"COMPENSATING", "COMPENSATED", "COMPENSATION_FAILED"}
FINAL_STATES = ("COMPLETED", "COMPENSATED", "COMPENSATION_FAILED", "CANCELLED", "RUNNING", "COMPENSATING", "CANCELLING")


@dataclass(frozen=True)
class LoadProfile:
    """What to run and how the local stack is tuned (only through its documented knobs).

    Attributes
    ----------
    workflows
        Trip bookings to start.
    transient_error_rate
        Probability (0..1) that a call to any sample service fails with 503 before any effect.
    latency_ms
        Latency of every sample service call (milliseconds).
    outage_service, outage_seconds
        The service that goes down once the run is under way, and for how long (seconds).
    outage_after_fraction
        The outage starts once this share of the workflows has been started (and the service has served a call).
    step_timeout_seconds
        Complete-by budget of every step and compensation attempt (seconds). Under load a request also waits in
        its queue, so this is larger than the demo's 5 s.
    max_in_flight
        At most this many workflows started and not yet terminal (the driver's admission control).
    start_concurrency
        HTTP clients starting workflows in parallel.
    time_limit_seconds
        Wall-clock limit of the whole run, stack start-up included (seconds); past it the run stops and fails.
    seed
        Seed of the services' fault draws.
    sqs_concurrency, max_workers_per_function, schedule_interval_seconds
        `devstack.stack.LocalStack` knobs: poll threads per SQS mapping, execution environments per function,
        period of the supervisor's schedule (seconds).
    deadline_shards, deadline_grace_seconds, max_clock_skew_seconds
        Template parameters ``DeadlineShards``, ``DeadlineGraceSeconds`` and ``MaxClockSkewSeconds``. One shard:
        sharding spreads writes on DynamoDB, but on moto every index query reads the whole table, so each shard
        costs the sweep a full pass.
    breaker_open_seconds, breaker_probe_seconds
        The agents' circuit breaker (``BREAKER_OPEN_SECONDS``, ``BREAKER_PROBE_SECONDS``; ``make run`` sets them too).
    poll_seconds
        How often the driver reads the running workflows' status (seconds).
    log_dir
        Per-function logs of this run.
    latency_by_service
        Latency of the named services' calls instead of ``latency_ms`` (milliseconds).
    quotas
        Give each sample service whose agent declares call limits in agents.yaml the same limits as its quota
        (``FaultKnobs.quota_in_flight``, ``quota_rate``, ``quota_burst``): a call beyond them is answered 429.
    call_wait_seconds
        The agents' ``CALL_WAIT_SECONDS`` (None: the template's default): how long a record waits for its call
        limits before it is deferred.
    """

    workflows: int = 1000
    transient_error_rate: float = 0.2
    latency_ms: float = 20.0
    outage_service: str = "hotels"
    outage_seconds: float = 30.0
    outage_after_fraction: float = 1 / 3
    step_timeout_seconds: int = 30
    max_in_flight: int = 25
    start_concurrency: int = 2
    time_limit_seconds: float = 1200.0
    seed: int = 7
    sqs_concurrency: int = 2
    max_workers_per_function: int = 2
    schedule_interval_seconds: float = 5.0
    deadline_shards: int = 1
    deadline_grace_seconds: int = 5
    max_clock_skew_seconds: int = 1
    breaker_open_seconds: int = 5
    breaker_probe_seconds: int = 5
    poll_seconds: float = 2.0
    log_dir: Path = DEFAULT_LOG_DIR
    latency_by_service: Mapping[str, float] = field(default_factory=dict)
    quotas: bool = False
    call_wait_seconds: float | None = None

    @property
    def burst(self) -> bool:
        """Whether every workflow may start at once (no admission control) without faults: a burst."""
        return self.max_in_flight >= self.workflows and not self.transient_error_rate and not self.outage_seconds


def burst_profile(workflows: int = 500, **changes: Any) -> LoadProfile:
    """``make burst``: ``workflows`` trip bookings started at once, no faults, the hotels service slow enough (0.4 s
    a call) that both of its agent's limits bind (5 calls at once of 0.4 s are 12.5 a second, over the rate of 10),
    each limited service given its agent's limits as its quota, and steps with time to wait in their queues."""
    profile = LoadProfile(
        workflows=workflows,
        transient_error_rate=0.0,
        latency_ms=20.0,
        outage_seconds=0.0,
        step_timeout_seconds=600,
        max_in_flight=workflows,
        start_concurrency=4,
        time_limit_seconds=1200.0,
        log_dir=ROOT / ".devstack" / "burst" / "logs",
        latency_by_service={"hotels": 400.0},
        quotas=True,
    )
    return dataclasses.replace(profile, **changes)


def service_quotas() -> dict[str, dict[str, Any]]:
    """The quota knobs of each sample service whose agent declares call limits in agents.yaml: the same limits."""
    quotas: dict[str, dict[str, Any]] = {}
    for agent in load_agents():
        limits = agent.call_limits()
        if limits is not None:
            quotas[agent.name] = {
                "quota_in_flight": limits.max_in_flight,
                "quota_rate": limits.rate,
                "quota_burst": None if limits.rate is None else limits.burst_calls,
            }
    return quotas


# ------------------------------------------------------------------------------------------------ final state


@dataclass(frozen=True)
class StepState:
    """A step as the state table holds it at the end of the run."""

    name: str
    status: str
    attempt: int
    comp_attempt: int
    resends: int
    deferrals: int
    limit_deferrals: int = 0


@dataclass
class WorkflowState:
    """A workflow and its steps as the state table holds them at the end of the run (times in epoch seconds)."""

    workflow_id: str
    status: str = "MISSING"
    created_at: int = 0
    updated_at: int = 0
    steps: dict[str, StepState] = field(default_factory=dict)


def read_final_state(dynamodb: Any, table: str) -> dict[str, WorkflowState]:
    """Read every workflow of the state table (one consistent scan, through the store adapter).

    Returns
    -------
    dict
        Workflow id → `WorkflowState`; steps that were never dispatched or sealed are absent.
    """
    store = DynamoDBStateStore(table, dynamodb)
    workflows: dict[str, WorkflowState] = {}
    for snapshot in store.workflows():
        workflow = snapshot.workflow
        workflows[workflow.workflow_id] = WorkflowState(
            workflow.workflow_id,
            status=workflow.status.value,
            created_at=workflow.created_at,
            updated_at=workflow.updated_at,
            steps={
                name: StepState(
                    name=name,
                    status=record.status.value,
                    attempt=record.attempt,
                    comp_attempt=record.comp_attempt,
                    resends=record.resends,
                    deferrals=record.deferrals + record.comp_deferrals,
                    limit_deferrals=record.limit_deferrals,
                )
                for name, record in snapshot.steps.items()
            },
        )
    return workflows


# ------------------------------------------------------------------------------------------------ dead letters


@dataclass(frozen=True)
class DeadLetter:
    """One message found in a dead-letter queue, and how the final state explains it."""

    queue: str
    message_id: str
    receive_count: int
    kind: str
    workflow_id: str
    step: str
    phase: str
    attempt: int
    explained: bool
    reason: str


def explain_dead_letter(queue: str, message: dict[str, Any], workflows: dict[str, WorkflowState]) -> DeadLetter:
    """Explain one dead-letter message from the final state of its workflow.

    A step request or a reply that failed five times is harmless when its workflow is terminal and the attempt it
    names is no longer in flight: the attempt was superseded (a resend, a deferral's new message, the move to
    compensation) or settled (its reply was applied, or the supervisor gave up on it). Anything else, such as a
    message for an unknown workflow, a workflow that is not terminal, or an attempt still in flight, is unexplained.

    Parameters
    ----------
    queue
        Logical id of the dead-letter queue.
    message
        The message as ``ReceiveMessage`` returns it (with ``Attributes``).
    workflows
        The final state (`read_final_state`).
    """
    attributes = message.get("Attributes") or {}
    receive_count = int(attributes.get("ApproximateReceiveCount", 0))
    base: dict[str, Any] = {
        "queue": queue,
        "message_id": message.get("MessageId", ""),
        "receive_count": receive_count,
        "kind": "?",
        "workflow_id": "",
        "step": "",
        "phase": "",
        "attempt": 0,
    }
    try:
        body = json.loads(message.get("Body") or "")
        kind = body["kind"]
        base.update(
            kind=kind,
            workflow_id=str(body["workflow_id"]),
            step=str(body["step"]),
            phase=str(body["phase"]),
            attempt=int(body["attempt"]),
        )
    except (ValueError, KeyError, TypeError):
        return DeadLetter(**base, explained=False, reason="not a step request or reply")
    if kind not in ("step.request", "step.reply"):
        return DeadLetter(**base, explained=False, reason=f"unexpected message kind {kind!r}")
    what = "request" if kind == "step.request" else "reply"
    workflow = workflows.get(base["workflow_id"])
    if workflow is None or workflow.status == "MISSING":
        return DeadLetter(**base, explained=False, reason=f"{what} for an unknown workflow")
    if workflow.status not in TERMINAL:
        return DeadLetter(**base, explained=False, reason=f"{what} for a workflow still {workflow.status}")
    step = workflow.steps.get(base["step"])
    if step is None:
        return DeadLetter(**base, explained=False, reason=f"{what} for a step the workflow never dispatched")
    attempt = base["attempt"]
    where = f"workflow {workflow.status}"
    if base["phase"] == "action":
        if step.status in COMPENSATION_STATUSES:
            return DeadLetter(
                **base, explained=True, reason=f"stale {what}: the step went on to compensation ({where})"
            )
        current = step.attempt
    else:
        if step.status not in COMPENSATION_STATUSES:
            return DeadLetter(**base, explained=False, reason=f"compensation {what} for a step never compensated")
        current = step.comp_attempt
    if current > attempt:
        reason = f"stale {what}: attempt {attempt} superseded by attempt {current} ({where})"
        return DeadLetter(**base, explained=True, reason=reason)
    if current == attempt and step.status not in IN_FLIGHT:
        reason = f"stale {what}: attempt {attempt} already settled {step.status} ({where})"
        return DeadLetter(**base, explained=True, reason=reason)
    reason = f"{what} for attempt {attempt}, but the step is {step.status} at attempt {current} ({where})"
    return DeadLetter(**base, explained=False, reason=reason)


def read_dead_letters(sqs: Any, physical: dict[str, str], workflows: dict[str, WorkflowState]) -> list[DeadLetter]:
    """Receive every message of every dead-letter queue (without deleting it) and explain each one.

    Each message is received once: the visibility timeout outlasts the read. The loop is bounded by the queue's
    message count plus a few empty receives.
    """
    letters: list[DeadLetter] = []
    for logical_id in dead_letter_queues(physical):
        url = physical[logical_id]
        expected = int(
            sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"][
                "ApproximateNumberOfMessages"
            ]
        )
        seen: set[str] = set()
        empty = 0
        for _ in range(expected + 5):
            messages = sqs.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=0,
                VisibilityTimeout=600,
                MessageSystemAttributeNames=["All"],
            ).get("Messages", [])
            if not messages:
                empty += 1
                if len(seen) >= expected or empty >= 3:
                    break
                continue
            for message in messages:
                if message["MessageId"] not in seen:
                    seen.add(message["MessageId"])
                    letters.append(explain_dead_letter(logical_id, message, workflows))
    return letters


# ------------------------------------------------------------------------------------------------ ledgers


@dataclass
class LedgerFacts:
    """What the services' ledgers and counters say (over all three services)."""

    calls: Counter[str] = field(default_factory=Counter)
    effects: int = 0
    duplicate_effects: int = 0
    undos: int = 0
    duplicate_undos: int = 0
    tombstones: int = 0
    disagreements: list[str] = field(default_factory=list)
    # (workflow id, step) -> whether the forward effect is still live (applied and not undone)
    live: dict[tuple[str, str], bool] = field(default_factory=dict)


def read_ledgers(services: dict[str, Any], ledgers: dict[str, Any]) -> LedgerFacts:
    """Read every service's ledger records and counters, and cross-check them.

    A ledger is put-if-absent by token, so it holds at most one effect per token; the services also count each
    application (``TravelService.effects``), which would show a second application. Both must agree.
    """
    facts = LedgerFacts()
    for name, service in services.items():
        stats = service.stats()["by_outcome"]
        facts.calls.update({outcome: n for outcome, n in stats.items() if n})
        counted = service.effects()
        undone = service.compensations()
        facts.duplicate_effects += sum(1 for n in counted.values() if n > 1)
        facts.duplicate_undos += sum(1 for n in undone.values() if n > 1)
        effect_tokens: dict[str, tuple[str, str]] = {}
        undo_tokens: set[str] = set()
        for key, record in ledgers[name].records():
            if record.kind == "response" and record.effect:
                effect_tokens[record.token] = (record.workflow_id, record.step)
            elif record.kind == "undo" and record.original_token is not None:
                undo_tokens.add(record.original_token)
            elif record.kind == "tombstone":
                facts.tombstones += 1
            if record.kind == "undo" and not key.startswith(f"{name}#undo#"):
                facts.disagreements.append(f"{name}: undo record under {key}")
        facts.effects += len(effect_tokens)
        facts.undos += len(undo_tokens)
        if set(effect_tokens) != set(counted):
            facts.disagreements.append(
                f"{name}: {len(effect_tokens)} effect records in the ledger, {len(counted)} tokens counted as applied"
            )
        if undo_tokens != set(undone):
            facts.disagreements.append(
                f"{name}: {len(undo_tokens)} undo records in the ledger, {len(undone)} tokens counted as undone"
            )
        stray = undo_tokens - set(effect_tokens)
        if stray:
            facts.disagreements.append(f"{name}: {len(stray)} undo records without an effect")
        for token, identity in effect_tokens.items():
            facts.live[identity] = token not in undo_tokens
    return facts


def saga_mismatches(workflows: dict[str, WorkflowState], facts: LedgerFacts) -> list[str]:
    """Compare each saga's final state with the effects the ledgers hold (the Compensating Transaction guarantee).

    A COMPLETED workflow holds one live effect per step; a COMPENSATED or CANCELLED one holds no live effect;
    COMPENSATION_FAILED may leave some (it waits for a person). An effect of an unknown workflow is a mismatch.
    """
    problems: list[str] = []
    for workflow in workflows.values():
        live = [step for step in workflow.steps if facts.live.get((workflow.workflow_id, step))]
        if workflow.status == "COMPLETED" and len(live) != len(workflow.steps):
            missing = sorted(set(workflow.steps) - set(live))
            problems.append(f"{workflow.workflow_id} COMPLETED but no live effect for {missing}")
        elif workflow.status in ("COMPENSATED", "CANCELLED") and live:
            problems.append(f"{workflow.workflow_id} {workflow.status} but effects still live for {sorted(live)}")
    known = set(workflows)
    for workflow_id, step in facts.live:
        if workflow_id not in known:
            problems.append(f"effect for unknown workflow {workflow_id} step {step}")
    return problems


# ------------------------------------------------------------------------------------------------ the run


@dataclass
class LoadResult:
    """The outcome of a run: the figures, the dead letters, and the failed checks (empty when all passed)."""

    profile: LoadProfile
    workflow_ids: list[str] = field(default_factory=list)
    workflows: dict[str, WorkflowState] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    ledger: LedgerFacts = field(default_factory=LedgerFacts)
    saga_mismatches: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    start_failures: int = 0
    start_retries: int = 0
    start_repeats: int = 0
    progress: list[tuple[float, int]] = field(default_factory=list)
    moto_errors: int = 0
    load_average: tuple[float, float] = (0.0, 0.0)
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    gc_seconds: float = 0.0
    startup_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    start_seconds: float = 0.0
    outage_at_seconds: float | None = None
    timed_out: bool = False
    poller_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    queues_left: dict[str, int] = field(default_factory=dict)
    #: What the figures are made from, as read at the end: each service's ledger records (``LedgerRecord``, in
    #: the order written) and call counts (``TravelService.stats``), by service name.
    ledger_records: dict[str, list[Any]] = field(default_factory=dict)
    service_stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The quotas of the limited services (``LoadProfile.quotas``): service name -> its ``quota_*`` knobs.
    quotas: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 when every check passed, else 1."""
        return 1 if self.problems else 0

    @property
    def final_states(self) -> Counter[str]:
        """Workflows started by this run, by final state (``MISSING`` when the table has no such workflow)."""
        return Counter(self._state(workflow_id).status for workflow_id in self.workflow_ids)

    def _state(self, workflow_id: str) -> WorkflowState:
        return self.workflows.get(workflow_id) or WorkflowState(workflow_id)

    @property
    def terminal(self) -> int:
        """Workflows started by this run that are terminal."""
        return sum(n for status, n in self.final_states.items() if status in TERMINAL)

    def steps(self) -> list[StepState]:
        """The steps of the workflows this run started, as the state table holds them at the end."""
        return [step for workflow_id in self.workflow_ids for step in self._state(workflow_id).steps.values()]

    def figures(self) -> list[tuple[str, str]]:
        """The measures, in order, as (measure, value) text pairs."""
        profile = self.profile
        steps = self.steps()
        total = len(self.workflow_ids) + self.start_failures
        states = self.final_states
        durations = sorted(
            max(0, state.updated_at - state.created_at)
            for state in (self._state(w) for w in self.workflow_ids)
            if state.status in TERMINAL
        )
        rows: list[tuple[str, str]] = [
            ("workflows started", f"{len(self.workflow_ids)} / {profile.workflows}"),
            ("workflows terminal", f"{self.terminal} / {total} ({100.0 * self.terminal / max(1, total):.1f} %)"),
        ]
        rows += [(f"final state {status}", str(states[status])) for status in FINAL_STATES if states.get(status)]
        if states.get("MISSING"):
            rows.append(("final state MISSING (not in the table)", str(states["MISSING"])))
        dead_by_queue = Counter(letter.queue for letter in self.dead_letters)
        rows += [
            ("steps dispatched", str(sum(1 for step in steps if step.attempt > 0))),
            ("steps skipped (never started: the workflow unwound first)", str(sum(1 for s in steps if not s.attempt))),
            ("step attempts (forward dispatches)", str(sum(step.attempt for step in steps))),
            ("supervisor resends", str(sum(step.resends for step in steps))),
            ("circuit-breaker deferrals", str(sum(step.deferrals for step in steps))),
            ("call-limit deferrals (sent again, no attempt used)", str(sum(s.limit_deferrals for s in steps))),
            ("steps that took more than one attempt", str(sum(1 for step in steps if step.attempt > 1))),
            ("compensations (steps compensated)", str(sum(1 for step in steps if step.comp_attempt > 0))),
            ("compensation attempts", str(sum(step.comp_attempt for step in steps))),
            ("remote calls", str(sum(self.ledger.calls.values()))),
            ("remote calls answered 503 (transient fault)", str(self.ledger.calls.get("transient", 0))),
            ("remote calls answered 503 (outage)", str(self.ledger.calls.get("outage", 0))),
            ("remote calls replayed from the ledger (same token again)", str(self.ledger.calls.get("replayed", 0))),
            ("side effects applied", str(self.ledger.effects)),
            ("side effects undone (compensations applied remotely)", str(self.ledger.undos)),
            ("duplicate side effects (token applied twice)", str(self.ledger.duplicate_effects)),
        ]
        for name, quota in self.quotas.items():
            stats = self.service_stats.get(name, {})
            rows += [
                (f"{name}: its quota", describe_quota(quota)),
                (f"{name}: calls at once, at most (its own count)", str(stats.get("in_flight_peak", 0))),
                (f"{name}: calls in its busiest second{_second_bound(quota)}", str(stats.get("busiest_second", 0))),
                (f"{name}: calls over its quota (answered 429)", str(_throttled(stats))),
            ]
        rows.append(("dead-letter messages", str(len(self.dead_letters))))
        rows += [(f"dead-letter messages in {queue}", str(n)) for queue, n in sorted(dead_by_queue.items())]
        unexplained = sum(1 for letter in self.dead_letters if not letter.explained)
        rows += [
            ("dead-letter messages unexplained", str(unexplained)),
            ("saga outcome ≠ ledgers", str(len(self.saga_mismatches))),
            ("start requests retried", str(self.start_retries)),
            ("start requests answered by an existing workflow (200)", str(self.start_repeats)),
            ("moto server errors (HTTP 500, retried by the SDK)", str(self.moto_errors)),
            ("stack start-up", f"{self.startup_seconds:.1f} s"),
            ("elapsed (first start → last terminal)", f"{self.elapsed_seconds:.1f} s"),
            ("workflows / second", f"{self.terminal / self.elapsed_seconds:.2f}" if self.elapsed_seconds else "-"),
        ]
        if durations:
            p95 = durations[min(len(durations) - 1, math.ceil(0.95 * len(durations)) - 1)]
            rows.append(
                (
                    "workflow duration p50 / p95 / max",
                    f"{statistics.median(durations):.0f} / {p95} / {durations[-1]} s",
                )
            )
        per_minute = self.per_minute()
        if per_minute:
            rows.append(("workflows ended per minute", ", ".join(str(n) for n in per_minute)))
        if self.cpu_seconds:
            busy = ", ".join(f"{name} {seconds:.0f}" for name, seconds in self.cpu_seconds.items())
            rows.append(("CPU seconds by process", busy))
            rows.append(("garbage-collector pauses in the local stack process", f"{self.gc_seconds:.0f} s"))
        rows.append(("machine load average (start / end, 1 min)", "{:.1f} / {:.1f}".format(*self.load_average)))
        return rows

    def per_minute(self) -> list[int]:
        """Workflows that became terminal in each whole minute of the run (from the driver's polls)."""
        counts: list[int] = []
        previous = 0
        for minute in range(1, int(self.elapsed_seconds // 60) + 1):
            reached = max((n for t, n in self.progress if t <= minute * 60), default=0)
            counts.append(reached - previous)
            previous = reached
        return counts

    def markdown(self, *, title: str = "") -> str:
        """The figures as a markdown table, headed by what was run, when and where."""
        profile = self.profile
        when = datetime.now(UTC).strftime("%Y-%m-%d")
        cores = os.cpu_count() or 0
        machine = f"{when}, machine: {cores} cores, Python {platform.python_version()}"
        if profile.burst:
            quotas = "; ".join(f"{name} {describe_quota(quota)}" for name, quota in self.quotas.items())
            default = (
                f"`make burst`, {machine}: {profile.workflows} trip bookings started at once, no faults, "
                f"the services' quotas: {quotas or 'none'}"
            )
        else:
            default = (
                f"`make load`, {machine}: {profile.workflows} trip bookings, transient error rate "
                f"{profile.transient_error_rate:.0%} on every service, {profile.outage_seconds:.0f}-second outage of "
                f"{profile.outage_service}, at most {profile.max_in_flight} workflows in flight"
            )
        header = title or default
        lines = [header, "", "| measure | value |", "|---|---:|"]
        lines += [f"| {name} | {value} |" for name, value in self.figures()]
        return "\n".join(lines)


def run_load(profile: LoadProfile | None = None, *, console: Console | None = None) -> LoadResult:
    """Run the load on a fresh local stack and check the outcome.

    Parameters
    ----------
    profile
        What to run (default: `LoadProfile()`: 1,000 workflows, 20 % transient errors, a 30 s hotels outage).
    console
        Where progress and tables go.

    Returns
    -------
    LoadResult
        ``problems`` is empty when every check passed.
    """
    from devstack.stack import LocalStack

    sample_services_importable()
    from http_server import serve
    from travel_services import SERVICES, FaultKnobs, InMemoryLedger, SystemClock, TravelService

    profile = profile or LoadProfile()
    console = console or Console()
    result = LoadResult(profile)
    result.load_average = (_load_average(), 0.0)
    begun = time.monotonic()
    deadline = begun + profile.time_limit_seconds
    result.quotas = service_quotas() if profile.quotas else {}
    knobs = {
        name: FaultKnobs(
            latency_ms=profile.latency_by_service.get(name, profile.latency_ms),
            transient_error_rate=profile.transient_error_rate,
            **result.quotas.get(name, {}),
        )
        for name in SERVICES
    }
    clock = SystemClock()
    ledgers = {name: InMemoryLedger() for name in SERVICES}
    services = {
        name: TravelService(name, ledgers[name], knobs[name], Random(f"{profile.seed}:{name}"), clock)
        for name in SERVICES
    }
    servers: dict[str, Any] = {}
    try:
        for name, service in services.items():
            servers[name] = serve(service)
        parameters = {
            **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
            "DeadlineShards": str(profile.deadline_shards),
            "DeadlineGraceSeconds": str(profile.deadline_grace_seconds),
            "MaxClockSkewSeconds": str(profile.max_clock_skew_seconds),
            "LogLevel": "WARN",
        }
        extra_env = {
            "BREAKER_OPEN_SECONDS": str(profile.breaker_open_seconds),
            "BREAKER_PROBE_SECONDS": str(profile.breaker_probe_seconds),
        }
        if profile.call_wait_seconds is not None:
            extra_env["CALL_WAIT_SECONDS"] = str(profile.call_wait_seconds)
        if profile.burst:
            limited = "; ".join(f"{name} {describe_quota(quota)}" for name, quota in result.quotas.items())
            wait = "" if profile.call_wait_seconds is None else f"; CALL_WAIT_SECONDS {profile.call_wait_seconds:g}"
            console.print(
                f"[bold]Burst:[/] {profile.workflows} trip bookings started at once, no faults; the services' "
                f"quotas: {limited or 'none'}{wait}; limit {profile.time_limit_seconds:.0f} s",
                overflow="fold",
            )
        else:
            console.print(
                f"[bold]Load:[/] {profile.workflows} trip bookings, {profile.transient_error_rate:.0%} transient "
                f"errors on every service, a {profile.outage_seconds:g} s outage of {profile.outage_service}; "
                f"limit {profile.time_limit_seconds:.0f} s"
            )
        with _stack_logs(profile.log_dir) as stack_log:
            stack = LocalStack(
                parameters=parameters,
                schedule_interval_seconds=profile.schedule_interval_seconds,
                sqs_concurrency=profile.sqs_concurrency,
                max_workers_per_function=profile.max_workers_per_function,
                extra_env=extra_env,
                log_dir=profile.log_dir,
            )
            cpu_before = time.process_time()
            with stack, _gc_pauses() as gc_pauses:
                result.startup_seconds = time.monotonic() - begun
                console.print(f"stack up in {result.startup_seconds:.1f} s; API {stack.api_url}")
                _Driver(profile, stack, services, result, console, deadline).run()
                result.cpu_seconds["local stack (moto, emulators, services)"] = time.process_time() - cpu_before
                result.gc_seconds = gc_pauses[0]
                for logical_id, pool in stack.pools.items():
                    result.cpu_seconds[logical_id] = sum(_cpu_seconds(pid) for pid in pool.worker_pids())
                _collect(stack, services, ledgers, result)
            result.moto_errors = stack_log.error_count
    finally:
        for server in servers.values():
            server.stop()
    result.load_average = (result.load_average[0], _load_average())
    check(result)
    return result


def _load_average() -> float:
    with contextlib.suppress(OSError, AttributeError):
        return os.getloadavg()[0]
    return 0.0


class _CountingHandler(logging.FileHandler):
    """Writes log records to a file and counts the moto server's errors ("Error on request", logged by werkzeug)."""

    error_count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "werkzeug" and record.levelno >= logging.ERROR:
            self.error_count += 1
        super().emit(record)


@contextlib.contextmanager
def _stack_logs(log_dir: Path) -> Iterator[_CountingHandler]:
    """Send the local stack's log records (pollers, workers, moto's server errors) to ``log_dir/devstack.log``.

    The moto server logs an unhandled exception of a request through werkzeug (and answers 500, which the SDK
    retries); those records go to the file too, not to the console, and the handler counts them.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    for old in log_dir.glob("*.log"):  # the logs of the previous run; workers append to theirs
        old.unlink()
    handler = _CountingHandler(log_dir / "devstack.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = []
    for name, level in (("devstack", logging.INFO), ("werkzeug", logging.WARNING)):
        named = logging.getLogger(name)
        saved.append((named, named.level, named.propagate))
        named.addHandler(handler)
        named.setLevel(level)
        named.propagate = False
    try:
        yield handler
    finally:
        for named, level, propagate in saved:
            named.removeHandler(handler)
            named.setLevel(level)
            named.propagate = propagate
        handler.close()


@contextlib.contextmanager
def _gc_pauses() -> Iterator[list[float]]:
    """Add up the time this process spends in the garbage collector (seconds) while the block runs.

    The moto server makes much cyclic garbage (each TransactWriteItems deep-copies the table), so the collector's
    pauses, which stop every thread of the local stack process, are part of where the time goes.
    """
    total = [0.0]
    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif started[0]:
            total[0] += time.perf_counter() - started[0]
            started[0] = 0.0

    gc.callbacks.append(callback)
    try:
        yield total
    finally:
        gc.callbacks.remove(callback)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (seconds), from /proc (Linux); 0 where it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class _Driver:
    """Starts the workflows over HTTP with admission control, starts the outage, waits until all are terminal.

    Progress is read with BatchGetItem on the workflow items of the workflows not yet seen terminal: its cost
    does not grow with the table, unlike a Scan or a Query on moto, which read every item of the table.
    """

    def __init__(
        self,
        profile: LoadProfile,
        stack: Any,
        services: dict[str, Any],
        result: LoadResult,
        console: Console,
        deadline: float,
    ) -> None:
        self.profile = profile
        self.stack = stack
        self.services = services
        self.result = result
        self.console = console
        self.deadline = deadline
        self.definition = demo_definition(timeout_seconds=profile.step_timeout_seconds)
        self.http = SignedHttp(
            stack.api_url, pool=urllib3.PoolManager(maxsize=profile.start_concurrency, retries=False)
        )
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.next_index = 0
        self.started = 0
        self.terminal = 0
        self.running: set[str] = set()
        self.ids: dict[int, str] = {}
        self.failures: list[str] = []

    def run(self) -> None:
        profile = self.profile
        dynamodb = self.stack.client("dynamodb")
        table = self.stack.physical_ids["StateTable"]
        outage_after = max(1, math.ceil(profile.workflows * profile.outage_after_fraction))
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        first_start = time.monotonic()
        starters = [
            threading.Thread(target=self._starter, name=f"load-starter-{n}", daemon=True)
            for n in range(profile.start_concurrency)
        ]
        with Progress(*columns, console=self.console, transient=False) as progress:
            starting = progress.add_task("workflows started over HTTP", total=profile.workflows)
            finishing = progress.add_task("workflows terminal", total=profile.workflows)
            for thread in starters:
                thread.start()
            while True:
                now = time.monotonic()
                if now >= self.deadline:
                    self.result.timed_out = True
                    break
                with self.lock:
                    started = self.started
                # The outage starts once the run is under way: a share of the workflows started, and the service
                # already serving their steps (so the outage meets traffic even in a small run).
                if (
                    self.result.outage_at_seconds is None
                    and profile.outage_seconds > 0
                    and started >= outage_after
                    and self.services[profile.outage_service].stats()["calls"] > 0
                ):
                    self.services[profile.outage_service].start_outage(profile.outage_seconds)
                    self.result.outage_at_seconds = now - first_start
                    progress.console.print(
                        f"{profile.outage_service} outage of {profile.outage_seconds:g} s starts at "
                        f"{self.result.outage_at_seconds:.0f} s ({started} workflows started)"
                    )
                starting_done = not any(thread.is_alive() for thread in starters)
                if starting_done and not self.result.start_seconds:
                    self.result.start_seconds = now - first_start
                self._poll(dynamodb, table)
                with self.lock:
                    self.result.progress.append((time.monotonic() - first_start, self.terminal))
                    progress.update(starting, completed=self.started)
                    progress.update(finishing, completed=self.terminal)
                    if starting_done and not self.running:
                        break
                self.stop.wait(max(0.0, min(profile.poll_seconds, self.deadline - time.monotonic())))
            self.result.elapsed_seconds = time.monotonic() - first_start
            self.stop.set()
            for thread in starters:
                thread.join(35.0)
        with self.lock:
            self.result.workflow_ids = [self.ids[index] for index in sorted(self.ids)]
            self.result.start_failures = len(self.failures)
        for failure in self.failures[:10]:
            self.console.print(f"[red]start failed:[/] {failure}")
        if self.result.timed_out:
            self.console.print(f"[red]time limit of {profile.time_limit_seconds:.0f} s reached; stopping the run")

    def _poll(self, dynamodb: Any, table: str) -> None:
        """Count the running workflows that have become terminal (BatchGetItem, 100 keys per request)."""
        with self.lock:
            running = sorted(self.running)
        ended: list[str] = []
        for chunk in range(0, len(running), 100):
            keys = [
                {"pk": {"S": f"WF#{workflow_id}"}, "sk": {"S": "#WF"}} for workflow_id in running[chunk : chunk + 100]
            ]
            request: dict[str, Any] = {table: {"Keys": keys, "ConsistentRead": True, "ProjectionExpression": "pk, #s"}}
            request[table]["ExpressionAttributeNames"] = {"#s": "status"}
            for _ in range(5):  # UnprocessedKeys are retried a few times; the rest waits for the next poll
                response = dynamodb.batch_get_item(RequestItems=request)
                ended += [
                    item["pk"]["S"].removeprefix("WF#")
                    for item in response["Responses"].get(table, [])
                    if item["status"]["S"] in TERMINAL
                ]
                request = response.get("UnprocessedKeys") or {}
                if not request:
                    break
        with self.lock:
            for workflow_id in ended:
                if workflow_id in self.running:
                    self.running.discard(workflow_id)
                    self.terminal += 1

    def _starter(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                if self.next_index >= self.profile.workflows:
                    return
                index = self.next_index
                self.next_index += 1
            # Admission control: wait while max_in_flight workflows are started and not yet terminal.
            while not self.stop.is_set():
                with self.lock:
                    if len(self.running) < self.profile.max_in_flight:
                        break
                self.stop.wait(0.1)
            if self.stop.is_set():
                return
            workflow_id = self._start(index)
            with self.lock:
                if workflow_id is not None:
                    self.ids[index] = workflow_id
                    self.running.add(workflow_id)
                    self.started += 1

    def _start(self, index: int) -> str | None:
        """POST one workflow; after a 5xx or a connection error, POST it again with the same Idempotency-Key.

        A start that did happen is then answered 200 with the existing workflow (counted as a repeat), one that did
        not is made now: the product's own idempotency, exercised under load.
        """
        key = f"load-{self.profile.seed}-{index}"
        body = json.dumps(
            {
                "definition": self.definition,
                "input": {
                    "traveller": f"traveller-{index:04d}",
                    "route": "LHR-JFK",
                    "nights": 1 + index % 5,
                    "amount": 100 + index,
                },
            }
        ).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": key}
        error = ""
        for attempt in range(8):
            if self.stop.is_set():
                break
            try:
                response = self.http.request("POST", "/workflows", body=body, headers=headers, timeout=60.0)
            except urllib3.exceptions.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            else:
                if response.status in (200, 201):
                    if response.status == 200:  # an earlier try had started it
                        with self.lock:
                            self.result.start_repeats += 1
                    return str(json.loads(response.data)["workflow_id"])
                error = f"HTTP {response.status}: {response.data[:200]!r}"
                if response.status < 500 and response.status != 429:
                    break
            with self.lock:
                self.result.start_retries += 1
            self.stop.wait(min(10.0, 3.0 * 2**attempt))
        with self.lock:
            self.failures.append(f"workflow {index}: {error}")
        return None


def _collect(stack: Any, services: dict[str, Any], ledgers: dict[str, Any], result: LoadResult) -> None:
    """Read the final state, the dead letters, the ledgers, the pollers' counters and what is left in the queues."""
    for poller in stack.pollers:
        stats = poller.stats
        result.poller_stats[poller.name] = {
            "invocations": stats.invocations,
            "failed_invocations": stats.failed_invocations,
            "kept": stats.kept,
        }
    result.workflows = read_final_state(stack.client("dynamodb"), stack.physical_ids["StateTable"])
    sqs = stack.client("sqs")
    result.dead_letters = read_dead_letters(sqs, stack.physical_ids, result.workflows)
    for logical_id in ("ResponseQueue", "FlightsRequestQueue", "HotelsRequestQueue", "PaymentsRequestQueue"):
        attributes = sqs.get_queue_attributes(
            QueueUrl=stack.physical_ids[logical_id],
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ],
        )["Attributes"]
        result.queues_left[logical_id] = sum(int(value) for value in attributes.values())
    result.ledger = read_ledgers(services, ledgers)
    result.ledger_records = {name: service.history() for name, service in services.items()}
    result.service_stats = {name: service.stats() for name, service in services.items()}
    ours = {
        workflow_id: result.workflows.get(workflow_id) or WorkflowState(workflow_id)
        for workflow_id in result.workflow_ids
    }
    result.saga_mismatches = saga_mismatches(ours, result.ledger)


def check(result: LoadResult) -> None:
    """Fill ``result.problems`` with every check that failed."""
    problems = result.problems
    total = result.profile.workflows
    if result.timed_out:
        problems.append(f"the run hit its time limit of {result.profile.time_limit_seconds:.0f} s")
    if result.start_failures or len(result.workflow_ids) != total:
        problems.append(f"{total - len(result.workflow_ids)} of {total} workflow(s) could not be started")
    not_terminal = len(result.workflow_ids) - result.terminal
    if not_terminal:
        states = {s: n for s, n in result.final_states.items() if s not in TERMINAL}
        problems.append(f"{not_terminal} workflow(s) did not reach a terminal state: {states}")
    if result.ledger.duplicate_effects:
        problems.append(f"{result.ledger.duplicate_effects} token(s) had their side effect applied twice")
    if result.ledger.duplicate_undos:
        problems.append(f"{result.ledger.duplicate_undos} effect(s) were undone twice")
    problems.extend(f"ledger: {text}" for text in result.ledger.disagreements)
    unexplained = [letter for letter in result.dead_letters if not letter.explained]
    if unexplained:
        problems.append(f"{len(unexplained)} dead-letter message(s) unexplained")
    if result.saga_mismatches:
        problems.append(f"{len(result.saga_mismatches)} saga(s) whose final state does not match the ledgers")
    for name, quota in result.quotas.items():
        stats = result.service_stats.get(name, {})
        if _throttled(stats):
            problems.append(f"{name} answered {_throttled(stats)} call(s) over its quota ({describe_quota(quota)}) 429")
        if quota.get("quota_in_flight") is not None and stats.get("in_flight_peak", 0) > quota["quota_in_flight"]:
            problems.append(f"{name} served {stats['in_flight_peak']} calls at once, over {quota['quota_in_flight']}")
    if result.profile.burst:
        retried = sum(1 for step in result.steps() if step.attempt > 1)
        if retried:
            problems.append(f"{retried} step(s) took more than one attempt in a burst without faults")


def _second_bound(quota: Mapping[str, Any]) -> str:
    """`` (its bucket allows 10 + 10)``: what a token bucket lets through in one second, a full burst and a second's
    tokens."""
    if quota.get("quota_rate") is None:
        return ""
    return f" (its bucket allows {quota['quota_burst']} + {quota['quota_rate']:g})"


def _throttled(stats: Mapping[str, Any]) -> int:
    return int(stats.get("by_outcome", {}).get("throttled", 0))


def render(result: LoadResult, console: Console, *, title: str = "Load run") -> None:
    """Print the figures, the dead letters with their explanation, the problems, and the markdown table."""
    table = Table(title=f"{title} (read from DynamoDB, the dead-letter queues and the services' ledgers)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in result.figures():
        table.add_row(name, value)
    console.print(table)
    if result.dead_letters:
        reasons = Counter((letter.queue, letter.explained, letter.reason) for letter in result.dead_letters)
        letters = Table(title="Dead-letter messages, explained from the final state of their workflow")
        letters.add_column("queue")
        letters.add_column("messages", justify="right")
        letters.add_column("explained")
        letters.add_column("why")
        for (queue, explained, reason), count in sorted(reasons.items()):
            letters.add_row(queue, str(count), "yes" if explained else "[red]NO[/]", reason)
        console.print(letters)
    failed_pollers = {name: s for name, s in result.poller_stats.items() if s["failed_invocations"] or s["kept"]}
    if failed_pollers:
        console.print(
            "records kept for redelivery (batch-item failures or failed invocations): "
            + ", ".join(f"{name} {s['kept']}" for name, s in failed_pollers.items())
        )
    left = {name: n for name, n in result.queues_left.items() if n}
    if left:
        console.print("messages still in the queues at the end (delayed or in flight): " + json.dumps(left))
    for mismatch in result.saga_mismatches[:10]:
        console.print(f"[red]saga mismatch:[/] {mismatch}")
    for problem in result.problems:
        console.print(f"[red]FAILED: {problem}")
    if not result.problems:
        console.print(
            f"[green]OK[/]: {result.terminal} workflows terminal, 0 duplicate side effects, "
            f"{len(result.dead_letters)} dead letter(s), all explained; sagas match the ledgers."
        )
        if result.profile.burst:
            steps = result.steps()
            for name, quota in result.quotas.items():
                stats = result.service_stats.get(name, {})
                peak, busiest = stats.get("in_flight_peak", 0), stats.get("busiest_second", 0)
                console.print(
                    f"[green]OK[/]: {name} ({describe_quota(quota)}) was called at most {peak} at once and {busiest} "
                    "in a second, 0 calls answered 429, by its own count"
                )
            console.print(
                f"[green]OK[/]: every one of {len(steps)} steps took one attempt; "
                f"{sum(step.limit_deferrals for step in steps)} dispatches waited for the call limits"
            )
    console.print()
    console.print(result.markdown(), markup=False, highlight=False, soft_wrap=True)


def write_report(result: LoadResult, path: Path) -> None:
    """Write the markdown table to ``path`` (for docs/bench.md, Reliability)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(result.markdown() + "\n")
