"""devstack.fair_queues: moto's standard queues deliver as SQS fair queues (a quiet tenant's messages before a noisy
tenant's backlog), called with boto3 as on AWS."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from moto import mock_aws

from devstack import fair_queues
from devstack.fair_queues import NOISY_AT_LEAST, Deliveries, fair_order, tenant_of


@pytest.fixture
def sqs() -> Iterator[Any]:
    fair_queues.install()
    with mock_aws():
        yield boto3.client("sqs", region_name="us-east-1")


def send(sqs: Any, url: str, group: str | None, count: int, first: int = 0) -> None:
    for n in range(first, first + count):
        extra = {"MessageGroupId": group} if group is not None else {}
        sqs.send_message(QueueUrl=url, MessageBody=f"{group}-{n}", **extra)


def receive(sqs: Any, url: str, count: int = 10) -> list[str]:
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=count, VisibilityTimeout=300)
    return [m["Body"] for m in messages.get("Messages", [])]


def test_a_quiet_tenants_message_is_delivered_before_a_noisy_tenants_backlog(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="work")["QueueUrl"]
    send(sqs, url, "burst", 60)
    # 30 of the burst's delivered (in flight): it is noisy from now on (30 or more, over 10 % of the deliveries)
    assert [b for _ in range(3) for b in receive(sqs, url)] == [f"burst-{n}" for n in range(30)]
    send(sqs, url, "quiet", 2)
    send(sqs, url, None, 1)  # no group: a tenant of its own, quiet
    assert receive(sqs, url, 5) == ["quiet-0", "quiet-1", "None-0", "burst-30", "burst-31"]
    # nothing is lost: the rest of the burst comes next, in its order
    assert [b for _ in range(3) for b in receive(sqs, url)] == [f"burst-{n}" for n in range(32, 60)]


def test_below_the_noisy_threshold_the_queue_keeps_arrival_order(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="work")["QueueUrl"]
    send(sqs, url, "burst", NOISY_AT_LEAST - 1)
    send(sqs, url, "quiet", 1)
    delivered = [b for _ in range(3) for b in receive(sqs, url)]
    assert delivered == [f"burst-{n}" for n in range(NOISY_AT_LEAST - 1)] + ["quiet-0"]


def test_a_fifo_queues_groups_keep_their_order(sqs: Any) -> None:
    url = sqs.create_queue(
        QueueName="work.fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    send(sqs, url, "burst", 40)
    assert len([b for _ in range(3) for b in receive(sqs, url)]) == 10  # one group in flight at a time (FIFO)
    sqs.purge_queue(QueueUrl=url)


def test_of_two_noisy_tenants_the_one_with_fewer_recent_deliveries_comes_first() -> None:
    def message(group: str, n: int) -> Any:
        return SimpleNamespace(group_id=group, id=f"{group}{n}")

    counts = Counter({"group:big": 200, "group:less": 40, "group:calm": 5})
    backlog = [message("big", 0), message("less", 0), message("calm", 0), message("big", 1), message("less", 1)]
    assert [m.id for m in fair_order(backlog, counts)] == ["calm0", "less0", "less1", "big0", "big1"]
    # none noisy (under 30 each): arrival order
    assert fair_order(backlog, Counter({"group:big": 29, "group:less": 29})) == backlog
    assert tenant_of(SimpleNamespace(group_id=None, id="m1")) == "message:m1"


def test_deliveries_older_than_the_window_no_longer_count() -> None:
    deliveries = Deliveries()
    deliveries.note(100.0, ["group:a"] * 30)
    deliveries.note(150.0, ["group:b"])
    assert deliveries.counts(159.0) == Counter({"group:a": 30, "group:b": 1})
    assert deliveries.counts(160.0) == Counter({"group:b": 1})
