"""Every botocore call made while a function runs is checked against that function's role before it is sent.

`install` wraps ``botocore.client.BaseClient._make_api_call`` once per process (every client, every paginator and
every retry loop goes through it; retries below it are not authorized again, as AWS authorizes each request but
they are the same request). While `acting_as` names a `Principal`, each call is mapped to what IAM authorizes
(`devstack.iam.requests.authorizations`) and evaluated (`devstack.iam.policy.evaluate`). A refused call raises the
error AWS would (``AccessDeniedException`` from DynamoDB and Secrets Manager; ``AccessDenied`` from SQS, S3 and
CloudWatch; a call `devstack.iam.requests` does not map is refused as unmapped), inside the function, so its own
error path runs; the refusal is also recorded (`refusals`) with the function, the action, the resource and the
statement that would allow it, and appended as a JSON line to ``$DEVSTACK_IAM_REFUSALS`` when that is set (how
worker processes report to the local stack).

Calls made while no principal acts (a test's own setup, the local stack's provisioning) are not checked.
"""

from __future__ import annotations

import contextvars
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Final

from devstack.iam.policy import AuthRequest, evaluate
from devstack.iam.requests import UnmappedOperation, authorizations
from devstack.iam.roles import Principal

__all__ = [
    "EVENT_SOURCE_ACTIONS",
    "PRINCIPAL_FILE_VARIABLE",
    "REFUSALS_FILE_VARIABLE",
    "Refusal",
    "acting_as",
    "clear_refusals",
    "event_source_refusals",
    "install",
    "install_for_worker",
    "read_refusals",
    "refusals",
]

REFUSALS_FILE_VARIABLE: Final = "DEVSTACK_IAM_REFUSALS"
"""A file each refusal is appended to as one JSON line (set for the local stack's worker processes)."""
PRINCIPAL_FILE_VARIABLE: Final = "DEVSTACK_IAM_PRINCIPAL"
"""A file holding the worker's function's `Principal` (`Principal.to_json`), read by `install_for_worker`."""

_ACTING: Final[contextvars.ContextVar[Principal | None]] = contextvars.ContextVar("devstack_iam_acting", default=None)
_LOCK: Final = threading.Lock()
_REFUSALS: Final[list[Refusal]] = []
_INSTALLED = False

#: The error code each service answers an unauthorized call with (each API reference's "Common Errors").
_DENIED_CODES: Final = {"dynamodb": "AccessDeniedException", "secretsmanager": "AccessDeniedException"}
_DENIED_STATUS: Final = {"dynamodb": 400, "secretsmanager": 400}


@dataclass(frozen=True)
class Refusal:
    """One call a function's role does not allow.

    Attributes
    ----------
    function, operation
        Who called what (``SchedulerFunction``, ``dynamodb:BatchGetItem``).
    action, resource
        What IAM authorizes and refused (empty for an operation the check cannot map).
    reason
        Why: no statement allows it, an explicit deny (named), or the operation is unmapped.
    missing
        The statement that would allow it, as JSON text (empty when the refusal is an explicit deny or unmapped).
    """

    function: str
    operation: str
    action: str
    resource: str
    reason: str
    missing: str

    def __str__(self) -> str:
        text = (
            f"{self.function}: {self.operation} refused: {self.action or '?'} on {self.resource or '?'} {self.reason}"
        )
        return f"{text}; missing statement: {self.missing}" if self.missing else text


@contextmanager
def acting_as(principal: Principal | None) -> Iterator[None]:
    """Check every AWS call made in this context (thread or task) against ``principal``'s role; None checks nothing."""
    token = _ACTING.set(principal)
    try:
        yield
    finally:
        _ACTING.reset(token)


def refusals() -> list[Refusal]:
    """The refusals recorded in this process so far (oldest first)."""
    with _LOCK:
        return list(_REFUSALS)


def clear_refusals() -> list[Refusal]:
    """Return the refusals recorded so far and forget them."""
    with _LOCK:
        taken = list(_REFUSALS)
        _REFUSALS.clear()
        return taken


def read_refusals(path: str | os.PathLike[str]) -> list[Refusal]:
    """The refusals appended to ``path`` by worker processes (none when the file does not exist)."""
    try:
        with open(path, encoding="utf-8") as source:
            return [Refusal(**json.loads(line)) for line in source if line.strip()]
    except FileNotFoundError:
        return []


#: What Lambda's event source mapping needs from the function's role to poll a queue (Lambda developer guide,
#: "Using Lambda with Amazon SQS", execution role permissions); CreateEventSourceMapping refuses a role without them.
EVENT_SOURCE_ACTIONS: Final = ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes")


def event_source_refusals(principal: Principal, queue_arn: str) -> list[Refusal]:
    """What ``principal``'s role lacks for Lambda to poll ``queue_arn`` for it (empty when it may)."""
    found = (
        _refused(
            principal,
            "lambda:CreateEventSourceMapping",
            AuthRequest(action, queue_arn, {"aws:SecureTransport": ["true"]}),
        )
        for action in EVENT_SOURCE_ACTIONS
    )
    return [refusal for refusal in found if refusal is not None]


def install_for_worker() -> None:
    """A local stack worker's init hook (``DEVSTACK_WORKER_INIT``): every call its function makes, from now on in
    this process, is checked against the role in ``$DEVSTACK_IAM_PRINCIPAL``."""
    with open(os.environ[PRINCIPAL_FILE_VARIABLE], encoding="utf-8") as source:
        principal = Principal.from_json(source.read())
    install()
    _ACTING.set(principal)  # the worker's main thread runs every invocation: its context keeps the principal


def _record(refusal: Refusal) -> None:
    with _LOCK:
        _REFUSALS.append(refusal)
    path = os.environ.get(REFUSALS_FILE_VARIABLE)
    if path:
        with open(path, "a", encoding="utf-8") as sink:  # one short line per write: appends do not interleave
            sink.write(json.dumps(asdict(refusal)) + "\n")


def _check(principal: Principal, service: str, operation: str, params: dict[str, Any]) -> Refusal | None:
    name = f"{service}:{operation}"
    try:
        requests = authorizations(service, operation, params, principal.where)
    except UnmappedOperation as error:
        return Refusal(principal.function, name, "", "", str(error), "")
    except (KeyError, TypeError) as error:  # parameters botocore's validation will refuse anyway
        return Refusal(principal.function, name, "", "", f"cannot map its parameters ({error!r})", "")
    return next((r for r in (_refused(principal, name, request) for request in requests) if r is not None), None)


def _refused(principal: Principal, operation: str, request: AuthRequest) -> Refusal | None:
    """The refusal of ``request`` (made for ``operation``) by ``principal``'s role, or None when it is allowed; a
    request no statement allows names the statement that would (an explicit deny names none: no allow helps)."""
    decision = evaluate(principal.statements, request)
    if decision.allowed:
        return None
    missing = (
        ""
        if decision.statement
        else json.dumps({"Effect": "Allow", "Action": request.action, "Resource": request.resource})
    )
    return Refusal(principal.function, operation, request.action, request.resource, decision.reason, missing)


def _denied_error(client: Any, principal: Principal, operation: str, refusal: Refusal) -> Exception:
    service = client.meta.service_model.service_name
    code = _DENIED_CODES.get(service, "AccessDenied")
    message = (
        f"User: {principal.arn} is not authorized to perform: {refusal.action or refusal.operation} "
        f"on resource: {refusal.resource or '*'} {refusal.reason}"
    )
    response = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": _DENIED_STATUS.get(service, 403), "RetryAttempts": 0},
    }
    error_class = client.exceptions.from_code(code)
    return error_class(response, operation)  # type: ignore[no-any-return]


def install() -> None:
    """Wrap botocore's API call once in this process (idempotent); checks happen only under `acting_as`."""
    global _INSTALLED
    from botocore.client import BaseClient

    with _LOCK:
        if _INSTALLED:
            return
        original = BaseClient._make_api_call  # type: ignore[attr-defined]

        def checked_api_call(self: Any, operation_name: str, api_params: dict[str, Any]) -> Any:
            principal = _ACTING.get()
            if principal is not None:
                service = self.meta.service_model.service_name
                refusal = _check(principal, service, operation_name, api_params)
                if refusal is not None:
                    _record(refusal)
                    raise _denied_error(self, principal, operation_name, refusal)
            return original(self, operation_name, api_params)

        setattr(BaseClient, "_make_api_call", checked_api_call)  # noqa: B010 # botocore's stubs omit it
        _INSTALLED = True
