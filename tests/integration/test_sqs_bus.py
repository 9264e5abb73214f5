"""The SQS message bus on moto: received messages made visible again at once, 10 per request."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from sasflow.adapters.sqs_bus import SqsMessageBus, queue_url
from sasflow.cost import Tally, ledger
from sasflow.ports import Outgoing, Receipt

pytestmark = pytest.mark.integration


@pytest.fixture
def sqs() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("sqs", region_name="us-east-1")


def test_a_queue_url_is_built_from_its_arn_as_sqs_documents_it() -> None:
    assert queue_url("arn:aws:sqs:eu-west-1:123456789012:sasflow-FlightsRequestQueue") == (
        "https://sqs.eu-west-1.amazonaws.com/123456789012/sasflow-FlightsRequestQueue"
    )
    for wrong in ("arn:aws:sns:eu-west-1:123456789012:topic", "arn:aws:sqs:eu-west-1::q", "q", ""):
        with pytest.raises(ValueError, match="not an SQS queue ARN"):
            queue_url(wrong)


def test_a_message_carries_its_share_of_the_send_and_what_its_workflow_owes(sqs: Any) -> None:
    # Given four messages for two workflows, one owing work done before the send, and one for no workflow
    url = sqs.create_queue(QueueName="requests")["QueueUrl"]
    book = ledger()
    book.charge("wf-1", Tally(wru=3))
    messages = [
        Outgoing(url, '{"n": 1}', workflow_id="wf-1"),
        Outgoing(url, '{"n": 2}', workflow_id="wf-1"),
        Outgoing(url, '{"n": 3}', workflow_id="wf-2"),
        Outgoing(url, '{"n": 4}'),
    ]
    # When the bus sends them (one SendMessageBatch request, one 64 KB chunk)
    assert SqsMessageBus(sqs).send(messages) == []
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])["Messages"]
    carried_by = {
        m["Body"]: Tally.from_attribute((m.get("MessageAttributes") or {}).get("sasflow-cost", {}).get("StringValue"))
        for m in got
    }
    # Then each message of a workflow carries a quarter of the request; the first of wf-1 also its 3 WRU
    assert carried_by['{"n": 1}'] == Tally(wru=3, sqs=0.25)
    assert carried_by['{"n": 2}'] == Tally(sqs=0.25) == carried_by['{"n": 3}']
    assert carried_by['{"n": 4}'] == Tally()  # no workflow's: no attribute
    assert book.take("wf-1") == Tally() and book.take("wf-2") == Tally()


def test_what_a_failed_send_took_is_owed_again(sqs: Any) -> None:
    book = ledger()
    book.charge("wf-9", Tally(wru=2))
    missing = "https://sqs.us-east-1.amazonaws.com/123456789012/no-such-queue"
    assert SqsMessageBus(sqs).send([Outgoing(missing, "{}", workflow_id="wf-9")]) == [0]
    owed = book.take("wf-9")  # the resend carries it, and the failed request too (and the warning's log bytes)
    assert (owed.wru, owed.sqs) == (2, 1)


def test_twelve_hidden_messages_are_visible_again_at_once_in_two_requests(sqs: Any) -> None:
    # Given 12 messages received with the template's visibility timeout of 180 s
    url = sqs.create_queue(QueueName="poisoned", Attributes={"VisibilityTimeout": "180"})["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    for index in range(12):
        sqs.send_message(QueueUrl=url, MessageBody=f"bad-{index}")
    received = []
    while len(received) < 12:
        received += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []) == []
    calls: list[int] = []
    event = "before-parameter-build.sqs.ChangeMessageVisibilityBatch"
    sqs.meta.events.register(event, lambda params, **_: calls.append(len(params["Entries"])))
    # When the bus makes them visible again
    failed = SqsMessageBus(sqs).make_visible([Receipt(arn, m["ReceiptHandle"]) for m in received])
    # Then none failed, two requests (10 + 2) did it, and the next receives get all 12 back without waiting 180 s
    assert failed == 0
    assert calls == [10, 2]
    again = []
    for _ in range(5):
        again += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    assert sorted(m["Body"] for m in again) == sorted(f"bad-{index}" for index in range(12))


def test_a_receipt_of_a_queue_that_does_not_exist_is_counted_and_logged(
    sqs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    bus = SqsMessageBus(sqs)
    with caplog.at_level(logging.WARNING, logger="sasflow.sqs"):
        failed = bus.make_visible(
            [Receipt("arn:aws:sqs:us-east-1:123456789012:gone", "rh-1"), Receipt("not-an-arn", "rh-2")]
        )
    assert failed == 2
    lines = [r for r in caplog.records if r.getMessage() == "make visible failed"]
    assert [r.queue_arn for r in lines] == ["arn:aws:sqs:us-east-1:123456789012:gone", "not-an-arn"]  # type: ignore[attr-defined]
