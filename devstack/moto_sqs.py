"""SQS dead-letter queue redrive for moto: StartMessageMoveTask, ListMessageMoveTasks, CancelMessageMoveTask.

moto 5.2.5 answers these three actions with ``NotImplementedError``. `install` adds them to moto's SQS response
and backend classes in this process, so ``moto.mock_aws()`` and the moto server that `devstack.stack.LocalStack`
runs in a thread of the same process both answer them, and product code calls boto3 exactly as on AWS
(``sqs.start_message_move_task(SourceArn=..., DestinationArn=..., MaxNumberOfMessagesPerSecond=...)``,
``sqs.list_message_move_tasks(SourceArn=..., MaxResults=...)``, ``sqs.cancel_message_move_task(TaskHandle=...)``).

Sources
-------
[API]
    Amazon SQS API Reference (sqs-2012-11-05): StartMessageMoveTask, ListMessageMoveTasks,
    ListMessageMoveTasksResultEntry, CancelMessageMoveTask, ReceiveMessage. botocore's service model carries the
    same text, and moto parses requests and serializes answers from it.
[GUIDE]
    Amazon SQS Developer Guide, "Learn how to configure a dead-letter queue redrive in Amazon SQS".
[RECORDED]
    The answers of AWS recorded by LocalStack's AWS-validated snapshot tests of these actions
    (``tests/aws/services/sqs/test_sqs_move_task.snapshot.json``). The API Reference lists the error shapes of each
    action but not which one a case gets; these recordings do, and give the messages.
[LOCAL]
    A choice of this emulator where AWS documents nothing, or where the emulation is simpler than AWS.

Rules
-----
1. *Source.* ``SourceArn`` must name an existing queue that is the dead-letter queue of at least one other SQS
   queue, i.e. some queue's ``RedrivePolicy.deadLetterTargetArn`` [API]. Otherwise ``InvalidParameterValue``
   "Source queue must be configured as a Dead Letter Queue." [RECORDED]. A ``SourceArn`` that names no queue gets
   ``ResourceNotFoundException`` "The resource that you specified for the SourceArn parameter doesn't exist."
   [LOCAL: the message AWS gives for a missing DestinationArn and for a task handle of a missing source, RECORDED].
2. *Destination.* With ``DestinationArn`` every message goes to that queue, which must exist, otherwise
   ``ResourceNotFoundException`` "The resource that you specified for the DestinationArn parameter doesn't exist."
   [API, RECORDED]. Without it (or blank) "the messages will be redriven back to their respective original source
   queues" [API]: the queue a message was moved from, which SQS exposes as the message's
   ``DeadLetterQueueSourceArn`` system attribute [API, ReceiveMessage]. moto moves a message to the dead-letter
   queue inside ReceiveMessage without recording where from; `install` wraps that so the message remembers the ARN
   of the queue it left (attribute ``dead_letter_queue_source_arn`` of moto's ``Message``). A message with no
   recorded source (sent straight to the dead-letter queue, or moved before `install`) goes to the dead-letter
   queue's only source queue when it has exactly one [LOCAL], otherwise the task fails (rule 6).
3. *Now, not later.* AWS runs an asynchronous task; here the messages are moved inside the StartMessageMoveTask
   call [LOCAL], so the task is ``COMPLETED`` (or ``FAILED``) when the call returns and is never ``RUNNING``.
   ``MaxNumberOfMessagesPerSecond`` (1 to 500 [API]; out of range ``InvalidParameterValue`` [LOCAL]) is therefore
   recorded and listed but does not slow anything. "Only one active message movement task is supported per queue
   at any given time" [API] (a second start gets ``InvalidParameterValue`` "There is already a task running. Only
   one active task is allowed for a source queue arn at a given time." [RECORDED]) cannot trigger here: moves in
   this process are serialized by a lock and none outlives its call.
4. *What moves.* The messages visible in the dead-letter queue when the task starts, oldest first ("redrive
   messages in the order they are received, starting with the oldest message" [GUIDE]);
   ``ApproximateNumberOfMessagesToMove`` is their number, "obtained at the time of starting" [API]. Messages in
   flight (received and not yet visible again) and delayed messages stay in the dead-letter queue [LOCAL].
5. *A moved message is a new message.* "The redrive task resets the retention period. All redriven messages are
   considered new messages with a new messageID and enqueueTime." [GUIDE]. So each is sent to its target as a new
   message: the same body, the same message attributes (and ``AWSTraceHeader``), a new ``MessageId``,
   ``SentTimestamp`` now, ``ApproximateReceiveCount`` 0, the target's ``DelaySeconds``; and it leaves the
   dead-letter queue. A FIFO message keeps its ``MessageGroupId`` and ``MessageDeduplicationId`` [LOCAL].
6. *Failure.* A target queue that does not exist when its message's turn comes (an original source queue deleted
   since, say) ends the task ``FAILED`` with ``FailureReason`` ``AWS.SimpleQueueService.NonExistentQueue`` (what
   AWS lists for a destination deleted during a task [RECORDED]); a target that refuses the message ends it
   ``FAILED`` with the refusal's error code [LOCAL]. Messages already moved stay moved and the rest stay in the
   dead-letter queue [RECORDED: that task listed 3 of 10 moved, and the dead-letter queue still had messages].
7. *Listing.* ListMessageMoveTasks gives the most recent tasks of ``SourceArn``, newest first: ``MaxResults``
   defaults to 1, at most 10 [API] (out of range ``InvalidParameterValue`` [LOCAL]); at most 10 tasks are kept
   per source [LOCAL]. An entry has ``Status`` (RUNNING, COMPLETED, CANCELLING, CANCELLED or FAILED),
   ``SourceArn``, ``ApproximateNumberOfMessagesMoved``, ``ApproximateNumberOfMessagesToMove`` and
   ``StartedTimestamp`` (epoch milliseconds [LOCAL: the API gives a Long]); ``DestinationArn`` and
   ``MaxNumberOfMessagesPerSecond`` only when the start request gave them, ``FailureReason`` only when FAILED, and
   ``TaskHandle`` only while RUNNING [API], so never here. A ``SourceArn`` that names no queue gets
   ``ResourceNotFoundException`` as in rule 1; a queue without tasks lists none [LOCAL].
8. *Task handle.* An opaque string [API]; here, like the handles AWS returns, the base64 of a JSON object with the
   task id and the source ARN [RECORDED: LocalStack decodes AWS's handles so], which is what lets cancel tell the
   cases of rule 9 apart.
9. *Cancelling.* "A message movement can only be cancelled when the current status is RUNNING" [API]. A handle
   that cannot be decoded gets ``InvalidParameterValue`` "Value for parameter TaskHandle is invalid."; a handle
   whose source queue does not exist ``ResourceNotFoundException`` "The resource that you specified for the
   SourceArn parameter doesn't exist."; a handle of no task ``ResourceNotFoundException`` "Task does not exist."
   [RECORDED]. A finished task, which is every task here, gets that same ``ResourceNotFoundException`` "Task does
   not exist." [LOCAL: AWS documents that only a RUNNING task can be cancelled, not the error for the others; this
   is its answer for a handle with nothing to cancel].

Known differences: moto answers ``ResourceNotFoundException`` with HTTP 400, because the botocore model gives the
shape no status, where AWS answers 404 [RECORDED]; boto3 raises the same error code either way. ReceiveMessage does
not return ``DeadLetterQueueSourceArn`` (moto does not list it among the system attributes it returns).
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import copy
import dataclasses
import functools
import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Final

from moto.core.responses import ActionResult
from moto.core.utils import unix_time_millis
from moto.moto_api._internal import mock_random
from moto.sqs.exceptions import SQSException
from moto.sqs.models import Queue, SQSBackend, sqs_backends
from moto.sqs.responses import SQSResponse

__all__ = ["SOURCE_ARN_ATTRIBUTE", "MessageMoveTask", "install"]

logger = logging.getLogger(__name__)

SOURCE_ARN_ATTRIBUTE: Final = "dead_letter_queue_source_arn"
"""Attribute of moto's ``Message`` holding the ARN of the queue moto moved it from into a dead-letter queue."""

MAX_MESSAGES_PER_SECOND: Final = 500  # [API] StartMessageMoveTask.MaxNumberOfMessagesPerSecond
MAX_RESULTS: Final = 10  # [API] ListMessageMoveTasks.MaxResults
KEPT_TASKS_PER_SOURCE: Final = 10  # [API] "the most recent message movement tasks (up to 10)"
NON_EXISTENT_QUEUE: Final = "AWS.SimpleQueueService.NonExistentQueue"

_TASKS_ATTRIBUTE: Final = "message_move_tasks"  # on an SQSBackend; moto's reset() clears its __dict__ with it
_MARK: Final = "__sasflow_message_move__"
_INSTALL_LOCK: Final = threading.Lock()
_MOVE_LOCK: Final = threading.RLock()
"""Serializes task starts, moves and cancels in this process (the moto server answers on several threads)."""

_RECEIVING: contextvars.ContextVar[Any] = contextvars.ContextVar("sasflow_sqs_receiving", default=None)
"""The queue a ReceiveMessage of this thread reads, while moto runs it (and may move messages to its DLQ)."""


class InvalidParameterValue(SQSException):
    def __init__(self, message: str) -> None:
        super().__init__("InvalidParameterValue", message)


class ResourceNotFound(SQSException):
    def __init__(self, message: str) -> None:
        super().__init__("ResourceNotFoundException", message)


def _not_found(parameter: str) -> ResourceNotFound:
    return ResourceNotFound(f"The resource that you specified for the {parameter} parameter doesn't exist.")


@dataclasses.dataclass
class MessageMoveTask:
    """One StartMessageMoveTask: what ListMessageMoveTasks reports of it.

    ``started_timestamp`` is in epoch milliseconds; the counts are messages.
    """

    task_id: str
    source_arn: str
    destination_arn: str | None
    max_number_of_messages_per_second: int | None
    started_timestamp: int
    status: str = "RUNNING"
    approximate_number_of_messages_moved: int = 0
    approximate_number_of_messages_to_move: int = 0
    failure_reason: str | None = None

    @property
    def task_handle(self) -> str:
        """The opaque handle StartMessageMoveTask returns (rule 8)."""
        return encode_task_handle(self.task_id, self.source_arn)

    def fail(self, reason: str) -> None:
        self.status = "FAILED"
        self.failure_reason = reason

    def entry(self) -> dict[str, Any]:
        """The task as a ListMessageMoveTasksResultEntry (rule 7)."""
        entry: dict[str, Any] = {
            "Status": self.status,
            "SourceArn": self.source_arn,
            "ApproximateNumberOfMessagesMoved": self.approximate_number_of_messages_moved,
            "ApproximateNumberOfMessagesToMove": self.approximate_number_of_messages_to_move,
            "StartedTimestamp": self.started_timestamp,
        }
        if self.status == "RUNNING":
            entry["TaskHandle"] = self.task_handle
        if self.destination_arn is not None:
            entry["DestinationArn"] = self.destination_arn
        if self.max_number_of_messages_per_second is not None:
            entry["MaxNumberOfMessagesPerSecond"] = self.max_number_of_messages_per_second
        if self.failure_reason is not None:
            entry["FailureReason"] = self.failure_reason
        return entry


def encode_task_handle(task_id: str, source_arn: str) -> str:
    """A task handle: base64 of ``{"taskId": ..., "sourceArn": ...}`` (rule 8)."""
    return base64.b64encode(json.dumps({"taskId": task_id, "sourceArn": source_arn}).encode()).decode()


def decode_task_handle(handle: str) -> tuple[str, str]:
    """``(task_id, source_arn)`` of a handle.

    Raises
    ------
    InvalidParameterValue
        The handle is not one `encode_task_handle` made.
    """
    try:
        fields = json.loads(base64.b64decode(handle.encode(), validate=True))
        task_id, source_arn = fields["taskId"], fields["sourceArn"]
    except (binascii.Error, ValueError, TypeError, KeyError, AttributeError) as error:
        raise InvalidParameterValue("Value for parameter TaskHandle is invalid.") from error
    if not isinstance(task_id, str) or not isinstance(source_arn, str):
        raise InvalidParameterValue("Value for parameter TaskHandle is invalid.")
    return task_id, source_arn


# --------------------------------------------------------------------------------------------- queues by ARN


def _arn_parts(arn: Any) -> tuple[str, str, str] | None:
    """``(region, account, name)`` of an SQS queue ARN ``arn:<partition>:sqs:<region>:<account>:<name>``."""
    if not isinstance(arn, str):
        return None
    parts = arn.split(":")
    if len(parts) != 6 or parts[0] != "arn" or parts[2] != "sqs" or not all(parts[3:]):
        return None
    return parts[3], parts[4], parts[5]


def _backend_of(region: str, account: str) -> Any:
    try:
        return sqs_backends[account][region]
    except KeyError:  # a region moto does not know
        return None


def _queue_by_arn(arn: str) -> Any:
    """moto's ``Queue`` with this ARN, or None."""
    parts = _arn_parts(arn)
    if parts is None:
        return None
    region, account, name = parts
    backend = _backend_of(region, account)
    queue = None if backend is None else backend.queues.get(name)
    return queue if queue is not None and queue.queue_arn == arn else None


def _require_queue(arn: Any, parameter: str) -> Any:
    if _arn_parts(arn) is None:
        raise InvalidParameterValue(f"Value for parameter {parameter} is invalid.")
    queue = _queue_by_arn(arn)
    if queue is None:
        raise _not_found(parameter)
    return queue


def _home_backend(queue: Any) -> Any:
    return sqs_backends[queue.account_id][queue.region]


def _tasks_of(backend: Any) -> dict[str, list[MessageMoveTask]]:
    """The backend's tasks by source ARN, oldest first."""
    tasks: dict[str, list[MessageMoveTask]] = backend.__dict__.setdefault(_TASKS_ATTRIBUTE, {})
    return tasks


def _dead_letter_sources(dlq: Any) -> list[Any]:
    """The queues whose redrive policy targets ``dlq`` (by ARN, as AWS reads the policy)."""
    return [
        queue
        for queue in _home_backend(dlq).queues.values()
        if queue is not dlq and (queue.redrive_policy or {}).get("deadLetterTargetArn") == dlq.queue_arn
    ]


# --------------------------------------------------------------------------------------------- moving


def _take(queue: Any, message: Any) -> bool:
    """Remove ``message`` from ``queue`` if it is still there and visible (not received meanwhile)."""
    with queue._messages_lock:
        if not message.visible or message.delayed:
            return False
        for index, candidate in enumerate(queue._messages):
            if candidate is message:
                del queue._messages[index]
                queue.pending_messages.discard(message)
                return True
    return False


def _put_back(queue: Any, message: Any) -> None:
    with queue._messages_lock:
        queue._messages.insert(0, message)


def _send_as_new(target: Any, message: Any) -> None:
    """Send ``message`` to ``target`` as a new message (rule 5); moto gives it a new id and receive count 0."""
    fifo = bool(target.fifo_queue)
    _home_backend(target).send_message(
        target.name,
        message.body,
        message_attributes=copy.deepcopy(message.message_attributes),
        delay_seconds=None,  # the target's DelaySeconds
        deduplication_id=message.deduplication_id if fifo else None,
        group_id=message.group_id if fifo else None,
        system_attributes=copy.deepcopy(message.system_attributes) or None,
    )


def _move(task: MessageMoveTask, source: Any) -> None:
    candidates = list(source.messages)  # visible and not delayed, oldest first (rules 4 and 5)
    task.approximate_number_of_messages_to_move = len(candidates)
    origins = _dead_letter_sources(source)
    sole_origin = origins[0].queue_arn if len(origins) == 1 else None
    for message in candidates:
        target_arn = task.destination_arn or getattr(message, SOURCE_ARN_ATTRIBUTE, None) or sole_origin
        target = None if target_arn is None else _queue_by_arn(target_arn)
        if target is None:
            task.fail(NON_EXISTENT_QUEUE)
            return
        if not _take(source, message):
            continue  # received or deleted since the task started
        try:
            _send_as_new(target, message)
        except SQSException as error:
            _put_back(source, message)
            task.fail(str(error.code))
            return
        task.approximate_number_of_messages_moved += 1
    task.status = "COMPLETED"


# --------------------------------------------------------------------------------------------- backend methods


def _start_message_move_task(
    self: Any,
    source_arn: str,
    destination_arn: str | None = None,
    max_number_of_messages_per_second: int | None = None,
) -> MessageMoveTask:
    """SQSBackend.start_message_move_task: validate, then move at once (rules 1 to 6)."""
    source = _require_queue(source_arn, "SourceArn")
    if not _dead_letter_sources(source):
        raise InvalidParameterValue("Source queue must be configured as a Dead Letter Queue.")
    destination_arn = destination_arn or None
    if destination_arn is not None:
        _require_queue(destination_arn, "DestinationArn")
    rate = max_number_of_messages_per_second
    if rate is not None and not 1 <= int(rate) <= MAX_MESSAGES_PER_SECOND:
        raise InvalidParameterValue(
            f"Value {rate} for parameter MaxNumberOfMessagesPerSecond is invalid. "
            f"Reason: must be between 1 and {MAX_MESSAGES_PER_SECOND}."
        )
    with _MOVE_LOCK:
        tasks = _tasks_of(_home_backend(source)).setdefault(source_arn, [])
        if any(t.status in ("RUNNING", "CANCELLING") for t in tasks):  # unreachable while moves finish in the call
            raise InvalidParameterValue(
                "There is already a task running. Only one active task is allowed for a source queue arn at a "
                "given time."
            )
        task = MessageMoveTask(
            task_id=str(mock_random.uuid4()),
            source_arn=source_arn,
            destination_arn=destination_arn,
            max_number_of_messages_per_second=None if rate is None else int(rate),
            started_timestamp=int(unix_time_millis()),
        )
        tasks.append(task)
        del tasks[:-KEPT_TASKS_PER_SOURCE]
        _move(task, source)
    logger.debug("message move task %s from %s: %s", task.task_id, source_arn, task.entry())
    return task


def _list_message_move_tasks(self: Any, source_arn: str, max_results: int | None = None) -> list[MessageMoveTask]:
    """SQSBackend.list_message_move_tasks: newest first (rule 7)."""
    source = _require_queue(source_arn, "SourceArn")
    limit = 1 if max_results is None else int(max_results)
    if not 1 <= limit <= MAX_RESULTS:
        raise InvalidParameterValue(
            f"Value {limit} for parameter MaxResults is invalid. Reason: must be between 1 and {MAX_RESULTS}."
        )
    with _MOVE_LOCK:
        tasks = _tasks_of(_home_backend(source)).get(source.queue_arn, [])
        return list(reversed(tasks))[:limit]


def _cancel_message_move_task(self: Any, task_handle: str) -> MessageMoveTask:
    """SQSBackend.cancel_message_move_task (rule 9); every task here has finished, so this always raises."""
    task_id, source_arn = decode_task_handle(task_handle)
    source = _queue_by_arn(source_arn)
    if source is None:
        raise _not_found("SourceArn")
    with _MOVE_LOCK:
        tasks = _tasks_of(_home_backend(source)).get(source.queue_arn, [])
        task = next((t for t in tasks if t.task_id == task_id), None)
        if task is None or task.status != "RUNNING":
            raise ResourceNotFound("Task does not exist.")
        task.status = "CANCELLED"  # a task that could run would be stopped here; none can
        return task


# --------------------------------------------------------------------------------------------- response methods


def _response_start_message_move_task(self: Any) -> Any:
    task = self.sqs_backend.start_message_move_task(
        source_arn=self._get_param("SourceArn"),
        destination_arn=self._get_param("DestinationArn"),
        max_number_of_messages_per_second=self._get_param("MaxNumberOfMessagesPerSecond"),
    )
    return ActionResult({"TaskHandle": task.task_handle})


def _response_list_message_move_tasks(self: Any) -> Any:
    tasks = self.sqs_backend.list_message_move_tasks(
        source_arn=self._get_param("SourceArn"), max_results=self._get_param("MaxResults")
    )
    return ActionResult({"Results": [task.entry() for task in tasks]})


def _response_cancel_message_move_task(self: Any) -> Any:
    task = self.sqs_backend.cancel_message_move_task(task_handle=self._get_param("TaskHandle"))
    return ActionResult({"ApproximateNumberOfMessagesMoved": task.approximate_number_of_messages_moved})


# --------------------------------------------------------------------------------------------- recording the source


def _recording_receive(original: Callable[..., Any]) -> Callable[..., Any]:
    """SQSBackend.receive_message that tells `_recording_add` which queue it reads (rule 2)."""

    @functools.wraps(original)
    def receive_message(self: Any, queue_name: str, *args: Any, **kwargs: Any) -> Any:
        token = _RECEIVING.set(self.queues.get(queue_name))
        try:
            return original(self, queue_name, *args, **kwargs)
        finally:
            _RECEIVING.reset(token)

    setattr(receive_message, _MARK, True)
    return receive_message


def _recording_add(original: Callable[..., Any]) -> Callable[..., Any]:
    """Queue.add_message that marks a message moto moves here from the queue being received (rule 2)."""

    @functools.wraps(original)
    def add_message(self: Any, message: Any) -> Any:
        origin = _RECEIVING.get()
        if origin is not None and origin is not self and origin.dead_letter_queue is self:
            setattr(message, SOURCE_ARN_ATTRIBUTE, origin.queue_arn)
        return original(self, message)

    setattr(add_message, _MARK, True)
    return add_message


# --------------------------------------------------------------------------------------------- install

_RESPONSE_METHODS: Final[dict[str, Callable[..., Any]]] = {
    "start_message_move_task": _response_start_message_move_task,
    "list_message_move_tasks": _response_list_message_move_tasks,
    "cancel_message_move_task": _response_cancel_message_move_task,
}
_BACKEND_METHODS: Final[dict[str, Callable[..., Any]]] = {
    "start_message_move_task": _start_message_move_task,
    "list_message_move_tasks": _list_message_move_tasks,
    "cancel_message_move_task": _cancel_message_move_task,
}


def install() -> None:
    """Add StartMessageMoveTask, ListMessageMoveTasks and CancelMessageMoveTask to moto's SQS in this process.

    Idempotent and thread-safe. moto dispatches an action to the ``SQSResponse`` method of its snake-case name,
    looked up on each request, so the methods added here serve ``moto.mock_aws()`` and every moto server of this
    process, including servers started before the call. Call it before the first message can reach a dead-letter
    queue: only moves made after it record their source queue (rule 2). Does nothing if moto already implements
    the actions itself.
    """
    with _INSTALL_LOCK:
        if getattr(SQSResponse, _MARK, False):
            return
        native = [name for name in _RESPONSE_METHODS if hasattr(SQSResponse, name)]
        if native:
            logger.info("moto implements %s itself; devstack.moto_sqs adds nothing", ", ".join(native))
            return
        for name, method in _RESPONSE_METHODS.items():
            setattr(method, _MARK, True)
            setattr(SQSResponse, name, method)
        for name, method in _BACKEND_METHODS.items():
            setattr(method, _MARK, True)
            setattr(SQSBackend, name, method)
        if not getattr(SQSBackend.receive_message, _MARK, False):
            SQSBackend.receive_message = _recording_receive(SQSBackend.receive_message)  # type: ignore[method-assign]
        if not getattr(Queue.add_message, _MARK, False):
            Queue.add_message = _recording_add(Queue.add_message)  # type: ignore[method-assign]
        setattr(SQSResponse, _MARK, True)
