"""An in-memory pipeline: scheduler, three agents and the supervisor, wired with fakes and an injected clock.

Messages go through a timed bus that honours SQS DelaySeconds against the injected clock. Tests deliver queues
explicitly (``run_agent``, ``run_scheduler``, ``pump``), can lose or duplicate messages, and move time with the
clock; nothing sleeps.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function

from sasflow.adapters.memory import (
    InMemoryPayloadStore,
    InMemoryStateStore,
    InMemoryTenantSlotStore,
    InMemoryTriggerStore,
)
from sasflow.agent import AgentRuntime
from sasflow.breaker import CircuitBreaker
from sasflow.call_limits import CallLimiter
from sasflow.claim_check import DEFAULT_MAX_PAYLOAD_BYTES, ClaimCheck
from sasflow.clock import Clock, ManualClock
from sasflow.definition import parse_definition
from sasflow.messages import StepReply, StepRequest, canonical_hash, decode_reply, decode_request, encode
from sasflow.ports import Outgoing, Receipt
from sasflow.records import Snapshot
from sasflow.registry import DefinitionRegistry
from sasflow.scheduler import SchedulerService
from sasflow.settings import AgentConfig, AgentRoute, EngineConfig
from sasflow.states import TERMINAL_WORKFLOW
from sasflow.supervisor import SupervisorService, SweepReport
from sasflow.triggers import TriggerConfig, TriggerService
from tests.support.fakes import FakeRemoteService, InMemoryBreakerStore, InMemoryPersistenceLayer

AGENTS = ("flights", "hotels", "payments")
#: The actions each sample agent accepts (agents.yaml).
ACTIONS = {
    "flights": ("reserve", "cancel_reservation"),
    "hotels": ("book", "cancel_booking", "upgrade_room", "cancel_upgrade"),
    "payments": ("charge", "refund"),
}
#: The principal the pipeline's workflows belong to, and the key of their ids.
OWNER = "arn:aws:iam::123456789012:user/tests"
ID_SECRET = b"pipeline-workflow-id-key"


class FakeLambdaContext:
    """The parts of a Lambda context the agents use; ``remaining_ms`` is fixed unless a test changes it."""

    function_name = "test-agent"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:test-agent"
    aws_request_id = "00000000-0000-0000-0000-000000000000"

    def __init__(self, remaining_ms: int = 60_000) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


REPLIES = "queue/replies"


def trip_definition(**step_overrides: dict[str, Any]) -> dict[str, Any]:
    """The sample saga: reserve a flight, book a hotel, charge the card; each with its compensation."""
    steps: list[dict[str, Any]] = [
        {
            "name": "reserve_flight",
            "agent": "flights",
            "action": "reserve",
            "input": {"traveller.$": "input.traveller", "route.$": "input.route"},
            "timeout_seconds": 30,
            "compensation": {"action": "cancel_reservation", "input": {"confirmation.$": "step.output.confirmation"}},
        },
        {
            "name": "book_hotel",
            "agent": "hotels",
            "action": "book",
            "input": {"traveller.$": "input.traveller", "flight.$": "steps.reserve_flight.output.confirmation"},
            "timeout_seconds": 30,
            "compensation": {"action": "cancel_booking"},
        },
        {
            "name": "charge_card",
            "agent": "payments",
            "action": "charge",
            "input": {"amount.$": "input.amount"},
            "timeout_seconds": 30,
            "compensation": {"action": "refund"},
        },
    ]
    for step in steps:
        step.update(step_overrides.get(step["name"], {}))
    return {"name": "trip-booking", "version": 1, "steps": steps}


TRIP_INPUT = {"traveller": "Ada Lovelace", "route": "LHR-JFK", "amount": 420}


@dataclass
class TimedBus:
    """A ``MessageBus`` whose messages become visible after their DelaySeconds on the injected clock."""

    clock: Clock
    queues: dict[str, list[tuple[float, Outgoing]]] = field(default_factory=dict)
    fail_next: int = 0
    sent: int = 0

    def send(self, messages: Sequence[Outgoing]) -> list[int]:
        failed = []
        for index, message in enumerate(messages):
            if self.fail_next > 0:
                self.fail_next -= 1
                failed.append(index)
                continue
            visible_at = self.clock.now() + message.delay_seconds
            self.queues.setdefault(message.queue_url, []).append((visible_at, message))
            self.sent += 1
        return failed

    def make_visible(self, receipts: Sequence[Receipt]) -> int:
        """Nothing received here stays hidden (``receive`` removes what it returns); none fails."""
        return 0

    def receive(self, queue_url: str) -> list[Outgoing]:
        """Remove and return the messages of ``queue_url`` that are visible now."""
        now = self.clock.now()
        queue = self.queues.get(queue_url, [])
        ready = [m for t, m in queue if t <= now]
        self.queues[queue_url] = [(t, m) for t, m in queue if t > now]
        return ready

    def peek(self, queue_url: str) -> list[Outgoing]:
        """Every message of ``queue_url``, visible or delayed, without removing it."""
        return [m for _, m in self.queues.get(queue_url, [])]


class Pipeline:
    """Scheduler + agents + supervisor over in-memory adapters, with fake remote services."""

    def __init__(
        self,
        *,
        clock: ManualClock | None = None,
        grace: int = 30,
        seed: int = 7,
        claim_check_threshold: int | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self.clock = clock or ManualClock()
        self.metrics: Counter[str] = Counter()
        #: The payload bucket in memory and the claim-checks over it (None: no claim-check, as before).
        self.payloads = InMemoryPayloadStore()
        self.claims: ClaimCheck | None = None
        self.agent_claims: ClaimCheck | None = None
        if claim_check_threshold is not None:
            limits = {"threshold_bytes": claim_check_threshold, "max_payload_bytes": max_payload_bytes}
            self.claims = ClaimCheck(self.payloads, metrics=self.count, **limits)
            self.agent_claims = ClaimCheck(self.payloads, metrics=self.count, cache_bytes=0, **limits)
        self.config = EngineConfig(
            agents={agent: AgentRoute(queue_url=f"queue/{agent}", actions=ACTIONS[agent]) for agent in AGENTS},
            response_queue_url=REPLIES,
            deadline_grace_seconds=grace,
            max_clock_skew_seconds=5,
            deadline_shards=4,
        )
        self.store = InMemoryStateStore(shards=self.config.deadline_shards)
        self.bus = TimedBus(self.clock)
        #: The triggers' items: a run that holds its trigger's slot gives it back when it ends.
        self.triggers = InMemoryTriggerStore()
        #: The tenants' items: a start of a definition with tenancy takes a slot, its workflow gives it back at its end.
        self.tenancy = InMemoryTenantSlotStore()
        self.scheduler = SchedulerService(
            self.store,
            self.clock,
            self.config,
            rng=random.Random(seed),
            metrics=self.count,
            id_secret=lambda: ID_SECRET,
            claims=self.claims,
            triggers=self.triggers,
            tenancy=self.tenancy,
        )
        self.supervisor = SupervisorService(
            self.store, self.bus, self.scheduler, self.clock, self.config, metrics=self.count
        )
        self.services = {agent: FakeRemoteService(agent, self.clock) for agent in AGENTS}
        self.breakers = InMemoryBreakerStore()
        self.persistence = {agent: InMemoryPersistenceLayer() for agent in AGENTS}
        self.runtimes = {agent: self.runtime(agent) for agent in AGENTS}
        self.call_log: list[tuple[str, str]] = []

    def publish(self, name: str, **step_overrides: dict[str, Any]) -> None:
        """Publish the sample saga (`trip_definition`, with ``step_overrides``) as version 1 of ``name``, as its
        owner would: what a trigger's definition must be before its occurrences start."""
        definition = parse_definition({**trip_definition(**step_overrides), "name": name, "version": 1})
        DefinitionRegistry(self.store).publish(name, 1, definition, owner=OWNER, now=0)

    def trigger(
        self, config: TriggerConfig, principal: str, items: InMemoryTriggerStore | None = None
    ) -> TriggerService:
        """The trigger of ``config`` on this pipeline (its triggers' items, or ``items``), starting as
        ``principal``."""
        return TriggerService(
            config, self.scheduler, self.bus, items or self.triggers, principal=principal, clock=self.clock,
            metrics=self.count,
        )  # fmt: skip

    def count(self, name: str, value: int = 1) -> None:
        self.metrics[name] += value

    def runtime(
        self, agent: str, *, clock: Clock | None = None, limiter: CallLimiter | None = None, **config: Any
    ) -> AgentRuntime:
        """Build an agent runtime with real powertools idempotency over an in-memory persistence layer."""
        agent_config = AgentConfig(
            agent_name=agent,
            actions=ACTIONS[agent],
            remote_base_url="https://remote.invalid",
            response_queue_url=REPLIES,
            **config,
        )
        persistence = self.persistence[agent]
        idempotency_config = IdempotencyConfig(
            event_key_jmespath="[workflow_id, step, phase, action, token]", raise_on_no_idempotency_key=True
        )
        idempotency_config.register_lambda_context(FakeLambdaContext())  # type: ignore[arg-type]

        def idempotent(function: Any) -> Any:
            return idempotent_function(
                function, data_keyword_argument="request", persistence_store=persistence, config=idempotency_config
            )

        breaker = CircuitBreaker(
            agent,
            self.breakers,
            clock or self.clock,
            failure_threshold=agent_config.breaker_failure_threshold,
            open_seconds=agent_config.breaker_open_seconds,
            probe_seconds=agent_config.breaker_probe_seconds,
        )
        return AgentRuntime(
            agent_config,
            self.services[agent],
            breaker,
            clock or self.clock,
            idempotent=idempotent,
            rng=random.Random(11),
            metrics=self.count,
            claims=self.agent_claims,
            limiter=limiter,
        )

    # ------------------------------------------------------------------ driving
    def start(
        self,
        definition: dict[str, Any] | None = None,
        workflow_input: dict[str, Any] | None = None,
        *,
        key: str | None = None,
        send: bool = True,
        owner: str = OWNER,
    ) -> str:
        """Start a workflow (the sample trip by default); ``send=False`` models a crash before the send."""
        body = {"definition": definition or trip_definition(), "input": workflow_input or TRIP_INPUT}
        result = self.scheduler.start_workflow(
            parse_definition(body["definition"]),
            body["input"],
            request_hash=canonical_hash(body),
            owner=owner,
            idempotency_key=key,
        )
        if send:
            self.bus.send(result.messages)
        return result.workflow.workflow_id

    def requests(self, agent: str) -> list[StepRequest]:
        """The requests waiting in ``agent``'s queue (visible or delayed), without delivering them."""
        return [decode_request(m.body) for m in self.bus.peek(f"queue/{agent}")]

    def run_agent(self, agent: str, *, lose_replies: bool = False, time_left: float = 60.0) -> list[StepReply]:
        """Deliver every visible request of ``agent``'s queue; return the replies (sent unless lost)."""
        replies = []
        for message in self.bus.receive(f"queue/{agent}"):
            request = decode_request(message.body)
            self.call_log.append((agent, request.action))
            reply = self.runtimes[agent].handle(request, lambda: time_left)
            replies.append(reply)
            if not lose_replies:
                self.bus.send([Outgoing(REPLIES, encode(reply))])
        return replies

    def run_scheduler(self) -> int:
        """Apply every visible reply; return how many were applied."""
        messages = self.bus.receive(REPLIES)
        for message in messages:
            self.bus.send(self.scheduler.on_reply(decode_reply(message.body)))
        return len(messages)

    def pump(self, rounds: int = 100) -> None:
        """Deliver agents' and scheduler's queues until nothing visible is left."""
        for _ in range(rounds):
            moved = sum(len(self.run_agent(agent)) for agent in AGENTS)
            moved += self.run_scheduler()
            if moved == 0:
                return
        raise AssertionError("pipeline did not go quiet")

    def sweep(self, **kwargs: Any) -> SweepReport:
        return self.supervisor.sweep(**kwargs)

    def snapshot(self, workflow_id: str) -> Snapshot:
        snapshot = self.store.load(workflow_id)
        assert snapshot is not None
        return snapshot

    def settle(self, workflow_id: str, *, max_ticks: int = 30, tick_seconds: float = 60.0) -> int:
        """Pump, then tick the supervisor (moving time by ``tick_seconds``) until the workflow is terminal.

        Returns the number of supervisor ticks it took.
        """
        self.pump()
        for tick in range(max_ticks):
            if self.snapshot(workflow_id).workflow.status in TERMINAL_WORKFLOW:
                return tick
            self.clock.advance(tick_seconds)
            self.sweep()
            self.pump()
        raise AssertionError(f"workflow {workflow_id} not terminal after {max_ticks} ticks")
