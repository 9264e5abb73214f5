"""Queue messages: the scheduler's step request to an agent, and the agent's reply.

Both carry the step's business identity (workflow id, step, phase, action) and the attempt, so that a reply is
applied only to the attempt it answers (DESIGN Rule 5) and an agent's idempotency key never depends on the SQS
message id (Rule 4).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import MalformedMessageError, PayloadTooLargeError
from .states import Outcome, Phase
from .types import ActionName, AgentName, Attempt, EpochSeconds, StepName, WorkflowId

#: SQS maximum message size: 262,144 bytes, counting the body and the message attributes
#: (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html).
SQS_MAX_MESSAGE_BYTES = 262_144

_TOKEN_NAMESPACE = uuid.UUID("6f1c2b7e-52f5-4c1e-9f59-3c2a4c7d9a10")


def remote_token(workflow_id: str, step: str, action: str) -> str:
    """Return the idempotency token sent with every remote call of one action of one step.

    The token is derived from the business identity only (never the attempt or the SQS message id), so a resend
    carries the same token and the remote service applies the effect at most once (Rule 4).

    Returns
    -------
    str
        A UUID (version 5) string.
    """
    return str(uuid.uuid5(_TOKEN_NAMESPACE, f"{workflow_id}/{step}/{action}"))


#: The priority of a workflow started without one: 1 is served first, 5 last (as Temporal's priority keys).
DEFAULT_PRIORITY = 3


class StepRequest(BaseModel):
    """Scheduler → agent: do ``action`` for ``step`` of ``workflow_id``, attempt ``attempt``, before ``complete_by``.

    ``original_token`` is set on compensations: the token of the forward action to undo.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["step.request"] = "step.request"
    workflow_id: WorkflowId
    step: StepName
    phase: Phase
    agent: AgentName
    action: ActionName
    attempt: Attempt
    complete_by: EpochSeconds
    token: str = Field(min_length=1, max_length=64)
    original_token: str | None = Field(default=None, max_length=64)
    input: dict[str, Any] = Field(default_factory=dict)
    backoff_base_seconds: float = Field(default=1.0, gt=0, le=60)
    backoff_cap_seconds: float = Field(default=20.0, gt=0, le=900)
    jitter: bool = True
    max_calls: int = Field(default=3, ge=1, le=10, description="Remote calls allowed within this attempt.")
    priority: int | None = Field(
        default=None, ge=1, le=5, description="Its workflow's priority, 1 (first) to 5; None: the default, 3."
    )
    tenant: str | None = Field(default=None, max_length=128, description="Its workflow's fair-share group.")

    @property
    def idempotency_identity(self) -> dict[str, str]:
        """The business identity the agent's idempotency key is taken from."""
        return {"workflow_id": self.workflow_id, "step": self.step, "phase": self.phase.value, "action": self.action}


class StepError(BaseModel):
    """Why an attempt did not succeed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str = Field(max_length=64)
    message: str = Field(max_length=2048)


class StepReply(BaseModel):
    """Agent → scheduler: the outcome of one attempt of one step.

    ``retry_at`` (epoch seconds, on the agent's clock) and ``retry_after_seconds`` (a duration from the reply) are
    set with ``Outcome.DEFERRED``: when the circuit breaker will allow a probe, or the call limits a call. The
    scheduler waits ``retry_after_seconds``, which does not depend on the two clocks agreeing.
    ``retryable`` is set with ``Outcome.FAILED`` when the attempt ran out of time (not of calls), so the scheduler
    may dispatch the next attempt at once instead of waiting for the supervisor.
    ``calls`` counts the remote calls this attempt made, whatever the outcome (a DEFERRED attempt may have made
    some before the circuit opened), and ``outcome_unknown`` says whether one of them may have taken effect without
    the agent learning its answer (a read timeout): the scheduler then remembers that the step may have happened.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["step.reply"] = "step.reply"
    workflow_id: WorkflowId
    step: StepName
    phase: Phase
    attempt: Attempt
    outcome: Outcome
    output: Any = None
    error: StepError | None = None
    retry_at: EpochSeconds | None = None
    retry_after_seconds: int | None = Field(default=None, ge=0, le=900)
    retryable: bool = False
    calls: int = Field(default=0, ge=0)
    outcome_unknown: bool = False
    #: Set with ``Outcome.DEFERRED`` by the agent's call limits (``"limit"``): the service is busy, not failing, so
    #: the deferral counts in no budget of deferrals; absent for an open circuit.
    deferred_by: Literal["limit"] | None = None
    #: A child of a map step reporting its end to its parent (``workflow_id`` is then the parent's): the child's
    #: index and terminal status. A map step's reply without ``child`` is its own tick: start what comes next.
    child: int | None = Field(default=None, ge=0)
    child_status: Literal["COMPLETED", "COMPENSATED", "COMPENSATION_FAILED", "CANCELLED"] | None = None


def encode(message: BaseModel) -> str:
    """Serialise a message to its SQS body (compact JSON).

    Raises
    ------
    PayloadTooLargeError
        When the body is over ``SQS_MAX_MESSAGE_BYTES`` (262,144 bytes, UTF-8).
    """
    body = message.model_dump_json(exclude_none=True)
    size = len(body.encode("utf-8"))
    if size > SQS_MAX_MESSAGE_BYTES:
        raise PayloadTooLargeError(f"{type(message).__name__} message", size, SQS_MAX_MESSAGE_BYTES)
    return body


def decode_request(body: str) -> StepRequest:
    """Parse an SQS body as a ``StepRequest``.

    Raises
    ------
    MalformedMessageError
        When the body is not JSON or does not match the model (the record then fails and ends in the DLQ).
    """
    return _decode(StepRequest, body)


def decode_reply(body: str) -> StepReply:
    """Parse an SQS body as a ``StepReply``.

    Raises
    ------
    MalformedMessageError
        When the body is not JSON or does not match the model.
    """
    return _decode(StepReply, body)


M = TypeVar("M", bound=BaseModel)


def _decode(model: type[M], body: str) -> M:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise MalformedMessageError(f"malformed {model.__name__}: {exc.errors(include_url=False)[:3]}") from exc


def canonical_hash(data: Any) -> str:
    """Return the SHA-256 hex digest of ``data`` serialised as canonical JSON (sorted keys, compact)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
