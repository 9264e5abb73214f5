"""Typed configuration read from the Lambda environment (set by template.yaml).

Nothing reads the environment at import time: handlers call ``from_env`` once per cold start (in ``bootstrap``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .call_limits import CallLimits

M = TypeVar("M", bound=BaseModel)

#: Plain http is allowed only to a loopback host (the local stack); every other remote service must be https.
_LOOPBACK_URL = re.compile(r"^http://(127\.0\.0\.1|localhost|\[::1\])(:\d+)?(/|$)")


class TriggerRoute(BaseModel):
    """A trigger as the operators see it (template ``TRIGGERS``, rendered from triggers.yaml): its queue (where a
    run-now goes), the principal its workflows belong to, and what ``sasflow triggers list`` shows of it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    queue_url: str = Field(min_length=1)
    principal: str = Field(min_length=1)
    kind: Literal["schedule", "event", "sqs", "s3"]
    definition: str = Field(min_length=1)
    source: str = Field(
        default="",
        description="The schedule's expression and time zone, the event's bus and pattern, the queue it reads, or "
        "the bucket and keys it watches.",
    )


class DeadLetterQueue(BaseModel):
    """A dead-letter queue of the stack (template ``DEAD_LETTER_QUEUES``, for the operators' redrive)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(min_length=1)
    arn: str = Field(min_length=1)


class AgentRoute(BaseModel):
    """How the engine reaches one agent: its request queue, and the actions it accepts (template ``AGENTS``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    queue_url: str = Field(min_length=1)
    actions: tuple[str, ...] = Field(min_length=1)


class EngineConfig(BaseModel):
    """Settings of the scheduler and supervisor (the orchestration engine).

    Attributes
    ----------
    agents:
        Agent name → its request queue and allowed actions (``AGENTS``, generated from agents.yaml). A definition
        may use only these agents, and of each only the actions it declares.
    deadline_shards:
        Partitions of the deadline index (write sharding; DESIGN Rule 3).
    deadline_grace_seconds:
        A step is overdue when ``now > complete_by + grace`` (epoch seconds).
    max_clock_skew_seconds:
        Largest tolerated skew between agent and supervisor clocks; must be below the grace.
    terminal_retention_days:
        Finished workflows expire (DynamoDB TTL) this many days after they end.
    max_deferrals:
        How many times an open circuit may defer one attempt before the attempt counts as failed.
    max_overdue_per_sweep:
        Cap on overdue entries one supervisor run handles; the next run takes the rest.
    lease_seconds:
        How long a supervisor holds its lease (Leader Election pattern); at most the supervisor's timeout.
    api_authorizer:
        The deployment's API authorizer (``AWS_IAM`` or ``JWT``): which verified identity a request must carry.
    workflow_id_secret:
        The Secrets Manager secret (ARN or name) whose value keys the workflow ids of Idempotency-Key starts.
    dead_letter_queues:
        Logical name → URL and ARN of every dead-letter queue (the operators' function only).
    triggers:
        Trigger name → its queue, principal and what it is (the operators' function only; ``triggers.py``).
    stuck_after:
        Resends and deferrals of a workflow's steps, in all, from which ``/ops/overdue`` calls it stuck.
    payload_bucket:
        The S3 bucket of claim-checked payloads (``PAYLOAD_BUCKET``); empty: no claim-check, payloads must fit in a
        message and the item as they are.
    claim_check_threshold_bytes:
        A payload (workflow input, step output, rendered input) whose compact JSON is larger is claim-checked (bytes).
    max_payload_bytes:
        The largest payload accepted, claim-checked or not (bytes; 10 MiB by default).
    batch_queue_url:
        The queue of the batch runs (``BATCH_QUEUE_URL``: the operators' and the batch function only; ``batches.py``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    state_table: str = "sasflow-state"
    response_queue_url: str = ""
    agents: dict[str, AgentRoute] = Field(default_factory=dict)
    deadline_shards: int = Field(default=8, ge=1, le=64)
    deadline_grace_seconds: int = Field(default=30, ge=1)
    max_clock_skew_seconds: int = Field(default=5, ge=0)
    terminal_retention_days: int = Field(default=30, ge=1)
    max_deferrals: int = Field(default=20, ge=0)
    max_overdue_per_sweep: int = Field(default=1000, ge=1)
    lease_seconds: int = Field(default=50, ge=1)
    api_authorizer: Literal["AWS_IAM", "JWT"] = "AWS_IAM"
    workflow_id_secret: str = ""
    dead_letter_queues: dict[str, DeadLetterQueue] = Field(default_factory=dict)
    triggers: dict[str, TriggerRoute] = Field(default_factory=dict)
    stuck_after: int = Field(default=5, ge=1)
    payload_bucket: str = ""
    claim_check_threshold_bytes: int = Field(default=32_768, ge=1_024, le=200_000)
    max_payload_bytes: int = Field(default=10_485_760, ge=2_048, le=104_857_600)
    batch_queue_url: str = ""

    @model_validator(mode="after")
    def _grace_covers_skew(self) -> EngineConfig:
        if self.deadline_grace_seconds <= self.max_clock_skew_seconds:
            raise ValueError("DEADLINE_GRACE_SECONDS must be greater than MAX_CLOCK_SKEW_SECONDS")
        return self

    @model_validator(mode="after")
    def _threshold_below_max(self) -> EngineConfig:
        _check_claim_limits(self.claim_check_threshold_bytes, self.max_payload_bytes)
        return self

    @property
    def agent_queue_urls(self) -> dict[str, str]:
        """Agent name → URL of its request queue."""
        return {name: agent.queue_url for name, agent in self.agents.items()}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> EngineConfig:
        """Build from ``STATE_TABLE``, ``RESPONSE_QUEUE_URL``, ``AGENTS`` (JSON object) and the rest.

        Raises
        ------
        ConfigurationError
            When a variable is missing or invalid.
        """
        return _build(
            cls,
            environ,
            {
                "state_table": "STATE_TABLE",
                "response_queue_url": "RESPONSE_QUEUE_URL",
                "agents": "AGENTS",
                "deadline_shards": "DEADLINE_SHARDS",
                "deadline_grace_seconds": "DEADLINE_GRACE_SECONDS",
                "max_clock_skew_seconds": "MAX_CLOCK_SKEW_SECONDS",
                "terminal_retention_days": "TERMINAL_RETENTION_DAYS",
                "max_deferrals": "MAX_DEFERRALS",
                "max_overdue_per_sweep": "MAX_OVERDUE_PER_SWEEP",
                "lease_seconds": "SUPERVISOR_LEASE_SECONDS",
                "api_authorizer": "API_AUTHORIZER",
                "workflow_id_secret": "WORKFLOW_ID_SECRET",  # nosec B105 # the variable's name; it holds the secret's ARN
                "dead_letter_queues": "DEAD_LETTER_QUEUES",
                "triggers": "TRIGGERS",
                "stuck_after": "STUCK_AFTER",
                "payload_bucket": "PAYLOAD_BUCKET",
                "claim_check_threshold_bytes": "CLAIM_CHECK_THRESHOLD_BYTES",
                "max_payload_bytes": "MAX_PAYLOAD_BYTES",
                "batch_queue_url": "BATCH_QUEUE_URL",
            },
            required=("STATE_TABLE", "RESPONSE_QUEUE_URL", "AGENTS"),
            json_fields=("agents", "dead_letter_queues", "triggers"),
        )


class AgentConfig(BaseModel):
    """Settings of one agent.

    Attributes
    ----------
    agent_name:
        The remote service this agent calls (``flights``, ``hotels``, ...).
    actions:
        The actions this agent accepts (``AGENT_ACTIONS``, comma-separated); a request for another is refused.
    remote_base_url:
        Base URL of the remote service; actions are POSTed to ``{base}/{action}``. https, or http on loopback only.
        None for a Python agent, whose actions are functions (``python_agent.AgentApp``).
    remote_auth:
        How calls authenticate: ``none``, ``sigv4`` (signed for ``execute-api`` with the function's role) or
        ``header`` (``remote_auth_header`` set to the value of ``remote_auth_secret``: ``secretsmanager:<id>`` or
        ``ssm:<name>``, read through powertools' parameters utility and cached for ``secret_max_age_seconds``).
    idempotency_table:
        DynamoDB table of powertools idempotency records (also holds the shared circuit-breaker state).
    response_queue_url:
        Where replies go.
    remote_timeout_seconds:
        Upper bound of one remote call (seconds); each call is also bounded by the attempt's remaining budget.
    safety_margin_seconds:
        Retries stop this long before ``min(complete_by, Lambda deadline)`` so that the reply is sent in time.
    breaker_failure_threshold, breaker_open_seconds, breaker_probe_seconds:
        Circuit breaker: consecutive failures that open it, how long it stays open, how long a half-open probe
        may take before another instance may probe (seconds).
    breaker_cache_seconds:
        How long an instance reuses its last read of the shared breaker before reading it again (seconds). An
        instance that sees a failure updates the shared state at once; the others learn of an opened breaker at
        most this late, and meanwhile their calls fail fast against the sick service.
    idempotency_expiry_seconds:
        How long a completed action's result is remembered (seconds).
    payload_bucket:
        The S3 bucket of claim-checked payloads (``PAYLOAD_BUCKET``); empty: no claim-check, payloads must fit in a
        message and the item as they are.
    claim_check_threshold_bytes:
        A payload (workflow input, step output, rendered input) whose compact JSON is larger is claim-checked (bytes).
    max_payload_bytes:
        The largest payload accepted, claim-checked or not (bytes; 10 MiB by default).
    concurrency:
        The records of one batch an instance works on at once, a thread each (``AGENT_CONCURRENCY``, 1 to 10; 1:
        one after the other). agents.yaml's ``concurrency`` sets it (10 for an HTTP agent, 1 for a Python agent).
    max_in_flight, call_rate, call_burst:
        The agent's call limits shared by its instances (``MAX_IN_FLIGHT``, ``CALL_RATE`` calls per second,
        ``CALL_BURST``; unset: not limited), from agents.yaml's ``max_in_flight``, ``rate`` and ``burst``
        (``sasflow.call_limits``).
    call_wait_seconds:
        How long a record may wait in its instance for a unit or a token before it is deferred (``CALL_WAIT_SECONDS``,
        0 to 10; 2 by default): waiting is billed Lambda time, a deferral a round trip through the scheduler.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent_name: str = Field(min_length=1)
    actions: tuple[str, ...] = Field(min_length=1)
    remote_base_url: str | None = Field(default=None, min_length=1)
    remote_auth: Literal["none", "sigv4", "header"] = "none"
    remote_auth_header: str | None = Field(default=None, pattern=r"^[A-Za-z0-9-]{1,64}$")
    remote_auth_secret: str | None = Field(default=None, pattern=r"^(secretsmanager|ssm):.+$")
    secret_max_age_seconds: int = Field(default=300, ge=0, le=86_400)
    idempotency_table: str = "sasflow-idempotency"
    response_queue_url: str = ""
    remote_timeout_seconds: float = Field(default=10.0, gt=0, le=900)
    safety_margin_seconds: float = Field(default=2.0, ge=0.1, le=60)
    breaker_failure_threshold: int = Field(default=5, ge=1)
    breaker_open_seconds: int = Field(default=30, ge=1)
    breaker_probe_seconds: int = Field(default=10, ge=1)
    breaker_cache_seconds: float = Field(default=5.0, ge=0, le=60)
    idempotency_expiry_seconds: int = Field(default=86_400, ge=60)
    payload_bucket: str = ""
    claim_check_threshold_bytes: int = Field(default=32_768, ge=1_024, le=200_000)
    max_payload_bytes: int = Field(default=10_485_760, ge=2_048, le=104_857_600)
    concurrency: int = Field(default=1, ge=1, le=10)
    max_in_flight: int | None = Field(default=None, ge=1, le=1_000)
    call_rate: float | None = Field(default=None, ge=0.01, le=10_000)
    call_burst: int | None = Field(default=None, ge=1, le=10_000)
    call_wait_seconds: float = Field(default=2.0, ge=0, le=10)

    @model_validator(mode="after")
    def _limits_consistent(self) -> AgentConfig:
        if self.max_in_flight is not None or self.call_rate is not None:
            self.call_limits()  # CallLimits names what is inconsistent (a burst below max_in_flight, ...)
        elif self.call_burst is not None:
            raise ValueError("CALL_BURST needs CALL_RATE (a burst is the calls a rate lets through at once)")
        return self

    def call_limits(self) -> CallLimits | None:
        """The declared call limits (None: the agent declares none)."""
        if self.max_in_flight is None and self.call_rate is None:
            return None
        from .call_limits import CallLimits  # the agents' only: the other functions' cold starts do not import it

        return CallLimits(max_in_flight=self.max_in_flight, rate=self.call_rate, burst=self.call_burst)

    @field_validator("remote_base_url")
    @classmethod
    def _https_url(cls, value: str | None) -> str | None:
        if value is None:
            return None  # a Python agent (python_agent.AgentApp) calls no service
        if not (value.startswith("https://") or _LOOPBACK_URL.match(value)):
            raise ValueError("REMOTE_BASE_URL must be an https URL (plain http only on loopback)")
        return value.rstrip("/")

    @field_validator("actions", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @model_validator(mode="after")
    def _header_auth_is_complete(self) -> AgentConfig:
        has_header = self.remote_auth_header is not None and self.remote_auth_secret is not None
        if (self.remote_auth == "header") != has_header:
            raise ValueError("REMOTE_AUTH=header needs REMOTE_AUTH_HEADER and REMOTE_AUTH_SECRET (and only it does)")
        return self

    @model_validator(mode="after")
    def _threshold_below_max(self) -> AgentConfig:
        _check_claim_limits(self.claim_check_threshold_bytes, self.max_payload_bytes)
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AgentConfig:
        """Build from ``AGENT_NAME``, ``REMOTE_BASE_URL``, ``IDEMPOTENCY_TABLE``, ``RESPONSE_QUEUE_URL`` and the rest.

        Raises
        ------
        ConfigurationError
            When a variable is missing or invalid.
        """
        return _build(
            cls,
            environ,
            {
                "agent_name": "AGENT_NAME",
                "actions": "AGENT_ACTIONS",
                "remote_base_url": "REMOTE_BASE_URL",
                "remote_auth": "REMOTE_AUTH",
                "remote_auth_header": "REMOTE_AUTH_HEADER",
                "remote_auth_secret": "REMOTE_AUTH_SECRET",  # nosec B105 # the variable's name; it holds where the secret lives
                "secret_max_age_seconds": "REMOTE_AUTH_SECRET_MAX_AGE_SECONDS",  # nosec B105 # a variable's name (a cache age)
                "idempotency_table": "IDEMPOTENCY_TABLE",
                "response_queue_url": "RESPONSE_QUEUE_URL",
                "remote_timeout_seconds": "REMOTE_TIMEOUT_SECONDS",
                "safety_margin_seconds": "AGENT_SAFETY_MARGIN_SECONDS",
                "breaker_failure_threshold": "BREAKER_FAILURE_THRESHOLD",
                "breaker_open_seconds": "BREAKER_OPEN_SECONDS",
                "breaker_probe_seconds": "BREAKER_PROBE_SECONDS",
                "breaker_cache_seconds": "BREAKER_CACHE_SECONDS",
                "idempotency_expiry_seconds": "IDEMPOTENCY_EXPIRY_SECONDS",
                "payload_bucket": "PAYLOAD_BUCKET",
                "claim_check_threshold_bytes": "CLAIM_CHECK_THRESHOLD_BYTES",
                "max_payload_bytes": "MAX_PAYLOAD_BYTES",
                "concurrency": "AGENT_CONCURRENCY",
                "max_in_flight": "MAX_IN_FLIGHT",
                "call_rate": "CALL_RATE",
                "call_burst": "CALL_BURST",
                "call_wait_seconds": "CALL_WAIT_SECONDS",
            },
            required=("AGENT_NAME", "AGENT_ACTIONS", "IDEMPOTENCY_TABLE", "RESPONSE_QUEUE_URL"),
            json_fields=(),
        )


def _check_claim_limits(threshold: int, largest: int) -> None:
    if threshold >= largest:
        raise ValueError("CLAIM_CHECK_THRESHOLD_BYTES must be below MAX_PAYLOAD_BYTES")


def _build(
    model: type[M],
    environ: Mapping[str, str],
    names: dict[str, str],
    *,
    required: tuple[str, ...],
    json_fields: tuple[str, ...],
) -> M:
    missing = [name for name in required if not environ.get(name)]
    if missing:
        raise ConfigurationError(f"missing environment variables: {', '.join(missing)}")
    data: dict[str, Any] = {}
    for field, env in names.items():
        raw = environ.get(env)
        if raw is None or raw == "":
            continue
        if field in json_fields:
            try:
                data[field] = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ConfigurationError(f"{env} is not valid JSON: {exc}") from exc
        else:
            data[field] = raw
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        # each error named by the environment variable that holds it, never by the model's field
        reasons = []
        for error in exc.errors(include_url=False, include_input=False):
            location = error["loc"]
            field = str(location[0]) if location else ""
            where = names.get(field, field) + "".join(f"[{part}]" for part in location[1:])
            reasons.append(f"{where}: {error['msg']}" if where else error["msg"])
        raise ConfigurationError(f"invalid configuration: {'; '.join(reasons)}") from exc
