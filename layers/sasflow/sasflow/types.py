"""Annotated aliases shared by the API, queue and store models.

Ids are validated at the edge so that a bad id never reaches DynamoDB keys or SQS bodies.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictInt

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
