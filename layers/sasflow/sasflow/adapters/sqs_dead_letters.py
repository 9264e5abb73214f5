"""Dead-letter queues for the operators: list what is in them, and move it back (SQS message move tasks).

Listing reads messages without taking them: each is received with a short visibility timeout and made visible
again at once (ChangeMessageVisibility to 0), so a listing never hides a message from a redrive. It raises the
messages' receive count, which a dead-letter queue does not act on (it has no redrive policy of its own).

A redrive is SQS ``StartMessageMoveTask`` (SQS Developer Guide, "Configuring a dead-letter queue redrive"): without
a destination, every message goes back to the queue it was dead-lettered from, as a new message. Moving a message
back is always safe: the engine acknowledges a stale one and changes nothing (DESIGN Rule 5), an agent answers a
request that is past its complete-by without calling its service, and the scheduler drops a reply for an attempt
that is not the step's current one.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_plus

from botocore.exceptions import ClientError

from ..errors import ConditionFailedError, DeadLetterQueueNotFoundError
from ..settings import DeadLetterQueue

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient

logger = logging.getLogger("sasflow.dead_letters")

#: How long a listed message stays hidden before it is made visible again (seconds): long enough to read a page.
_PEEK_VISIBILITY_SECONDS = 30
#: Receives one listing makes at most (10 messages each): a page is bounded whatever the queue holds.
_MAX_RECEIVES = 10


@dataclass(frozen=True)
class DeadLetter:
    """One message in a dead-letter queue, as far as its body tells.

    Attributes
    ----------
    queue:
        The dead-letter queue's logical name (``FlightsDeadLetterQueue``).
    message_id:
        The SQS message id.
    kind:
        ``step.request`` (to an agent), ``step.reply`` (to the scheduler), ``trigger.refused`` (an occurrence a
        trigger could not start: ``reason`` says why), ``trigger.tick`` (a schedule's tick that failed five times),
        ``trigger.event`` (an event that failed five times, or that its rule could not deliver),
        or ``unreadable``.
    workflow_id, step, phase, attempt:
        What the message is about (None when the body is not a sasflow message).
    sent_at:
        When it was first sent (epoch seconds; SQS ``SentTimestamp``).
    age_seconds:
        How long ago that was, at the listing (seconds).
    receive_count:
        ``ApproximateReceiveCount`` (the receives that dead-lettered it, and the listings since).
    body_bytes:
        Size of its body (bytes).
    reason:
        Why a trigger refused the occurrence (``CODE: what to do``), when it did.
    """

    queue: str
    message_id: str
    kind: str
    workflow_id: str | None
    step: str | None
    phase: str | None
    attempt: int | None
    sent_at: int
    age_seconds: int
    receive_count: int
    body_bytes: int
    reason: str | None = None


@dataclass
class DeadLetterListing:
    """What a dead-letter queue holds: its approximate depth, the messages read, and its recent move tasks."""

    queue: str
    approximate_messages: int
    messages: list[DeadLetter] = field(default_factory=list)
    move_tasks: list[dict[str, Any]] = field(default_factory=list)


class DeadLetterQueues:
    """The stack's dead-letter queues (``EngineConfig.dead_letter_queues``) over one SQS client.

    Parameters
    ----------
    client:
        A boto3 SQS client.
    queues:
        Logical name → URL and ARN of each dead-letter queue.
    """

    def __init__(self, client: SQSClient, queues: dict[str, DeadLetterQueue]) -> None:
        self.client = client
        self.queues = queues

    def _queue(self, name: str) -> DeadLetterQueue:
        try:
            return self.queues[name]
        except KeyError:
            raise DeadLetterQueueNotFoundError(
                f"no dead-letter queue {name!r}; there are {sorted(self.queues)}"
            ) from None

    def depths(self) -> dict[str, int]:
        """Approximate number of messages in each dead-letter queue (one GetQueueAttributes each)."""
        return {name: self._depth(queue) for name, queue in sorted(self.queues.items())}

    def _depth(self, queue: DeadLetterQueue) -> int:
        attributes = self.client.get_queue_attributes(
            QueueUrl=queue.url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attributes.get("ApproximateNumberOfMessages", 0))

    def peek(self, name: str, *, now: int, limit: int = 50) -> DeadLetterListing:
        """Read up to ``limit`` messages of dead-letter queue ``name`` without taking them, and its move tasks.

        ``limit`` 0 receives nothing (a redrive's progress is read so, without hiding messages from the move).

        Raises
        ------
        DeadLetterQueueNotFoundError
            When the stack has no dead-letter queue of that name.
        """
        queue = self._queue(name)
        listing = DeadLetterListing(name, self._depth(queue))
        seen: dict[str, DeadLetter] = {}
        handles: list[str] = []
        for _ in range(_MAX_RECEIVES):
            if len(seen) >= limit:
                break
            response = self.client.receive_message(
                QueueUrl=queue.url,
                MaxNumberOfMessages=min(10, limit - len(seen)),
                VisibilityTimeout=_PEEK_VISIBILITY_SECONDS,
                WaitTimeSeconds=0,
                MessageSystemAttributeNames=["SentTimestamp", "ApproximateReceiveCount"],
            )
            messages = response.get("Messages", [])
            if not messages:
                break
            for message in messages:
                handles.append(message["ReceiptHandle"])
                seen.setdefault(message["MessageId"], _dead_letter(name, dict(message), now))
        self._release(queue, handles)
        listing.messages = sorted(seen.values(), key=lambda letter: letter.sent_at)
        listing.move_tasks = self.move_tasks(name)
        return listing

    def _release(self, queue: DeadLetterQueue, handles: list[str]) -> None:
        for start in range(0, len(handles), 10):
            entries: list[dict[str, Any]] = [
                {"Id": str(i), "ReceiptHandle": handle, "VisibilityTimeout": 0}
                for i, handle in enumerate(handles[start : start + 10])
            ]
            failed = self.client.change_message_visibility_batch(QueueUrl=queue.url, Entries=entries).get("Failed")  # type: ignore[arg-type]
            if failed:  # they become visible again when the short timeout ends
                logger.warning("listed dead letters not released at once", extra={"failed": len(failed)})

    def redrive(self, name: str, *, max_per_second: int | None = None) -> dict[str, Any]:
        """Move every message of dead-letter queue ``name`` back to the queue it came from.

        Returns
        -------
        dict
            ``queue``, ``task_handle`` and ``approximate_messages`` (the depth when the move started).

        Raises
        ------
        DeadLetterQueueNotFoundError
            When the stack has no dead-letter queue of that name.
        ConditionFailedError
            When SQS refuses the move (a move of this queue is already running, or the queue is not a dead-letter
            queue of any other): the API's 409, with SQS's reason.
        """
        queue = self._queue(name)
        depth = self._depth(queue)
        kwargs: dict[str, Any] = {"SourceArn": queue.arn}
        if max_per_second is not None:
            kwargs["MaxNumberOfMessagesPerSecond"] = max_per_second
        try:
            handle = self.client.start_message_move_task(**kwargs)["TaskHandle"]
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise ConditionFailedError(
                f"SQS refused to move {name}'s messages: {error.get('Code', '')}: {error.get('Message', '')}"
            ) from None
        logger.info("dead letters redriven", extra={"queue": name, "approximate_messages": depth})
        return {"queue": name, "task_handle": handle, "approximate_messages": depth}

    def move_tasks(self, name: str) -> list[dict[str, Any]]:
        """The recent message move tasks of dead-letter queue ``name``, newest first (status, moved, to move)."""
        queue = self._queue(name)
        results = self.client.list_message_move_tasks(SourceArn=queue.arn, MaxResults=10).get("Results", [])
        return [
            {
                "task_handle": task.get("TaskHandle"),  # only while RUNNING (SQS ListMessageMoveTasks)
                "status": task.get("Status"),
                "started_at": int(task.get("StartedTimestamp", 0)) // 1000,
                "moved": task.get("ApproximateNumberOfMessagesMoved", 0),
                "to_move": task.get("ApproximateNumberOfMessagesToMove"),
                "failure_reason": task.get("FailureReason"),
            }
            for task in results
        ]


def _occurrence(body: Any) -> str | None:
    """Which tick, event or upload a trigger's message is (``tick <time>``, ``event <id>``, ``upload <bucket>/<key>``),
    so a person can tell two refused ones apart; None when the body names none (an sqs trigger's refusal names its
    message instead)."""
    try:
        document = json.loads(body) if isinstance(body, str) else None
    except (ValueError, RecursionError):  # not JSON, or nested past the interpreter's limit (found by a trial)
        return None
    if not isinstance(document, dict):
        return None
    if isinstance(document.get("scheduled_time"), str):
        return _text(f"tick {document['scheduled_time']}", 80)
    if isinstance(document.get("id"), str) and "detail" in document:
        return _text(f"event {document['id']}", 80)
    records: Any = document.get("Records")  # an s3 trigger's upload: which object
    try:
        found = records[0]["s3"]
        bucket, key = found["bucket"]["name"], found["object"]["key"]
    except (TypeError, KeyError, IndexError):
        return None
    if not isinstance(key, str):  # a refused notification's key may be anything (found by a trial: an int, a 500)
        return _text(f"upload {bucket}/{key!r}", 200)
    try:
        decoded = unquote_plus(key, errors="strict")
    except UnicodeDecodeError:
        decoded = key  # as the notification has it: the trigger refused it for that
    return _text(f"upload {bucket}/{decoded}", 200)


def _dead_letter(queue: str, message: dict[str, Any], now: int) -> DeadLetter:
    body = message.get("Body", "")
    attributes = message.get("Attributes", {})
    sent_at = int(attributes.get("SentTimestamp", now * 1000)) // 1000
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # a poison message may be anything, 3,000 levels deep included
        document = None
    if not isinstance(document, dict):
        document = {}
    attempt = document.get("attempt")
    kind, reason = str(document.get("kind", "unreadable")), None
    refused = document.get("refused")
    if isinstance(refused, dict):  # sasflow.triggers.TriggerService.refuse
        which = _occurrence(refused.get("body") if isinstance(refused.get("body"), str) else document.get("body"))
        original = refused.get("message")  # an sqs trigger's: its occurrence is the message's id
        if isinstance(original, dict) and isinstance(original.get("id"), str):
            which = _text(f"message {original['id']}", 80)
        said = f"{refused.get('code')}: {refused.get('reason')}"
        kind, reason = "trigger.refused", _text(f"{which}: {said}" if which else said, 1024)
    elif "scheduled_time" in document:
        kind, reason = "trigger.tick", _occurrence(body)
    elif "detail-type" in document and "id" in document:  # an event as an EventBridge rule delivers it
        kind, reason = "trigger.event", _occurrence(body)
    return DeadLetter(
        queue=queue,
        message_id=message["MessageId"],
        kind=kind,
        workflow_id=_text(document.get("workflow_id")),
        step=_text(document.get("step")),
        phase=_text(document.get("phase")),
        attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
        sent_at=sent_at,
        age_seconds=max(0, now - sent_at),
        receive_count=int(attributes.get("ApproximateReceiveCount", 0)),
        body_bytes=len(body.encode("utf-8", "surrogatepass")),
        reason=reason,
    )


def _text(value: Any, limit: int = 128) -> str | None:
    return value[:limit] if isinstance(value, str) else None
