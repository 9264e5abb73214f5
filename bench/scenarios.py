"""The bench scenarios (S1 to S7), run through the real handlers on moto with every AWS call metered.

One run: the tables and queues from template.yaml inside ``moto.mock_aws``; the real Lambda handlers (API,
scheduler, three agents, supervisor) loaded in process, each building its own boto3 clients exactly as on Lambda, so
the `bench.accounting.Meter` sees every call; the remote services are the simulation's `SimRemote` (a ledger by
token, with fault knobs). Time is a `ManualClock` shared by the handlers, powertools' idempotency and moto's SQS
(visibility timeouts, delays), so a run is deterministic for its seed and fast.

How AWS is emulated, and why the counts are what AWS would bill:

- **Event source mapping.** Each SQS-triggered function's queue is drained the way the template's mapping does it
  (``BatchSize: 10``, ``MaximumBatchingWindowInSeconds`` as deployed: the ``Profile``'s windows, ``cost`` unless
  told otherwise (`COST_PARAMETERS`), or ``SchedulerBatchingWindowSeconds`` and ``AgentBatchingWindowSeconds`` when
  they are set): ``ReceiveMessage`` up to 10, invoke the handler with the batch,
  ``DeleteMessageBatch`` for the records that did not fail. These requests are made against moto and counted. A
  mapping invokes as Lambda's does (Lambda developer guide, "Using Lambda with Amazon SQS": records are gathered
  until the batching window expires or the batch size is reached): with a window of W > 0 s, once W seconds have
  passed since the first message visible now became visible (then all that is visible, 10 at a time), and at once
  for each full batch of 10 (the rest goes on gathering); a mapping with a 0 s window drains its queue at the
  instant a message becomes visible, so its batches hold only what arrived together (one ``SendMessageBatch``),
  the smallest batches and the most requests per step; Lambda's five pollers may split such a batch further, so
  at 0 s this count is a lower bound. (Before 2026-12-07 a mapping with a window drained at most once per W
  seconds since its last drain: an idle queue's message went at once, a busy queue's waited for the window.)
  `check_mappings` refuses windows AWS does not take (not whole seconds in 0..300).
- **Empty long polls** are not made against moto (the emulation knows when a queue is empty); they are added as a
  modelled fixed cost: an idle mapping keeps 5 long polls of 20 s open (Lambda developer guide, "Using Lambda with
  Amazon SQS": Lambda starts with five polling connections; ``ReceiveMessageWaitTimeSeconds`` 20 s), so an idle
  queue costs 5 requests per 20 s.
- **Instances.** Each agent's function is one instance with its own time (`InstanceClock`): what its invocation
  waits for (a call limit's token, a slow call) moves its time, not the world's, so the other functions run
  meanwhile as Lambda runs them at once; what it sends then is visible from that time on. A batch's records start
  in the agent's service order, one after the other, and the call limits see the batch's records at once
  (`CallLimiter.expect`), as its threads do on AWS. The queues deliver as SQS fair queues (`devstack.fair_queues`).
- **Schedule.** The supervisor runs every 60 simulated seconds (the template's ``rate(1 minute)``); EventBridge
  scheduled rules are free, the supervisor's Lambda time and calls are counted.
- **API Gateway.** Each start is one HTTP API request to the API function.
- **Callbacks (S5).** The approver answers each callback step's token the second it is issued, with
  ``POST /callbacks/{token}`` on the API function (one HTTP API request and one invocation, counted). It reads the
  token from the table (uncounted): it stands for whoever the ``notify`` action reached, and that action (an
  agent's request carrying the token) is counted like any step's.
- **Triggers (S6).** The workflows start from occurrences instead of the API: events an EventBridge rule delivers
  to the event trigger's queue (S6: the event's PutEvents, $1 per million, and the rule's SendMessage, counted),
  messages a producer sends to the sqs trigger's queue (S6-sqs: the send counted), and S3's notifications of
  uploads (S6-s3: the notification's SendMessage counted; the upload is the user's on either side). The trigger's
  function runs under its own mapping (receives and deletes counted, and its Lambda time, as the engine's).
- **Tenants (S1-tenancy, S7).** The definition limits each tenant (``tenancy``, the input's ``customer``): S1-tenancy
  is S1 with a limit nobody reaches (what the slots cost on the happy path); in S7 one tenant starts 2,000
  workflows at once and another 20, one a second, under ``max_running`` 20 with a queue: the quiet tenant's time
  from start to end is compared with its time alone (S7-alone, the same 20 with nobody else).
- **Lambda time** is the wall time of each handler call on this machine (moto answers in process, in about the time
  DynamoDB and SQS take), rounded up to 1 ms and billed at the template's ``MemorySize``.

What is left out on both sides (issue 4): the agents' own Lambda invocations and compute, which Step Functions would
spend too. The agents' DynamoDB (idempotency records, circuit breaker) and SQS requests are ours and are counted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import itertools
import json
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import boto3

from bench.accounting import Meter, Usage
from devstack.event_sources import build_sqs_record
from devstack.inprocess import environment, function_environment, load_function_module, offline_aws
from devstack.provision import provision
from devstack.template import FunctionSpec, SqsEventSpec, Stack, remote_service_parameters
from sasflow.adapters.dynamodb_store import WORKFLOW_SORT_KEY, DynamoDBStateStore, item_size, workflow_item
from sasflow.agent_lambda import metric_counter
from sasflow.batch import one_at_a_time
from sasflow.bootstrap import Lazy, build_agent, build_engine
from sasflow.callbacks import task_token
from sasflow.clock import ManualClock
from sasflow.cost import Tally, forget_ledgers
from sasflow.records import Snapshot
from simulation.run import AGENT_FUNCTIONS, START, ClockContext, callback_event, scheduled_event, start_event
from simulation.world import FaultLog, Faults, SimRemote, powertools_on_clock

ROOT = Path(__file__).resolve().parents[1]
_AGENT_OF = {logical_id: agent for agent, logical_id in AGENT_FUNCTIONS.items()}
TICK_SECONDS = 60
IDLE_POLLERS = 5
LONG_POLL_SECONDS = 20
ENGINE_FUNCTIONS = ("ApiFunction", "SchedulerFunction", "SupervisorFunction")
#: The batches' runner: its queue carries operators' batches, not workflows' steps (``workflow_consumers``).
BATCH_FUNCTION = "BatchFunction"
TERMINAL = {"COMPLETED", "COMPENSATED", "COMPENSATION_FAILED", "CANCELLED"}
MAX_SIMULATED_SECONDS = 6 * 3600


@dataclass(frozen=True)
class Scenario:
    """One bench scenario.

    Attributes
    ----------
    name, title:
        ``S1`` and what it is.
    steps:
        Steps per workflow (a chain).
    workflows:
        Workflows started.
    arrivals_per_second:
        Start requests per simulated second (a steady load, so batches fill as they would in production).
    faults:
        The remote services' fault rates (the simulation's `Faults`).
    lost_invocation:
        Probability that an agent invocation dies before it calls out (its batch comes back after the visibility
        timeout, by then the step is overdue and the supervisor resends it).
    seed:
        Seed of every random draw.
    callback:
        Whether an approval (a ``callback`` step whose token goes out through ``notify``) follows the first step.
    map_items:
        When set, each workflow is one map step over this many items (`map_definition`): a child workflow each.
    trigger:
        When set (``event``, ``sqs``, ``s3``), the workflows start from that trigger of triggers.yaml, not the API.
    parameters:
        Template parameter overrides ``(name, value)`` the run deploys with (e.g. the batching windows); the
        template's defaults otherwise.
    """

    name: str
    title: str
    steps: int
    workflows: int
    arrivals_per_second: float = 2.0
    faults: Faults = field(default_factory=Faults.none)
    lost_invocation: float = 0.0
    seed: int = 7
    callback: bool = False
    map_items: int = 0
    parameters: tuple[tuple[str, str], ...] = ()
    trigger: str = ""
    #: When above 0, the definition limits each tenant (the input's ``customer``) to this many running, the rest
    #: queued (``tenancy``, ``over_limit: queue``).
    max_running: int = 0
    #: The last ``quiet`` workflows are a quiet tenant's, started ``arrivals_per_second`` apart from the start; the
    #: others are a bursting tenant's, all started at once (S7; all of them quiet: its baseline, alone). 0: every
    #: workflow at the steady pace, of five tenants.
    quiet: int = 0


#: What the cost scenarios deploy with, unless ``parameters`` say otherwise: the template's ``cost`` profile (the
#: batching windows that the cost targets are for; the ``latency`` profile's cost is measured by `bench.windows`).
COST_PARAMETERS: Final[Mapping[str, str]] = MappingProxyType({"Profile": "cost"})


def scenarios(scale: float = 1.0, parameters: dict[str, str] | None = None) -> list[Scenario]:
    """S1 to S6 with ``workflows`` scaled by ``scale`` (the smoke test uses a tiny scale).

    Every scenario deploys with `COST_PARAMETERS`, updated with ``parameters`` (``--parameter-overrides`` of
    ``python -m bench``; the window parameters override the profile's windows).
    """
    overrides = tuple(sorted({**COST_PARAMETERS, **(parameters or {})}.items()))
    return [dataclasses.replace(s, parameters=overrides) for s in _scenarios(scale)]


def _scenarios(scale: float) -> list[Scenario]:
    def n(value: int) -> int:
        return max(2, round(value * scale))

    s2_faults = dataclasses.replace(Faults.none(), remote_transient=0.2, remote_reject=0.05)
    return [
        Scenario("S1", "3-step workflows, happy path", 3, n(200)),
        Scenario(
            "S2",
            "3 steps, 20% transient faults, lost invocations (supervisor resends), rejections (compensation)",
            3,
            n(200),
            faults=s2_faults,
            lost_invocation=0.03,
        ),
        Scenario("S3", "10-step workflows, happy path", 10, n(100)),
        Scenario(
            "S4",
            f"a map step of {n(1000):,} items (a one-step child workflow each, 100 at once), happy path",
            1,
            1,
            map_items=n(1000),
        ),
        Scenario(
            "S5",
            "3 steps and an approval (a callback step, its token sent through notify), answered at once",
            3,
            n(100),
            callback=True,
        ),
        Scenario(
            "S6",
            "3-step workflows started by events (an EventBridge rule to the event trigger)",
            3,
            n(1000),
            trigger="event",
        ),
        Scenario("S6-sqs", "3-step workflows started by messages to the sqs trigger's queue", 3, n(200), trigger="sqs"),
        Scenario(
            "S1-tenancy",
            "S1 with a limit per tenant nobody reaches (tenancy: max_running 50 per customer, queued over it)",
            3,
            n(200),
            max_running=50,
        ),
        Scenario(
            "S7-alone",
            f"a quiet tenant's {QUIET} workflows, one a second, alone (S7's baseline)",
            3,
            QUIET,
            max_running=S7_MAX_RUNNING,
            quiet=QUIET,
            arrivals_per_second=1.0,
        ),
        Scenario(
            "S7",
            f"one tenant starts {n(2000):,} workflows at once beside a quiet one starting {QUIET}, one a second "
            f"(tenancy: max_running {S7_MAX_RUNNING} per tenant, queued over it)",
            3,
            n(2000) + QUIET,
            max_running=S7_MAX_RUNNING,
            quiet=QUIET,
            arrivals_per_second=1.0,
        ),
        Scenario(
            "S6-s3",
            "3-step workflows started by uploads (S3's notifications to the s3 trigger)",
            3,
            n(200),
            trigger="s3",
        ),
    ]


#: S7: the quiet tenant's workflows, and each tenant's max_running.
QUIET = 20
S7_MAX_RUNNING = 20


def chain_definition(steps: int) -> dict[str, Any]:
    """A chain of ``steps`` steps over the three sample agents; the first three are the sample trip booking."""
    request = json.loads((ROOT / "events" / "trip_booking_request.json").read_text())
    template: list[dict[str, Any]] = request["definition"]["steps"]
    result: list[dict[str, Any]] = []
    for index in range(steps):
        step = json.loads(json.dumps(template[index % 3]))
        step["name"] = template[index % 3]["name"] if index < 3 else f"{template[index % 3]['name']}_{index}"
        step["depends_on"] = [result[-1]["name"]] if result else []
        step["input"] = {k: v for k, v in step["input"].items() if not v.startswith("steps.")}
        if result:
            step["input"]["previous.$"] = f"steps.{result[-1]['name']}.output.confirmation"
        result.append(step)
    return {"name": f"chain-{steps}", "version": 1, "steps": result}


#: The approval of S5: a callback step after the first step, its token sent through an agent's action (as the
#: simulation's approvals do), one attempt of an hour.
APPROVAL_STEP: dict[str, Any] = {
    "name": "approval",
    "type": "callback",
    "timeout_seconds": 3600,
    "notify": {"agent": "payments", "action": "charge", "input": {"amount.$": "input.amount"}},
}


#: The child workflow of S4's map step: one step of the sample trip (charge the item's amount, refunded when undone).
MAP_CHILD_STEP: dict[str, Any] = {
    "name": "charge_item",
    "agent": "payments",
    "action": "charge",
    "input": {"amount.$": "input.item", "currency": "EUR"},
    "timeout_seconds": 30,
    "compensation": {"action": "refund", "input": {"amount.$": "input.item"}},
}
#: S4's concurrency: children in flight at once.
MAP_CONCURRENCY = 100


def map_definition() -> dict[str, Any]:
    """S4's workflow: one map step over ``input.orders``, a one-step child workflow each (`MAP_CHILD_STEP`)."""
    child = {"name": "charge-item", "version": 1, "steps": [MAP_CHILD_STEP]}
    step = {
        "name": "charge_items",
        "type": "map",
        "items": "input.orders",
        "definition": child,
        "max_concurrency": MAP_CONCURRENCY,
    }
    return {"name": "map-items", "version": 1, "steps": [step]}


def callback_definition(steps: int) -> dict[str, Any]:
    """`chain_definition` with `APPROVAL_STEP` after its first step (the next step waits for it)."""
    definition = chain_definition(steps)
    first, *rest = definition["steps"]
    approval = {**APPROVAL_STEP, "depends_on": [first["name"]]}
    if rest:
        rest[0] = {**rest[0], "depends_on": ["approval"]}
    definition["steps"] = [first, approval, *rest]
    definition["name"] = f"chain-{steps}-approval"
    return definition


@dataclass
class StepFacts:
    """What happened to one step of one workflow (from the remote ledgers and the final state)."""

    status: str = ""
    forward_ok: bool = False
    resends: int = 0
    action_calls: int = 0
    compensation_calls: int = 0
    lost_invocations: int = 0


@dataclass
class ScenarioResult:
    """The counts of one scenario run. ``orchestration`` excludes the agents' own Lambda work."""

    scenario: Scenario
    usage: Usage
    statuses: Counter[str]
    steps_run: int
    facts: dict[str, dict[str, StepFacts]]
    simulated_seconds: float
    idle_queue_seconds: float
    empty_polls: float
    receive_batches: list[int]
    supervisor_resends: int
    memory_mb: dict[str, int]
    definition: dict[str, Any]
    wall_seconds: float = 0.0
    #: Map steps' children by status (they are workflows of their own; ``statuses`` counts the started ones).
    children: Counter[str] = field(default_factory=Counter)
    #: The largest started workflow's item (bytes, by DynamoDB's rules), as last stored.
    parent_item_bytes: int = 0
    #: The trigger function the workflows started from (S6), if any.
    trigger_function: str | None = None
    #: Calls each agent's function (logical id) made to its remote service, every attempt of every phase.
    remote_calls: dict[str, int] = field(default_factory=dict)
    #: How long each agent's invocations waited for their calls, in calls: a batch's records call at once
    #: (``AGENT_CONCURRENCY`` at a time), so an invocation waits for its longest chain of calls (`calls_waited`).
    remote_waits: dict[str, int] = field(default_factory=dict)
    #: Invocations of each agent's function that died before they called out (`Scenario.lost_invocation`).
    lost_invocations: dict[str, int] = field(default_factory=dict)
    #: What the product tallied on each workflow's item (`sasflow.cost`), by workflow id (map children included).
    tallies: dict[str, Tally] = field(default_factory=dict)
    #: Each tenant's workflows' times from start to end (simulated seconds, sorted), by the input's ``customer``.
    durations: dict[str, list[float]] = field(default_factory=dict)
    #: Workflows that waited QUEUED for their tenant's slot.
    queued: int = 0

    @property
    def workflows(self) -> int:
        return sum(self.statuses.values())


class _LogSink(io.TextIOBase):
    """Standard output of the functions under test: counts the bytes each function writes (``Usage.log_bytes``).

    One sink for the process: powertools' Logger binds the stream when a function's module is first imported, and
    the modules are imported once, so every run counts through the same sink, into the meter of the run going on.
    """

    def __init__(self) -> None:
        super().__init__()
        self.meter: Meter | None = None

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.meter is not None:
            function = self.meter.current_function() or "outside a function"
            self.meter.usage.log_bytes[function] += len(text.encode("utf-8", "surrogatepass"))
        return len(text)


_LOG_SINK = _LogSink()


class _CountingRemote(SimRemote):
    """A `SimRemote` that also counts calls by (workflow, step, phase): the Task attempts Step Functions would make."""

    def __init__(self, *args: Any, calls: Counter[tuple[str, str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.step_calls = calls
        self.made = 0

    def call(self, request: Any, timeout_seconds: float) -> dict[str, Any]:
        self.step_calls[(request.workflow_id, request.step, request.phase.value)] += 1
        self.made += 1
        return super().call(request, timeout_seconds)


class InstanceClock:
    """The time of one function's instance: the world's (`ManualClock`), or later while the instance is busy.

    What the instance waits for (a call limit's token, a slow call) moves only its own time, never the world's:
    other functions run meanwhile, as Lambda runs them at once. A message it sends then is sent at its own time
    (`_moto_sqs_on` makes it wait until then), and its next invocation starts once it is free again.
    """

    def __init__(self, world: ManualClock) -> None:
        self.world = world
        self._busy_until = -math.inf

    def now(self) -> float:
        """The world's time, or the instance's when it is busy until later."""
        return max(self.world.now(), self._busy_until)

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on the instance's own time."""
        if seconds < 0:
            raise ValueError("time never goes backwards")
        self._busy_until = self.now() + seconds

    advance = sleep


@contextlib.contextmanager
def _moto_sqs_on(clock: Callable[[], Any]) -> Iterator[None]:
    """Make moto's SQS (visibility timeouts, delays, timestamps) read the clock ``clock()`` returns (the world's, or
    an invoked instance's), and a message never visible before the time it was sent (an instance's time may be
    ahead of the world's)."""
    import moto.sqs.models as sqs_models

    module: Any = sqs_models
    saved = (module.unix_time, module.unix_time_millis, module.Message.mark_sent)
    module.unix_time = lambda dt=None: clock().now()
    module.unix_time_millis = lambda dt=None: clock().now() * 1000.0
    mark_sent = module.Message.mark_sent

    def sent_then(message: Any, delay_seconds: int | None = None) -> None:
        mark_sent(message, delay_seconds)
        message.delayed_until = max(message.delayed_until, float(message.sent_timestamp))

    module.Message.mark_sent = sent_then
    try:
        yield
    finally:
        module.unix_time, module.unix_time_millis, module.Message.mark_sent = saved


class ScenarioRun:
    """Runs one `Scenario` and returns its `ScenarioResult`."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.rng = random.Random(scenario.seed)
        self.clock = ManualClock(START)
        #: Each agent's instance's time (`InstanceClock`), and the clock moto's SQS reads: the invoked agent's
        self.lanes = {agent: InstanceClock(self.clock) for agent in AGENT_FUNCTIONS}
        self.sqs_clock: ManualClock | InstanceClock = self.clock
        self.meter = Meter()
        self.step_calls: Counter[tuple[str, str, str]] = Counter()
        self.lost: Counter[tuple[str, str, str]] = Counter()
        self.lost_invocations: Counter[str] = Counter()
        self.remote_waits: Counter[str] = Counter()
        if scenario.map_items:
            self.definition = map_definition()
        elif scenario.callback:
            self.definition = callback_definition(scenario.steps)
        else:
            self.definition = chain_definition(scenario.steps)
        if scenario.max_running:
            self.definition["tenancy"] = {
                "max_running": scenario.max_running,
                "tenant_key": "customer",
                "over_limit": "queue",
            }
        self.answered: set[str] = set()
        #: When each workflow was started and first seen ended (simulated seconds), by its input's traveller.
        self.started_at: dict[str, float] = {}
        self.ended_at: dict[str, float] = {}
        self._travellers: dict[str, str | None] = {}  # by workflow item key (`_looks`)
        self.receive_batches: list[int] = []
        self.idle_queue_seconds = 0.0

    def run(self) -> ScenarioResult:
        import time

        started = time.perf_counter()
        # The functions log as deployed (the template's LogLevel), into a sink that counts what CloudWatch Logs
        # would ingest, by the function that wrote it: their log lines and their metrics (EMF lines).
        _LOG_SINK.meter = self.meter
        try:
            with (
                contextlib.redirect_stdout(_LOG_SINK),
                offline_aws(),
                powertools_on_clock(self.clock),
                _moto_sqs_on(lambda: self.sqs_clock),
                self.meter.installed(),
            ):
                self._setup()
                self._loop()
                result = self._result()
        finally:
            _LOG_SINK.meter = None
        result.wall_seconds = time.perf_counter() - started
        return result

    # ------------------------------------------------------------------ setup
    def _setup(self) -> None:
        from aws_lambda_powertools.utilities import parameters as powertools_parameters

        # Every run starts from cold sandboxes: powertools' parameter cache lives in the process, so without this
        # only the first run of a process would read (and be billed for) the workflow-id secret.
        powertools_parameters.clear_caches()
        forget_ledgers()  # and no work a previous run left pending (sasflow.cost)
        parameters = remote_service_parameters({agent: f"https://{agent}.bench.invalid" for agent in AGENT_FUNCTIONS})
        parameters.update(dict(self.scenario.parameters))
        self.stack = Stack.from_file(ROOT / "template.yaml", parameters=parameters)
        with self.meter.paused():
            self.physical = provision(self.stack, secret_values={"WorkflowIdSecret": "bench-workflow-id-key"})
            self.observer = boto3.client("dynamodb")  # the bench's own reads: created paused, never counted
            self.sqs_observer = boto3.client("sqs")
            self.observer_store = DynamoDBStateStore(self.physical["StateTable"], self.observer)
        self.specs = {spec.logical_id: spec for spec in self.stack.functions()}
        log = FaultLog()
        seq = itertools.count(1)
        self.remotes = {
            agent: _CountingRemote(
                agent,
                self.lanes[agent],
                random.Random(self.rng.random()),
                self.scenario.faults,
                log,
                seq,
                calls=self.step_calls,
            )
            for agent in AGENT_FUNCTIONS
        }
        self.modules: dict[str, Any] = {}
        for logical_id in ENGINE_FUNCTIONS:
            spec = self.specs[logical_id]
            module: Any = load_function_module(spec)
            env = function_environment(spec)
            rng = random.Random(self.rng.random())  # the scheduler's backoff jitter: seeded, so a run replays
            correlate = module.logger.set_correlation_id  # as the handler wires it (its log lines name the workflow)
            module.engine = Lazy(functools.partial(build_engine, env, clock=self.clock, rng=rng, correlate=correlate))
            self.modules[logical_id] = module
        for agent, logical_id in AGENT_FUNCTIONS.items():
            spec = self.specs[logical_id]
            module = load_function_module(spec)
            env = function_environment(spec)
            rng = random.Random(self.rng.random())
            # its metrics as deployed (agent_services): the EMF line each invocation writes is in its log bill; its
            # records at once as deployed, on this thread in any order (their waits: `calls_waited`)
            module.agent = Lazy(
                functools.partial(
                    build_agent,
                    env,
                    clock=self.lanes[agent],
                    remote=self.remotes[agent],
                    rng=rng,
                    metrics=metric_counter(module.handler),
                    records=one_at_a_time,
                )
            )
            self.modules[logical_id] = module
        self.trigger_id: str | None = None
        if self.scenario.trigger:
            self._setup_trigger()
        # powertools' loggers of one service share one handler; the functions point it at sasflow.cost.LOG_STREAM,
        # which writes to whatever sys.stdout is (here the counting sink), so every run counts its own lines
        self.consumers = workflow_consumers(self.specs.values())
        if self.trigger_id is not None:
            self.consumers += [
                (self.trigger_id, e) for e in self.specs[self.trigger_id].events if isinstance(e, SqsEventSpec)
            ]
        check_mappings(self.consumers)
        # The SQS client of the event source mappings (Lambda's pollers): counted.
        self.poller = boto3.client("sqs")

    def _setup_trigger(self) -> None:
        """S6: the trigger function of triggers.yaml of the scenario's kind, and the definition it starts published
        as its owner would (uncounted: once per deployment)."""
        from sasflow.bootstrap import build_trigger
        from sasflow.definition import parse_definition
        from sasflow.registry import DefinitionRegistry

        [spec] = [
            spec
            for spec in self.specs.values()
            if "TRIGGER" in spec.environment
            and json.loads(function_environment(spec)["TRIGGER"])["kind"] == self.scenario.trigger
        ]
        self.trigger_id = spec.logical_id
        self.trigger_config = json.loads(function_environment(spec)["TRIGGER"])
        module: Any = load_function_module(spec)
        env = function_environment(spec)
        correlate = module.logger.set_correlation_id
        module.service = Lazy(functools.partial(build_trigger, env, clock=self.clock, correlate=correlate))
        self.modules[spec.logical_id] = module
        [event] = [e for e in spec.events if isinstance(e, SqsEventSpec)]
        self.trigger_queue_url = event.queue_url
        name = self.trigger_config["definition"]
        with self.meter.paused():
            DefinitionRegistry(self.observer_store).publish(
                name, 1, parse_definition({**self.definition, "name": name}), owner="bench", now=int(START)
            )

    # ------------------------------------------------------------------ invocation
    def _invoke(self, logical_id: str, event: Any) -> Any:
        spec = self.specs[logical_id]
        # Metrics on, as deployed (the local stack turns them off): each invocation's EMF line is in its log bill.
        deployed = {**function_environment(spec), "POWERTOOLS_METRICS_DISABLED": "false"}
        # an agent's records, by the step request each carries: how many calls each made is its chain of waits
        agent = logical_id in AGENT_FUNCTIONS.values()
        keys = [_request_key(record) for record in event["Records"]] if agent else []
        before = {key: self.step_calls[key] for key in keys}
        lane = self.lanes[_AGENT_OF[logical_id]] if agent else self.clock
        self.sqs_clock = lane
        try:
            with environment(deployed), self.meter.lambda_invocation(logical_id):
                return self.modules[logical_id].handler(event, ClockContext(spec, lane))
        finally:
            self.sqs_clock = self.clock
            if agent:
                chains = []
                for key in keys:
                    chains.append(self.step_calls[key] - before[key])
                    before[key] = self.step_calls[key]  # a copy of the same request in the batch made no more calls
                self.remote_waits[logical_id] += calls_waited(chains, int(deployed.get("AGENT_CONCURRENCY", "1")))

    def _occur(self, index: int, workflow_input: dict[str, Any]) -> None:
        """S6: one occurrence reaches the trigger's queue, sent (and counted) as its source sends it."""
        from urllib.parse import quote_plus

        from devstack.events import envelope

        when = datetime.fromtimestamp(int(self.clock.now()), UTC)
        kind = self.scenario.trigger
        if kind == "event":
            self.meter.usage.eventbridge_events += 1  # the producer's PutEvents; the rule's delivery is free
            body = json.dumps(
                envelope(
                    "sasflow.demo",
                    "TripRequested",
                    workflow_input,
                    region="us-east-1",
                    event_id=f"e-{index}",
                    time=when,
                )
            )
        elif kind == "sqs":
            body = json.dumps(workflow_input)
        else:
            key = f"requests/{workflow_input['traveller']} trip.json"
            found = {"key": quote_plus(key), "size": 512, "eTag": "9b2cf535f27731c974343645a3985328"}
            found |= {"versionId": f"v{index}", "sequencer": f"{index:018X}"}
            record = {
                "eventVersion": "2.1",
                "eventSource": "aws:s3",
                "eventTime": when.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
                "eventName": "ObjectCreated:Put",
                "s3": {"bucket": {"name": self.trigger_config["bucket"]}, "object": found},
            }
            body = json.dumps({"Records": [record]})
        with self.meter.attributed(f"{kind} delivery"):
            self.poller.send_message(QueueUrl=self.trigger_queue_url, MessageBody=body)

    def _start(self, index: int) -> None:
        workflow_input: dict[str, Any] = {
            "traveller": f"t-{index}",
            "route": "LHR-JFK",
            "nights": 1 + index % 4,
            "amount": 100 + index,
        }
        self.started_at[workflow_input["traveller"]] = self.clock.now()
        if self.scenario.max_running:
            quiet = index >= self.scenario.workflows - self.scenario.quiet if self.scenario.quiet else False
            workflow_input["customer"] = "quiet" if quiet else ("burst" if self.scenario.quiet else f"c{index % 5}")
        if self.scenario.map_items:
            workflow_input["orders"] = [100 + i for i in range(self.scenario.map_items)]
        if self.scenario.trigger:
            self._occur(index, workflow_input)
            return
        body = {"definition": self.definition, "input": workflow_input}
        self.meter.usage.api_requests += 1
        response = self._invoke("ApiFunction", start_event(body, key=f"bench-{self.scenario.name}-{index}"))
        if response["statusCode"] not in (200, 201):
            raise RuntimeError(f"start {index} failed: {response}")

    def _deliver(self, logical_id: str, event_spec: SqsEventSpec) -> None:
        """One batching window of the event source mapping: drain what is visible now, 10 at a time (a trigger's
        mapping's requests are its own: S6 reports what a start costs)."""
        if logical_id == self.trigger_id:
            with self.meter.attributed(f"{logical_id} mapping"):
                self._drain(logical_id, event_spec)
        else:
            self._drain(logical_id, event_spec)

    def _drain(self, logical_id: str, event_spec: SqsEventSpec) -> None:
        # before its window ends, only full batches go (the rest goes on gathering)
        since = self._visible_since(event_spec.queue_url)
        full_only = bool(since) and self.clock.now() < min(since) + event_spec.batching_window_seconds
        while (
            len(self._visible_since(event_spec.queue_url)) >= _batch(event_spec)
            if full_only
            else self._visible(event_spec.queue_url)
        ):
            messages = self.poller.receive_message(
                QueueUrl=event_spec.queue_url,
                MaxNumberOfMessages=min(event_spec.batch_size, 10),
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
                WaitTimeSeconds=0,
            ).get("Messages", [])
            if not messages:
                return
            self.receive_batches.append(len(messages))
            if logical_id in AGENT_FUNCTIONS.values() and self.rng.random() < self.scenario.lost_invocation:
                # The invocation dies before it calls out (a crash, a timeout): the batch comes back after the
                # visibility timeout. Its Lambda time is agent work, left out of the orchestration cost on both sides
                # (the whole bill counts it as an invocation that waited as long as a call, `cost.whole_bill`).
                self.lost_invocations[logical_id] += 1
                for message in messages:
                    request = json.loads(message["Body"])
                    self.lost[(request["workflow_id"], request["step"], request["phase"])] += 1
                continue
            event = {
                "Records": [build_sqs_record(m, queue_arn=event_spec.queue_arn, region="us-east-1") for m in messages]
            }
            try:
                result = self._invoke(logical_id, event)
            except Exception:  # the whole batch fails; SQS redelivers it
                continue
            failed = {f["itemIdentifier"] for f in (result or {}).get("batchItemFailures", [])}
            done = [m for m in messages if m["MessageId"] not in failed]
            for chunk in range(0, len(done), 10):
                self.poller.delete_message_batch(
                    QueueUrl=event_spec.queue_url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                        for i, m in enumerate(done[chunk : chunk + 10])
                    ],
                )

    def _queue(self, url: str) -> Any:
        from moto.sqs.models import sqs_backends

        return sqs_backends["123456789012"]["us-east-1"].queues[url.rsplit("/", 1)[1]]

    def _visible(self, url: str) -> bool:
        queue = self._queue(url)
        return any(m.visible and not m.delayed for m in queue._messages)

    def _next_visible_at(self) -> float | None:
        times = []
        for _, event_spec in self.consumers:
            for message in self._queue(event_spec.queue_url)._messages:
                times.append(max(message.visible_at, message.delayed_until or 0) / 1000.0)
        return min(times) if times else None

    # ------------------------------------------------------------------ the loop
    def _arrivals(self) -> list[tuple[float, int]]:
        """(when, index) of each start, in time order: a steady pace; or (S7) the bursting tenant's all at once and
        the quiet tenant's at the pace."""
        interval = 1.0 / self.scenario.arrivals_per_second
        quiet = self.scenario.quiet
        if not quiet:
            return [(START + index * interval, index) for index in range(self.scenario.workflows)]
        first_quiet = self.scenario.workflows - quiet
        burst = [(START, index) for index in range(first_quiet)]
        return burst + [(START + k * interval, first_quiet + k) for k in range(quiet)]

    def _loop(self) -> None:
        schedule = self._arrivals()
        arrivals = [at for at, _ in schedule]
        started = 0
        next_tick = START + TICK_SECONDS
        ticks = 0
        while True:
            while started < len(arrivals) and arrivals[started] <= self.clock.now():
                self._start(schedule[started][1])
                started += 1
            self._deliver_due()
            if self.scenario.quiet:
                self._note_ended()
            if self.scenario.callback:
                self._approve()
            if self.clock.now() >= next_tick:
                ticks += 1
                self._invoke("SupervisorFunction", scheduled_event(ticks))
                next_tick += TICK_SECONDS
            if started == len(arrivals) and self._all_terminal():
                return
            if self.clock.now() - START > MAX_SIMULATED_SECONDS:
                raise RuntimeError(f"{self.scenario.name}: workflows still running after {MAX_SIMULATED_SECONDS} s")
            # Next second, or jump to the next thing that can happen when nothing is visible. With a 0 s window
            # somewhere, time moves to the exact instant of the next arrival, message or window end instead.
            candidates = [next_tick]
            if started < len(arrivals):
                candidates.append(arrivals[started])
            if self._eager():
                # (an agent's retries move the clock while it runs, so an arrival or a tick may already be due)
                target = max(self.clock.now(), min(candidates + self._next_deliveries()))
            else:
                visible_at = self._next_visible_at()
                if visible_at is not None:
                    candidates.append(visible_at)
                target = max(self.clock.now() + 1.0, math.ceil(min(candidates)))
            idle_queues = sum(1 for _, spec in self.consumers if not self._visible(spec.queue_url))
            self.idle_queue_seconds += idle_queues * (target - self.clock.now())
            self.clock.set(target)

    def _approve(self) -> None:
        """Answer every callback token issued and not yet answered, through the API function (counted)."""
        for snapshot in self._stored():
            record = snapshot.steps.get("approval")
            if record is None or record.callback_nonce is None or record.status.value != "PROCESSING":
                continue
            workflow_id = snapshot.workflow.workflow_id
            token = task_token(workflow_id, "approval", record.attempt, record.callback_nonce)
            if token in self.answered:
                continue
            self.answered.add(token)
            body = {"status": "succeeded", "output": {"approved_by": f"approver-{workflow_id[:8]}"}}
            self.meter.usage.api_requests += 1
            response = self._invoke("ApiFunction", callback_event(token, body, request_id=f"bench-cb-{token[-8:]}"))
            if response["statusCode"] != 200:
                raise RuntimeError(f"callback answer for {workflow_id} failed: {response}")

    def _visible_since(self, url: str) -> list[float]:
        """When each message visible now in the queue at ``url`` became visible (epoch seconds)."""
        return [
            max(message.visible_at, message.delayed_until or 0) / 1000.0
            for message in self._queue(url)._messages
            if message.visible and not message.delayed
        ]

    def _due(self, event_spec: SqsEventSpec) -> bool:
        """Whether the mapping of ``event_spec`` invokes now: a full batch is visible, or the window has passed
        since the first visible message became visible."""
        since = self._visible_since(event_spec.queue_url)
        if len(since) >= _batch(event_spec):
            return True
        return bool(since) and self.clock.now() >= min(since) + event_spec.batching_window_seconds

    def _deliver_due(self) -> None:
        """Each mapping whose window has passed drains its queue.

        With every window of 1 s or more, one pass at each simulated second. With a 0 s window somewhere, time
        moves by instants, so passes repeat at this instant while a mapping is due (what a 0 s mapping's invocation
        sends is answered at once; a mapping with a window drains again only once its window has passed).
        """
        while True:
            for logical_id, event_spec in self.consumers:
                if self._due(event_spec):
                    self._deliver(logical_id, event_spec)
            if not self._eager() or not any(self._due(spec) for _, spec in self.consumers):
                return

    def _eager(self) -> bool:
        return any(spec.batching_window_seconds < 1 for _, spec in self.consumers)

    def _next_deliveries(self) -> list[float]:
        """When each mapping could invoke next, if nothing else happens first (epoch seconds, each later than now)."""
        now = self.clock.now()
        times = []
        for _, event_spec in self.consumers:
            since = self._visible_since(event_spec.queue_url)
            if since:
                times.append(min(since) + event_spec.batching_window_seconds)  # the window of what is visible
            for message in self._queue(event_spec.queue_url)._messages:
                times.append(max(message.visible_at, message.delayed_until or 0) / 1000.0)  # a batch may fill
        return [at for at in times if at > now]

    def _note_ended(self) -> None:
        """Note when each workflow is first seen ended (S7 times its quiet tenant's workflows)."""
        for traveller, status, _ in self._looks():
            if status in TERMINAL and traveller is not None:
                self.ended_at.setdefault(traveller, self.clock.now())

    def _all_terminal(self) -> bool:
        looks = self._looks()
        started = sum(1 for _, _, child in looks if not child)  # map children are workflows too
        return started == self.scenario.workflows and all(status in TERMINAL for _, status, _ in looks)

    def _looks(self) -> list[tuple[str | None, str, bool]]:
        """(input's traveller, status, whether a map child) of every workflow, read from moto's table in this
        process: the loop looks after every step it takes, and a Scan through boto3 each time (the bench's own reads,
        never counted either way) made large runs (S7's 2,000) slow."""
        from moto.dynamodb.models import dynamodb_backends

        table = dynamodb_backends["123456789012"]["us-east-1"].tables[self.physical["StateTable"]]
        looks = []
        for by_sort_key in table.items.values():
            for item in by_sort_key.values():
                attrs = item.attrs
                if attrs["sk"].value != WORKFLOW_SORT_KEY:
                    continue
                pk = attrs["pk"].value
                if pk not in self._travellers:
                    raw = attrs.get("input")
                    workflow_input = json.loads(raw.value) if raw is not None and raw.type == "S" else {}
                    traveller = workflow_input.get("traveller") if isinstance(workflow_input, dict) else None
                    self._travellers[pk] = traveller if isinstance(traveller, str) else None
                parent = attrs.get("parent")
                looks.append(
                    (self._travellers[pk], attrs["status"].value, parent is not None and parent.type != "NULL")
                )
        return looks

    def _stored(self) -> list[Snapshot]:
        """Every workflow in the state table (the bench's own reads: never counted)."""
        with self.meter.paused():
            return list(self.observer_store.workflows())

    def _result(self) -> ScenarioResult:
        statuses: Counter[str] = Counter()
        facts: dict[str, dict[str, StepFacts]] = {}
        children: Counter[str] = Counter()
        parent_bytes = 0
        tallies: dict[str, Tally] = {}
        durations: dict[str, list[float]] = {}
        queued = 0
        for snapshot in self._stored():
            workflow_id = snapshot.workflow.workflow_id
            tallies[workflow_id] = snapshot.cost
            customer, traveller = snapshot.workflow.input.get("customer"), snapshot.workflow.input.get("traveller")
            if isinstance(customer, str) and traveller in self.ended_at:
                # from its start to the loop's first look that found it ended (simulated seconds)
                durations.setdefault(customer, []).append(self.ended_at[traveller] - self.started_at[traveller])
            queued += snapshot.workflow.queue_ticket is not None
            if snapshot.workflow.parent is not None:
                children[snapshot.workflow.status.value] += 1
            else:
                statuses[snapshot.workflow.status.value] += 1
                parent_bytes = max(parent_bytes, item_size(workflow_item(snapshot, version=1, shards=8)))
            for step, record in snapshot.steps.items():
                facts.setdefault(workflow_id, {})[step] = StepFacts(
                    status=record.status.value,
                    forward_ok=record.output is not None,
                    resends=record.resends,
                    action_calls=self.step_calls[(workflow_id, step, "action")],
                    compensation_calls=self.step_calls[(workflow_id, step, "compensation")],
                    lost_invocations=self.lost[(workflow_id, step, "action")],
                )
        steps_run = sum(1 for steps in facts.values() for f in steps.values() if f.status != "SKIPPED")
        seconds = self.clock.now() - START
        empty_polls = self.idle_queue_seconds * IDLE_POLLERS / LONG_POLL_SECONDS
        return ScenarioResult(
            scenario=self.scenario,
            usage=self.meter.usage,
            statuses=statuses,
            steps_run=steps_run,
            facts=facts,
            simulated_seconds=seconds,
            idle_queue_seconds=self.idle_queue_seconds,
            empty_polls=empty_polls,
            receive_batches=self.receive_batches,
            supervisor_resends=sum(f.resends for steps in facts.values() for f in steps.values()),
            memory_mb={spec.logical_id: spec.memory_mb for spec in self.specs.values()},
            definition=self.definition,
            children=children,
            parent_item_bytes=parent_bytes,
            trigger_function=self.trigger_id,
            remote_calls={AGENT_FUNCTIONS[agent]: remote.made for agent, remote in self.remotes.items()},
            remote_waits=dict(self.remote_waits),
            lost_invocations=dict(self.lost_invocations),
            tallies=tallies,
            durations={customer: sorted(values) for customer, values in durations.items()},
            queued=queued,
        )


def _batch(event_spec: SqsEventSpec) -> int:
    """The records one invocation of the mapping takes at most (its ``BatchSize``, at most 10 here)."""
    return min(event_spec.batch_size, 10)


def _request_key(record: dict[str, Any]) -> tuple[str, str, str]:
    """The step request an agent's SQS record carries: (workflow id, step, phase), as `_CountingRemote` counts."""
    request = json.loads(record["body"])
    return (request["workflow_id"], request["step"], request["phase"])


def calls_waited(chains: Iterable[int], workers: int) -> int:
    """How many calls' time an invocation waits when its records' calls (``chains``: each record's calls, one after
    the other, in the batch's order) run ``workers`` records at a time, each record on the first free worker, as
    `sasflow.batch.AtOnce`'s thread pool does: the longest worker's sum."""
    loads = [0] * max(1, workers)
    for chain in chains:
        index = loads.index(min(loads))
        loads[index] += chain
    return max(loads)


#: The batching windows AWS takes for an SQS event source mapping (``MaximumBatchingWindowInSeconds``, seconds).
MAX_BATCHING_WINDOW = 300


def workflow_consumers(functions: Iterable[FunctionSpec]) -> list[tuple[str, SqsEventSpec]]:
    """The SQS event source mappings a workflow's steps pass through: the scheduler's and each agent's. A trigger's
    (triggers.yaml) is not one of them: the scenarios start workflows through the API, and what a trigger adds per
    start (its tick, its queue, its function) and the idle polling of its queue are costed in docs/triggers.md. Nor
    is the batches' (``BatchFunction``): it carries an operator's batch, never a step; its idle polling is costed in
    docs/batches.md."""
    return [
        (spec.logical_id, event)
        for spec in functions
        if "TRIGGER" not in spec.environment and spec.logical_id != BATCH_FUNCTION
        for event in spec.events
        if isinstance(event, SqsEventSpec)
    ]


def check_mappings(consumers: list[tuple[str, SqsEventSpec]]) -> None:
    """Refuse mappings this emulation would bill wrongly or AWS would not deploy.

    Source: Lambda developer guide, "Using Lambda with Amazon SQS" (a window of 0 to 300 whole seconds; batches
    over 10 need a window of at least 1 s and are gathered from several receives, which this emulation does not
    model).

    Raises
    ------
    ValueError
        When a mapping's ``MaximumBatchingWindowInSeconds`` is not a whole number of seconds in 0..300 or its batch
        size is over 10.
    """
    for logical_id, event in consumers:
        window = event.batching_window_seconds
        if window != int(window) or not 0 <= window <= MAX_BATCHING_WINDOW or event.batch_size > 10:
            raise ValueError(
                f"{logical_id}: batching window {window:g} s, batch size {event.batch_size}; the bench models"
                f" windows of 0 to {MAX_BATCHING_WINDOW} whole seconds and batches of at most 10"
            )


def run_scenario(scenario: Scenario) -> ScenarioResult:
    """Run one scenario in this process (each run has its own moto backend)."""
    return ScenarioRun(scenario).run()


def engine_functions() -> set[str]:
    """The functions whose Lambda work is orchestration (the agents' is left out on both sides)."""
    return set(ENGINE_FUNCTIONS)


def agent_functions() -> set[str]:
    """The agents' functions (logical ids)."""
    return set(AGENT_FUNCTIONS.values())


def function_specs() -> dict[str, FunctionSpec]:
    """The template's functions (for memory sizes in reports)."""
    stack = Stack.from_file(ROOT / "template.yaml", parameters={"DeploySampleServices": "false"})
    return {spec.logical_id: spec for spec in stack.functions()}
