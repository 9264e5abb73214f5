"""SQS batch processing with the outbox: partial failures, send failures, events without records."""

from __future__ import annotations

from typing import Any

import pytest
from aws_lambda_powertools.utilities.batch import process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from sasflow.adapters.memory import InMemoryBus
from sasflow.batch import OutboxBatchProcessor
from sasflow.messages import decode_reply
from sasflow.ports import Outgoing


def sqs_record(message_id: str, body: str) -> dict[str, Any]:
    return {
        "messageId": message_id,
        "receiptHandle": f"rh-{message_id}",
        "body": body,
        "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": {},
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:q",
        "awsRegion": "us-east-1",
    }


VALID = '{"kind":"step.reply","workflow_id":"wf-1","step":"a","phase":"action","attempt":1,"outcome":"succeeded"}'


def handle(record: SQSRecord) -> list[Outgoing]:
    reply = decode_reply(record.body)
    return [Outgoing("queue/next", reply.workflow_id)]


def test_only_the_malformed_records_fail_and_their_neighbours_produce_messages() -> None:
    bus = InMemoryBus()
    records = [
        sqs_record("good", VALID),
        sqs_record("bad-json", "not-json"),
        sqs_record("no-step", '{"kind":"step.reply"}'),
    ]
    response = process_partial_response({"Records": records}, handle, OutboxBatchProcessor(lambda: bus))
    assert sorted(f["itemIdentifier"] for f in response["batchItemFailures"]) == ["bad-json", "no-step"]
    assert [m.body for m in bus.queues["queue/next"]] == ["wf-1"]


def test_a_record_whose_message_could_not_be_sent_is_reported_failed_so_sqs_retries_it() -> None:
    bus = InMemoryBus(fail_next=1)
    event = {"Records": [sqs_record("first", VALID), sqs_record("second", VALID)]}
    response = process_partial_response(event, handle, OutboxBatchProcessor(lambda: bus))
    assert response["batchItemFailures"] == [{"itemIdentifier": "first"}]
    assert len(bus.queues["queue/next"]) == 1


def test_the_processor_starts_every_batch_with_an_empty_outbox() -> None:
    bus = InMemoryBus()
    processor = OutboxBatchProcessor(lambda: bus)
    process_partial_response({"Records": [sqs_record("one", VALID)]}, handle, processor)
    process_partial_response({"Records": [sqs_record("two", "not-json")]}, handle, processor)
    assert len(bus.queues["queue/next"]) == 1


@pytest.mark.parametrize("event", [{}, {"Records": []}, {"Records": "x"}, {"foo": "bar"}])
def test_an_event_without_records_is_an_error(event: Any) -> None:
    bus = InMemoryBus()
    with pytest.raises(Exception, match=r"(?i)records|event"):
        process_partial_response(event, handle, OutboxBatchProcessor(lambda: bus))
    assert bus.queues == {}
