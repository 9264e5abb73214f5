"""SQS batch processing with an outbox, for powertools ``process_partial_response``.

``OutboxBatchProcessor`` is a powertools ``BatchProcessor`` (SQS, ReportBatchItemFailures) whose record handler
returns the messages that record produces. A record that raises becomes a batch-item failure and its neighbours
still succeed (DESIGN Rule 9). When the batch ends, every produced message is sent, 10 per SendMessageBatch request,
and a record whose messages could not be sent is turned into a batch-item failure too, so SQS delivers it again.
``process_partial_response`` refuses an event without ``Records``: that is an error, never an empty success.

With ``reserve_seconds`` the processor stops starting records once the invocation has less than that left (read from
the Lambda context): the records not started become batch-item failures, so SQS delivers them again to a fresh
invocation, instead of the whole batch timing out and coming back after the visibility timeout (Lambda developer
guide, "Handling errors for an SQS event source": a timed-out invocation fails the whole batch).

Every batch-item failure writes one WARNING line, ``batch item failed``, with the queue's ``message_id``, its
``receive_count`` (SQS ``ApproximateReceiveCount``), ``reason`` (the error's class and message) and ``permanent``
(a malformed message, or any ``PermanentError``: it will fail again on every receive until the redrive policy moves
it to the dead-letter queue).

A poison message (one whose body is malformed: ``MalformedMessageError``, which no later receive can change) is made
visible again when the batch ends (``MessageBus.make_visible``: its visibility timeout set to 0), so SQS delivers it
again at once and its redrive policy moves it to the dead-letter queue after ``maxReceiveCount`` receives, within
seconds, and its alarm fires. Without that it would take ``maxReceiveCount`` x ``VisibilityTimeout`` (5 x 180 s =
15 minutes with template.yaml's queues). Every other failure keeps its visibility timeout: a transient one (a
throttled write, a lost race, a service down) is given that time to pass before the next receive, and a
``ConfigurationError`` waits for the deployment to be fixed instead of sending every message to the dead-letter queue.
"""

from __future__ import annotations

import contextvars
import logging
import random
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType
from aws_lambda_powertools.utilities.batch.base import FailureResponse, SuccessResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from pydantic import ValidationError

from .cost import ledger
from .errors import MalformedMessageError, PermanentError
from .messages import StepReply, decode_reply
from .ports import MessageBus, Outgoing, Receipt

logger = logging.getLogger("sasflow.batch")
#: Longest ``reason`` a failure line carries (characters): an error may quote a large body, which is never logged.
MAX_REASON_CHARS = 512


class OutboxBatchProcessor(BatchProcessor):
    """A ``BatchProcessor`` for SQS whose record handler returns ``Sequence[Outgoing]`` to send after the batch.

    Parameters
    ----------
    bus:
        Returns the message bus; called when the batch ends (so the bus can be built lazily at cold start).
    reserve_seconds:
        Do not start a record with less than this left in the invocation (seconds); 0 starts every record.
    """

    def __init__(
        self,
        bus: Callable[[], MessageBus],
        *,
        reserve_seconds: float = 0.0,
        runner: Callable[[], RecordRunner] | None = None,
        order: Callable[[Sequence[dict[str, Any]]], list[dict[str, Any]]] | None = None,
    ) -> None:
        super().__init__(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
        self._bus = bus
        self._runner = runner
        self._order = order
        self._outbox: list[tuple[dict[str, Any], Outgoing]] = []
        self._poison: list[Receipt] = []
        self._reserve_ms = reserve_seconds * 1000

    def _process_record(self, record: dict[str, Any]) -> SuccessResponse | FailureResponse:
        context = getattr(self, "lambda_context", None)
        if self._reserve_ms and context is not None and context.get_remaining_time_in_millis() < self._reserve_ms:
            try:
                raise OutOfTimeError(f"less than {self._reserve_ms / 1000:g} s left in the invocation; not started")
            except OutOfTimeError:
                return self.failure_handler(record=SQSRecord(record), exception=sys.exc_info())
        return super()._process_record(record)

    def process(self) -> list[tuple[Any, ...]]:
        """Handle the batch's records, one after the other or at once (``runner``); results in the records' order."""
        if self._runner is None:
            return super().process()
        records = self.records if self._order is None else self._order(self.records)
        results = self._runner()(self._process_record, records)
        # records finish in any order: their messages leave in the batch's order, as one at a time
        position = {id(record): index for index, record in enumerate(self.records)}
        self._outbox.sort(key=lambda entry: position.get(id(entry[0]), len(position)))
        return results

    def _prepare(self) -> None:
        super()._prepare()
        self._outbox = []
        self._poison = []

    def success_handler(self, record: Any, result: Any) -> SuccessResponse:
        """Collect what the record produced (``result``), then count it as a success."""
        for message in result or ():
            self._outbox.append((record, message))
        return super().success_handler(record, result)

    def failure_handler(self, record: Any, exception: Any) -> FailureResponse:
        """Count ``record`` as a batch-item failure and log it (see the module docstring for the line's keys)."""
        error = exception[1]
        log_failure(record, failure_reason(error), permanent=isinstance(error, PermanentError))
        if isinstance(error, MalformedMessageError):
            receipt = _receipt(record)
            if receipt is not None:
                self._poison.append(receipt)
        return super().failure_handler(record, exception)

    def _clean(self) -> None:
        if self._outbox:
            failed = self._bus().send([message for _, message in self._outbox])
            self._fail({_message_id(self._outbox[index][0]) for index in failed})
        if self._poison:
            # Its redrive policy counts receives: visible again now, it reaches the dead-letter queue in seconds.
            self._bus().make_visible(self._poison)
        super()._clean()

    def _fail(self, message_ids: set[str | None]) -> None:
        for record in list(self.success_messages):
            # powertools keeps the raw record dicts here and reports failures from data classes
            if _message_id(record) in message_ids:
                log_failure(record, "its messages could not be sent", permanent=False)
                self.success_messages.remove(record)
                self.fail_messages.append(SQSRecord(record) if isinstance(record, dict) else record)


_Record = TypeVar("_Record")
_Result = TypeVar("_Result")


def fair_order(
    records: Sequence[dict[str, Any]], key: Callable[[dict[str, Any]], tuple[int, str]]
) -> list[dict[str, Any]]:
    """``records`` in the order a limited service should be called for them: by priority (``key``'s first item, 1
    first), then round-robin between groups (its second: each group's first record, then each one's second, ...),
    then as they came."""
    taken: dict[tuple[int, str], int] = {}
    ranked = []
    for index, record in enumerate(records):
        priority, group = key(record)
        turn = taken.get((priority, group), 0)
        taken[(priority, group)] = turn + 1
        ranked.append(((priority, turn, index), record))
    return [record for _, record in sorted(ranked, key=lambda item: item[0])]


class RecordRunner(Protocol):
    """Runs a batch's record handler over its records and returns the results in the records' order."""

    def __call__(self, handle: Callable[[_Record], _Result], records: Sequence[_Record]) -> list[_Result]:
        """``[handle(record) for record in records]``, in whatever order or at once."""
        ...


def one_at_a_time(handle: Callable[[_Record], _Result], records: Sequence[_Record]) -> list[_Result]:
    """Handle the records one after the other, in order (a `RecordRunner`)."""
    return [handle(record) for record in records]


class AtOnce:
    """Handle a batch's records at once, up to ``workers`` at a time, a thread each (a `RecordRunner`).

    An agent spends most of a record waiting for its remote service: with its batch's calls in flight together, an
    invocation waits about as long as its slowest record instead of the sum of them, and Lambda bills that once
    (docs/agents.md, "Calls at once"). Each worker uses its caller's cost ledger (`sasflow.cost.Ledger.adopted`) and
    a copy of its context variables; the pool lives as long as the sandbox.
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def __call__(self, handle: Callable[[_Record], _Result], records: Sequence[_Record]) -> list[_Result]:
        """Handle ``records`` on the pool (one record or one worker: on this thread) and wait for them all."""
        if self.workers <= 1 or len(records) <= 1:
            return one_at_a_time(handle, records)
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sasflow-record")
            pool = self._pool
        book = ledger()

        def adopted(record: _Record) -> _Result:
            with book.adopted():
                return handle(record)

        futures = [pool.submit(contextvars.copy_context().run, adopted, record) for record in records]
        return [future.result() for future in futures]


class AnyOrder:
    """Handle the records one after the other in an order drawn from ``rng``, results in the records' order (a
    `RecordRunner`): the simulation's and the bench's stand-in for `AtOnce`, whose records finish in any order, on
    one thread so that a seeded run replays."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def __call__(self, handle: Callable[[_Record], _Result], records: Sequence[_Record]) -> list[_Result]:
        """Handle ``records`` in a shuffled order."""
        order = list(range(len(records)))
        self.rng.shuffle(order)
        results: dict[int, _Result] = {}
        for index in order:
            results[index] = handle(records[index])
        return [results[index] for index in range(len(records))]


class OutOfTimeError(Exception):
    """A record was not started because the invocation is about to time out; SQS delivers it again."""


def failure_reason(error: BaseException | None) -> str:
    """The error's class and message; for a body that failed validation, where and why, never the body itself."""
    cause = getattr(error, "__cause__", None)
    if isinstance(cause, ValidationError):
        where = "; ".join(
            f"{'.'.join(str(part) for part in item['loc']) or 'body'}: {item['msg']}"
            for item in cause.errors(include_url=False, include_input=False)[:3]
        )
        return f"{type(error).__name__}: {cause.title} {where}"
    return f"{type(error).__name__}: {error}"


def log_failure(record: Any, reason: str, *, permanent: bool) -> None:
    """Write the ``batch item failed`` line of ``record`` (an SQS record dict or ``SQSRecord``)."""
    raw = _raw(record)
    attributes = raw.get("attributes") if isinstance(raw, dict) else None
    try:
        receive_count = int((attributes or {}).get("ApproximateReceiveCount", 0))
    except (TypeError, ValueError):
        receive_count = 0
    logger.warning(
        "batch item failed",
        extra={
            "message_id": _message_id(record),
            "receive_count": receive_count,
            "reason": reason[:MAX_REASON_CHARS],
            "permanent": permanent,
        },
    )


def _raw(record: Any) -> Any:
    """An SQS record as Lambda passed it: powertools keeps raw dicts in some lists and data classes in others."""
    return record.raw_event if isinstance(record, SQSRecord) else record


def _receipt(record: Any) -> Receipt | None:
    """The queue and receipt handle of an SQS record (dict or ``SQSRecord``), or None when it lacks either."""
    raw = _raw(record)
    if not isinstance(raw, dict):
        return None
    queue_arn, handle = raw.get("eventSourceARN"), raw.get("receiptHandle")
    if not isinstance(queue_arn, str) or not isinstance(handle, str) or not queue_arn or not handle:
        return None
    return Receipt(queue_arn, handle)


def _message_id(record: Any) -> str | None:
    if isinstance(record, dict):
        return record.get("messageId")
    return getattr(record, "message_id", None)


#: What a record handler returns: the messages to send once the batch has been handled.
RecordResult = Sequence[Outgoing]


class ReplyGroups:
    """The record handler of one scheduler batch: the replies of one workflow are applied together.

    Built per invocation from the event: the well-formed replies are grouped by workflow, in batch order. The first
    record of a group applies the whole group (`SchedulerService.on_replies`: one read and one write) and returns
    its messages; the group's other records then return nothing, or raise the same error, so they fail with it and
    SQS delivers them again. A malformed record is in no group: it fails alone (DESIGN Rule 9).

    Parameters
    ----------
    apply:
        Applies the replies of one workflow and returns the messages to send (``SchedulerService.on_replies``).
    records:
        The event's ``Records`` (SQS records as Lambda passes them).
    """

    def __init__(self, apply: Callable[[Sequence[StepReply]], list[Outgoing]], records: Sequence[dict[str, Any]]):
        self._apply = apply
        self._groups: dict[str, list[StepReply]] = {}
        self._workflow_of: dict[str, str] = {}  # message id -> workflow id, of the well-formed replies
        self._results: dict[str, list[Outgoing] | BaseException] = {}
        for record in records:
            try:
                reply = decode_reply(record.get("body", ""))
            except MalformedMessageError:
                continue
            self._groups.setdefault(reply.workflow_id, []).append(reply)
            self._workflow_of[record.get("messageId", "")] = reply.workflow_id

    def handle(self, record: SQSRecord) -> list[Outgoing]:
        """Handle one record: apply its workflow's group once; a malformed body raises ``MalformedMessageError``."""
        workflow_id = self._workflow_of.get(record.message_id)
        if workflow_id is None:
            decode_reply(record.body)  # raises: the record was not well formed
            raise MalformedMessageError(f"record {record.message_id} was not in the batch it was handled in")
        if workflow_id in self._results:
            result = self._results[workflow_id]
            if isinstance(result, BaseException):
                raise result
            return []  # the group's first record returned the messages
        try:
            result = self._apply(self._groups[workflow_id])
        except Exception as error:
            self._results[workflow_id] = error
            raise
        self._results[workflow_id] = []
        return result
