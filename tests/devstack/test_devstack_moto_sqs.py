"""devstack.moto_sqs: SQS dead-letter queue redrive (StartMessageMoveTask, ListMessageMoveTasks, CancelMessageMoveTask)
added to moto, through ``mock_aws`` and through a moto server, called with boto3 as on AWS."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from devstack import moto_sqs

REGION = "us-east-1"

ATTRIBUTES = {
    "kind": {"DataType": "String", "StringValue": "reply"},
    "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01"},
    "n": {"DataType": "Number", "StringValue": "7"},
}


@dataclass
class Pipe:
    """A work queue whose redrive policy targets a dead-letter queue."""

    url: str
    arn: str
    dlq_url: str
    dlq_arn: str


def arn_of(sqs: Any, url: str) -> str:
    return str(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])


def counts(sqs: Any, url: str) -> tuple[int, int]:
    """(visible, in flight) messages of a queue."""
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]), int(attributes["ApproximateNumberOfMessagesNotVisible"])


def make_queue(sqs: Any, name: str, dlq_arn: str | None = None, max_receive_count: int = 2) -> tuple[str, str]:
    attributes = {}
    if dlq_arn is not None:
        attributes["RedrivePolicy"] = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receive_count})
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    return url, arn_of(sqs, url)


def make_pipe(sqs: Any, name: str, dlq: tuple[str, str] | None = None) -> Pipe:
    dlq_url, dlq_arn = dlq or make_queue(sqs, f"{name}-dlq")
    url, arn = make_queue(sqs, name, dlq_arn)
    return Pipe(url, arn, dlq_url, dlq_arn)


def fail_until_dead_lettered(sqs: Any, pipe: Pipe, bodies: list[str]) -> list[str]:
    """Send ``bodies`` and receive them as a failing poller would (visibility 0, never deleted) until moto has moved
    them all to the dead-letter queue; return their message ids."""
    ids = [
        sqs.send_message(QueueUrl=pipe.url, MessageBody=body, MessageAttributes=ATTRIBUTES)["MessageId"]
        for body in bodies
    ]
    for _ in range(10 * len(bodies)):
        if counts(sqs, pipe.url) == (0, 0):
            break
        sqs.receive_message(QueueUrl=pipe.url, MaxNumberOfMessages=10, VisibilityTimeout=0, WaitTimeSeconds=0)
    return ids


def drain(sqs: Any, url: str) -> list[dict[str, Any]]:
    """Every visible message of a queue (received once and deleted)."""
    messages: list[dict[str, Any]] = []
    while batch := sqs.receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=10,
        WaitTimeSeconds=0,
        AttributeNames=["All"],
        MessageAttributeNames=["All"],
    ).get("Messages", []):
        messages.extend(batch)
        for message in batch:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return messages


def error_of(excinfo: pytest.ExceptionInfo[ClientError]) -> tuple[str, str]:
    error = excinfo.value.response["Error"]
    return error["Code"], error["Message"]


@pytest.fixture
def sqs() -> Iterator[Any]:
    """An SQS client on ``mock_aws`` with the redrive actions installed (shadows the module server's client)."""
    moto_sqs.install()
    with mock_aws():
        yield boto3.client("sqs", region_name=REGION)


# ----------------------------------------------------------------------------------------------- moving back


def test_moto_dead_letters_after_max_receive_count_and_the_source_is_recorded(sqs: Any, unique: str) -> None:
    # Given a queue that redrives after 2 receives
    pipe = make_pipe(sqs, f"work-{unique}")

    # When a poller fails the same messages again and again
    fail_until_dead_lettered(sqs, pipe, ["a", "b"])

    # Then moto moved both to the dead-letter queue, and the source queue was recorded on each
    assert counts(sqs, pipe.url) == (0, 0)
    assert counts(sqs, pipe.dlq_url) == (2, 0)
    from moto.sqs.models import sqs_backends

    account = pipe.dlq_arn.split(":")[4]
    dlq = sqs_backends[account][REGION].queues[f"work-{unique}-dlq"]
    assert [getattr(m, moto_sqs.SOURCE_ARN_ATTRIBUTE, None) for m in dlq._messages] == [pipe.arn, pipe.arn]


def test_without_destination_each_message_goes_back_to_its_own_source_queue(sqs: Any, unique: str) -> None:
    # Given two work queues sharing one dead-letter queue, each with messages dead-lettered
    first = make_pipe(sqs, f"first-{unique}")
    second = make_pipe(sqs, f"second-{unique}", dlq=(first.dlq_url, first.dlq_arn))
    first_ids = fail_until_dead_lettered(sqs, first, ["f1", "f2"])
    second_ids = fail_until_dead_lettered(sqs, second, ["s1"])
    assert counts(sqs, first.dlq_url) == (3, 0)

    # When the operator redrives the dead-letter queue without a destination
    handle = sqs.start_message_move_task(SourceArn=first.dlq_arn)["TaskHandle"]

    # Then each message is back in the queue it came from, as a new message with the same body and attributes
    assert isinstance(handle, str) and handle
    back_first, back_second = drain(sqs, first.url), drain(sqs, second.url)
    assert sorted(m["Body"] for m in back_first) == ["f1", "f2"]
    assert [m["Body"] for m in back_second] == ["s1"]
    for message in back_first + back_second:
        assert message["MessageAttributes"] == ATTRIBUTES
        assert message["Attributes"]["ApproximateReceiveCount"] == "1"  # first receive since the move: reset
    assert not {m["MessageId"] for m in back_first} & set(first_ids)
    assert not {m["MessageId"] for m in back_second} & set(second_ids)
    assert counts(sqs, first.dlq_url) == (0, 0)

    # And the task lists as completed, with what it moved and no destination
    [task] = sqs.list_message_move_tasks(SourceArn=first.dlq_arn)["Results"]
    assert task["Status"] == "COMPLETED"
    assert task["SourceArn"] == first.dlq_arn
    assert (task["ApproximateNumberOfMessagesMoved"], task["ApproximateNumberOfMessagesToMove"]) == (3, 3)
    assert isinstance(task["StartedTimestamp"], int)
    assert not {"DestinationArn", "TaskHandle", "FailureReason", "MaxNumberOfMessagesPerSecond"} & set(task)


def test_with_destination_every_message_goes_there(sqs: Any, unique: str) -> None:
    # Given dead-lettered messages and another queue
    pipe = make_pipe(sqs, f"work-{unique}")
    fail_until_dead_lettered(sqs, pipe, ["a", "b", "c"])
    other_url, other_arn = make_queue(sqs, f"other-{unique}")

    # When the operator redrives to that queue at a given rate
    sqs.start_message_move_task(SourceArn=pipe.dlq_arn, DestinationArn=other_arn, MaxNumberOfMessagesPerSecond=5)

    # Then all went there, none to the source queue, and the dead-letter queue is empty
    moved = drain(sqs, other_url)
    assert sorted(m["Body"] for m in moved) == ["a", "b", "c"]
    assert all(m["MessageAttributes"] == ATTRIBUTES for m in moved)
    assert counts(sqs, pipe.url) == (0, 0)
    assert counts(sqs, pipe.dlq_url) == (0, 0)
    [task] = sqs.list_message_move_tasks(SourceArn=pipe.dlq_arn)["Results"]
    assert (task["Status"], task["DestinationArn"], task["MaxNumberOfMessagesPerSecond"]) == ("COMPLETED", other_arn, 5)
    assert (task["ApproximateNumberOfMessagesMoved"], task["ApproximateNumberOfMessagesToMove"]) == (3, 3)


def test_messages_in_flight_in_the_dead_letter_queue_stay(sqs: Any, unique: str) -> None:
    # Given two dead-lettered messages, one of which an operator is looking at (in flight)
    pipe = make_pipe(sqs, f"work-{unique}")
    fail_until_dead_lettered(sqs, pipe, ["a", "b"])
    [held] = sqs.receive_message(QueueUrl=pipe.dlq_url, MaxNumberOfMessages=1, VisibilityTimeout=300)["Messages"]

    # When the dead-letter queue is redriven
    sqs.start_message_move_task(SourceArn=pipe.dlq_arn)

    # Then only the visible one moved; the one in flight is still in the dead-letter queue
    assert [m["Body"] for m in drain(sqs, pipe.url)] == [next(b for b in "ab" if b != held["Body"])]
    assert counts(sqs, pipe.dlq_url) == (0, 1)
    [task] = sqs.list_message_move_tasks(SourceArn=pipe.dlq_arn)["Results"]
    assert (task["ApproximateNumberOfMessagesMoved"], task["ApproximateNumberOfMessagesToMove"]) == (1, 1)


def test_a_deleted_original_source_fails_the_task_and_leaves_the_messages(sqs: Any, unique: str) -> None:
    # Given dead-lettered messages whose source queue has since been deleted (another queue keeps the DLQ a DLQ)
    gone = make_pipe(sqs, f"gone-{unique}")
    make_pipe(sqs, f"kept-{unique}", dlq=(gone.dlq_url, gone.dlq_arn))
    fail_until_dead_lettered(sqs, gone, ["a"])
    sqs.delete_queue(QueueUrl=gone.url)

    # When the dead-letter queue is redriven to the original sources
    sqs.start_message_move_task(SourceArn=gone.dlq_arn)

    # Then the task failed as AWS reports a missing queue, and the message is still in the dead-letter queue
    [task] = sqs.list_message_move_tasks(SourceArn=gone.dlq_arn)["Results"]
    assert (task["Status"], task["FailureReason"]) == ("FAILED", "AWS.SimpleQueueService.NonExistentQueue")
    assert task["ApproximateNumberOfMessagesMoved"] == 0
    assert counts(sqs, gone.dlq_url) == (1, 0)


def test_tasks_list_newest_first_one_by_default(sqs: Any, unique: str) -> None:
    # Given two redrives of the same dead-letter queue (the first has finished, so the second may start)
    pipe = make_pipe(sqs, f"work-{unique}")
    fail_until_dead_lettered(sqs, pipe, ["a"])
    sqs.start_message_move_task(SourceArn=pipe.dlq_arn)
    drain(sqs, pipe.url)
    fail_until_dead_lettered(sqs, pipe, ["b", "c"])
    sqs.start_message_move_task(SourceArn=pipe.dlq_arn)

    # When the tasks are listed
    default = sqs.list_message_move_tasks(SourceArn=pipe.dlq_arn)["Results"]
    both = sqs.list_message_move_tasks(SourceArn=pipe.dlq_arn, MaxResults=10)["Results"]

    # Then the newest comes first, and only it by default
    assert [t["ApproximateNumberOfMessagesMoved"] for t in default] == [2]
    assert [t["ApproximateNumberOfMessagesMoved"] for t in both] == [2, 1]
    _, other_arn = make_queue(sqs, f"fresh-{unique}")
    assert sqs.list_message_move_tasks(SourceArn=other_arn)["Results"] == []
    with pytest.raises(ClientError) as excinfo:
        sqs.list_message_move_tasks(SourceArn=pipe.dlq_arn, MaxResults=11)
    assert error_of(excinfo)[0] == "InvalidParameterValue"


# ----------------------------------------------------------------------------------------------- refusals


def test_a_source_that_is_no_dead_letter_queue_is_refused(sqs: Any, unique: str) -> None:
    # Given a work queue (it has a DLQ, but no queue has it as its DLQ)
    pipe = make_pipe(sqs, f"work-{unique}")

    # When it is given as the source
    with pytest.raises(ClientError) as excinfo:
        sqs.start_message_move_task(SourceArn=pipe.arn, DestinationArn=pipe.dlq_arn)

    # Then SQS refuses, as AWS does
    assert error_of(excinfo) == ("InvalidParameterValue", "Source queue must be configured as a Dead Letter Queue.")


def test_missing_queues_are_refused(sqs: Any, unique: str) -> None:
    pipe = make_pipe(sqs, f"work-{unique}")
    with pytest.raises(ClientError) as excinfo:
        sqs.start_message_move_task(SourceArn=pipe.dlq_arn, DestinationArn=f"{pipe.arn}-missing")
    assert error_of(excinfo) == (
        "ResourceNotFoundException",
        "The resource that you specified for the DestinationArn parameter doesn't exist.",
    )
    with pytest.raises(ClientError) as excinfo:
        sqs.start_message_move_task(SourceArn=f"{pipe.dlq_arn}-missing")
    assert error_of(excinfo)[0] == "ResourceNotFoundException"
    with pytest.raises(ClientError) as excinfo:
        sqs.start_message_move_task(SourceArn=pipe.dlq_arn, MaxNumberOfMessagesPerSecond=501)
    assert error_of(excinfo)[0] == "InvalidParameterValue"


def test_cancelling_a_finished_task_is_refused(sqs: Any, unique: str) -> None:
    # Given a redrive, finished when its start returned
    pipe = make_pipe(sqs, f"work-{unique}")
    fail_until_dead_lettered(sqs, pipe, ["a"])
    handle = sqs.start_message_move_task(SourceArn=pipe.dlq_arn)["TaskHandle"]

    # When the operator cancels it
    with pytest.raises(ClientError) as excinfo:
        sqs.cancel_message_move_task(TaskHandle=handle)

    # Then SQS answers that there is no such task (only a RUNNING task can be cancelled), and it stays completed
    assert error_of(excinfo) == ("ResourceNotFoundException", "Task does not exist.")
    assert isinstance(excinfo.value, sqs.exceptions.ResourceNotFoundException)
    [task] = sqs.list_message_move_tasks(SourceArn=pipe.dlq_arn)["Results"]
    assert task["Status"] == "COMPLETED"


def test_cancelling_with_a_bad_handle_is_refused(sqs: Any, unique: str) -> None:
    with pytest.raises(ClientError) as excinfo:
        sqs.cancel_message_move_task(TaskHandle="foobared")
    assert error_of(excinfo) == ("InvalidParameterValue", "Value for parameter TaskHandle is invalid.")
    gone = moto_sqs.encode_task_handle("10f57157-fc38-4da9-a113-4de7e12d05dd", f"arn:aws:sqs:{REGION}:1:x-{unique}")
    with pytest.raises(ClientError) as excinfo:
        sqs.cancel_message_move_task(TaskHandle=gone)
    assert error_of(excinfo) == (
        "ResourceNotFoundException",
        "The resource that you specified for the SourceArn parameter doesn't exist.",
    )


def test_install_is_idempotent() -> None:
    from moto.sqs.models import Queue, SQSBackend

    from devstack import fair_queues

    def wrappers(method: Any) -> list[str]:
        """The modules whose wrappers are around moto's own method, outermost first."""
        names = []
        while hasattr(method, "__wrapped__"):
            names.append(method.__code__.co_filename.rsplit("/", 1)[-1])
            method = method.__wrapped__
        return names

    moto_sqs.install()
    moto_sqs.install()
    fair_queues.install()  # the local stack installs both (fair queues wrap ReceiveMessage too)
    fair_queues.install()
    # one wrapper of each, around moto's own methods
    assert sorted(wrappers(SQSBackend.receive_message)) == ["fair_queues.py", "moto_sqs.py"]
    assert wrappers(Queue.add_message) == ["moto_sqs.py"]


# ----------------------------------------------------------------------------------------------- moto server


@pytest.fixture
def redrive_server() -> Iterator[str]:
    """A moto server on loopback, started after `install` as LocalStack does; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    moto_sqs.install()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def test_the_three_actions_through_a_moto_server(redrive_server: str, unique: str) -> None:
    # Given a boto3 client pointed at the server, and messages the server dead-lettered
    sqs = boto3.client(
        "sqs",
        region_name=REGION,
        endpoint_url=redrive_server,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    pipe = make_pipe(sqs, f"server-{unique}")
    fail_until_dead_lettered(sqs, pipe, ["a", "b"])
    assert counts(sqs, pipe.dlq_url) == (2, 0)

    # When the operator starts, lists and cancels a redrive
    handle = sqs.start_message_move_task(SourceArn=pipe.dlq_arn, MaxNumberOfMessagesPerSecond=10)["TaskHandle"]
    [task] = sqs.list_message_move_tasks(SourceArn=pipe.dlq_arn, MaxResults=1)["Results"]
    with pytest.raises(ClientError) as excinfo:
        sqs.cancel_message_move_task(TaskHandle=handle)

    # Then the messages are back in the source queue and the server answered as in process
    assert sorted(m["Body"] for m in drain(sqs, pipe.url)) == ["a", "b"]
    assert counts(sqs, pipe.dlq_url) == (0, 0)
    assert (task["Status"], task["ApproximateNumberOfMessagesMoved"], task["ApproximateNumberOfMessagesToMove"]) == (
        "COMPLETED",
        2,
        2,
    )
    assert error_of(excinfo) == ("ResourceNotFoundException", "Task does not exist.")
    for url in (pipe.url, pipe.dlq_url):
        sqs.delete_queue(QueueUrl=url)
