"""Wiring: build the real adapters and services once per cold start (cosmicpython's ``bootstrap``).

Handlers call these on their first invocation, never at import, so that nothing reads the environment or creates a
boto3 client before the endpoint (or moto) is set. Tests build services with fakes instead and never come here.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .clock import Clock, SystemClock
from .errors import ConfigurationError
from .ports import Counter, MessageBus, StateStore, TriggerStore, WorkflowIndex, no_metrics
from .settings import AgentConfig, EngineConfig

if TYPE_CHECKING:
    # Only an agent needs these (and tenacity): `build_agent` imports them, so the API, scheduler and supervisor
    # handlers never load them at cold start.
    from .agent import AgentRuntime, RemoteClient
    from .batch import RecordRunner
    from .batches import BatchService
    from .claim_check import ClaimCheck

    # Only the engine's handlers need these: `build_engine` imports them, so an agent never loads the scheduler,
    # the workflow records and the definitions' models. The engine's handlers import them at init themselves, as
    # their first invocation needs them (and their loggers make the "sasflow" logger that the handlers configure
    # at import: copy_config_to_registered_loggers only finds loggers that exist by then).
    from .scheduler import SchedulerService
    from .supervisor import SupervisorService
    from .triggers import TriggerService


@dataclass(frozen=True)
class EngineServices:
    """What the API, scheduler and supervisor handlers use."""

    config: EngineConfig
    store: StateStore
    bus: MessageBus
    scheduler: SchedulerService
    supervisor: SupervisorService


@dataclass(frozen=True)
class AgentServices:
    """What an agent handler uses. ``idempotency_config`` needs ``register_lambda_context`` on every invocation."""

    config: AgentConfig
    runtime: AgentRuntime
    bus: MessageBus
    idempotency_config: Any
    #: How a batch's records run: at once, ``config.concurrency`` at a time (`sasflow.batch.AtOnce`); None: one
    #: after the other
    records: RecordRunner | None = None


def build_engine(
    environ: Mapping[str, str] | None = None,
    *,
    clock: Clock | None = None,
    metrics: Counter = no_metrics,
    bus: MessageBus | None = None,
    dynamodb: Any = None,
    rng: random.Random | None = None,
    correlate: Callable[[str], None] | None = None,
    s3: Any = None,
) -> EngineServices:
    """Build the engine's services over DynamoDB and SQS from the environment.

    Every collaborator can be injected (simulations and tests); the defaults are the real AWS clients.
    ``correlate`` is powertools' ``Logger.set_correlation_id`` in a handler: the scheduler calls it with the id of
    each workflow it works on.

    Raises
    ------
    ConfigurationError
        When an environment variable is missing or invalid.
    """
    from .adapters.dynamodb_store import DynamoDBStateStore, dynamodb_client
    from .adapters.sqs_bus import SqsMessageBus, sqs_client
    from .adapters.tenancy_dynamodb import DynamoDBTenantSlotStore
    from .adapters.trigger_dynamodb import DynamoDBTriggerStore
    from .scheduler import SchedulerService
    from .supervisor import SupervisorService

    config = EngineConfig.from_env(os.environ if environ is None else environ)
    clock = clock or SystemClock()
    store = DynamoDBStateStore(config.state_table, dynamodb or dynamodb_client(), shards=config.deadline_shards)
    bus = bus or SqsMessageBus(sqs_client())
    id_secret = _workflow_id_key(config.workflow_id_secret) if config.workflow_id_secret else None
    scheduler = SchedulerService(
        store,
        clock,
        config,
        metrics=metrics,
        rng=rng,
        id_secret=id_secret,
        correlate=correlate,
        claims=claim_check(config.payload_bucket, config, metrics=metrics, s3=s3),
        triggers=DynamoDBTriggerStore(config.state_table, store.client),
        tenancy=DynamoDBTenantSlotStore(config.state_table, store.client),
    )
    supervisor = SupervisorService(store, bus, scheduler, clock, config, metrics=metrics)
    return EngineServices(config, store, bus, scheduler, supervisor)


def build_trigger(
    environ: Mapping[str, str] | None = None,
    *,
    clock: Clock | None = None,
    metrics: Counter = no_metrics,
    bus: MessageBus | None = None,
    dynamodb: Any = None,
    correlate: Callable[[str], None] | None = None,
    s3: Any = None,
) -> TriggerService:
    """Build a trigger function's service (``triggers.py``): the engine, and the trigger of ``TRIGGER`` (JSON,
    rendered from triggers.yaml), starting workflows as ``TRIGGER_PRINCIPAL`` (its role).

    Raises
    ------
    ConfigurationError
        When an environment variable is missing or invalid.
    """
    from .triggers import TriggerConfig, TriggerService

    env = os.environ if environ is None else environ
    missing = [name for name in ("TRIGGER", "TRIGGER_PRINCIPAL") if not env.get(name)]
    if missing:
        raise ConfigurationError(f"missing environment variables: {', '.join(missing)}")
    config = TriggerConfig.from_env(env["TRIGGER"])
    engine = build_engine(env, clock=clock, metrics=metrics, bus=bus, dynamodb=dynamodb, correlate=correlate, s3=s3)
    assert engine.scheduler.triggers is not None  # nosec B101 # build_engine gives every engine one
    return TriggerService(
        config,
        engine.scheduler,
        engine.bus,
        engine.scheduler.triggers,
        principal=env["TRIGGER_PRINCIPAL"],
        clock=engine.scheduler.clock,
        metrics=metrics,
    )


def build_batches(
    environ: Mapping[str, str] | None = None,
    *,
    clock: Clock | None = None,
    metrics: Counter = no_metrics,
    dynamodb: Any = None,
    sqs: Any = None,
    correlate: Callable[[str], None] | None = None,
    engine: EngineServices | None = None,
) -> BatchService:
    """Build the batches' service (``batches.py``) on the engine (``engine``, or one built from the environment):
    the batches' items in the state table, the runs' queue ``BATCH_QUEUE_URL``.

    Raises
    ------
    ConfigurationError
        When an environment variable is missing or invalid.
    """
    from .adapters.batch_dynamodb import DynamoDBBatchStore
    from .adapters.sqs_bus import SqsMessageBus, sqs_client
    from .batches import BatchRunner, BatchService
    from .finding import WorkflowFinder

    if engine is None:
        bus = SqsMessageBus(sqs or sqs_client())
        engine = build_engine(environ, clock=clock, metrics=metrics, bus=bus, dynamodb=dynamodb, correlate=correlate)
    store = engine.store
    index: WorkflowIndex = store  # type: ignore[assignment]
    runner = BatchRunner(
        DynamoDBBatchStore(engine.config.state_table, store.client),  # type: ignore[attr-defined]
        WorkflowFinder(index, engine.config.deadline_shards),
        engine.scheduler,
        engine.bus,
        engine.scheduler.clock,
    )
    return BatchService(runner, engine.config.batch_queue_url)


@dataclass(frozen=True)
class OpsServices:
    """What the operators' handler uses: the engine, the store's indexes and the dead-letter queues."""

    engine: EngineServices
    index: WorkflowIndex
    dead_letters: Any  # adapters.sqs_dead_letters.DeadLetterQueues
    triggers: TriggerStore


def build_ops(
    environ: Mapping[str, str] | None = None,
    *,
    clock: Clock | None = None,
    metrics: Counter = no_metrics,
    dynamodb: Any = None,
    sqs: Any = None,
    correlate: Callable[[str], None] | None = None,
) -> OpsServices:
    """Build the operators' services: the engine (its store is also the index) and the dead-letter queues.

    Raises
    ------
    ConfigurationError
        When an environment variable is missing or invalid.
    """
    from .adapters.sqs_bus import SqsMessageBus, sqs_client
    from .adapters.sqs_dead_letters import DeadLetterQueues

    client = sqs or sqs_client()
    engine = build_engine(
        environ, clock=clock, metrics=metrics, bus=SqsMessageBus(client), dynamodb=dynamodb, correlate=correlate
    )
    index: WorkflowIndex = engine.store  # type: ignore[assignment]
    assert engine.scheduler.triggers is not None  # nosec B101 # build_engine gives every engine one
    dead_letters = DeadLetterQueues(client, engine.config.dead_letter_queues)
    return OpsServices(engine, index, dead_letters, engine.scheduler.triggers)


def _workflow_id_key(secret_id: str) -> Callable[[], bytes]:
    """The key of the workflow ids, read from Secrets Manager on first use and kept for the sandbox's life."""
    from .adapters.secrets import secret_reader

    read = secret_reader(f"secretsmanager:{secret_id}", max_age=86_400)
    key: list[bytes] = []

    def get() -> bytes:
        if not key:
            key.append(read().encode())
        return key[0]

    return get


def build_agent(
    environ: Mapping[str, str] | None = None,
    *,
    clock: Clock | None = None,
    metrics: Counter = no_metrics,
    bus: MessageBus | None = None,
    dynamodb: Any = None,
    remote: RemoteClient | None = None,
    rng: random.Random | None = None,
    s3: Any = None,
    records: RecordRunner | None = None,
) -> AgentServices:
    """Build an agent's runtime: HTTP client, shared circuit breaker and powertools idempotency over DynamoDB.

    Every collaborator can be injected (simulations and tests); the defaults are the real clients, and a batch's
    records run at once on ``AGENT_CONCURRENCY`` threads (``records``: the simulation's and the bench's
    `sasflow.batch.AnyOrder`, on one thread).

    Raises
    ------
    ConfigurationError
        When an environment variable is missing or invalid.
    """
    from aws_lambda_powertools.utilities.idempotency import (
        DynamoDBPersistenceLayer,
        IdempotencyConfig,
        idempotent_function,
    )

    from .adapters.breaker_dynamodb import DynamoDBBreakerStore
    from .adapters.dynamodb_store import dynamodb_client
    from .adapters.http_remote import HeaderAuth, HttpRemoteClient, NoAuth, RemoteAuth, default_sigv4
    from .adapters.limits_dynamodb import DynamoDBLimitsStore
    from .adapters.secrets import secret_reader
    from .adapters.sqs_bus import SqsMessageBus, sqs_client
    from .agent import AgentRuntime
    from .batch import AtOnce
    from .breaker import CircuitBreaker
    from .call_limits import CallLimiter

    config = AgentConfig.from_env(os.environ if environ is None else environ)
    clock = clock or SystemClock()
    client = dynamodb or dynamodb_client()
    # One persistence layer per IdempotencyConfig. The key is the business identity taken from the message body.
    persistence = DynamoDBPersistenceLayer(table_name=config.idempotency_table, boto3_client=client)
    idempotency_config = IdempotencyConfig(
        event_key_jmespath="[workflow_id, step, phase, action, token]",
        raise_on_no_idempotency_key=True,
        expires_after_seconds=config.idempotency_expiry_seconds,
    )

    def idempotent(function: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        return idempotent_function(  # type: ignore[no-any-return]
            function,
            data_keyword_argument="request",
            persistence_store=persistence,
            config=idempotency_config,
            # agent#<name>#<hash>: the agent's IAM policy allows it these records only (dynamodb:LeadingKeys).
            key_prefix=f"agent#{config.agent_name}",
        )

    auth: RemoteAuth
    if config.remote_auth == "sigv4":
        auth = default_sigv4()
    elif config.remote_auth == "header":
        assert config.remote_auth_header is not None and config.remote_auth_secret is not None  # nosec B101 # narrows types: AgentConfig refuses header auth without both
        auth = HeaderAuth(
            config.remote_auth_header, secret_reader(config.remote_auth_secret, max_age=config.secret_max_age_seconds)
        )
    else:
        auth = NoAuth()

    limits = config.call_limits()
    breaker = CircuitBreaker(
        config.agent_name,
        DynamoDBBreakerStore(config.idempotency_table, client),
        clock,
        failure_threshold=config.breaker_failure_threshold,
        open_seconds=config.breaker_open_seconds,
        probe_seconds=config.breaker_probe_seconds,
        cache_seconds=config.breaker_cache_seconds,
    )
    if remote is None:
        if config.remote_base_url is None:
            raise ConfigurationError("missing environment variables: REMOTE_BASE_URL (an HTTP agent's service)")
        remote = HttpRemoteClient(config.remote_base_url, auth=auth)
    runtime = AgentRuntime(
        config,
        remote,
        breaker,
        clock,
        idempotent=idempotent,
        rng=rng,
        metrics=metrics,
        claims=claim_check(config.payload_bucket, config, metrics=metrics, s3=s3, cache_bytes=0),
        limiter=None
        if limits is None
        else CallLimiter(
            config.agent_name,
            limits,
            DynamoDBLimitsStore(config.idempotency_table, client),
            clock,
            # a lease outlasts the longest call it covers, one renewal and the guard on both sides
            lease_seconds=max(30.0, config.remote_timeout_seconds + 18.0),
            want_at_once=config.concurrency,
            max_wait_seconds=config.call_wait_seconds,
            rng=rng,
            metrics=metrics,
        ),
    )
    return AgentServices(
        config,
        runtime,
        bus or SqsMessageBus(sqs_client()),
        idempotency_config,
        records if records is not None else AtOnce(config.concurrency),
    )


def claim_check(
    bucket: str, config: EngineConfig | AgentConfig, *, metrics: Counter, s3: Any = None, cache_bytes: int | None = None
) -> ClaimCheck | None:
    """The claim-check over the payload bucket ``bucket`` (``PAYLOAD_BUCKET``), or None when there is none.

    The S3 client is created on first use, so a function that never meets a large payload never builds it.
    """
    if not bucket:
        return None
    from .adapters.s3_payloads import S3PayloadStore
    from .claim_check import RESOLVED_CACHE_BYTES, ClaimCheck

    return ClaimCheck(
        S3PayloadStore(bucket, s3),
        threshold_bytes=config.claim_check_threshold_bytes,
        max_payload_bytes=config.max_payload_bytes,
        cache_bytes=RESOLVED_CACHE_BYTES if cache_bytes is None else cache_bytes,
        metrics=metrics,
    )


T = TypeVar("T")


class Lazy(Generic[T]):
    """Build a value on first use and keep it for the life of the Lambda sandbox (one cold start)."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._value: T | None = None

    def __call__(self) -> T:
        """Return the value, building it the first time."""
        if self._value is None:
            self._value = self._factory()
        return self._value
