"""Deterministic fault-injection simulation of sasflow: the real handlers and DynamoDB store adapter (moto).

One run: build the tables from template.yaml inside ``moto.mock_aws``, load the real Lambda handlers (API, scheduler,
three agents, supervisor) in process, inject a ``ManualClock``, a seeded ``random.Random``, the simulated SQS and
remote services, and crash points around every DynamoDB call and every send. Start the workflows over the API
handler, then play the event loop (deliveries in random order, supervisor ticks on its schedule, a second supervisor
interleaved inside the first) until everything has gone quiet. Then check the invariants against DynamoDB, the
queues and the remote services' ledgers.

Replay a seed with ``python -m simulation --seed N --workflows M``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import multiprocessing
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from aws_lambda_powertools.utilities import parameters
from aws_lambda_powertools.utilities.idempotency.exceptions import IdempotencyAlreadyInProgressError

from devstack.identities import identity, request_context_authorizer
from devstack.inprocess import (
    FakeLambdaContext,
    environment,
    function_environment,
    load_function_module,
    offline_aws,
)
from devstack.provision import provision
from devstack.template import FunctionSpec, SqsEventSpec, Stack, remote_service_parameters
from sasflow.adapters.batch_dynamodb import DynamoDBBatchStore
from sasflow.adapters.dynamodb_store import WORKFLOW_SORT_KEY, DynamoDBStateStore
from sasflow.adapters.trigger_dynamodb import DynamoDBTriggerStore, trigger_key
from sasflow.batch import AnyOrder
from sasflow.batches import BatchService
from sasflow.bootstrap import Lazy, OpsServices, build_agent, build_batches, build_engine
from sasflow.callbacks import task_token
from sasflow.clock import Clock, ManualClock, OffsetClock
from sasflow.definition import parse_definition
from sasflow.errors import ClaimCheckMissingError
from sasflow.records import Snapshot
from sasflow.registry import DefinitionRegistry
from sasflow.states import ENDED_RUN, Outcome
from sasflow.triggers import ON_TIME_SECONDS, Overlap, TriggerConfig, TriggerKind, TriggerService
from simulation.direct import DirectDynamoDB, table_items
from simulation.invariants import Violation, check_invariants
from simulation.triggers import MESSAGE, TEST_EVENT, Delivery, TriggerLog, plan_deliveries
from simulation.world import (
    CrashInjector,
    FaultLog,
    Faults,
    QueueSpec,
    SimBus,
    SimCrash,
    SimMessage,
    SimQueues,
    SimRemote,
    StaleReads,
    Tag,
    in_flight_tags,
    powertools_on_clock,
    tag_of,
)

ROOT = Path(__file__).resolve().parents[1]
AGENT_FUNCTIONS = {
    "flights": "FlightsAgentFunction",
    "hotels": "HotelsAgentFunction",
    "payments": "PaymentsAgentFunction",
}
START = 1_800_000_000.0
#: The batches' runner (functions/batches): a consumer once the operator has started a batch.
BATCH_FUNCTION = "BatchFunction"
TICK_SECONDS = 60.0  # the template's rate(1 minute)
#: The call limits the simulation deploys on the sample agent that declares them (agents.yaml: hotels, 5 in flight and
#: 10 a second): tighter, so that a run's one start a second reaches them, and a record waits at most 0.5 s in its
#: instance, so that deferrals, leases changing hands and lapsing under crashes happen in every run (invariant 21).
SIM_CALL_LIMITS = {
    "HotelsAgentFunction": {"MAX_IN_FLIGHT": "1", "CALL_RATE": "1.5", "CALL_BURST": "1", "CALL_WAIT_SECONDS": "0.5"}
}
MAX_TICKS_AFTER_LAST_START = 240
#: Two deadline shards, not the template's 8: the sharded sweep is still exercised (every shard is read, entries
#: land in both), but moto answers each index query by sorting the whole table.
SIM_DEADLINE_SHARDS = 2
#: Where DynamoDB's calls go: "fast" = moto's backend called directly (simulation/direct.py), "moto" = boto3's client
#: through moto's HTTP stubs. Same semantics and the same report for a seed (tests/simulation: the differential test).
WORLDS = ("fast", "moto")
#: The claim-check threshold of the simulation (bytes; the template's default is 32 KiB): small payloads, so the
#: claim-checked workflows stay fast on moto.
SIM_CLAIM_CHECK_THRESHOLD = 1_024
#: The bodies of poison messages: not JSON, or JSON that is no step request or reply (``Faults.poison_message``).
#: The trigger's catch-up window in the simulation (seconds; the sample's is 15 minutes).
SIM_CATCH_UP_SECONDS = 120
#: The name of the simulated S3's bucket whose uploads an s3 seed's trigger watches.
SIM_UPLOAD_BUCKET = "sim-{seed}-triprequestsbucket"
#: The trigger's overlap policy, by seed (``seed % 3``): every run of make sim has each.
SIM_OVERLAPS = ("allow", "skip", "buffer_one")
#: Which trigger of triggers.yaml a seed drives: the event trigger when ``seed % 5 == 4``, the sqs trigger when
#: ``seed % 10 == 8``, the s3 trigger when ``seed % 10 == 7``, else the schedule.
SIM_EVENT_SEEDS = 5
SIM_QUEUE_SEEDS = 10


def trigger_kind(seed: int) -> str:
    """The kind of trigger the simulation of ``seed`` drives (``SIM_EVENT_SEEDS``, ``SIM_QUEUE_SEEDS``)."""
    if seed % SIM_EVENT_SEEDS == SIM_EVENT_SEEDS - 1:
        return "event"
    if seed % SIM_QUEUE_SEEDS == SIM_QUEUE_SEEDS - 3:
        return "s3"
    return "sqs" if seed % SIM_QUEUE_SEEDS == SIM_QUEUE_SEEDS - 2 else "schedule"


POISON_BODIES = ("{not json", "[]", "null", '{"hello": "world"}', '{"step": 1, "attempt": "one"}', "")


def trip_definition(shape: str) -> dict[str, Any]:
    """The sample saga as a chain, or as a DAG where flight and hotel run in parallel before the payment."""
    request = json.loads((ROOT / "events" / "trip_booking_request.json").read_text())
    definition: dict[str, Any] = request["definition"]
    if shape == "dag":
        definition["steps"][1]["depends_on"] = []
        definition["steps"][1]["input"] = {"traveller.$": "input.traveller"}
        definition["steps"][2]["depends_on"] = ["reserve_flight", "book_hotel"]
    return definition


#: The child definition of the simulation's map steps: charge one order, refunded when undone.
MAP_CHILD: dict[str, Any] = {
    "name": "charge-order",
    "steps": [
        {
            "name": "charge_order",
            "agent": "payments",
            "action": "charge",
            "input": {"amount.$": "input.item", "currency": "EUR"},
            "timeout_seconds": 30,
            "compensation": {"action": "refund", "input": {"amount.$": "input.item"}},
        }
    ],
}


def _unwound_wait(step_item: dict[str, Any] | None) -> bool:
    """Whether a step's stored entry is a wait, a callback or a map ended because its workflow unwound (FAILED,
    ``UNWOUND``; a map whose children started goes on to unwind them in the same write: COMPENSATING)."""
    fields = (step_item or {}).get("M", {})
    error = json.loads(fields.get("error", {}).get("S", "null")) or {}
    return fields.get("status", {}).get("S") in ("FAILED", "COMPENSATING") and error.get("code") == "UNWOUND"


def _step(definition: dict[str, Any], name: str) -> dict[str, Any]:
    return next(step for step in definition["steps"] if step["name"] == name)


@dataclass
class RunReport:
    """What one simulated run did and found."""

    seed: int
    workflows: int
    statuses: Counter[str] = field(default_factory=Counter)
    #: Map steps' children by final state (workflows of their own; ``statuses`` counts the workflows started).
    children: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    invocations: int = 0
    ticks: int = 0
    simulated_seconds: float = 0.0
    wall_seconds: float = 0.0
    dead_letters: int = 0
    #: The operator's actions by "action status" (200 applied or repeated, 409 did not apply any more).
    operator_actions: Counter[str] = field(default_factory=Counter)
    #: The approver's answers by "status HTTP status" (200 applied, 409 used already, 410 expired).
    callback_answers: Counter[str] = field(default_factory=Counter)
    #: Claim-checked payload objects left in the bucket at the end, and the reads of them during the run.
    payload_objects: int = 0
    payload_reads: int = 0
    #: The dispatches the hotels agent's call limits deferred, and the calls its service received (invariant 21).
    limit_deferrals: int = 0
    limited_calls: int = 0
    #: Starts refused because their tenant ran max_running workflows (429), and workflows of limited definitions.
    tenant_refused: int = 0
    tenant_workflows: int = 0
    #: Workflows that waited QUEUED in their tenant's queue (runs with ``over_limit: queue``).
    tenant_queued: int = 0
    #: The workflows the schedule's ticks started, by final state (``statuses`` counts the API's starts), and the
    #: messages sent to the trigger's queue (ticks with their duplicates, and bad ones).
    triggered: Counter[str] = field(default_factory=Counter)
    trigger_deliveries: int = 0
    trigger_dead_letters: int = 0
    #: Ticks skipped (the operator had paused the trigger, or a run held its slot), ticks missed (handled later than
    #: its catch-up window), and the distinct run-now occurrences the operator asked for.
    trigger_skipped: int = 0
    trigger_missed: int = 0
    trigger_run_nows: int = 0
    #: The kind of trigger this run drove (``trigger_kind``), its overlap policy (a schedule's), and the ticks it kept
    #: waiting for the slot (buffer_one).
    trigger_kind: str = "schedule"
    trigger_overlap: str = "allow"
    trigger_buffered: int = 0
    #: An sqs or s3 trigger's messages sent back to wait while an operator had paused it (each started after the
    #: resume), and S3's test events sent to an s3 trigger (none starts anything).
    trigger_held: int = 0
    trigger_test_events: int = 0
    #: SHA-256 of every item of the state table at the end (canonical JSON, in key order): two runs of a seed, in
    #: either world, in any process, end with the same digest or they did not replay.
    state_digest: str = ""

    def replay_command(self) -> str:
        return f"make sim ARGS='--seed {self.seed} --workflows {self.workflows} --runs 1'"


class Simulation:
    """One seeded run over ``workflows`` workflows."""

    def __init__(self, seed: int, workflows: int, faults: Faults | None = None, *, world: str = "fast") -> None:
        if world not in WORLDS:
            raise ValueError(f"world must be one of {sorted(WORLDS)}, not {world!r}")
        self.world = world
        self.seed = seed
        self.workflows = workflows
        self.faults = faults or Faults()
        self.rng = random.Random(seed)
        self.clock = ManualClock(START)
        self.log = FaultLog()
        self.report = RunReport(seed, workflows)
        self._nested = False
        self.rescued: set[str] = set()
        #: (workflow id, version) of every workflow write DynamoDB accepted, with how often (invariant 9).
        self.committed: Counter[tuple[str, int]] = Counter()
        #: The invocations running now, innermost last: (logical id, the attempts of the batch it was given).
        self._running: list[tuple[str, list[Tag]]] = []
        self._successes: list[set[Tag]] = []  # the SUCCEEDED replies of each invocation in ``_running``
        #: Agent invocations per (workflow, step, phase): [deadline, state] with state running, done or killed.
        self._holders: dict[tuple[str, str, str], list[list[Any]]] = {}
        #: Writes of the scheduler that moved a step in flight without a reply to its current attempt (invariant 11).
        self.stale_applied: list[Violation] = []
        #: Writes that started a step of a workflow that stayed paused (invariant 12).
        self.paused_moved: list[Violation] = []
        #: Writes that gave a map step's child a TTL while its parent had not ended (invariant 17).
        self.child_expiring: list[Violation] = []
        #: Every instance's call limiter, by agent, and the calls that started while they held too many units (21).
        self.limiters: dict[str, list[Any]] = {}
        self.limit_violations: list[Violation] = []
        #: The operator's actions by (action, HTTP status), and the tick each paused workflow was paused at.
        self.operator_actions: Counter[str] = Counter()
        self.operator_failed: list[Violation] = []
        self.paused_at: dict[str, int] = {}
        #: The approver's answers by (status, HTTP status); the bodies applied (200) per token; tokens seen per
        #: workflow (invariant 16).
        self.callback_answers: Counter[str] = Counter()
        self.callbacks_applied: dict[str, list[dict[str, Any]]] = {}
        self.callbacks_maybe: dict[str, list[dict[str, Any]]] = {}
        self.tokens_seen: dict[str, list[str]] = {}
        self.tokens_reused: set[str] = set()
        #: The tokens an operator answered (``POST /ops/callbacks/{token}``, audited) instead of the owner, chosen by a
        #: generator of their own so the rest of a seed's run replays as before; and each operator answer applied.
        self.approver_route_rng = random.Random(f"approver-route:{seed}")  # nosec B311 # seeded simulation choices
        self.answered_by_operator: set[str] = set()
        self.operator_answers: dict[str, list[dict[str, Any]]] = {}
        self.approval_attempts_shown: dict[str, set[int]] = {}
        #: Reads of a claim-checked payload that found no object (invariant 18), and the workflows that carry one.
        #: Drawn from a generator of their own, so runs without large payloads replay as before.
        self.payload_missing: list[Violation] = []
        self.payload_rng = random.Random(seed * 7_919 + 17)
        self.payload_reads = 0
        #: The poison messages put on the consumers' queues, by message id: the queue's URL (invariant 19). Drawn
        #: from a generator of their own, so runs without them replay as before.
        self.poisoned: dict[str, str] = {}
        self.poison_rng = random.Random(seed * 104_729 + 29)
        #: Workflows whose definition limits its tenants (invariant 22), drawn from a generator of their own: the run's
        #: max_running, the starts refused with 429 (their Idempotency-Keys) and what was seen over the limit.
        self.tenancy_rng = random.Random(seed * 15_485_863 + 37)
        self.tenant_limit = 1 + seed % 2
        #: Half the runs queue their tenants' starts over the limit (``over_limit: queue``), the others refuse them.
        self.tenant_queue = (seed // 2) % 2 == 1
        #: A start's priority (30 % of them, 1 to 5): the hotels agent orders its batches and spaces its deferrals by
        #: it. Drawn from a generator of its own, so the other draws stay as they were.
        self.priority_rng = random.Random(seed * 7_919 + 43)
        self.tenant_refused: set[str] = set()
        self.tenant_violations: list[Violation] = []
        #: The operator's batches (invariant 23), drawn from a generator of their own: the requests sent (by
        #: Idempotency-Key), the batch ids the API answered, and those cancelled.
        self.batch_rng = random.Random(seed * 9_973 + 47)
        self.batch_tokens = itertools.count(1)
        self.batch_requests: dict[str, dict[str, Any]] = {}
        self.batch_ids: dict[str, str] = {}
        self.batches_cancelled: set[str] = set()
        #: The schedule's ticks (simulation/triggers.py, invariant 20), drawn from a generator of their own.
        self.trigger_rng = random.Random(seed * 6_113 + 31)
        self.trigger_log = TriggerLog()
        self.trigger_paused = False
        self.run_now_keys: list[str] = []
        self.deliveries: list[Delivery] = plan_deliveries(
            self.trigger_rng,
            START,
            # over ten minutes at least: the operator (at supervisor ticks) pauses and resumes between the ticks
            max(600.0, workflows * 6.0),
            round(workflows * self.faults.triggered),
            duplicate=self.faults.trigger_duplicate,
            bad=self.faults.trigger_bad,
            events=f"sim-{seed}" if trigger_kind(seed) == "event" else None,
            messages=trigger_kind(seed) == "sqs",
            uploads=SIM_UPLOAD_BUCKET.format(seed=seed) if trigger_kind(seed) == "s3" else None,
        )

    # ------------------------------------------------------------------ setup
    def _setup(self) -> None:
        # SIM_DEADLINE_SHARDS, not the template's 8: the supervisor's 8 index queries per tick were over 40% of a
        # run's time on moto. The remote services are simulated in process; their URLs only have to be valid.
        parameters = {
            **remote_service_parameters({agent: f"https://{agent}.sim.invalid" for agent in AGENT_FUNCTIONS}),
            "DeadlineShards": str(SIM_DEADLINE_SHARDS),
            "ClaimCheckThresholdBytes": str(SIM_CLAIM_CHECK_THRESHOLD),
        }
        self.stack = Stack.from_file(ROOT / "template.yaml", parameters=parameters)
        # The key of the workflow ids is drawn from the seed: a random one would change the ids, their deadline
        # shards and so the order of the whole run.
        self.physical = provision(self.stack, secret_values={"WorkflowIdSecret": f"sim-key-{self.seed}"})
        specs = {spec.logical_id: spec for spec in self.stack.functions()}
        self.specs = specs
        self.queues = SimQueues(self._queue_specs(), self.clock, random.Random(self.rng.random()))
        self.bus = SimBus(self.queues, random.Random(self.rng.random()), self.faults, self.log)
        self.crashes = CrashInjector(
            random.Random(self.rng.random()),
            self.faults,
            self.log,
            idempotency_table=self.physical["IdempotencyTable"],
        )
        self.stale = StaleReads(random.Random(self.rng.random()), self.faults, self.log)
        self.dynamodb = self._dynamodb_client()
        self._install_hooks(self.dynamodb, self.crashes)
        self.stale.install(self.dynamodb)
        seq = itertools.count(1)
        self.remotes = {
            agent: SimRemote(agent, self.clock, random.Random(self.rng.random()), self.faults, self.log, seq)
            for agent in AGENT_FUNCTIONS
        }
        self._plan_outages()
        self.modules: dict[str, Any] = {}
        for logical_id in ("ApiFunction", "SchedulerFunction", "SupervisorFunction"):
            self.modules[logical_id] = self._load_engine_function(specs[logical_id])
        self.modules["OpsFunction"] = self._load_ops_function(specs["OpsFunction"])
        for agent, logical_id in AGENT_FUNCTIONS.items():
            self.modules[logical_id] = self._load_agent_function(specs[logical_id], agent)
        # The trigger of triggers.yaml this seed drives (trigger_kind), and the definition it starts, published as an
        # operator would.
        kind = trigger_kind(self.seed)
        self.trigger_id = next(
            logical_id
            for logical_id, spec in specs.items()
            if "TRIGGER" in spec.environment
            and TriggerConfig.from_env(function_environment(spec)["TRIGGER"]).kind.value == kind
        )
        # A catch-up window shorter than a redelivery after a crash (180 s of visibility timeout): some ticks are
        # handled too late and missed, as after an outage.
        # Its overlap policy is the seed's (SIM_OVERLAPS), as triggers.yaml would declare it.
        [trigger_event] = [e for e in specs[self.trigger_id].events if isinstance(e, SqsEventSpec)]
        self.trigger_queue_url = trigger_event.queue_url
        rendered = TriggerConfig.from_env(function_environment(specs[self.trigger_id])["TRIGGER"])
        self.trigger_config = rendered.model_copy(
            update={
                "catch_up_seconds": SIM_CATCH_UP_SECONDS,
                "overlap": Overlap(SIM_OVERLAPS[self.seed % len(SIM_OVERLAPS)]),
                "queue_url": self.trigger_queue_url,
            }
            if kind == "schedule"
            # the simulated S3's bucket, whose uploads the s3 trigger watches (others are refused)
            else {"bucket": SIM_UPLOAD_BUCKET.format(seed=self.seed)}
            if kind == "s3"
            else {}
        )
        trigger_spec = specs[self.trigger_id]
        environment = {**trigger_spec.environment, "TRIGGER": self.trigger_config.model_dump_json()}
        specs[self.trigger_id] = dataclasses.replace(trigger_spec, environment=environment)
        self.modules[self.trigger_id] = self._load_trigger_function(specs[self.trigger_id])
        definition = {**trip_definition("chain"), "name": self.trigger_config.definition, "version": 1}
        DefinitionRegistry(self.state_store()).publish(
            definition["name"], 1, parse_definition(definition), owner="sim-operator", now=int(START)
        )
        # Every consumer but the triggers this seed does not drive (their queues get nothing), and the batches'
        # runner until the operator starts a batch (so a run without batches replays as before).
        self.consumers: list[tuple[str, SqsEventSpec]] = [
            (spec.logical_id, event)
            for spec in specs.values()
            for event in spec.events
            if isinstance(event, SqsEventSpec)
            and ("TRIGGER" not in spec.environment or spec.logical_id == self.trigger_id)
            and spec.logical_id != BATCH_FUNCTION
        ]
        self.batch_consumer = next(
            (BATCH_FUNCTION, event) for event in specs[BATCH_FUNCTION].events if isinstance(event, SqsEventSpec)
        )

    def _install_hooks(self, client: Any, crashes: CrashInjector) -> None:
        """Record every workflow write DynamoDB accepts, then arm the crash points around every call.

        A write that DynamoDB accepted is recorded even when a crash follows it: botocore runs the handlers of one
        event name in the order first, middle, last, but those of "after-call.dynamodb.PutItem" only after the ones
        of the crash hook's "after-call.dynamodb.*", so the recorder is registered first under the same name.
        """
        client.meta.events.register("before-parameter-build.dynamodb.PutItem", _keep_params)
        client.meta.events.register_first("after-call.dynamodb.*", self._record_commit)
        crashes.install(client)

    def _queue_specs(self) -> list[QueueSpec]:
        result = []
        for logical_id, kind, _, active in self.stack.template_resources():
            if kind != "AWS::SQS::Queue" or not active:
                continue
            properties = self.stack.properties(logical_id)
            redrive = properties.get("RedrivePolicy") or {}
            dlq_arn = redrive.get("deadLetterTargetArn")
            dlq_url = None
            if dlq_arn:
                dlq_name = dlq_arn.rsplit(":", 1)[1]
                dlq_url = next(u for lid, u in self.physical.items() if u.endswith("/" + dlq_name))
            result.append(
                QueueSpec(
                    url=self.physical[logical_id],
                    visibility_timeout=int(properties.get("VisibilityTimeout", 30)),
                    max_receive_count=int(redrive["maxReceiveCount"]) if redrive else None,
                    dead_letter_url=dlq_url,
                )
            )
        return result

    def _plan_outages(self) -> None:
        for _ in range(self.faults.remote_outages):
            remote = self.rng.choice(list(self.remotes.values()))
            start = START + self.rng.uniform(0, max(60.0, self.workflows * 2.0))
            long = self.rng.random() < self.faults.long_outage
            seconds = self.faults.long_outage_seconds if long else self.faults.outage_seconds
            remote.outages.append((start, start + seconds))

    def _load_engine_function(self, spec: FunctionSpec) -> Any:
        module: Any = load_function_module(spec)
        env = function_environment(spec)
        rng = random.Random(self.rng.random())
        module.engine = Lazy(
            lambda: self._watch_rescues(
                self._watch_payloads(
                    build_engine(env, clock=self.clock, bus=self.bus, dynamodb=self.dynamodb, rng=rng),
                    lambda built: built.scheduler.claims,
                )
            )
        )
        return module

    def _load_trigger_function(self, spec: FunctionSpec) -> Any:
        """The real trigger handler (functions/trigger) over the simulated world."""
        module: Any = load_function_module(spec)
        env = function_environment(spec)
        rng = random.Random(self.rng.random())

        def build() -> TriggerService:
            engine = build_engine(env, clock=self.clock, bus=self.bus, dynamodb=self.dynamodb, rng=rng)
            config = TriggerConfig.from_env(env["TRIGGER"])
            return self._watch_trigger(
                TriggerService(
                    config,
                    engine.scheduler,
                    engine.bus,
                    self._trigger_store(),
                    principal=env["TRIGGER_PRINCIPAL"],
                    clock=self.clock,
                )
            )

        module.service = Lazy(build)
        return module

    def _load_batch_function(self, spec: FunctionSpec) -> Any:
        """The real batch handler (functions/batches) over the simulated world."""
        module: Any = load_function_module(spec)
        env = function_environment(spec)
        rng = random.Random(self.batch_rng.random())
        module.batches = Lazy(
            lambda: self._seeded_tokens(
                build_batches(engine=build_engine(env, clock=self.clock, bus=self.bus, dynamodb=self.dynamodb, rng=rng))
            )
        )
        return module

    def _seeded_tokens(self, service: BatchService) -> BatchService:
        """The batches' service with its runs' tokens numbered (uuid4 on Lambda), so a seed replays exactly."""
        service.tokens = lambda: f"sim-run-{next(self.batch_tokens)}"
        return service

    def _trigger_store(self) -> DynamoDBTriggerStore:
        """The triggers' items, on the crash-armed client the functions use."""
        return DynamoDBTriggerStore(self.physical["StateTable"], self.dynamodb)

    def _load_ops_function(self, spec: FunctionSpec) -> Any:
        module: Any = load_function_module(spec)
        env = function_environment(spec)
        rng = random.Random(self.rng.random())

        def build() -> OpsServices:
            engine = self._watch_payloads(
                build_engine(env, clock=self.clock, bus=self.bus, dynamodb=self.dynamodb, rng=rng),
                lambda built: built.scheduler.claims,
            )
            return OpsServices(engine, engine.store, dead_letters=None, triggers=self._trigger_store())

        module.ops = Lazy(build)
        module.batches = Lazy(lambda: self._seeded_tokens(build_batches(engine=module.ops().engine)))
        return module

    def _watch_rescues(self, engine: Any) -> Any:
        """Record the workflows the safety net had to repair (invariant 8 checks each against the DLQs).

        The safety net is the supervisor advancing a workflow that is not terminal but has nothing in flight, so no
        reply can move it. A repair counts only when no message of the workflow was still waiting in a live queue:
        a redelivery would have repaired it too, the safety net merely came first.
        """
        scheduler = engine.scheduler
        original = scheduler.on_overdue

        def on_overdue(workflow_id: str) -> list[Any]:
            before = self.state_store().load(workflow_id)
            stuck = (
                before is not None
                and before.workflow.status.value not in _TERMINAL
                and before.workflow.status.value != "HELD"  # its hold timeout, not the safety net
                and not any(r.in_flight for r in before.steps.values())
            )
            pending = any(
                _body_workflow_id(m.body) == workflow_id
                for spec in self.queues.specs.values()
                if spec.dead_letter_url is not None
                for m in self.queues.messages[spec.url]
            )
            messages: list[Any] = original(workflow_id)
            after = self.state_store().load(workflow_id)
            changed = after is not None and before is not None and after.version != before.version
            if stuck and (messages or changed) and not pending:
                self.rescued.add(workflow_id)
            return messages

        scheduler.on_overdue = on_overdue
        return engine

    def _record_commit(self, http_response: Any, context: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name != "PutItem":
            return
        item = context.get("sim_params", {}).get("Item", {})
        key = item.get("pk", {}).get("S", "")
        if http_response.status_code == 200 and key.startswith("WF#") and "version" in item:
            self.committed[(key[3:], int(item["version"]["N"]))] += 1
            self._check_replies_applied(key[3:], self.stale.latest(key), item)
            self._check_paused(key[3:], self.stale.latest(key), item)
            self._check_child_retention(key[3:], item)
            self.stale.committed(key, item)

    def _check_replies_applied(self, workflow_id: str, before: dict[str, Any] | None, after: dict[str, Any]) -> None:
        """Invariant 11, checked on every write of the scheduler function (it only applies replies): a step in
        flight may change only when the batch holds a reply to its current attempt of its current phase, or a
        success of an earlier attempt of its action under the current token (an attempt after its last operator
        retry, ``attempt_base``) that completes it. So no failure of an earlier attempt (late, duplicated,
        redriven) moves it, and no success from before a retry does. A wait step is ended by the unwind of its
        workflow too (``UNWOUND``), which a reply of another step may start."""
        if before is None or not self._running or self._running[-1][0] != "SchedulerFunction":
            return
        replies = set(self._running[-1][1])
        successes = self._successes[-1] if self._successes else set()
        old_steps = before.get("steps", {}).get("M", {})
        new_steps = after.get("steps", {}).get("M", {})
        for tag in in_flight_tags(before):
            _, name, phase, attempt = tag
            if (
                old_steps.get(name) != new_steps.get(name)
                and tag not in replies
                and not _unwound_wait(new_steps.get(name))
                # a map step moves on its children's reports and its ticks, all sent to its first attempt
                and not ("map" in old_steps.get(name, {}).get("M", {}) and any(t[:2] == tag[:2] for t in replies))
                and not _earlier_success_applied(tag, old_steps.get(name), new_steps.get(name), successes)
            ):
                answered = sorted(t[3] for t in replies if t[:3] == tag[:3])
                self.stale_applied.append(
                    Violation(
                        "stale reply applied",
                        workflow_id,
                        f"{name} {phase} attempt {attempt} changed by replies of attempts {answered}",
                    )
                )

    def _check_paused(self, workflow_id: str, before: dict[str, Any] | None, after: dict[str, Any]) -> None:
        """Invariant 12, checked on every write: while a workflow stays paused, nothing new starts. No step leaves
        PENDING and no compensation begins (a step in flight may finish, be resent or time out)."""
        if before is None or not before.get("paused") or not after.get("paused"):
            return
        old_steps = before.get("steps", {}).get("M", {})
        for name, doc in after.get("steps", {}).get("M", {}).items():
            new = doc["M"]["status"]["S"]
            old = old_steps.get(name, {}).get("M", {}).get("status", {}).get("S", "PENDING")
            if (old == "PENDING" and new not in ("PENDING", "SKIPPED")) or (
                new == "COMPENSATING" and old != "COMPENSATING"
            ):
                self.paused_moved.append(
                    Violation("paused workflow started a step", workflow_id, f"{name} {old}->{new}")
                )

    def _check_child_retention(self, workflow_id: str, item: dict[str, Any]) -> None:
        """Invariant 17, checked on every write: a map step's child gets a TTL (``expires_at``) only once its parent
        has ended, so it never expires while its parent may still compensate it (a parent HELD for a person)."""
        parent = item.get("parent", {}).get("M", {}).get("w", {}).get("S")
        if parent is None or "expires_at" not in item:
            return
        latest = self.stale.latest(f"WF#{parent}")
        status = (latest or {}).get("status", {}).get("S")
        if latest is not None and status not in _TERMINAL:
            detail = f"expires at {item['expires_at']['N']} while its parent {parent} is {status}"
            self.child_expiring.append(Violation("child may expire before its parent ends", workflow_id, detail))

    def config_grace(self) -> int:
        """The deployed deadline grace (seconds): the scheduler's ``DEADLINE_GRACE_SECONDS``."""
        return int(self.stack.function("SchedulerFunction").environment["DEADLINE_GRACE_SECONDS"])

    def state_store(self) -> DynamoDBStateStore:
        """A store over a client without crash hooks, for the simulation's own reads."""
        if not hasattr(self, "_checker_store"):
            self._checker_store = DynamoDBStateStore(
                self.physical["StateTable"], self.dynamodb_checker(), shards=SIM_DEADLINE_SHARDS
            )
        return self._checker_store

    def stored_workflows(self) -> list[Snapshot]:
        """Every workflow in the state table, as the store reads it."""
        store = self.state_store()
        return [store.from_item(item) for item in self.state_items() if item["sk"]["S"] == WORKFLOW_SORT_KEY]

    def state_items(self) -> list[dict[str, Any]]:
        """Every item of the state table (DynamoDB JSON), strongly consistent: a Scan on moto; in the fast world read
        straight from moto's table, the same items without the Scan's per-item accounting."""
        table = self.physical["StateTable"]
        if self.world == "fast":
            return list(table_items(table))
        pages = self.dynamodb_checker().get_paginator("scan").paginate(TableName=table, ConsistentRead=True)
        return [item for page in pages for item in page["Items"]]

    def _load_agent_function(self, spec: FunctionSpec, agent: str) -> Any:
        module: Any = load_function_module(spec)
        env = {**function_environment(spec), **SIM_CALL_LIMITS.get(spec.logical_id, {})}
        skew = self.rng.uniform(-self.faults.clock_skew_seconds, self.faults.clock_skew_seconds)
        clock = OffsetClock(self.clock, skew)
        rng = random.Random(self.rng.random())
        # a batch's records at once, as deployed (AGENT_CONCURRENCY): here one after the other, in a seeded order
        records = AnyOrder(random.Random(f"{self.seed}:{spec.logical_id}:records"))  # leaves the run's draws alone
        module.agent = Lazy(
            lambda: self._watch_limits(
                agent,
                self._watch_in_progress(
                    self._watch_payloads(
                        build_agent(
                            env,
                            clock=clock,
                            bus=self.bus,
                            dynamodb=self.dynamodb,
                            remote=self.remotes[agent],
                            rng=rng,
                            records=records,
                        ),
                        lambda built: built.runtime.claims,
                    )
                ),
            )
        )
        return module

    def _watch_limits(self, agent: str, services: Any) -> Any:
        """Keep every instance's call limiter, to check at each call what they hold together (invariant 21)."""
        limiter = services.runtime.limiter
        if limiter is not None:
            self.limiters.setdefault(agent, []).append(limiter)
            self.remotes[agent].on_call = lambda: self._check_units(agent)
        return services

    def _check_tenants(self) -> None:
        """Invariant 22, as it goes: the workflows of each tenant that have not ended (nor wait QUEUED) are never more
        than the run's max_running, and a tenant's queue starts its workflows in ticket order, each once (after every
        start of a limited definition, and at every supervisor tick)."""
        ended = {status.value for status in ENDED_RUN} | {"QUEUED"}
        # the raw items' few attributes, not whole snapshots: this runs after every such start and at every tick
        items = [item for item in self.state_items() if item["sk"]["S"] == WORKFLOW_SORT_KEY and "tenant" in item]
        running: Counter[tuple[str, str]] = Counter(
            (item["dname"]["S"], item["tenant"]["S"]) for item in items if item["status"]["S"] not in ended
        )
        for (name, tenant), count in sorted(running.items()):
            if count > self.tenant_limit:
                detail = f"{count} of {name} running for {tenant}; max_running is {self.tenant_limit}"
                self.tenant_violations.append(Violation("tenant ran more than max_running", "-", detail))
        waiting: dict[tuple[str, str], list[int]] = {}
        started: dict[tuple[str, str], list[int]] = {}
        for item in items:
            if "ticket" not in item:
                continue
            queue = (item["dname"]["S"], item["tenant"]["S"])
            ticket = int(item["ticket"]["N"])
            dequeued = sum(1 for line in item.get("h", {}).get("S", "").split("\n") if line.split(" ")[1:2] == ["G"])
            if dequeued > 1:
                detail = f"{item['pk']['S']} (ticket {ticket}) started {dequeued} times"
                self.tenant_violations.append(Violation("a queued workflow started twice", "-", detail))
            if item["status"]["S"] == "QUEUED":
                waiting.setdefault(queue, []).append(ticket)
            elif dequeued:
                started.setdefault(queue, []).append(ticket)
        for queue, tickets in sorted(waiting.items()):
            passed = [ticket for ticket in started.get(queue, []) if ticket > min(tickets)]
            if passed:
                detail = f"{queue[1]}: ticket {min(tickets)} still QUEUED, tickets {sorted(passed)} started"
                self.tenant_violations.append(Violation("a tenant's queue started out of ticket order", "-", detail))

    def _check_units(self, agent: str) -> None:
        """Invariant 21, as a call starts: the units the agent's instances believe they hold, each by its own clock,
        are never more than ``max_in_flight`` together (two instances that both believe they hold a unit may both
        call on it)."""
        limiters = self.limiters[agent]
        held = {limiter.holder: limiter.units for limiter in limiters}
        limit = limiters[0].limits.units
        if sum(held.values()) > limit:
            detail = (
                f"at {self.clock.now():.3f}: {sum(held.values())} units held at once ({held}); the limit is {limit}"
            )
            self.limit_violations.append(Violation("call limit units held beyond max_in_flight", "-", detail))

    def _watch_payloads(self, services: Any, claims_of: Callable[[Any], Any]) -> Any:
        """Record every read of a claim-checked payload that finds no object (invariant 18), as it happens."""
        claims = claims_of(services)
        if claims is None:
            return services
        store = claims.store
        original = store.get

        def get(key: str) -> bytes:
            self.payload_reads += 1
            try:
                return bytes(original(key))
            except ClaimCheckMissingError:
                workflow_id = key.split("/", 1)[0]
                self.payload_missing.append(Violation("claim-checked payload missing when read", workflow_id, key))
                raise

        store.get = get
        return services

    def _watch_in_progress(self, services: Any) -> Any:
        """Attribute an attempt refused as already in progress to the fault behind it, when there is one.

        Powertools refuses a request while another invocation holds its idempotency record: a concurrent copy (a
        duplicate delivery), or one killed after its remote effect, whose record expires with its invocation's
        deadline (``register_lambda_context``). A refusal while no such holder exists is the product's own doing
        and is not attributed, so the unwind it leads to is reported (invariant 10).
        """
        runtime = services.runtime
        original = runtime.handle

        def handle(request: Any, time_left: Any, **kwargs: Any) -> Any:
            key = (request.workflow_id, request.step, request.phase.value)
            now = self.clock.now()
            holders = self._holders.setdefault(key, [])
            held = any(state == "running" or (state == "killed" and deadline > now) for deadline, state in holders)
            entry = [now + time_left(), "running"]
            holders.append(entry)
            try:
                reply = original(request, time_left, **kwargs)
            except IdempotencyAlreadyInProgressError:
                entry[1] = "done"
                if held:
                    self.log("refused while another invocation holds it", [(*key, request.attempt)])
                raise
            except BaseException:
                entry[1] = "killed"
                raise
            entry[1] = "done"
            return reply

        runtime.handle = handle
        return services

    # ------------------------------------------------------------------ invocation
    def _invoke(self, logical_id: str, event: Any, *, sandbox: str = "") -> tuple[bool, Any]:
        """Invoke a handler like Lambda: environment applied, faults armed, a context on the simulated clock.

        ``sandbox`` names a second instance of the function (its own module state), for concurrent invocations.
        """
        spec = self.specs[logical_id]
        context = ClockContext(spec, self.clock)
        self.report.invocations += 1
        module = self._module(logical_id, sandbox)
        armed = (self.crashes.armed, self.bus.armed, self.stale.armed)
        self.crashes.armed = self.bus.armed = self.stale.armed = True
        self._maybe_interleave(logical_id, event)
        tags = _event_tags(event)
        self._running.append((logical_id, tags))
        self._successes.append(_success_tags(event))
        self.log.context.append(tags)
        self.log.unsent.append([])
        try:
            with environment(function_environment(spec)):
                return True, module.handler(event, context)
        except (SimCrash, IdempotencyAlreadyInProgressError) as error:
            return False, error
        except Exception as error:  # any other escape is also a failed invocation; SQS redelivers
            self.log(f"invocation error {type(error).__name__}", attribute=False)
            return False, error
        finally:
            self.crashes.armed, self.bus.armed, self.stale.armed = armed
            self.log.context.pop()
            self.log.unsent.pop()
            self._running.pop()
            self._successes.pop()

    def _module(self, logical_id: str, sandbox: str) -> Any:
        key = logical_id + sandbox
        if key not in self.modules:
            spec = self.specs[logical_id]
            agent = next((a for a, f in AGENT_FUNCTIONS.items() if f == logical_id), None)
            if agent:
                self.modules[key] = self._load_agent_function(spec, agent)
            elif logical_id == self.trigger_id:
                self.modules[key] = self._load_trigger_function(spec)
            elif logical_id == BATCH_FUNCTION:
                self.modules[key] = self._load_batch_function(spec)
            else:
                self.modules[key] = self._load_engine_function(spec)
        return self.modules[key]

    def _maybe_interleave(self, logical_id: str, event: Any) -> None:
        """Sometimes let a second instance of a consumer run a whole batch in the middle of this invocation."""
        consumer_ids = {c for c, _ in self.consumers}
        if self._nested or self.crashes.on_call is not None or logical_id not in consumer_ids:
            return
        own_event = next(e for c, e in self.consumers if c == logical_id)
        workflow_ids = _workflow_ids(event)
        siblings_waiting = self.queues.visible(own_event.queue_url, lambda m: _body_workflow_id(m.body) in workflow_ids)
        related: set[str] = set()
        if siblings_waiting and self.rng.random() < self.faults.concurrent_sibling:
            # Messages of the same workflows (say the reply of a parallel sibling step) are waiting: a second
            # instance of this function takes them between this instance's read and its write, the race on a join.
            other_id, other_event, related = logical_id, own_event, workflow_ids
        elif self.rng.random() < self.faults.concurrent_invocation:
            other_id, other_event = self.rng.choice(self.consumers)
        else:
            return
        trigger = self.rng.randint(1, 6)
        calls = itertools.count(1)

        loaded: list[str | None] = [None]

        def interleave(operation: str, body: str = "") -> None:
            nonlocal related
            if related:
                # Just before the first write that follows the load of a workflow whose other messages wait in the
                # queue: the window between a scheduler's read and its conditional write, where a concurrent
                # instance's write makes the loaded view stale.
                if operation == "GetItem":
                    match = _WORKFLOW_KEY.search(body)
                    if match:  # a workflow's read (a definition's GetItem names DEF#..., not WF#...)
                        loaded[0] = match.group(1)
                    return
                if operation != "PutItem" or loaded[0] not in related:
                    return
                related = {loaded[0]}
                if not self.queues.visible(other_event.queue_url, lambda m: _body_workflow_id(m.body) in related):
                    loaded[0] = None
                    return
            elif next(calls) != trigger:
                return
            self.crashes.on_call = None
            self._nested = True
            self.log("concurrent invocation interleaved" + (" (same workflows)" if related else ""), attribute=False)
            try:
                self._deliver(other_id, other_event, sandbox="#2", related=related)
            finally:
                self._nested = False

        self.crashes.on_call = interleave

    def _deliver(
        self, logical_id: str, event_spec: SqsEventSpec, *, sandbox: str = "", related: set[str] | None = None
    ) -> bool:
        # Like Lambda's event source mapping, batches vary in size (1..BatchSize), so related messages (the replies
        # of parallel steps) may land in different, concurrent invocations.
        size = self.rng.randint(1, min(event_spec.batch_size, 10))
        prefer = (lambda m: _body_workflow_id(m.body) in related) if related else None
        # Sometimes a batch takes one message per workflow, so the replies of parallel siblings go to different
        # (possibly concurrent) invocations, as they do when Lambda's poller splits them.
        spread = not related and self.rng.random() < 0.5
        group = (lambda m: _body_workflow_id(m.body)) if spread else None
        messages = self.queues.receive(event_spec.queue_url, size, prefer, group)
        if not messages:
            return False
        if related and any(_body_workflow_id(m.body) in related for m in messages):
            self.log("concurrent instance took a message of the same workflow", attribute=False)
        if self.rng.random() < self.faults.consumer_lost:
            # The poller received the batch and died: the messages come back after the visibility timeout.
            self.log("consumer lost after receive", [tag_of(m.body) for m in messages])
            return True
        ok, result = self._invoke(logical_id, _sqs_event(messages, event_spec.queue_arn), sandbox=sandbox)
        self.crashes.on_call = None if not self._nested else self.crashes.on_call
        if not ok:
            if logical_id in SIM_CALL_LIMITS:
                # Lambda replaces a sandbox whose invocation died: the limited agent's next invocation is a new
                # instance, and the units the dead one held come back only when its lease lapses (invariant 21)
                self.modules.pop(logical_id + sandbox, None)
            return True  # the invocation died: SQS hides the whole batch for the visibility timeout
        for message in messages:
            message.handled_at[message.receive_count] = self.clock.now()
        failed = {f["itemIdentifier"] for f in result.get("batchItemFailures", [])}
        for message in messages:
            if message.message_id not in failed:
                self.queues.delete(event_spec.queue_url, message.receipt)
        return True

    def _start(self, index: int) -> None:
        shape = "dag" if index % 2 == 1 else "chain"
        definition = trip_definition(shape)
        if self.rng.random() < self.faults.hold_policy:
            # A step that fails for good holds the workflow for a person; unless one acts, the timeout compensates.
            definition["on_failure"] = "hold"
            definition["hold_timeout_seconds"] = self.rng.choice([300, 900])
        trip_input: dict[str, Any] = {
            "traveller": f"t-{index}",
            "route": "LHR-JFK",
            "nights": 1 + index % 4,
            "amount": 100 + index,
        }
        if self.payload_rng.random() < self.faults.large_payload:
            # Above the threshold: the input is claim-checked at the start, the hotel's rendered input before its
            # request, and its output (the service echoes the manifest) by its agent.
            trip_input["manifest"] = "".join(f"{index}:{line:04d};" for line in range(SIM_CLAIM_CHECK_THRESHOLD // 4))
            _step(definition, "book_hotel")["input"]["manifest.$"] = "input.manifest"
        if self.rng.random() < self.faults.conditional:
            _step(definition, "book_hotel")["when"] = "input.needs_hotel"
            trip_input["needs_hotel"] = self.rng.random() < 0.5
        if self.rng.random() < self.faults.wait_step:
            seconds = self.rng.choice([0, 45, 90, 600, 1_200])  # 1,200 s: longer than SQS's delay, the supervisor's
            if self.rng.random() < 0.5:
                wait: dict[str, Any] = {"name": "cool_off", "type": "wait", "seconds": seconds}
            else:
                wait = {"name": "cool_off", "type": "wait", "until": "input.resume_at"}
                trip_input["resume_at"] = int(self.clock.now()) + seconds
            if shape == "dag":
                wait["depends_on"] = ["reserve_flight"]
                _step(definition, "charge_card")["depends_on"].append("cool_off")
            definition["steps"].insert(1, wait)  # a chain: the hotel then waits for it
        if self.rng.random() < self.faults.callback_step:
            approval: dict[str, Any] = {
                "name": "approval",
                "type": "callback",
                "timeout_seconds": self.rng.choice([120, 300]),
                "retry": {"max_attempts": 2, "backoff_base_seconds": 1.0, "backoff_cap_seconds": 1.0},
            }
            if self.rng.random() < 0.5:
                # its token goes out through an agent's action (any action the agent allows), like a notification
                approval["notify"] = {"agent": "payments", "action": "charge", "input": {"amount.$": "input.amount"}}
            if shape == "dag":
                approval["depends_on"] = ["reserve_flight"]
                _step(definition, "charge_card")["depends_on"].append("approval")
            definition["steps"].insert(1, approval)
        if self.rng.random() < self.faults.map_step:
            # A map after the flight: a child workflow per order (each charges, and refunds when undone), under a
            # small concurrency and tolerance, so children fail, are cancelled and compensate with their parent.
            fan_out: dict[str, Any] = {
                "name": "charge_orders",
                "type": "map",
                "items": "input.orders",
                "max_concurrency": self.rng.choice([1, 2, 3]),
                "tolerated_failure": self.rng.choice([0, 1, "50%"]),
                "timeout_seconds": self.rng.choice([60, 300]),
                "definition": MAP_CHILD,
            }
            trip_input["orders"] = [100 + index * 10 + i for i in range(self.rng.randint(0, 4))]
            if shape == "dag":
                fan_out["depends_on"] = ["reserve_flight"]
                _step(definition, "charge_card")["depends_on"].append("charge_orders")
            definition["steps"].insert(1, fan_out)
        if self.poison_rng.random() < self.faults.poison_message:
            self._poison()
        tenancy = self.tenancy_rng.random() < self.faults.tenancy
        if tenancy:
            definition["tenancy"] = {"max_running": self.tenant_limit, "tenant_key": "customer"}
            if self.tenant_queue:
                definition["tenancy"]["over_limit"] = "queue"
            trip_input["customer"] = f"c{self.tenancy_rng.randint(0, 4)}"
        body: dict[str, Any] = {"definition": definition, "input": trip_input}
        if self.priority_rng.random() < 0.3:
            body["priority"] = self.priority_rng.randint(1, 5)
        key = f"sim-{self.seed}-{index}"
        event = start_event(body, key=key)
        # A client retries a start until it gets an answer (the Idempotency-Key makes that safe).
        for _ in range(20):
            ok, response = self._invoke("ApiFunction", event)
            if ok and response["statusCode"] in (200, 201):
                if tenancy:
                    self._check_tenants()
                return
            if ok and response["statusCode"] == 429 and tenancy:
                # Its customer runs max_running trips: refused, nothing written; this client gives up.
                self.log("start refused: its tenant is at max_running", attribute=False)
                self.tenant_refused.add(key)
                return
            self.clock.advance(1)
        raise AssertionError(f"start {index} never succeeded")

    def _tick(self) -> None:
        self.report.ticks += 1
        event = scheduled_event(self.report.ticks)
        if self.rng.random() < self.faults.second_supervisor:
            # A second supervisor runs the same sweep inside the first, at one of its DynamoDB calls, as if its lease
            # had expired: only the conditional writes keep them apart.
            trigger = self.rng.randint(1, 12)
            calls = itertools.count(1)

            def interleave(_: str, __: str = "") -> None:
                if next(calls) == trigger:
                    self.crashes.on_call = None
                    self.log("second supervisor interleaved", attribute=False)
                    self._second_supervisor()

            self.crashes.on_call = interleave
        self._invoke("SupervisorFunction", event)
        self.crashes.on_call = None
        if self.faults.tenancy:
            self._check_tenants()
        self._operate()
        self._operate_batches()
        self._operate_trigger()
        self._approve()

    # ------------------------------------------------------------------ the approver
    def _approve(self) -> None:
        """The person who answers callback steps, through the clients' API function (as the workflow's owner).

        For each waiting token, once per tick: approve (50 %), reject (10 %), heartbeat (10 %), or nothing (30 %: the
        step may time out, and its retry issues a new token). An applied answer is sent again once half the time,
        and a superseded token is used late once: those must be refused (409, 410) and change nothing. Before an
        applied answer is changed, the same answer is sent again: it must be 200 and apply nothing (invariant 16).
        """
        for snapshot in sorted(self.stored_workflows(), key=lambda s: s.workflow.workflow_id):
            wid = snapshot.workflow.workflow_id
            record = snapshot.steps.get("approval")
            if record is None or record.callback_nonce is None:
                continue
            token = task_token(wid, "approval", record.attempt, record.callback_nonce)
            if record.status.value != "PROCESSING":
                if token in self.callbacks_applied and token not in self.tokens_reused and self.rng.random() < 0.5:
                    self.tokens_reused.add(token)
                    # the same answer again (a caller whose response was lost) must be 200 and apply nothing
                    self._answer(token, self.callbacks_applied[token][0], repeat=True)
                    self._answer(token, {"status": "succeeded", "output": {"again": True}})  # must be 409
                continue
            # An attempt whose whole window passed between two ticks (the simulated time other invocations spent:
            # remote hangs, backoff sleeps) was never shown to the approver: its timeout is the world's doing.
            shown = self.approval_attempts_shown.setdefault(wid, set())
            for earlier in range(1, record.attempt):
                if earlier not in shown:
                    self.log.touched[(wid, "approval", "action", earlier)].add("no approver tick during the attempt")
                    shown.add(earlier)
            shown.add(record.attempt)
            seen = self.tokens_seen.setdefault(wid, [])
            for old in seen:
                if old != token and old not in self.tokens_reused:
                    self.tokens_reused.add(old)
                    self._answer(old, {"status": "succeeded", "output": {"late": True}})  # must be 410
            if token not in seen:
                seen.append(token)
            roll = self.rng.random()
            tag = (wid, "approval", "action", record.attempt)
            if roll < 0.5:
                self._answer(token, {"status": "succeeded", "output": {"approved_by": f"approver-{wid[:8]}"}})
            elif roll < 0.6:
                # a person's refusal is a fault of this attempt that explains its unwind (invariant 10)
                self.log("approver rejected", [tag], attribute=False)
                self.log.touched[tag].add("approver rejected")
                self._answer(token, {"status": "failed", "error": {"code": "NOT_APPROVED", "message": "no"}})
            elif roll < 0.7:
                self._answer(token, {"status": "heartbeat"})
            else:
                self.log("approver did not answer", [tag], attribute=False)
                self.log.touched[tag].add("approver did not answer")

    def _answer(self, token: str, body: dict[str, Any], *, repeat: bool = False) -> int:
        """Send one answer: as the owner (the clients' route), or, for a token the approver chose to leave to the
        operator (a third of them), as the operator through ``POST /ops/callbacks/{token}`` with a reason (audited)."""
        request_id = f"cb-{self.seed}-{self.report.ticks}-{len(self.callback_answers)}"
        fresh = body["status"] != "heartbeat" and not repeat and token not in self.callbacks_applied
        if fresh and self.approver_route_rng.random() < 1 / 3:
            self.answered_by_operator.add(token)
        by_operator = token in self.answered_by_operator and body["status"] != "heartbeat"
        if by_operator:
            ops_body: dict[str, Any] = (
                {"answer": "approve", "reason": "sim operator: approve", "output": body.get("output")}
                if body["status"] == "succeeded"
                else {"answer": "reject", "reason": body["error"]["message"], "code": body["error"]["code"]}
            )
            event, function = ops_event(f"/ops/callbacks/{token}", ops_body, key=request_id), "OpsFunction"
        else:
            event, function = callback_event(token, body, request_id=request_id), "ApiFunction"
        for _ in range(20):
            ok, response = self._invoke(function, event)
            if ok and response["statusCode"] < 500:
                status = int(response["statusCode"])
                self.callback_answers[f"{body['status']} {status}{' again' if repeat else ''}"] += 1
                if repeat and status != 200:
                    self.operator_failed.append(
                        Violation("same callback answer refused", token.split("~")[0], str(status))
                    )
                elif status == 200 and body["status"] != "heartbeat" and not repeat:
                    self.callbacks_applied.setdefault(token, []).append(body)
                    if by_operator:
                        self.operator_answers.setdefault(token, []).append(body)
                        self.callback_answers[f"{body['status']} by the operator"] += 1
                return status
            # no answer: the function may have crashed after its write, so this use may have applied
            self.callbacks_maybe.setdefault(token, []).append(body)
            self.clock.advance(1)
        self.operator_failed.append(Violation("callback failed", token.split("~")[0], body["status"]))
        return 500

    # ------------------------------------------------------------------ the operator
    def _operate(self) -> None:
        """The person on call: resumes what it paused two ticks ago, and sometimes acts on one workflow.

        Actions go through the operators' function (its real handler), each with an Idempotency-Key retried until
        the function answers, as the CLI does. A 409 (the workflow moved on meanwhile) is a valid answer.
        """
        for workflow_id, tick in sorted(self.paused_at.items()):
            if self.report.ticks - tick >= 2:
                self._act(workflow_id, "resume")
                del self.paused_at[workflow_id]
        if self.rng.random() >= self.faults.operator_action:
            return
        snapshots = sorted(self.stored_workflows(), key=lambda s: s.workflow.workflow_id)
        choices: list[tuple[str, str, dict[str, Any]]] = []
        for snapshot in snapshots:
            workflow = snapshot.workflow
            wid, status = workflow.workflow_id, workflow.status.value
            if wid in self.paused_at:
                continue
            if status == "HELD":
                failed = next((n for n, r in snapshot.steps.items() if r.status.value == "FAILED"), None)
                choices += [(wid, "retry", {"step": failed}), (wid, "retry", {"step": failed})]
                choices += [(wid, "skip", {"step": failed, "output": {"confirmation": f"BY-HAND-{wid[:8]}"}})]
                choices += [(wid, "compensate", {}), (wid, "cancel", {})]
            elif status == "COMPENSATION_FAILED":
                choices += [(wid, "retry-compensation", {}), (wid, "retry-compensation", {}), (wid, "resolve", {})]
            elif status in ("RUNNING", "COMPENSATING", "CANCELLING") and not workflow.paused:
                # A pause matters while something is still to start: a step not dispatched, or an unwind.
                waiting = len(snapshot.steps) < len(workflow.definition.steps) or status != "RUNNING"
                choices += [(wid, "pause", {})] * (3 if waiting else 1)
                if status == "RUNNING" and self.rng.random() < 0.1:
                    choices += [(wid, "compensate", {}), (wid, "cancel", {})]
        if not choices:
            return
        workflow_id, action, extra = self.rng.choice(choices)
        if self._act(workflow_id, action, **extra) == 200 and action == "pause":
            self.paused_at[workflow_id] = self.report.ticks

    #: What the simulated operator's batches do: an action, and the status of the workflows it is given.
    BATCHES = (
        ("retry", "HELD"),
        ("retry", "HELD"),
        ("compensate", "HELD"),
        ("pause", "RUNNING"),
        ("resume", "PAUSED"),
        ("retry-compensation", "COMPENSATION_FAILED"),
        ("cancel", "RUNNING"),
    )

    def _operate_batches(self) -> None:
        """The person on call acting on a fleet (invariant 23): starts a batch through the operators' function, sends
        the same request again (its Idempotency-Key: the same batch), or cancels a running one. Its runs are
        BatchFunction's, delivered like every consumer's messages, under the same crash faults."""
        if self.batch_ids:
            self._resume_what_batches_paused()
        if self.batch_rng.random() >= self.faults.operator_batch:
            return
        roll = self.batch_rng.random()
        if roll < 0.2 and self.batch_requests:
            key = self.batch_rng.choice(sorted(self.batch_requests))  # a retried command: the same batch
        elif roll < 0.3 and self.batch_ids:
            batch_id = self.batch_rng.choice(sorted(self.batch_ids.values()))
            response = self._operator_request(
                f"/ops/batches/{batch_id}/cancel", {"reason": "sim operator: stop"}, "", "batch cancel", batch_id
            )
            if response is not None and response["statusCode"] == 200:
                self.batches_cancelled.add(batch_id)
            return
        else:
            action, status = self.batch_rng.choice(self.BATCHES)
            key = f"batch-{self.seed}-{self.report.ticks}-{action}"
            self.batch_requests[key] = {
                "action": action,
                "where": {"status": status},
                "reason": f"sim operator: {action} every {status}",
                "max_per_second": self.batch_rng.choice([1, 5, 50]),
            }
        response = self._operator_request("/ops/batches", self.batch_requests[key], key, "batch start", "batch")
        if response is None or response["statusCode"] not in (200, 202):
            return
        self.batch_ids[key] = json.loads(response["body"])["batch_id"]
        if self.batch_consumer not in self.consumers:
            self.consumers.append(self.batch_consumer)

    def _resume_what_batches_paused(self) -> None:
        """Once no batch runs, a batch resumes the workflows batches paused (those the operator paused alone are its
        own to resume): every workflow ends."""
        store = DynamoDBBatchStore(self.physical["StateTable"], self.dynamodb_checker())
        if any(
            b is None or not b.finished for b in (store.get(i, consistent=True) for i in set(self.batch_ids.values()))
        ):
            return
        paused = [
            s.workflow.workflow_id
            for s in self.stored_workflows()
            if s.workflow.paused
            and s.workflow.workflow_id not in self.paused_at
            and s.workflow.status.value not in ("COMPLETED", "COMPENSATED", "CANCELLED", "COMPENSATION_FAILED")
        ]
        if not paused:
            return
        key = f"batch-{self.seed}-{self.report.ticks}-resume-paused"
        self.batch_requests[key] = {
            "action": "resume",
            "where": {"status": "PAUSED"},
            "reason": "sim operator: resume what batches paused",
            "max_per_second": 50,
        }
        response = self._operator_request("/ops/batches", self.batch_requests[key], key, "batch start", "batch")
        if response is not None and response["statusCode"] in (200, 202):
            self.batch_ids[key] = json.loads(response["body"])["batch_id"]

    def _act(self, workflow_id: str, action: str, **extra: Any) -> int:
        body = {"reason": f"sim operator: {action}", **{k: v for k, v in extra.items() if v is not None}}
        key = f"op-{self.seed}-{self.report.ticks}-{workflow_id[:8]}-{action}"
        response = self._operator_request(f"/ops/workflows/{workflow_id}/{action}", body, key, action, workflow_id)
        return 500 if response is None else int(response["statusCode"])

    def _operator_request(
        self, path: str, body: dict[str, Any], key: str, label: str, subject: str
    ) -> dict[str, Any] | None:
        """One operator request through the operators' function, with its Idempotency-Key retried until the function
        answers, as the CLI does; counted by ``label`` and its status. None when it never answered."""
        event = ops_event(path, body, key=key)
        for _ in range(20):
            ok, response = self._invoke("OpsFunction", event)
            if ok and response["statusCode"] < 500:
                self.operator_actions[f"{label} {response['statusCode']}"] += 1
                return dict(response)
            self.clock.advance(1)
        # Crashes are injected at random, so 20 tries in a row fail only when the action itself fails: a 500 that an
        # on-call engineer would meet. It is a violation, and the person gives up on this workflow.
        self.operator_actions[f"{label} failed"] += 1
        self.operator_failed.append(Violation("operator action failed", subject, label))
        return None

    def _operate_trigger(self) -> None:
        """The person on call and the trigger: pauses it (its ticks are then skipped), resumes it, or runs it now,
        sometimes twice with one Idempotency-Key (one occurrence, one workflow), through the operators' function."""
        kind = self.trigger_config.kind
        # a queue trigger's messages wait out a pause: once every message is sent, the operator resumes it
        last_resume = kind in (TriggerKind.SQS, TriggerKind.S3) and self.trigger_paused and not self.deliveries
        if not last_resume and (
            not self.trigger_log.occurrences or self.trigger_rng.random() >= self.faults.trigger_operator
        ):
            return
        name = self.trigger_config.name
        action = self.trigger_rng.choice(["resume" if self.trigger_paused else "pause", "run-now"])
        if last_resume:
            action = "resume"
        event_trigger = kind is not TriggerKind.SCHEDULE  # an event's or a queue's: nothing to run now
        if action == "run-now" and self.run_now_keys and self.trigger_rng.random() < 0.3:
            key = self.run_now_keys[-1]  # the same request again: a double click, a retried command
        else:
            key = f"trigger-op-{self.seed}-{self.report.ticks}-{action}"
        body = {"reason": f"sim operator: {action}"}
        response = self._operator_request(f"/ops/triggers/{name}/{action}", body, key, f"trigger {action}", name)
        if response is None:
            return
        if event_trigger and action == "run-now":
            # an event or queue trigger has no tick to run now: refused, and nothing sent
            if response["statusCode"] != 409:
                self.trigger_log.seen.append(
                    Violation("an event trigger ran now", "-", f"{response['statusCode']} {response['body'][:80]}")
                )
            return
        if action == "run-now":
            self.run_now_keys.append(key)
            self.trigger_log.occurrences.add(json.loads(response["body"])["occurrence"])
        else:
            self.trigger_paused = action == "pause"

    def _watch_trigger(self, service: TriggerService) -> TriggerService:
        """Record what each occurrence did, and whether its trigger was paused when it was handled (invariant 20)."""
        original = service.handle
        checker = self.dynamodb_checker()
        table = self.physical["StateTable"]

        def handle(occurrence: Any, outbox: Any = None) -> Any:
            item = checker.get_item(TableName=table, Key=trigger_key(service.config.name), ConsistentRead=True)
            paused = "paused_by" in item.get("Item", {})
            late = self.clock.now() - occurrence.at
            outcome = original(occurrence, outbox)
            missed = (outcome.skipped or "").startswith("missed")
            if outcome.held:
                self.trigger_log.held.add(occurrence.identity)
            elif trigger_kind(self.seed) in ("sqs", "s3") and outcome.skipped is not None:  # not the code's .holds
                self.trigger_log.seen.append(
                    Violation("a queue trigger dropped a message", "-", f"{occurrence.identity}: {outcome.skipped}")
                )
            elif outcome.buffered:
                self.trigger_log.buffered.add(occurrence.identity)
            elif outcome.skipped is not None:
                (self.trigger_log.missed if missed else self.trigger_log.skipped).add(occurrence.identity)
            if service.config.slot and outcome.workflow_id is not None:
                self._one_run_at_a_time(outcome.workflow_id)
            if missed and late <= max(ON_TIME_SECONDS, SIM_CATCH_UP_SECONDS):
                self.trigger_log.seen.append(
                    Violation("a tick missed within its catch-up window", "-", f"{occurrence.identity}: {late:.0f} s")
                )
            # a run-now, and a tick kept waiting (buffer_one) before the pause, start all the same
            if paused and not (occurrence.run_now or occurrence.buffered) and outcome.created:
                self.trigger_log.seen.append(
                    Violation("a paused trigger started a tick", outcome.workflow_id or "-", occurrence.identity)
                )
            return outcome

        service.handle = handle  # type: ignore[method-assign]
        return service

    def _one_run_at_a_time(self, workflow_id: str) -> None:
        """Overlap skip and buffer_one (invariant 20): a run of the trigger is seen for the first time; of it and
        each run seen before, the one created first must have ended by now (an ended run never runs again), or the
        two ran at once. Both directions: a crash can make a run be seen long after a later one."""
        log = self.trigger_log
        if workflow_id in log.runs:
            return
        store = self.state_store()
        mine = store.load(workflow_id)
        if mine is None:
            log.seen.append(Violation("a trigger's run is missing", workflow_id, "seen started, not in the table"))
            return
        created = log.runs[workflow_id] = mine.workflow.created_at
        if mine.workflow.status in ENDED_RUN:
            log.ended.add(workflow_id)

        def ended(run: str) -> bool:
            if run not in log.ended:
                snapshot = store.load(run)
                if snapshot is not None and snapshot.workflow.status in ENDED_RUN:
                    log.ended.add(run)
            return run in log.ended

        for other, created_at in sorted(log.runs.items()):
            if other == workflow_id:
                continue
            # created in the same second: either may have come first
            firsts = [
                run for run, at in ((other, created_at), (workflow_id, created)) if at == min(created_at, created)
            ]
            if not any(ended(run) for run in firsts):
                later = other if other not in firsts else workflow_id
                log.seen.append(Violation("two runs of a trigger at once", later, f"{firsts[0]} had not ended"))

    def _second_supervisor(self) -> None:
        engine = self.modules["SupervisorFunction"].engine()
        with contextlib.suppress(SimCrash):  # an injected crash ends the second supervisor's run
            engine.supervisor.sweep(owner="second-supervisor", use_lease=False)

    # ------------------------------------------------------------------ the loop
    def _poison(self) -> None:
        """Put a poison message on the queue of the scheduler or of an agent the simulation drives (a bad
        deployment's message, a hand-written send)."""
        driven = {"SchedulerFunction", *AGENT_FUNCTIONS.values()}
        consumers = sorted((c for c in self.consumers if c[0] in driven), key=lambda consumer: consumer[0])
        _, event_spec = self.poison_rng.choice(consumers)
        body = self.poison_rng.choice(POISON_BODIES)
        self.poisoned[self.queues.send(event_spec.queue_url, body)] = event_spec.queue_url
        self.log("poison message", attribute=False)

    def run(self) -> RunReport:
        started = time.perf_counter()
        # A fresh deployment: powertools' parameter caches are per process, and every run's stack has the same
        # secret names, so a run would otherwise read the previous run's WorkflowIdSecret (other workflow ids,
        # other shards: a seed that replays only in a fresh process).
        parameters.clear_caches()
        with offline_aws(), powertools_on_clock(self.clock):
            self._setup()
            self._loop()
            self.report.violations = check_invariants(self)
            self._collect()
        self.report.wall_seconds = time.perf_counter() - started
        return self.report

    def _loop(self) -> None:
        start_times = sorted(
            START + self.rng.uniform(0, max(30.0, self.workflows * 1.0)) for _ in range(self.workflows)
        )
        for index in range(1, len(start_times)):
            if self.rng.random() < self.faults.burst_start:
                start_times[index] = start_times[index - 1]  # a burst: started together with the one before
        next_tick = START + TICK_SECONDS
        started = 0
        ticks_after_last_start = 0
        while True:
            urls = [event.queue_url for _, event in self.consumers]  # the batches' queue joins with the first batch
            # Deliver everything visible now, in random order, before moving time.
            progressed = True
            while progressed:
                progressed = False
                order = list(self.consumers)
                self.rng.shuffle(order)
                for logical_id, event_spec in order:
                    if self.rng.random() < self.faults.slow_poller:
                        # This consumer's poller lags a pass, so messages pile up (the replies of parallel siblings
                        # among them) and batches hold related messages, as under real load. The pass repeats until
                        # nothing is visible, so the messages are delivered later, never dropped.
                        progressed = True
                        continue
                    progressed |= self._deliver(logical_id, event_spec)
            if started < self.workflows and start_times[started] <= self.clock.now():
                self._start(started)
                started += 1
                continue
            if self.deliveries and self.deliveries[0].at <= self.clock.now():
                self._send_tick(self.deliveries.pop(0))
                continue
            if (
                started == self.workflows
                and not self.deliveries
                and self.queues.pending(urls) == 0
                and self._all_terminal()
            ):
                return
            candidates = [next_tick]
            if started < self.workflows:
                candidates.append(start_times[started])
            if self.deliveries:
                candidates.append(self.deliveries[0].at)
            visible = self.queues.next_visible_at(urls)
            if visible is not None:
                candidates.append(visible)
            target = max(self.clock.now(), min(candidates))
            self.clock.set(target)
            if self.clock.now() >= next_tick:
                self._tick()
                next_tick += TICK_SECONDS
                if started == self.workflows and not self.deliveries:
                    ticks_after_last_start += 1
                    if ticks_after_last_start > MAX_TICKS_AFTER_LAST_START:
                        return  # the invariants will report what did not finish

    def _send_tick(self, delivery: Delivery) -> None:
        """EventBridge Scheduler, a rule, a producer (or a hand-written send) puts a message on the trigger's queue."""
        message_id = self.queues.send(self.trigger_queue_url, delivery.body)
        self.trigger_log.deliveries += 1
        if delivery.identity is None:
            self.trigger_log.bad.add(delivery.body)
        elif delivery.identity == TEST_EVENT:
            self.trigger_log.test_events += 1
        elif delivery.identity == MESSAGE:  # an sqs trigger's occurrence: the message's id
            self.trigger_log.occurrences.add(f"message {message_id}")
        else:
            self.trigger_log.occurrences.add(delivery.identity)

    def _all_terminal(self) -> bool:
        snapshots = self.stored_workflows()
        # map steps' children are workflows too, and so are the ones the trigger started
        started = sum(1 for s in snapshots if s.workflow.parent is None and s.workflow.trigger is None)
        accepted = self.workflows - len(self.tenant_refused)  # a start refused for its tenant wrote nothing
        return started == accepted and all(s.workflow.status.value in _TERMINAL for s in snapshots)

    def _dynamodb_client(self) -> Any:
        """boto3's client on moto (world "moto"), or the same calls answered by moto's backend directly ("fast")."""
        return DirectDynamoDB() if self.world == "fast" else boto3.client("dynamodb")

    def dynamodb_checker(self) -> Any:
        """A client without crash hooks, for the simulation's own reads."""
        if not hasattr(self, "_checker"):
            self._checker = self._dynamodb_client()
        return self._checker

    def _collect(self) -> None:
        stored = self.stored_workflows()
        self.report.statuses = Counter(
            s.workflow.status.value for s in stored if s.workflow.parent is None and s.workflow.trigger is None
        )
        self.report.triggered = Counter(s.workflow.status.value for s in stored if s.workflow.trigger is not None)
        self.report.trigger_deliveries = self.trigger_log.deliveries
        self.report.trigger_dead_letters = len(self.queues.messages[self.trigger_config.dead_letter_url])
        self.report.trigger_skipped = len(self.trigger_log.skipped)
        self.report.trigger_missed = len(self.trigger_log.missed)
        self.report.trigger_kind = self.trigger_config.kind.value
        self.report.trigger_held = len(self.trigger_log.held)
        self.report.trigger_test_events = self.trigger_log.test_events
        self.report.trigger_overlap = self.trigger_config.overlap.value
        self.report.trigger_buffered = len(self.trigger_log.buffered)
        self.report.trigger_run_nows = len(set(self.run_now_keys))
        self.report.children = Counter(s.workflow.status.value for s in stored if s.workflow.parent is not None)
        self.report.limit_deferrals = sum(r.limit_deferrals for s in stored for r in s.steps.values())
        self.report.limited_calls = sum(len(self.remotes[agent].starts) for agent in self.limiters)
        self.report.tenant_refused = len(self.tenant_refused)
        self.report.tenant_workflows = sum(1 for s in stored if s.workflow.tenant is not None)
        self.report.tenant_queued = sum(1 for s in stored if s.workflow.queue_ticket is not None)
        self.report.faults = self.log.counts
        self.report.operator_actions = self.operator_actions
        self.report.callback_answers = self.callback_answers
        self.report.simulated_seconds = self.clock.now() - START
        self.report.state_digest = self._state_digest()
        self.report.dead_letters = sum(
            len(self.queues.messages[spec.dead_letter_url])
            for spec in self.queues.specs.values()
            if spec.dead_letter_url
        )

    def _state_digest(self) -> str:
        items = self.state_items()
        items.sort(key=lambda item: (item["pk"]["S"], item["sk"]["S"]))
        for item in items:
            if "lease_until" in item:
                item["owner"] = {"S": "<random: a supervisor instance's uuid4>"}
            if "cost" in item:
                # what the work cost (sasflow.cost) is measured, not decided: it holds Lambda's time on this machine
                # (and the fast world's clients are not metered); its size is fixed, so no write's cost depends on it
                item["cost"] = {"B": b"<measured>"}
        text = json.dumps(items, sort_keys=True, default=_blob_text)
        # A task token's secret part is random by design (secrets.token_urlsafe), whatever the seed.
        text = re.sub(r'("callback_nonce": \{"S": )"[^"]*"', r'\1"<random>"', text)
        return hashlib.sha256(text.encode()).hexdigest()


def _blob_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


_TERMINAL = {"COMPLETED", "COMPENSATED", "COMPENSATION_FAILED", "CANCELLED"}


class ClockContext(FakeLambdaContext):
    """A context whose deadline runs on the simulated clock (retries that sleep use up the invocation)."""

    def __init__(self, spec: FunctionSpec, clock: Clock) -> None:
        super().__init__(spec.logical_id, spec.timeout_seconds, spec.memory_mb)
        self._clock = clock
        self._deadline = clock.now() + spec.timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - self._clock.now()) * 1000))


def _keep_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    context["sim_params"] = params


def _sqs_event(messages: list[SimMessage], queue_arn: str) -> dict[str, Any]:
    return {
        "Records": [
            {
                "messageId": m.message_id,
                "receiptHandle": m.receipt,
                "body": m.body,
                "attributes": {
                    "ApproximateReceiveCount": str(m.receive_count),
                    "SentTimestamp": str(int(m.sent_at * 1000)),
                },
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": "us-east-1",
            }
            for m in messages
        ]
    }


_WORKFLOW_KEY = re.compile(r'"WF#([^"]+)"')


def _body_workflow_id(body: str) -> str | None:
    try:
        value = json.loads(body).get("workflow_id")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _success_tags(event: Any) -> set[Tag]:
    """The attempts of an SQS event's step replies that report SUCCEEDED."""
    records = event.get("Records", []) if isinstance(event, dict) else []
    tags: set[Tag] = set()
    for record in records:
        body = record.get("body", "")
        tag = tag_of(body)
        if tag is None:
            continue
        with contextlib.suppress(ValueError):
            message = json.loads(body)
            if message.get("kind") == "step.reply" and message.get("outcome") == Outcome.SUCCEEDED.value:
                tags.add(tag)
    return tags


def _earlier_success_applied(
    tag: Tag, before: dict[str, Any] | None, after: dict[str, Any] | None, successes: set[Tag]
) -> bool:
    """Whether the batch's success of an earlier attempt, under the step's current token, completed it (invariant
    11's exception): the action in flight as attempt n; a SUCCEEDED reply of an attempt in (attempt_base, n)."""
    workflow_id, name, phase, attempt = tag
    if phase != "action" or before is None or after is None:
        return False
    base = int(before.get("M", {}).get("attempt_base", {}).get("N", "0"))
    # FAILED: output too large; COMPENSATING and after: its workflow unwinds, so the write that completed it starts
    # its compensation at once (a map's child cancelled by its parent)
    if after.get("M", {}).get("status", {}).get("S") not in (
        "COMPLETED",
        "FAILED",
        "COMPENSATING",
        "COMPENSATED",
        "COMPENSATION_FAILED",
    ):
        return False
    return any((workflow_id, name, "action", earlier) in successes for earlier in range(base + 1, attempt))


def _event_tags(event: Any) -> list[Tag]:
    """The attempts of an SQS event's records (requests or replies); empty for any other event."""
    records = event.get("Records", []) if isinstance(event, dict) else []
    return [tag for r in records if (tag := tag_of(r.get("body", ""))) is not None]


def _workflow_ids(event: Any) -> set[str]:
    """The workflow ids of an SQS event's records (malformed bodies are skipped)."""
    records = event.get("Records", []) if isinstance(event, dict) else []
    return {wid for r in records if (wid := _body_workflow_id(r.get("body", ""))) is not None}


def scheduled_event(tick: int) -> dict[str, Any]:
    """The EventBridge scheduled event the supervisor receives on its ``tick``-th run."""
    return {
        "version": "0",
        "id": f"tick-{tick}",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "123456789012",
        "time": "",
        "region": "us-east-1",
        "resources": [],
        "detail": {},
    }


def start_event(body: Any, *, key: str) -> dict[str, Any]:
    """An HTTP API (payload 2.0) ``POST /workflows`` event with ``body`` and an ``Idempotency-Key``."""
    return {
        "version": "2.0",
        "routeKey": "POST /workflows",
        "rawPath": "/workflows",
        "rawQueryString": "",
        "headers": {"content-type": "application/json", **({"idempotency-key": key} if key else {})},
        "requestContext": {
            # what API Gateway adds once it has verified the caller's SigV4 signature (devstack.identities)
            "authorizer": request_context_authorizer(identity("client-a")),
            "http": {"method": "POST", "path": "/workflows", "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1"},
            "requestId": key,
            "routeKey": "POST /workflows",
            "stage": "$default",
        },
        "body": json.dumps(body),
        "isBase64Encoded": False,
    }


def callback_event(token: str, body: Any, *, request_id: str) -> dict[str, Any]:
    """An HTTP API (payload 2.0) ``POST /callbacks/{token}`` event of the workflows' owner (client-a)."""
    path = f"/callbacks/{token}"
    return {
        "version": "2.0",
        "routeKey": "POST /callbacks/{token}",
        "rawPath": path,
        "rawQueryString": "",
        "headers": {"content-type": "application/json"},
        "requestContext": {
            "authorizer": request_context_authorizer(identity("client-a")),
            "http": {"method": "POST", "path": path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1"},
            "requestId": request_id,
            "routeKey": "POST /callbacks/{token}",
            "stage": "$default",
        },
        "pathParameters": {"token": token},
        "body": json.dumps(body),
        "isBase64Encoded": False,
    }


def ops_event(path: str, body: Any, *, key: str) -> dict[str, Any]:
    """An HTTP API (payload 2.0) ``POST /ops/...`` event of the local operator, with an ``Idempotency-Key``: an action
    on a workflow (``/ops/workflows/{workflow_id}/{action}``), on a trigger (``/ops/triggers/{name}/{action}``), or
    an answer to a callback step (``/ops/callbacks/{token}``)."""
    parts = path.split("/")
    route, name = {
        "triggers": ("POST /ops/triggers/{name}/{action}", "name"),
        "callbacks": ("POST /ops/callbacks/{token}", "token"),
        "batches": ("POST /ops/batches/{batch_id}/cancel", "batch_id"),
    }.get(parts[2], ("POST /ops/workflows/{workflow_id}/{action}", "workflow_id"))
    parameters: dict[str, str] | None
    if path == "/ops/batches":
        route, parameters = "POST /ops/batches", None
    elif parts[2] in ("callbacks", "batches"):
        parameters = {name: parts[3]}
    else:
        parameters = {name: parts[3], "action": parts[4]}
    return {
        "version": "2.0",
        "routeKey": route,
        "rawPath": path,
        "rawQueryString": "",
        "headers": {"content-type": "application/json", **({"idempotency-key": key} if key else {})},
        "requestContext": {
            "authorizer": request_context_authorizer(identity("operator")),
            "http": {"method": "POST", "path": path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1"},
            "requestId": key or path,
            "routeKey": route,
            "stage": "$default",
        },
        **({"pathParameters": parameters} if parameters else {}),
        "body": json.dumps(body),
        "isBase64Encoded": False,
    }


def run_one(seed: int, workflows: int, faults: Faults | None = None, world: str = "fast") -> RunReport:
    """Run one simulation (a separate moto backend; safe to call in a worker process). Logging is off while it runs
    and as it was afterwards (a bench run later in the process counts the functions' log lines)."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)  # the handlers log every injected crash; the report says what matters
    try:
        return Simulation(seed, workflows, faults, world=world).run()
    finally:
        logging.disable(previous)


def run_many(
    seed: int,
    workflows: int,
    runs: int,
    faults: Faults | None = None,
    *,
    jobs: int = 1,
    progress: Callable[[RunReport], None] | None = None,
    world: str = "fast",
) -> list[RunReport]:
    """Run ``runs`` simulations of ``workflows`` each, with seeds ``seed, seed+1, ...``, on ``jobs`` processes.

    Each run is independent and deterministic for its seed, so the order of completion does not matter.
    """
    seeds = [seed + index for index in range(runs)]
    reports: list[RunReport] = []
    if jobs <= 1:
        for each in seeds:
            reports.append(run_one(each, workflows, faults, world))
            if progress is not None:
                progress(reports[-1])
        return reports
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(run_one, each, workflows, faults, world) for each in seeds]
        for future in as_completed(futures):
            reports.append(future.result())
            if progress is not None:
                progress(reports[-1])
    return sorted(reports, key=lambda r: r.seed)
