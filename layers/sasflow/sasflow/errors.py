"""One error hierarchy for the whole core.

Retryable errors are distinct from permanent ones, so that callers (agent retry, batch processing, API mapping)
decide on the class and never on message text. The API maps these to HTTP status codes in exactly one place.
"""

from __future__ import annotations


class SasflowError(Exception):
    """Base class of every error raised on purpose by sasflow."""


class PermanentError(SasflowError):
    """Retrying cannot help: the input or the configuration is wrong."""


class RetryableError(SasflowError):
    """A later attempt may succeed (throttling, a transient remote failure, a service outage)."""


class InvalidDefinitionError(PermanentError):
    """A workflow definition failed validation (unknown dependency, cycle, bad JMESPath reference)."""


class UnknownStepError(InvalidDefinitionError):
    """An operator's action names a step the workflow's definition does not have."""


class MissingReferenceError(InvalidDefinitionError):
    """A ``key.$`` reference of a step's input resolved to nothing, and the definition gives no default.

    The step fails with ``MISSING_REFERENCE`` (a start whose first step it is gets HTTP 422 and writes nothing).
    ``path`` is where the value was to go (``steps[book_hotel].input.guest``), ``expression`` the JMESPath that found
    nothing.
    """

    def __init__(self, path: str, expression: str) -> None:
        super().__init__(f"{path}: {expression!r} resolved to nothing (give a default to allow that)")
        self.path = path
        self.expression = expression


class OutputNeededError(MissingReferenceError):
    """An operator's skip gives no output, and a later step's reference without a default reads it (HTTP 422
    ``MISSING_REFERENCE``): the workflow would be held again one step later. ``path`` and ``expression`` name the
    first such reference, ``step`` the skipped step."""

    def __init__(self, step: str, path: str, expression: str) -> None:
        InvalidDefinitionError.__init__(
            self,
            f"skipping step {step} needs its output: {path}: {expression!r} reads it and has no default (give the "
            "output; an explicit null is allowed)",
        )
        self.step = step
        self.path = path
        self.expression = expression


class StepNotEvaluatedError(InvalidDefinitionError):
    """A step's ``when`` or a wait's ``until`` could not be evaluated at run time (a JMESPath function given a wrong
    type, a time that is not epoch seconds or ISO 8601, a wait longer than a year).

    The step fails with ``code`` (``CONDITION_NOT_EVALUATED`` or ``WAIT_NOT_EVALUATED``); a start whose first step it
    is gets HTTP 422.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ConditionNotEvaluatedError(StepNotEvaluatedError):
    """A step's ``when`` could not be evaluated (``CONDITION_NOT_EVALUATED``)."""

    def __init__(self, message: str) -> None:
        super().__init__("CONDITION_NOT_EVALUATED", message)


class MapItemsNotEvaluatedError(StepNotEvaluatedError):
    """A map step's ``items`` is not a list, or holds more than ``definition.MAX_MAP_ITEMS`` items
    (``MAP_ITEMS_NOT_EVALUATED``)."""

    def __init__(self, message: str) -> None:
        super().__init__("MAP_ITEMS_NOT_EVALUATED", message)


class WaitNotEvaluatedError(StepNotEvaluatedError):
    """A wait step's ``until`` is not a time, or more than a year away (``WAIT_NOT_EVALUATED``)."""

    def __init__(self, message: str) -> None:
        super().__init__("WAIT_NOT_EVALUATED", message)


class TenantKeyError(InvalidDefinitionError):
    """A definition's ``tenancy.tenant_key`` gives no tenant on a start's input (null, an object, a list, an empty or
    too long text): the start is refused with HTTP 422 ``TENANT_KEY_NOT_EVALUATED`` and writes nothing."""


class TenantLimitError(RetryableError):
    """A start over its tenant's ``tenancy.max_running``: refused with HTTP 429 and ``Retry-After``, nothing written
    (a trigger's occurrence is delivered again by its queue, and ends in its dead-letter queue after five tries).

    Attributes
    ----------
    tenant, definition, max_running:
        Whose limit, of which definition (by name), and the limit.
    retry_after:
        Seconds after which a start may find a free slot (a hint: workflows end when they end).
    """

    def __init__(self, tenant: str, definition: str, max_running: int, retry_after: int) -> None:
        super().__init__(
            f"tenant {tenant} runs {max_running} or more workflow(s) of {definition}, at its tenancy.max_running "
            f"({max_running}): start again after {retry_after} s, when one has ended"
        )
        self.tenant = tenant
        self.definition = definition
        self.max_running = max_running
        self.retry_after = retry_after


class WorkflowNotFoundError(PermanentError):
    """No workflow has the given id, or it belongs to another principal (the API answers 404 to both)."""


class StepNotFoundError(PermanentError):
    """A read names a step the workflow does not have, or one that is not of the kind asked for (HTTP 404): the
    message names the steps that are."""


class StepNotDispatchedError(PermanentError):
    """A step's input is asked for before the step was dispatched (HTTP 409): it renders once its dependencies
    complete."""


class PayloadNotFoundError(PermanentError):
    """No claim-checked payload of that digest under the workflow (HTTP 404)."""


class InvalidCursorError(PermanentError):
    """A page cursor that this API did not give (HTTP 400)."""


class DeadLetterQueueNotFoundError(PermanentError):
    """No dead-letter queue of that name in this stack (template ``DEAD_LETTER_QUEUES``; HTTP 404)."""


class BatchNotFoundError(PermanentError):
    """No batch of operator actions has this id (HTTP 404)."""


class TriggerNotFoundError(PermanentError):
    """No trigger of that name in this stack (template ``TRIGGERS``, from triggers.yaml; HTTP 404)."""


class TriggerAlreadyPausedError(PermanentError):
    """Another pause holds the trigger (HTTP 409): its who, when and why are kept until it is resumed."""


class TriggerNotRunnableError(PermanentError):
    """A run-now of an event trigger (HTTP 409): it starts on its bus's events, it has no tick to run."""


class UnauthenticatedError(PermanentError):
    """The request carries no verified identity (HTTP 403, as API Gateway answers an unsigned request)."""


class IdempotencyKeyConflictError(PermanentError):
    """The Idempotency-Key was already used with a different request body (HTTP 409)."""


class PayloadTooLargeError(PermanentError):
    """A message or item exceeds an AWS size limit (SQS 262,144 bytes, DynamoDB item 400 KB)."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"{what} is {size} bytes; the limit is {limit} bytes")
        self.what = what
        self.size = size
        self.limit = limit


class ClaimCheckMissingError(PermanentError):
    """A claim-check reference names an object the payload store does not hold, or whose bytes do not match its
    SHA-256 (an object lost or deleted while its workflow still needed it: ``claim_check.py``)."""

    def __init__(self, key: str, detail: str = "no such object") -> None:
        super().__init__(f"claim-checked payload {key}: {detail}")
        self.key = key


class MalformedMessageError(PermanentError):
    """A queue message is not valid JSON or does not match its model: it goes to the dead-letter queue."""


class ConfigurationError(PermanentError):
    """An environment variable or template parameter is missing or invalid."""


class ConditionFailedError(SasflowError):
    """A conditional write lost a race or found an unexpected state (Rule 2: a normal outcome, not a failure)."""


class ContentionError(RetryableError):
    """A workflow changed under every one of a call's conditional writes; the message is delivered again later.

    Each write lost to another writer of the same workflow (parallel replies, the supervisor, a cancel) and every
    fresh read led to another lost write. The record becomes a batch-item failure, so nothing is lost.
    """

    def __init__(self, workflow_id: str, attempts: int) -> None:
        super().__init__(f"workflow {workflow_id} changed during each of {attempts} read-and-write attempts")
        self.workflow_id = workflow_id
        self.attempts = attempts


class LeaseNotAcquiredError(SasflowError):
    """Another supervisor holds the lease."""


class RemoteRejectedError(PermanentError):
    """The remote service refused the action for a business reason; nothing happened remotely."""

    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


class RemoteTransientError(RetryableError):
    """The remote call failed in a way that may succeed later (5xx, 429, timeout, connection error).

    ``outcome_unknown`` is True when the request may have reached the service (a read timeout), so the action may
    have happened; retries with the same idempotency token make that safe. Once the agent's retries give up,
    ``calls`` counts the calls the attempt made and ``outcome_unknown`` covers all of them.
    """

    def __init__(self, message: str, *, status: int | None = None, outcome_unknown: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.outcome_unknown = outcome_unknown
        self.calls = 0


class AttemptDeferredError(RetryableError):
    """The agent may not call its service now; the attempt is deferred to ``retry_at`` without being used up.

    ``retry_at`` is epoch seconds. ``calls`` and ``outcome_unknown`` say what the attempt did before it was stopped
    (set by the agent runtime).
    """

    def __init__(self, message: str, agent: str, retry_at: int) -> None:
        super().__init__(message)
        self.agent = agent
        self.retry_at = retry_at
        self.calls = 0
        self.outcome_unknown = False


class CircuitOpenError(AttemptDeferredError):
    """The circuit breaker for the remote service is open; ``retry_at`` is when it lets a half-open probe through."""

    def __init__(self, agent: str, retry_at: int) -> None:
        super().__init__(f"circuit for {agent} is open until {retry_at}", agent, retry_at)


class CallsLimitedError(AttemptDeferredError):
    """The agent's declared call limits (max_in_flight, rate) leave no call for this record now
    (``sasflow.call_limits``); ``retry_at`` is when a unit or a token may be free."""

    def __init__(self, agent: str, retry_at: int, limits: str) -> None:
        super().__init__(f"calls to {agent} are at their limit ({limits}) until {retry_at}", agent, retry_at)


class DeadlineExceededError(RetryableError):
    """No time is left before min(complete_by, Lambda deadline) minus the safety margin.

    ``calls`` counts the remote calls made before time ran out (0: the attempt never reached the service), and
    ``outcome_unknown`` whether one of them may have taken effect unanswered.
    """

    def __init__(self, message: str, *, calls: int = 0, outcome_unknown: bool = False) -> None:
        super().__init__(message)
        self.calls = calls
        self.outcome_unknown = outcome_unknown
