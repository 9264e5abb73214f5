"""SQS batch processing with the outbox: partial failures, send failures, events without records."""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

import pytest
from aws_lambda_powertools.utilities.batch import process_partial_response
from aws_lambda_powertools.utilities.batch.exceptions import UnexpectedBatchTypeError
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from sasflow.adapters.memory import InMemoryBus
from sasflow.batch import AnyOrder, AtOnce, OutboxBatchProcessor, ReplyGroups
from sasflow.cost import Tally, ledger
from sasflow.errors import ConfigurationError, ContentionError
from sasflow.messages import decode_reply
from sasflow.ports import Outgoing, Receipt


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
    # Given an event that is not an SQS batch
    bus = InMemoryBus()
    # When it is processed / Then powertools refuses it as an unexpected batch type, and nothing is sent
    with pytest.raises(UnexpectedBatchTypeError, match=r"^Unexpected batch event type\. Possible values are: SQS,"):
        process_partial_response(event, handle, OutboxBatchProcessor(lambda: bus))
    assert bus.queues == {}


class _Countdown:
    """A Lambda context whose remaining time drops by ``step_ms`` every time it is read."""

    def __init__(self, remaining_ms: int, step_ms: int) -> None:
        self.remaining_ms = remaining_ms
        self.step_ms = step_ms

    def get_remaining_time_in_millis(self) -> int:
        value = self.remaining_ms
        self.remaining_ms -= self.step_ms
        return value


def test_records_not_started_before_the_reserve_come_back_as_failures_and_the_started_ones_are_sent() -> None:
    bus = InMemoryBus()
    handled: list[str] = []

    def record_handler(record: SQSRecord) -> list[Outgoing]:
        handled.append(record.message_id)
        return handle(record)

    # 7 s left at the first record, 1 s less at each: records 1-3 start (7, 6, 5 s left), 4 and 5 do not (4, 3 s).
    event = {"Records": [sqs_record(f"r{i}", VALID) for i in range(1, 6)]}
    processor = OutboxBatchProcessor(lambda: bus, reserve_seconds=5)
    response = process_partial_response(event, record_handler, processor, context=_Countdown(7_000, 1_000))
    assert handled == ["r1", "r2", "r3"]
    assert response["batchItemFailures"] == [{"itemIdentifier": "r4"}, {"itemIdentifier": "r5"}]
    assert len(bus.queues["queue/next"]) == 3


def test_without_a_reserve_every_record_starts_however_little_time_is_left() -> None:
    bus = InMemoryBus()
    event = {"Records": [sqs_record("a", VALID), sqs_record("b", VALID)]}
    response = process_partial_response(event, handle, OutboxBatchProcessor(lambda: bus), context=_Countdown(10, 5))
    assert response["batchItemFailures"] == []


def reply_body(workflow_id: str, step: str) -> str:
    return (
        f'{{"kind":"step.reply","workflow_id":"{workflow_id}","step":"{step}","phase":"action","attempt":1,'
        '"outcome":"succeeded"}'
    )


def test_the_replies_of_one_workflow_in_a_batch_are_applied_together_once() -> None:
    # Given a batch with three replies of wf-1 (parallel steps), one of wf-2 and a malformed record
    records = [
        sqs_record("1a", reply_body("wf-1", "a")),
        sqs_record("2a", reply_body("wf-2", "a")),
        sqs_record("junk", "not-json"),
        sqs_record("1b", reply_body("wf-1", "b")),
        sqs_record("1c", reply_body("wf-1", "c")),
    ]
    applied: list[list[str]] = []

    def apply(replies: Any) -> list[Outgoing]:
        applied.append([f"{r.workflow_id}/{r.step}" for r in replies])
        return [Outgoing("queue/next", replies[0].workflow_id)]

    groups = ReplyGroups(apply, records)
    bus = InMemoryBus()
    # When the batch is processed
    response = process_partial_response({"Records": records}, groups.handle, OutboxBatchProcessor(lambda: bus))
    # Then each workflow was applied once with all its replies, in batch order, and only the malformed record failed
    assert applied == [["wf-1/a", "wf-1/b", "wf-1/c"], ["wf-2/a"]]
    assert [m.body for m in bus.queues["queue/next"]] == ["wf-1", "wf-2"]
    assert response["batchItemFailures"] == [{"itemIdentifier": "junk"}]


def test_when_a_workflow_group_fails_every_record_of_it_fails_and_the_others_do_not() -> None:
    records = [
        sqs_record("1a", reply_body("wf-1", "a")),
        sqs_record("2a", reply_body("wf-2", "a")),
        sqs_record("1b", reply_body("wf-1", "b")),
    ]

    def apply(replies: Any) -> list[Outgoing]:
        if replies[0].workflow_id == "wf-1":
            raise RuntimeError("the workflow kept changing")
        return []

    response = process_partial_response(
        {"Records": records}, ReplyGroups(apply, records).handle, OutboxBatchProcessor(InMemoryBus)
    )
    assert sorted(f["itemIdentifier"] for f in response["batchItemFailures"]) == ["1a", "1b"]


def test_a_poison_record_logs_one_line_with_its_message_id_receive_count_and_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a batch with a well-formed reply and a poison body received for the third time
    bus = InMemoryBus()
    poison = sqs_record("poison-3", '{"kind":"step.reply","secret":"card-4111"}')
    poison["attributes"]["ApproximateReceiveCount"] = "3"
    # When it is processed
    with caplog.at_level(logging.WARNING, logger="sasflow.batch"):
        response = process_partial_response(
            {"Records": [sqs_record("fine", VALID), poison]}, handle, OutboxBatchProcessor(lambda: bus)
        )
    # Then the poison record fails alone, with one line that says which message, how often and why
    assert response["batchItemFailures"] == [{"itemIdentifier": "poison-3"}]
    lines = [r for r in caplog.records if r.getMessage() == "batch item failed"]
    assert [(r.message_id, r.receive_count, r.permanent) for r in lines] == [("poison-3", 3, True)]  # type: ignore[attr-defined]
    assert lines[0].reason == (  # type: ignore[attr-defined]
        "MalformedMessageError: StepReply workflow_id: Field required; step: Field required; phase: Field required"
    )
    assert "card-4111" not in caplog.text  # the body is never logged


def test_a_record_whose_messages_could_not_be_sent_logs_a_failure_that_is_not_permanent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = InMemoryBus(fail_next=1)
    with caplog.at_level(logging.WARNING, logger="sasflow.batch"):
        process_partial_response({"Records": [sqs_record("unsent", VALID)]}, handle, OutboxBatchProcessor(lambda: bus))
    lines = [r for r in caplog.records if r.getMessage() == "batch item failed"]
    assert [(r.message_id, r.receive_count, r.permanent, r.reason) for r in lines] == [  # type: ignore[attr-defined]
        ("unsent", 1, False, "its messages could not be sent")
    ]


def test_only_a_poison_record_is_made_visible_again_when_the_batch_ends() -> None:
    # Given a batch of a good reply, two poison bodies, a transient failure, a configuration error and an unsent one
    bus = InMemoryBus(fail_next=1)

    def flaky(record: SQSRecord) -> list[Outgoing]:
        if record.message_id == "throttled":
            raise ContentionError("wf-1 changed under every write")
        if record.message_id == "misconfigured":
            raise ConfigurationError("RESPONSE_QUEUE_URL is not set")
        return handle(record)

    records = [
        sqs_record("unsent", VALID),
        sqs_record("poison-1", "not-json"),
        sqs_record("throttled", VALID),
        sqs_record("misconfigured", VALID),
        sqs_record("poison-2", '{"kind":"step.reply"}'),
    ]
    # When it is processed
    response = process_partial_response({"Records": records}, flaky, OutboxBatchProcessor(lambda: bus))
    # Then every failure is a batch-item failure, but only the poison records are made visible again at once (their
    # redrive policy moves them to the dead-letter queue in seconds); the others wait out the visibility timeout
    assert {f["itemIdentifier"] for f in response["batchItemFailures"]} == {
        "unsent",
        "poison-1",
        "throttled",
        "misconfigured",
        "poison-2",
    }
    assert bus.made_visible == [
        Receipt("arn:aws:sqs:us-east-1:123456789012:q", "rh-poison-1"),
        Receipt("arn:aws:sqs:us-east-1:123456789012:q", "rh-poison-2"),
    ]


def test_a_batch_without_a_poison_record_makes_nothing_visible() -> None:
    bus = InMemoryBus()
    process_partial_response({"Records": [sqs_record("good", VALID)]}, handle, OutboxBatchProcessor(lambda: bus))
    assert bus.made_visible == []
    assert [m.body for m in bus.queues["queue/next"]] == ["wf-1"]


def _replies(count: int) -> list[dict[str, Any]]:
    return [sqs_record(f"m{i}", VALID.replace('"wf-1"', f'"wf-{i}"')) for i in range(count)]


def test_at_once_a_batchs_records_are_all_in_hand_together_and_their_results_keep_the_batchs_order() -> None:
    # Given a record handler that returns only once all five records of the batch are in hand at the same time
    together = threading.Barrier(5, timeout=10)

    def handle_together(record: SQSRecord) -> list[Outgoing]:
        together.wait()  # one record at a time would wait here for ten seconds, then fail every record
        return handle(record)

    bus = InMemoryBus()
    # When a batch of five runs at once, five at a time, and one of them is malformed
    records = _replies(5)
    records[3]["body"] = "not-json"
    processor = OutboxBatchProcessor(lambda: bus, runner=lambda: AtOnce(5))
    response = process_partial_response({"Records": records}, handle_together, processor)
    # Then only the malformed record failed, and the others' messages are sent in the batch's order
    assert response["batchItemFailures"] == [{"itemIdentifier": "m3"}]
    assert [m.body for m in bus.queues["queue/next"]] == ["wf-0", "wf-1", "wf-2", "wf-4"]


def test_at_once_works_at_most_its_workers_at_a_time() -> None:
    in_hand, most = 0, 0
    lock = threading.Lock()

    def count(record: int) -> int:
        nonlocal in_hand, most
        with lock:
            in_hand += 1
            most = max(most, in_hand)
        time.sleep(0.02)  # real threads: each record holds its worker a moment, as a remote call would
        with lock:
            in_hand -= 1
        return record * 2

    assert AtOnce(3)(count, list(range(9))) == [2 * r for r in range(9)]
    assert most == 3


def test_a_worker_charges_its_records_work_to_its_callers_ledger_under_the_records_workflow() -> None:
    # Given the caller's ledger, in an invocation
    book = ledger()

    def work(workflow_id: str) -> str:
        with ledger().working_on(workflow_id):  # as the agent's record handler does, on a worker thread
            ledger().charge(None, Tally(wru=1))
        return threading.current_thread().name

    with book.invocation(256):
        threads = AtOnce(2)(work, ["wf-a", "wf-b"])
        # Then each worker's work is on the caller's ledger, under its record's workflow
        assert {book.take("wf-a").wru, book.take("wf-b").wru} == {1.0}
    assert all(name.startswith("sasflow-record") for name in threads)


def test_an_exception_no_record_handler_catches_ends_the_batch_as_it_would_one_at_a_time() -> None:
    class Killed(BaseException):
        pass

    def die(record: int) -> int:
        if record == 1:
            raise Killed("the sandbox ended")
        return record

    with pytest.raises(Killed):
        AtOnce(4)(die, [0, 1, 2])


def test_any_order_replays_with_its_seed_and_returns_results_in_the_records_order() -> None:
    seen: list[int] = []

    def note(record: int) -> int:
        seen.append(record)
        return -record

    assert AnyOrder(random.Random(7))(note, list(range(8))) == [-r for r in range(8)]
    first = list(seen)
    seen.clear()
    AnyOrder(random.Random(7))(note, list(range(8)))
    assert seen == first and sorted(first) == list(range(8)) and first != list(range(8))
