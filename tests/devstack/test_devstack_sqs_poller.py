"""devstack.event_sources.SqsPoller against a moto server: Lambda's SQS event source mapping, emulated."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aws_lambda_powertools.utilities.parser.models import SqsModel

from devstack.event_sources import SqsPoller, batch_item_failures
from devstack.lambda_runtime import InvokeResult
from devstack.template import SqsEventSpec
from tests.support.polling import wait_until


class RecordingInvoker:
    """A fake function: records each event and answers with ``respond(event)``."""

    def __init__(self, respond: Callable[[dict[str, Any]], InvokeResult]) -> None:
        self.respond = respond
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def invoke(self, event: Any) -> InvokeResult:
        with self._lock:
            self.events.append(json.loads(json.dumps(event)))
        return self.respond(event)

    @property
    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return [record for event in self.events for record in event["Records"]]


def ok(payload: Any = None) -> InvokeResult:
    return InvokeResult(ok=True, payload=payload, error=None, duration_ms=1.0, cold_start=False)


def failing(event: dict[str, Any]) -> InvokeResult:
    return InvokeResult(ok=False, payload={"errorType": "Boom"}, error="Boom: x", duration_ms=1.0, cold_start=False)


def report_failures_of_bodies_named_fail(event: dict[str, Any]) -> InvokeResult:
    failures = [{"itemIdentifier": r["messageId"]} for r in event["Records"] if r["body"] == "fail"]
    return ok({"batchItemFailures": failures})


def counts(sqs: Any, url: str) -> tuple[int, int]:
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]), int(attributes["ApproximateNumberOfMessagesNotVisible"])


@pytest.fixture
def queue(sqs: Any, unique: str) -> Iterator[tuple[str, str]]:
    """A fresh queue (visibility timeout 30 s); yields (url, arn)."""
    url = sqs.create_queue(QueueName=f"poller-{unique}", Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    yield url, arn
    sqs.delete_queue(QueueUrl=url)


def _poller(
    queue: tuple[str, str],
    invoker: RecordingInvoker,
    endpoint: str,
    *,
    report: bool = True,
    batch_size: int = 10,
    **kw: Any,
) -> SqsPoller:
    url, arn = queue
    spec = SqsEventSpec("Q", url, arn, batch_size=batch_size, report_batch_item_failures=report, name="Work")
    return SqsPoller(spec, invoker, region="us-east-1", endpoint_url=endpoint, concurrency=1, **kw)


def test_successes_are_deleted_and_batch_item_failures_stay(sqs: Any, moto_server: str, queue: tuple[str, str]) -> None:
    # Given three messages, one of which the function reports as failed
    url, arn = queue
    sqs.send_message(
        QueueUrl=url,
        MessageBody="ok-1",
        MessageAttributes={
            "kind": {"DataType": "String", "StringValue": "reply"},
            "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01"},
        },
    )
    sqs.send_message(QueueUrl=url, MessageBody="fail")
    sqs.send_message(QueueUrl=url, MessageBody="ok-3")
    invoker = RecordingInvoker(report_failures_of_bodies_named_fail)
    poller = _poller(queue, invoker, moto_server)

    # When the poller runs until it has settled all three
    poller.start()
    try:
        wait_until(lambda: poller.stats.deleted + poller.stats.kept >= 3)
    finally:
        poller.stop()

    # Then the two successes are gone and only the failure is in flight, waiting for its visibility timeout
    assert not poller.running
    assert (poller.stats.deleted, poller.stats.kept, poller.stats.failed_invocations) == (2, 1, 0)
    assert counts(sqs, url) == (0, 1)
    failed = next(record for record in invoker.records if record["body"] == "fail")
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=failed["receiptHandle"], VisibilityTimeout=0)
    left = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)["Messages"]
    assert [message["Body"] for message in left] == ["fail"]

    # And each record has Lambda's SQS event shape
    record = next(record for record in invoker.records if record["body"] == "ok-1")
    assert set(record) == {
        "messageId", "receiptHandle", "body", "attributes", "messageAttributes", "md5OfMessageAttributes",
        "md5OfBody", "eventSource", "eventSourceARN", "awsRegion",
    }  # fmt: skip
    assert (record["eventSource"], record["eventSourceARN"], record["awsRegion"]) == ("aws:sqs", arn, "us-east-1")
    assert record["attributes"]["ApproximateReceiveCount"] == "1"
    assert {"SentTimestamp", "SenderId", "ApproximateFirstReceiveTimestamp"} <= set(record["attributes"])
    assert record["messageAttributes"] == {
        "kind": {"stringValue": "reply", "stringListValues": [], "binaryListValues": [], "dataType": "String"},
        "blob": {"binaryValue": "AAE=", "stringListValues": [], "binaryListValues": [], "dataType": "Binary"},
    }
    assert record["md5OfBody"] == hashlib.md5(b"ok-1").hexdigest()
    parsed = SqsModel.model_validate(invoker.events[0])  # powertools' model of the Lambda SQS event
    assert parsed.Records[0].eventSource == "aws:sqs"


def test_a_failed_invocation_deletes_nothing(sqs: Any, moto_server: str, queue: tuple[str, str]) -> None:
    url, _ = queue
    for index in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=f"m{index}")
    poller = _poller(queue, RecordingInvoker(failing), moto_server)
    poller.start()
    try:
        wait_until(lambda: poller.stats.kept >= 3)
    finally:
        poller.stop()
    assert (poller.stats.deleted, poller.stats.kept) == (0, 3)
    assert counts(sqs, url) == (0, 3)


def test_without_report_batch_item_failures_the_batch_is_all_or_nothing(
    sqs: Any, moto_server: str, queue: tuple[str, str]
) -> None:
    url, _ = queue
    sqs.send_message(QueueUrl=url, MessageBody="fail")
    sqs.send_message(QueueUrl=url, MessageBody="ok")
    poller = _poller(queue, RecordingInvoker(report_failures_of_bodies_named_fail), moto_server, report=False)
    poller.start()
    try:
        wait_until(lambda: poller.stats.deleted >= 2)
    finally:
        poller.stop()
    assert counts(sqs, url) == (0, 0)


def test_batches_respect_the_batch_size(sqs: Any, moto_server: str, queue: tuple[str, str]) -> None:
    url, _ = queue
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(7)])
    invoker = RecordingInvoker(lambda event: ok())
    poller = _poller(queue, invoker, moto_server, batch_size=3)
    poller.start()
    try:
        wait_until(lambda: poller.stats.deleted >= 7)
    finally:
        poller.stop()
    assert max(len(event["Records"]) for event in invoker.events) <= 3
    assert sorted(record["body"] for record in invoker.records) == [str(i) for i in range(7)]


def test_moto_moves_a_record_to_the_dead_letter_queue_after_max_receive_count(
    sqs: Any, moto_server: str, unique: str
) -> None:
    # Given a queue that redrives after 2 receives, and a function that always fails
    dlq_url = sqs.create_queue(QueueName=f"dlq-{unique}")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})
    url = sqs.create_queue(QueueName=f"src-{unique}", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sqs.send_message(QueueUrl=url, MessageBody="poison")
    invoker = RecordingInvoker(failing)
    # (a zero visibility timeout when polling makes the record come back at once)
    poller = _poller((url, arn), invoker, moto_server, visibility_timeout_seconds=0)

    # When the poller keeps receiving it
    poller.start()
    try:
        wait_until(lambda: counts(sqs, dlq_url)[0] == 1)
    finally:
        poller.stop()

    # Then SQS (moto) moved it to the dead-letter queue after exactly maxReceiveCount deliveries
    assert [record["attributes"]["ApproximateReceiveCount"] for record in invoker.records] == ["1", "2"]
    assert counts(sqs, url) == (0, 0)
    moved = sqs.receive_message(QueueUrl=dlq_url, WaitTimeSeconds=0)["Messages"]
    assert [message["Body"] for message in moved] == ["poison"]


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (None, set()),
        ({}, set()),
        ({"batchItemFailures": None}, set()),
        ({"batchItemFailures": []}, set()),
        ({"batchItemFailures": [{"itemIdentifier": "b"}]}, {"b"}),
        ({"batchItemFailures": [{"itemIdentifier": ""}]}, None),
        ({"batchItemFailures": [{"itemIdentifier": None}]}, None),
        ({"batchItemFailures": [{"itemId": "a"}]}, None),
        ({"batchItemFailures": [{"itemIdentifier": "zzz"}]}, None),
        ("not an object", None),
    ],
)
def test_partial_batch_response_rules(payload: Any, expected: set[str] | None) -> None:
    assert batch_item_failures(payload, ["a", "b"]) == expected


def test_an_invalid_partial_response_keeps_the_whole_batch(sqs: Any, moto_server: str, queue: tuple[str, str]) -> None:
    url, _ = queue
    sqs.send_message(QueueUrl=url, MessageBody="x")
    poller = _poller(
        queue, RecordingInvoker(lambda e: ok({"batchItemFailures": [{"itemIdentifier": "nope"}]})), moto_server
    )
    poller.start()
    try:
        wait_until(lambda: poller.stats.failed_invocations >= 1)
    finally:
        poller.stop()
    assert (poller.stats.deleted, poller.stats.kept) == (0, 1)
    assert counts(sqs, url) == (0, 1)
