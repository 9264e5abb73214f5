"""Annotated aliases shared by the API, queue and store models.

Ids are validated at the edge so that a bad id never reaches DynamoDB keys or SQS bodies.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, StrictInt

#: Workflow id: a UUID string, or any URL-safe id up to 64 characters.
WorkflowId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
#: Step name: unique within a workflow definition; used in store keys and JMESPath references.
StepName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z][A-Za-z0-9_]*$")]
#: Agent name: one agent (and one request queue) per remote service.
AgentName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_-]*$")]
#: Action name understood by the remote service.
ActionName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$")]
#: Epoch seconds (UTC), always an integer: DynamoDB stores it as type N and compares it in the deadline index.
EpochSeconds = Annotated[StrictInt, Field(ge=0, le=32503680000)]
#: Attempt number, starting at 1.
Attempt = Annotated[StrictInt, Field(ge=1, le=1000)]
#: Client-supplied Idempotency-Key header value.
IdempotencyKey = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _a_reason(text: str) -> str:
    if not text.strip():
        raise ValueError("a reason must say something: it is audited with your principal")
    if _CONTROL.search(text):
        raise ValueError("a reason is one line of text, without control characters")
    return text


#: Why an operator acts: audited with their principal, so never blank, one line, no control characters.
Reason = Annotated[str, Field(min_length=1, max_length=500), AfterValidator(_a_reason)]
#: A trigger's name, as in triggers.yaml (it names AWS resources too).
TriggerName = Annotated[str, Field(min_length=1, max_length=40, pattern=r"^[a-z][a-z0-9-]*$")]
