"""Task tokens of callback steps: single-use, unguessable, and naming the attempt they answer.

A token is ``<workflow id>~<step>~<attempt>~<nonce>``. The nonce is 192 random bits (``secrets``) drawn when the
attempt is dispatched and kept on the step (``StepRecord.callback_nonce``), so no key is needed to issue or check
one, and nobody can forge a token for an attempt: the nonce of the attempt in flight is compared in constant time.
The readable part only routes the request to its workflow; the API then checks that the caller owns it (a token of
another owner is 404, like the workflow itself).

What a use answers (``POST /callbacks/{token}``):

====================================================== =========================================================
the token                                              answer
====================================================== =========================================================
names no workflow of the caller, or its nonce is wrong 404 ``CALLBACK_NOT_FOUND``
its attempt is waiting                                 200: applied (success, failure, or a heartbeat)
its attempt was answered already with this same answer 200: the result the first use was given (applied once)
its attempt was answered already with another answer  409 ``CALLBACK_ALREADY_USED``
its attempt is past complete-by + the grace, timed out 410 ``CALLBACK_EXPIRED``
or its workflow moved on
====================================================== =========================================================

*The same answer* is one whose canonical body (status, output, error, reason; sorted keys, compact JSON, absent and
null alike) has the SHA-256 digest kept on the step when the first was applied (`answer_digest`): a caller whose
response was lost can send it again safely. A heartbeat is never an answer: after one, a heartbeat is 409.
"""

from __future__ import annotations

import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import ConditionFailedError
from .messages import StepError, canonical_hash

_TOKEN = re.compile(
    r"^(?P<workflow>[A-Za-z0-9_.:-]{1,64})~(?P<step>[A-Za-z][A-Za-z0-9_]{0,63})~(?P<attempt>[1-9][0-9]{0,3})~(?P<nonce>[A-Za-z0-9_-]{32})$"
)
#: Characters of a task token at most (the route's path parameter is bounded by it).
MAX_TOKEN_CHARS = 64 + 1 + 64 + 1 + 4 + 1 + 32


class CallbackRefusedError(ConditionFailedError):
    """A use of a token that does not apply. A refusal, so the scheduler confirms it from a strongly consistent read
    first (an eventually consistent one may not show the attempt yet)."""


class CallbackNotFoundError(CallbackRefusedError):
    """The token names no workflow of the caller, or no attempt it issued (HTTP 404)."""


class CallbackUsedError(CallbackRefusedError):
    """The token's attempt was answered already: a token works once (HTTP 409)."""


class CallbackExpiredError(CallbackRefusedError):
    """The token's attempt timed out, or its workflow no longer waits for it (HTTP 410)."""


@dataclass(frozen=True)
class TaskToken:
    """A parsed token: the attempt it answers, and its nonce."""

    workflow_id: str
    step: str
    attempt: int
    nonce: str


def new_nonce() -> str:
    """32 URL-safe characters: 192 bits from ``secrets`` (the nonce of one attempt)."""
    return secrets.token_urlsafe(24)


def task_token(workflow_id: str, step: str, attempt: int, nonce: str) -> str:
    """The token of ``attempt`` of callback step ``step``."""
    return f"{workflow_id}~{step}~{attempt}~{nonce}"


def parse_token(token: str) -> TaskToken:
    """Split a token into the attempt it names and its nonce.

    Raises
    ------
    CallbackNotFoundError
        When it is not a token this engine issues.
    """
    match = _TOKEN.match(token)
    if match is None:
        raise CallbackNotFoundError("not a task token")
    return TaskToken(match["workflow"], match["step"], int(match["attempt"]), match["nonce"])


def nonce_matches(expected: str | None, given: str) -> bool:
    """Constant-time comparison of a stored nonce with a given one (False when none is stored)."""
    return expected is not None and hmac.compare_digest(expected.encode(), given.encode())


class CallbackRequest(BaseModel):
    """Body of ``POST /callbacks/{token}``: the answer to a callback step's attempt.

    ``succeeded`` completes the step with ``output`` (any JSON, kept like a task's output); ``failed`` fails the
    attempt with ``error`` (its retry policy may issue a new token); ``heartbeat`` keeps it waiting and moves its
    complete-by to ``timeout_seconds`` from now.
    """

    model_config = ConfigDict(extra="forbid")

    status: Literal["succeeded", "failed", "heartbeat"]
    output: Any = None
    error: StepError | None = None
    reason: str | None = Field(default=None, max_length=1024, description="Why (kept with a failure's error).")

    @model_validator(mode="after")
    def _shape_of_its_status(self) -> CallbackRequest:
        given = {name for name in ("output", "error", "reason") if getattr(self, name) is not None}
        allowed = {"succeeded": {"output"}, "failed": {"error", "reason"}, "heartbeat": set()}[self.status]
        if given - allowed:
            raise ValueError(f"a {self.status} answer takes no {', '.join(sorted(given - allowed))}")
        if self.status == "failed" and self.error is None:
            raise ValueError("a failed answer needs its error: {code, message}")
        return self


class CallbackResult(BaseModel):
    """Answer of ``POST /callbacks/{token}``: the step the token answered, and where it is now."""

    workflow_id: str
    step: str
    attempt: int
    step_status: str
    workflow_status: str
    complete_by: int | None = Field(default=None, description="After a heartbeat: the new complete-by (epoch s).")


def answer_digest(request: CallbackRequest) -> str:
    """The SHA-256 hex digest of an answer's canonical body (``messages.canonical_hash``).

    Two answers are the same when their digests are: the same status and the same output, or the same error and
    reason. A field left out and one given as null are the same (both are absent from the canonical body).
    """
    return canonical_hash(request.model_dump(mode="json", exclude_none=True))
